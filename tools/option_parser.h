// SPDX-License-Identifier: Apache-2.0
// qcowtool's one option parser: each verb lists its options in a table
// (long name, short letter, argument kind, what to do with the value) and
// gets back its operands. It runs on glibc's getopt_long, so the messages
// users and the CLI tests see for a bad option ("qcowtool map:
// unrecognized option '--x'"), long-option abbreviations, option/operand
// interleaving and `--` stay exactly those of getopt and qemu-img.
#ifndef QCOW2_TOOLS_OPTION_PARSER_H_
#define QCOW2_TOOLS_OPTION_PARSER_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tools/cli_util.h"

namespace qcow2::tool {

// What Parse() and every option's handler return to go on; any other
// value is the exit status to stop with.
inline constexpr int kGoOn = -1;

class OptionParser {
 public:
  enum class Arg { kNone, kRequired, kOptional };
  // Takes the option's value (nullptr for Arg::kNone, and for an absent
  // optional value); returns kGoOn or an exit status.
  using Handler = std::function<int(const char* value)>;
  // A bad option, for parsers that word their own messages.
  struct BadOption {
    bool missing_value;  // a known option without its required value
    int letter;          // the short option at fault, 0 for a long one
    std::string word;    // the command-line word at fault
  };

  // `usage` is printed after a usage error (and by Help()).
  explicit OptionParser(std::string usage);
  OptionParser(const OptionParser&) = delete;  // handlers point at it
  OptionParser& operator=(const OptionParser&) = delete;

  // One option: `long_name` "" for a letter alone, `letter` 0 for a long
  // name alone. Options given more than once call `take` each time.
  OptionParser& Add(std::string_view long_name, char letter, Arg arg,
                    Handler take);

  // Shorthands for the common kinds.
  OptionParser& Flag(std::string_view long_name, char letter, bool* out);
  OptionParser& Text(std::string_view long_name, char letter,
                     std::string* out);
  OptionParser& Text(std::string_view long_name, char letter,
                     std::optional<std::string>* out);
  OptionParser& List(std::string_view long_name, char letter,
                     std::vector<std::string>* out);
  // Accepted for qemu-img compatibility, without effect.
  OptionParser& Ignore(std::string_view long_name, char letter, Arg arg);
  // -h, --help: prints `help` (the usage when empty) to stdout, exit 0.
  OptionParser& Help(std::string help = "");
  // -f, --format FMT: qcow2 or raw, else a usage error.
  OptionParser& Format(std::string* out);
  // The same check for another option naming an image format.
  OptionParser& Format(std::string_view long_name, char letter,
                       std::string* out);
  // --output=human|json.
  OptionParser& Output(OutputFormat* out);
  // -U, --force-share and --backing-root=DIR.
  OptionParser& Policy(OpenPolicy* out);
  // -U, --force-share alone.
  OptionParser& ForceShare(OpenPolicy* out);
  // --backing-root=DIR alone.
  OptionParser& BackingRoot(OpenPolicy* out);
  // --object secret,... and --image-opts (Policy adds them too).
  OptionParser& Secrets(OpenPolicy* out);

  // Words bad options in the caller's own terms (getopt prints nothing);
  // without it getopt prints its message and Parse returns the usage
  // error.
  OptionParser& OnBadOption(std::function<int(const BadOption&)> report);

  // Parses argv[1..] (argv[0] prefixes getopt's messages). Returns kGoOn
  // with the operands in order in `*operands`, else the exit status.
  int Parse(int argc, char** argv, std::vector<std::string>* operands);

  // A usage error: the message (if any), then the usage, to stderr.
  int Error(TextArg message) const { return UsageError(usage_, message); }
  const std::string& usage() const { return usage_; }

 private:
  struct Entry {
    std::string long_name;
    char letter;
    Arg arg;
    Handler take;
  };
  const Entry* Find(int code) const;

  std::string usage_;
  std::vector<Entry> entries_;
  std::function<int(const BadOption&)> report_;
};

// The operand checks most verbs share, in qemu-img's words: exactly one
// IMAGE, else "expecting an image name" or "unexpected argument 'X'".
int ExpectOneImage(const OptionParser& parser,
                   const std::vector<std::string>& operands,
                   std::string* image);

// Parse() then ExpectOneImage().
int ParseOneImage(OptionParser* parser, int argc, char** argv,
                  std::string* image);

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_OPTION_PARSER_H_
