// SPDX-License-Identifier: Apache-2.0
// Secrets as qemu-img 7.2 takes them, checked against qemu-img itself on
// one LUKS-encrypted image:
// - `info --image-opts` names the image as QEMU does (a json:{...} name
//   once encrypt.key-secret is given, the plain name otherwise; the
//   backing files of --backing-chain by their names), human and JSON,
//   the whole output compared, and refuses backing.* options as
//   qemu-img info does;
// - every verb that opens an image opens it with `--object secret,...`
//   and `--image-opts ...,encrypt.key-secret=ID`, and without the secret
//   fails with QEMU's words (the file untouched), run the same way
//   through qemu-img (qemu-nbd for serve) where QEMU has the verb and
//   the options.
// The image has small fixed PBKDF2 counts, so each open costs little.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "qcow2/options.h"
#include "tests/util/harden_sha256.h"
#include "tests/util/luks_cli.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using ::qcow2::testing::CommandResult;
using ::qcow2::testing::MakeEncrypted;
using ::qcow2::testing::ReadFileBytes;
using ::qcow2::testing::Run;
using ::qcow2::testing::Sha256Hex;
using ::qcow2::testing::TempDir;
using ::testing::HasSubstr;

constexpr char kNeeded[] = "Parameter 'encrypt.key-secret' is required for cipher";

// stderr with the program's name taken off each "qemu-img: " or
// "qcowtool: " line start, to compare the messages themselves.
std::string Message(const std::string& err) {
  std::string out = absl::StrReplaceAll(
      "\n" + err, {{"\nqemu-img: ", "\n"}, {"\nqcowtool: ", "\n"}});
  return out.substr(1);
}

CommandResult Both(const std::string& program, std::vector<std::string> args) {
  args.insert(args.begin(), program);
  return Run(args);
}

// --- info: image names -------------------------------------------------

TEST(CliLuksSecretsTest, InfoNamesImagesAsQemu) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string base = dir.File("base.qcow2");
  const std::string top = dir.File("top.qcow2");
  // A name QEMU's JSON printer escapes: quote, backslash, tab, non-ASCII
  // and a code point beyond the BMP.
  const std::string odd = dir.File("q\"b\\c\t\xc3\xa9\xf0\x9f\x98\x80.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeEncrypted(base, "base-pass"));
  ASSERT_NO_FATAL_FAILURE(MakeEncrypted(top, "top-pass", base));
  std::filesystem::copy_file(base, odd);
  const std::vector<std::string> objects = {
      "--object", "secret,id=s0,data=base-pass", "--object",
      "secret,id=s1,data=top-pass"};
  auto opts = [](const std::string& path, const std::string& extra) {
    return absl::StrCat("driver=qcow2,file.filename=", path, extra);
  };
  const std::vector<std::vector<std::string>> cases = {
      {"--image-opts", opts(base, ",encrypt.key-secret=s0")},
      {"--output=json", "--image-opts", opts(base, ",encrypt.key-secret=s0")},
      {"--backing-chain", "--image-opts", opts(top, ",encrypt.key-secret=s1")},
      {"--output=json", "--backing-chain", "--image-opts",
       opts(top, ",encrypt.key-secret=s1")},
      // No option beyond the defaults: the plain name.
      {"--image-opts", opts(base, "")},
      {"--output=json", "--image-opts", opts(base, "")},
      {"--output=json", "--backing-chain", "--image-opts", opts(top, "")},
      {"--image-opts",
       absl::StrCat("driver=qcow2,file.driver=file,file.filename=", base,
                    ",encrypt.key-secret=s0")},
      // The driver probed; a secret that does not fit (info tries none).
      {"--image-opts",
       absl::StrCat("file.filename=", base, ",encrypt.key-secret=s1")},
      {"--image-opts", opts(odd, ",encrypt.key-secret=s0")},
      {"--output=json", "--image-opts", opts(odd, ",encrypt.key-secret=s0")},
      // info opens no backing file, so backing.* is an unknown option.
      {"--image-opts",
       opts(top, ",encrypt.key-secret=s1,backing.encrypt.key-secret=s0")},
      {"--output=json", base},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"info"};
    args.insert(args.end(), objects.begin(), objects.end());
    args.insert(args.end(), c.begin(), c.end());
    SCOPED_TRACE(absl::StrJoin(args, " "));
    CommandResult want = Both("qemu-img", args);
    CommandResult got = Both(::qcow2::testing::QcowtoolPath(), args);
    EXPECT_EQ(got.exit_code, want.exit_code);
    EXPECT_EQ(got.out, want.out);
    EXPECT_EQ(Message(got.err), Message(want.err));
  }
  // Not vacuous: QEMU's json: name is among what was compared.
  CommandResult r = Both("qemu-img", {"info", "--object",
                                      "secret,id=s0,data=base-pass",
                                      "--image-opts",
                                      opts(base, ",encrypt.key-secret=s0")});
  EXPECT_THAT(r.out, HasSubstr("image: json:{\"encrypt.key-secret\": \"s0\", "
                               "\"driver\": \"qcow2\", \"file\": {"));
}

