// SPDX-License-Identifier: Apache-2.0
// qcowtool's command handlers. Each is called with argv[0] set to the
// command name and the command's own arguments after it, parses them with
// getopt_long, and returns the process exit status (see tools/cli_util.h:
// 0 success, 1 wrong arguments, 2 image errors). Every command prints its
// usage on --help.
//
// Adding a command: declare its handler here, define it in its own
// tools/cmd_NAME.cc, and add one line to the table in tools/main.cc.
#ifndef QCOW2_TOOLS_COMMANDS_H_
#define QCOW2_TOOLS_COMMANDS_H_

namespace qcow2::tool {

int RunInfo(int argc, char** argv);
int RunMap(int argc, char** argv);
int RunConvert(int argc, char** argv);
int RunCreate(int argc, char** argv);
int RunSnapshot(int argc, char** argv);
int RunIo(int argc, char** argv);
int RunCheck(int argc, char** argv);
int RunBench(int argc, char** argv);
int RunServe(int argc, char** argv);
// `serve --vhost-user-blk` (tools/cmd_serve_vhost.cc), dispatched from
// RunServe when IsVhostUserBlkServe() finds the option.
bool IsVhostUserBlkServe(int argc, char** argv);
int RunServeVhostUserBlk(int argc, char** argv);
int RunBitmap(int argc, char** argv);
int RunCompare(int argc, char** argv);
int RunResize(int argc, char** argv);
int RunMeasure(int argc, char** argv);
int RunRebase(int argc, char** argv);
int RunCommit(int argc, char** argv);
int RunStream(int argc, char** argv);
int RunAmend(int argc, char** argv);
int RunDd(int argc, char** argv);

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_COMMANDS_H_
