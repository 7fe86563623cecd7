// SPDX-License-Identifier: Apache-2.0
// The NBD wire protocol's numbers (NetworkBlockDevice/nbd doc/proto.md) and
// big-endian field helpers. Every multi-byte field on the wire is big-endian.
#ifndef QCOW2_SERVE_NBD_PROTOCOL_H_
#define QCOW2_SERVE_NBD_PROTOCOL_H_

#include <cstdint>
#include <string>

namespace qcow2::nbd {

// Handshake.
constexpr uint64_t kNbdMagic = 0x4e42444d41474943ull;     // "NBDMAGIC"
constexpr uint64_t kOptMagic = 0x49484156454F5054ull;     // "IHAVEOPT"
constexpr uint64_t kOptReplyMagic = 0x0003e889045565a9ull;
constexpr uint16_t kFlagFixedNewstyle = 1 << 0;
constexpr uint16_t kFlagNoZeroes = 1 << 1;
constexpr uint32_t kClientFlagFixedNewstyle = 1 << 0;
constexpr uint32_t kClientFlagNoZeroes = 1 << 1;

// Options.
constexpr uint32_t kOptExportName = 1;
constexpr uint32_t kOptAbort = 2;
constexpr uint32_t kOptList = 3;
constexpr uint32_t kOptStartTls = 5;
constexpr uint32_t kOptInfo = 6;
constexpr uint32_t kOptGo = 7;
constexpr uint32_t kOptStructuredReply = 8;
constexpr uint32_t kOptListMetaContext = 9;
constexpr uint32_t kOptSetMetaContext = 10;

// Option replies.
constexpr uint32_t kRepAck = 1;
constexpr uint32_t kRepServer = 2;
constexpr uint32_t kRepInfo = 3;
constexpr uint32_t kRepMetaContext = 4;
constexpr uint32_t kRepErrBit = 1u << 31;
constexpr uint32_t kRepErrUnsup = kRepErrBit | 1;
constexpr uint32_t kRepErrPolicy = kRepErrBit | 2;
constexpr uint32_t kRepErrInvalid = kRepErrBit | 3;
constexpr uint32_t kRepErrTlsReqd = kRepErrBit | 5;
constexpr uint32_t kRepErrUnknown = kRepErrBit | 6;
constexpr uint32_t kRepErrShutdown = kRepErrBit | 7;
constexpr uint32_t kRepErrTooBig = kRepErrBit | 9;

// NBD_INFO_* of INFO and GO.
constexpr uint16_t kInfoExport = 0;
constexpr uint16_t kInfoName = 1;
constexpr uint16_t kInfoDescription = 2;
constexpr uint16_t kInfoBlockSize = 3;

// Transmission flags.
constexpr uint16_t kTransHasFlags = 1 << 0;
constexpr uint16_t kTransReadOnly = 1 << 1;
constexpr uint16_t kTransSendFlush = 1 << 2;
constexpr uint16_t kTransSendFua = 1 << 3;
constexpr uint16_t kTransSendTrim = 1 << 5;
constexpr uint16_t kTransSendWriteZeroes = 1 << 6;
constexpr uint16_t kTransSendDf = 1 << 7;
constexpr uint16_t kTransCanMultiConn = 1 << 8;
constexpr uint16_t kTransSendCache = 1 << 10;
constexpr uint16_t kTransSendFastZero = 1 << 11;

// Transmission phase.
constexpr uint32_t kRequestMagic = 0x25609513;
constexpr uint32_t kSimpleReplyMagic = 0x67446698;
constexpr uint32_t kStructuredReplyMagic = 0x668e33ef;
constexpr size_t kRequestSize = 28;
constexpr size_t kSimpleReplySize = 16;
constexpr size_t kChunkHeaderSize = 20;

constexpr uint16_t kCmdRead = 0;
constexpr uint16_t kCmdWrite = 1;
constexpr uint16_t kCmdDisc = 2;
constexpr uint16_t kCmdFlush = 3;
constexpr uint16_t kCmdTrim = 4;
constexpr uint16_t kCmdCache = 5;
constexpr uint16_t kCmdWriteZeroes = 6;
constexpr uint16_t kCmdBlockStatus = 7;

constexpr uint16_t kCmdFlagFua = 1 << 0;
constexpr uint16_t kCmdFlagNoHole = 1 << 1;
constexpr uint16_t kCmdFlagDf = 1 << 2;
constexpr uint16_t kCmdFlagReqOne = 1 << 3;
constexpr uint16_t kCmdFlagFastZero = 1 << 4;

constexpr uint16_t kReplyFlagDone = 1 << 0;
constexpr uint16_t kReplyNone = 0;
constexpr uint16_t kReplyOffsetData = 1;
constexpr uint16_t kReplyOffsetHole = 2;
constexpr uint16_t kReplyBlockStatus = 5;
constexpr uint16_t kReplyError = (1 << 15) | 1;
constexpr uint16_t kReplyErrorOffset = (1 << 15) | 2;

// Error values of replies (not the host's errno numbers).
constexpr uint32_t kEperm = 1;
constexpr uint32_t kEio = 5;
constexpr uint32_t kEnomem = 12;
constexpr uint32_t kEinval = 22;
constexpr uint32_t kEnospc = 28;
constexpr uint32_t kEoverflow = 75;
constexpr uint32_t kEnotsup = 95;
constexpr uint32_t kEshutdown = 108;

// base:allocation flags.
constexpr uint32_t kStateHole = 1 << 0;
constexpr uint32_t kStateZero = 1 << 1;
// qemu:dirty-bitmap:NAME flag.
constexpr uint32_t kStateDirty = 1 << 0;

// The largest READ or WRITE payload accepted (as qemu-nbd's).
constexpr uint32_t kMaxPayload = 32u << 20;
// The largest option payload accepted during the handshake.
constexpr uint32_t kMaxOptionLength = 64u << 10;
// Strings (names, queries) in options: as the protocol's limit.
constexpr uint32_t kMaxStringLength = 4096;

inline void Put16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v >> 8));
  out->push_back(static_cast<char>(v));
}
inline void Put32(std::string* out, uint32_t v) {
  Put16(out, static_cast<uint16_t>(v >> 16));
  Put16(out, static_cast<uint16_t>(v));
}
inline void Put64(std::string* out, uint64_t v) {
  Put32(out, static_cast<uint32_t>(v >> 32));
  Put32(out, static_cast<uint32_t>(v));
}
inline uint16_t Get16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] << 8 | p[1]);
}
inline uint32_t Get32(const uint8_t* p) {
  return static_cast<uint32_t>(Get16(p)) << 16 | Get16(p + 2);
}
inline uint64_t Get64(const uint8_t* p) {
  return static_cast<uint64_t>(Get32(p)) << 32 | Get32(p + 4);
}

}  // namespace qcow2::nbd

#endif  // QCOW2_SERVE_NBD_PROTOCOL_H_