// --- every verb ----------------------------------------------------------

// One verb: its arguments after the verb, "@" standing for the image's
// option string (inside a word too: dd's if=@), "%o" for an output file,
// "%p" a pid file, "%s" a socket. `qemu`: what QEMU runs the same way
// ("" when QEMU 7.2 has no such verb or options); `same_out`: stdout and
// stderr compared with QEMU's; `daemon`: a server that forks once ready.
struct Verb {
  std::string name;
  std::vector<std::string> args;
  std::string qemu = "qemu-img";
  bool same_out = false;
  bool daemon = false;
  bool needs_secret = true;  // qemu-img info reads metadata only
};

// Stops the server whose pid `pid_file` holds (none: nothing started).
void StopDaemon(const std::string& pid_file) {
  std::ifstream in(pid_file);
  pid_t pid = -1;
  if (in >> pid) ::qcow2::testing::StopServer(pid);
}

// Runs `program` (the verb first, but for qemu-nbd) on a fresh copy of
// `pristine` named by `row` and a tag of who and how; `secret` puts the
// --object and encrypt.key-secret in. A daemon is stopped again.
// *image_hash: the copy's hash afterwards.
CommandResult RunVerb(const std::string& program, const Verb& v, int row,
                      const std::string& pristine, const TempDir& dir,
                      bool secret, std::string* image_hash) {
  const bool qemu = program.rfind("qemu", 0) == 0;
  const std::string base = dir.File(absl::StrCat(
      "r", row, "-", qemu ? "q" : "o", secret ? "s" : "n"));
  const std::string img = base + ".qcow2";
  std::filesystem::copy_file(pristine, img);
  std::string opts = absl::StrCat("driver=qcow2,file.filename=", img);
  if (secret) absl::StrAppend(&opts, ",encrypt.key-secret=s0");
  std::vector<std::string> argv = {program};
  if (program != "qemu-nbd") {
    for (absl::string_view w : absl::StrSplit(v.name, ' ')) {
      argv.emplace_back(w);
    }
  }
  if (secret) argv.insert(argv.end(), {"--object", "secret,id=s0,data=p4ss"});
  argv.push_back("--image-opts");
  for (const std::string& a : v.args) {
    argv.push_back(absl::StrReplaceAll(a, {{"@", opts},
                                           {"%o", base + ".out"},
                                           {"%p", base + ".pid"},
                                           {"%s", base + ".sock"}}));
  }
  CommandResult r;
  if (v.daemon) {
    // Through a shell, its output to a file: the daemon must not hold the
    // pipes Run reads to their end.
    std::string cmd;
    for (const std::string& a : argv) absl::StrAppend(&cmd, "'", a, "' ");
    r = ::qcow2::testing::RunShell(
        absl::StrCat(cmd, ">/dev/null 2>", base, ".log"));
    auto err = ReadFileBytes(base + ".log");
    if (err.ok()) r.err.assign(err->begin(), err->end());
    StopDaemon(base + ".pid");
  } else {
    r = Run(argv);
  }
  auto bytes = ReadFileBytes(img);
  *image_hash = bytes.ok() ? Sha256Hex(*bytes) : "";
  return r;
}

// Our output with our copy's tag made QEMU's (the names differ only there).
std::string AsQemus(const std::string& text, bool secret) {
  return absl::StrReplaceAll(text, {{secret ? "-os." : "-on.",
                                     secret ? "-qs." : "-qn."}});
}

