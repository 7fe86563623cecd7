// SPDX-License-Identifier: Apache-2.0
#include "tools/option_parser.h"

#include <getopt.h>

#include <utility>

namespace qcow2::tool {

namespace {

// getopt codes of long-only options: above every char.
constexpr int kFirstLongCode = 256;

// Makes the next getopt_long() call start afresh at argv[1] (commands are
// called with argv[0] set to the command name).
void ResetGetopt() {
  // glibc: 0 reinitialises the scanner completely (including its
  // argument permutation state); the next argument scanned is argv[1].
  optind = 0;
  opterr = 1;
}

int HasArg(OptionParser::Arg arg) {
  switch (arg) {
    case OptionParser::Arg::kNone:
      return no_argument;
    case OptionParser::Arg::kRequired:
      return required_argument;
    case OptionParser::Arg::kOptional:
      return optional_argument;
  }
  return no_argument;
}

}  // namespace

OptionParser::OptionParser(std::string usage) : usage_(std::move(usage)) {}

OptionParser& OptionParser::Add(std::string_view long_name, char letter,
                                Arg arg, Handler take) {
  entries_.push_back(
      Entry{std::string(long_name), letter, arg, std::move(take)});
  return *this;
}

OptionParser& OptionParser::Flag(std::string_view long_name, char letter,
                                 bool* out) {
  return Add(long_name, letter, Arg::kNone, [out](const char*) {
    *out = true;
    return kGoOn;
  });
}

OptionParser& OptionParser::Text(std::string_view long_name, char letter,
                                 std::string* out) {
  return Add(long_name, letter, Arg::kRequired, [out](const char* v) {
    *out = v;
    return kGoOn;
  });
}

OptionParser& OptionParser::Text(std::string_view long_name, char letter,
                                 std::optional<std::string>* out) {
  return Add(long_name, letter, Arg::kRequired, [out](const char* v) {
    *out = v;
    return kGoOn;
  });
}

OptionParser& OptionParser::List(std::string_view long_name, char letter,
                                 std::vector<std::string>* out) {
  return Add(long_name, letter, Arg::kRequired, [out](const char* v) {
    out->push_back(v);
    return kGoOn;
  });
}

OptionParser& OptionParser::Ignore(std::string_view long_name, char letter,
                                   Arg arg) {
  return Add(long_name, letter, arg, [](const char*) { return kGoOn; });
}

OptionParser& OptionParser::Help(std::string help) {
  return Add("help", 'h', Arg::kNone,
             [this, help = std::move(help)](const char*) {
               return PrintHelp(help.empty() ? usage_ : help);
             });
}

OptionParser& OptionParser::Format(std::string* out) {
  return Format("format", 'f', out);
}

OptionParser& OptionParser::Format(std::string_view long_name, char letter,
                                   std::string* out) {
  return Add(long_name, letter, Arg::kRequired, [this, out](const char* v) {
    if (auto s = CheckImageFormat(v); !s.ok()) return Error(s.message());
    *out = v;
    return kGoOn;
  });
}

OptionParser& OptionParser::Output(OutputFormat* out) {
  return Add("output", 0, Arg::kRequired, [this, out](const char* v) {
    auto f = ParseOutputFormat(v);
    if (!f.ok()) return Error(f.status().message());
    *out = *f;
    return kGoOn;
  });
}

OptionParser& OptionParser::ForceShare(OpenPolicy* out) {
  return Flag("force-share", 'U', &out->force_share);
}

OptionParser& OptionParser::BackingRoot(OpenPolicy* out) {
  return Text("backing-root", 0, &out->backing_root);
}

OptionParser& OptionParser::Policy(OpenPolicy* out) {
  return ForceShare(out).BackingRoot(out).Secrets(out);
}

OptionParser& OptionParser::Secrets(OpenPolicy* out) {
  Add("object", 0, Arg::kRequired, [out](const char* v) {
    absl::Status s = out->AddObject(v);
    return s.ok() ? kGoOn : ReportQemuImgError(s);
  });
  return Flag("image-opts", 0, &out->image_opts);
}

OptionParser& OptionParser::OnBadOption(
    std::function<int(const BadOption&)> report) {
  report_ = std::move(report);
  return *this;
}

const OptionParser::Entry* OptionParser::Find(int code) const {
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    const int own = e.letter != 0 ? static_cast<unsigned char>(e.letter)
                                  : kFirstLongCode + static_cast<int>(i);
    if (own == code) return &e;
  }
  return nullptr;
}

int OptionParser::Parse(int argc, char** argv,
                        std::vector<std::string>* operands) {
  // With a leading ':' getopt stays silent and tells a missing value
  // (':') from an unknown option ('?').
  std::string letters = report_ ? ":" : "";
  std::vector<option> longs;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.letter != 0) {
      letters += e.letter;
      if (e.arg == Arg::kRequired) letters += ":";
      if (e.arg == Arg::kOptional) letters += "::";
    }
    if (!e.long_name.empty()) {
      const int code = e.letter != 0 ? static_cast<unsigned char>(e.letter)
                                     : kFirstLongCode + static_cast<int>(i);
      longs.push_back({e.long_name.c_str(), HasArg(e.arg), nullptr, code});
    }
  }
  longs.push_back({nullptr, 0, nullptr, 0});

  ResetGetopt();
  if (report_) opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, letters.c_str(), longs.data(),
                          nullptr)) != -1) {
    const Entry* e = (c == '?' || c == ':') ? nullptr : Find(c);
    if (e == nullptr) {
      if (!report_) return UsageError(usage_, "");  // getopt said why
      const int letter = optopt > 0 && optopt < kFirstLongCode ? optopt : 0;
      return report_(BadOption{c == ':', letter, argv[optind - 1]});
    }
    const int rc = e->take(e->arg == Arg::kNone ? nullptr : optarg);
    if (rc != kGoOn) return rc;
  }
  operands->assign(argv + optind, argv + argc);
  return kGoOn;
}

int ExpectOneImage(const OptionParser& parser,
                   const std::vector<std::string>& operands,
                   std::string* image) {
  if (operands.empty()) return parser.Error("expecting an image name");
  if (operands.size() > 1) {
    return parser.Error("unexpected argument '" + operands[1] + "'");
  }
  *image = operands[0];
  return kGoOn;
}

int ParseOneImage(OptionParser* parser, int argc, char** argv,
                  std::string* image) {
  std::vector<std::string> operands;
  if (int rc = parser->Parse(argc, argv, &operands); rc != kGoOn) return rc;
  return ExpectOneImage(*parser, operands, image);
}

}  // namespace qcow2::tool
