// SPDX-License-Identifier: Apache-2.0
// qcowtool: a qemu-img-like command line over libqcow2.
//
//   qcowtool COMMAND [options] ARGS...
//   qcowtool help [COMMAND]
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "qcow2/c.h"
#include "qcow2/version.h"
#include "tools/cli_util.h"
#include "tools/commands.h"

namespace qcow2::tool {
namespace {

struct Command {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* summary;  // one line for the command list
};

// One line per command, in the order `qcowtool --help` lists them.
constexpr Command kCommands[] = {
    {"info", RunInfo, "show facts about an image (and its backing chain)"},
    {"map", RunMap, "show how the virtual disk maps to the image files"},
    {"convert", RunConvert, "copy an image's contents into a raw or qcow2 file"},
    {"create", RunCreate, "create a new qcow2 or raw image"},
    {"snapshot", RunSnapshot,
     "internal snapshots (-l/-c/-a/-d) or an overlay backed by an image"},
    {"io", RunIo, "read, write, discard and check data (like qemu-io)"},
    {"check", RunCheck, "check (and repair) an image's refcounts and metadata"},
    {"bench", RunBench, "measure I/O performance and amplification"},
    {"serve", RunServe, "export an image over NBD (nbdkit with libqcow2)"},
    {"bitmap", RunBitmap, "add, remove, clear, enable, disable, merge bitmaps"},
    {"compare", RunCompare, "check whether two images have the same contents"},
    {"resize", RunResize, "change the virtual size of an image"},
    {"measure", RunMeasure, "compute the file size a new image needs"},
    {"rebase", RunRebase, "change an image's backing file (safe or -u)"},
    {"commit", RunCommit, "write an image's data into its backing file"},
    {"stream", RunStream,
     "pull the chain's data into an image, keeping a base (qcowtool only)"},
    {"amend", RunAmend, "change format options of an image (compat, refcounts)"},
    {"dd", RunDd, "copy part of an image into a new one (like dd(1))"},
};

std::string Usage() {
  std::string u =
      "usage: qcowtool COMMAND [options] ARGS...\n"
      "       qcowtool help [COMMAND]\n"
      "       qcowtool -V|--version\n"
      "\n"
      "Commands:\n";
  for (const Command& c : kCommands) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-10s %s\n", c.name, c.summary);
    u += line;
  }
  u += "\n'qcowtool COMMAND --help' describes a command's options.\n";
  u += kToolExitStatusHelp;
  return u;
}

const Command* Find(std::string_view name) {
  for (const Command& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

// The tool's version and the library's it runs with (the shared library
// may be newer than the headers qcowtool was built with).
int PrintVersion() {
  std::printf("qcowtool version %s (libqcow2 %s)\n", QCOW2_VERSION_STRING,
              qcow2_version_string());
  return kExitOk;
}

bool IsHelp(std::string_view arg) {
  return arg == "--help" || arg == "-h" || arg == "help";
}

int Main(int argc, char** argv) {
  if (argc < 2) return UsageError(Usage(), "no command given");
  std::string_view cmd = argv[1];
  if (cmd == "--version" || cmd == "-V") return PrintVersion();
  if (IsHelp(cmd)) {
    if (argc == 2) return PrintHelp(Usage());
    const Command* c = Find(argv[2]);
    if (c == nullptr) {
      return UsageError(Usage(),
                        std::string("unknown command '") + argv[2] + "'");
    }
    std::string prog = std::string("qcowtool ") + c->name;
    char help_flag[] = "--help";
    char* sub_argv[] = {prog.data(), help_flag, nullptr};
    return c->run(2, sub_argv);
  }
  const Command* c = Find(cmd);
  if (c == nullptr) {
    return UsageError(Usage(),
                      std::string("unknown command '") + argv[1] + "'");
  }
  // getopt_long prefixes its messages with argv[0]: "qcowtool map: ...".
  std::string prog = std::string("qcowtool ") + c->name;
  argv[1] = prog.data();
  return c->run(argc - 1, argv + 1);
}

}  // namespace
}  // namespace qcow2::tool

int main(int argc, char** argv) { return qcow2::tool::Main(argc, argv); }