TEST(CliLuksSecretsTest, EveryVerbTakesTheSecretAsQemuImg) {
  SKIP_WITHOUT_QEMU();
  TempDir dir;
  const std::string pristine = dir.File("pristine.qcow2");
  ASSERT_NO_FATAL_FAILURE(MakeEncrypted(pristine, "p4ss"));
  auto bytes = ReadFileBytes(pristine);
  ASSERT_TRUE(bytes.ok());
  const std::string pristine_hash = Sha256Hex(*bytes);

  std::vector<Verb> verbs = {
      {"info", {"@"}, "qemu-img", true, false, false},
      {"check", {"--output=json", "@"}, "qemu-img", true},
      {"map", {"--output=json", "@"}, "qemu-img", true},
      {"compare", {"@", "@"}, "qemu-img", true},
      {"convert", {"-O", "raw", "@", "%o"}},
      // No backing file: both open the image, then refuse the same way.
      {"commit", {"@"}, "qemu-img", true},
      {"rebase", {"-u", "-b", "", "@"}, "qemu-img", true},
      {"resize", {"@", "8M"}, "qemu-img", true},
      {"amend", {"-o", "lazy_refcounts=on", "@"}, "qemu-img", true},
      {"measure", {"--output=json", "-O", "qcow2", "@"}, "qemu-img", true},
      {"snapshot", {"-l", "@"}, "qemu-img", true},
      {"snapshot", {"-c", "sn1", "@"}, "qemu-img", true},
      {"bitmap", {"--add", "@", "b0"}, "qemu-img", true},
      {"dd", {"if=@", "of=%o", "bs=64k", "count=1"}, "qemu-img", true},
      // qemu-img 7.2's bench takes no --object: ours only.
      {"bench pattern", {"-c", "16", "@"}, ""},
      {"serve", {"--fork", "--pid-file", "%p", "--socket", "%s", "@"},
       "qemu-nbd", false, true},
      {"serve",
       {"--fork", "--pid-file", "%p", "--vhost-user-blk", "%s", "@"}, "",
       false, true},
  };
  if (::qcow2::testing::Run({"nbdkit", "--version"}).exit_code == 0) {
    verbs.push_back({"serve",
                     {"--nbdkit", "--fork", "--pid-file", "%p", "--socket",
                      "%s", "@"},
                     "", false, true});
  }
  // qemu-nbd's spelling of the NBD server's arguments.
  const Verb qemu_nbd = {"serve", {"--fork", "--pid-file", "%p", "-k", "%s", "@"},
                         "qemu-nbd", false, true};
  const std::string tool = ::qcow2::testing::QcowtoolPath();
  for (size_t row = 0; row < verbs.size(); ++row) {
    const Verb& v = verbs[row];
    const Verb& q = v.qemu == "qemu-nbd" ? qemu_nbd : v;
    SCOPED_TRACE(absl::StrCat(v.name, " ", absl::StrJoin(v.args, " ")));
    for (bool secret : {true, false}) {
      SCOPED_TRACE(secret ? "with the secret" : "without");
      std::string ours_hash, theirs_hash;
      CommandResult got = RunVerb(tool, v, row, pristine, dir, secret,
                                  &ours_hash);
      const bool opens = secret || !v.needs_secret;
      if (opens && v.name == "commit") {
        EXPECT_THAT(got.err, HasSubstr("Image does not have a backing file"));
      } else if (opens) {
        EXPECT_EQ(got.exit_code, 0) << got.err;
      } else {
        EXPECT_NE(got.exit_code, 0);
        EXPECT_THAT(got.err, HasSubstr(kNeeded));
        EXPECT_EQ(ours_hash, pristine_hash);
      }
      if (v.qemu.empty()) continue;
      CommandResult want = RunVerb(v.qemu, q, row, pristine, dir, secret,
                                   &theirs_hash);
      EXPECT_EQ(got.exit_code == 0, want.exit_code == 0) << want.err;
      // qemu-img's verbs give its status, failures included.
      if (v.qemu == "qemu-img") EXPECT_EQ(got.exit_code, want.exit_code);
      if (!opens) {
        EXPECT_THAT(want.err, HasSubstr(kNeeded));
      }
      if (opens && v.same_out) {
        EXPECT_EQ(got.exit_code, want.exit_code);
        EXPECT_EQ(AsQemus(got.out, secret), want.out);
        EXPECT_EQ(AsQemus(Message(got.err), secret), Message(want.err));
      }
    }
  }
}

}  // namespace
}  // namespace qcow2
