// SPDX-License-Identifier: Apache-2.0
// The vhost-user wire format (QEMU's docs/interop/vhost-user.rst): message
// numbers, feature bits, and a total decoder of one front-end message.
//
// A message is a 12-byte header (request, flags, payload size, all
// little-endian u32) followed by `size` payload bytes, with file
// descriptors passed alongside as SCM_RIGHTS. DecodeMessage() checks the
// header and that the payload has the exact shape the request needs
// (size, descriptor count, field ranges); everything that reaches the
// device past it is well formed. It does no I/O: the socket code reads
// bytes and descriptors, the fuzz target feeds it arbitrary ones.
#ifndef QCOW2_SERVE_VHOST_PROTOCOL_H_
#define QCOW2_SERVE_VHOST_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace qcow2::vhost {

enum Request : uint32_t {
  kGetFeatures = 1,
  kSetFeatures = 2,
  kSetOwner = 3,
  kResetOwner = 4,
  kSetMemTable = 5,
  kSetLogBase = 6,
  kSetLogFd = 7,
  kSetVringNum = 8,
  kSetVringAddr = 9,
  kSetVringBase = 10,
  kGetVringBase = 11,
  kSetVringKick = 12,
  kSetVringCall = 13,
  kSetVringErr = 14,
  kGetProtocolFeatures = 15,
  kSetProtocolFeatures = 16,
  kGetQueueNum = 17,
  kSetVringEnable = 18,
  kGetConfig = 24,
  kSetConfig = 25,
};

// The name of a request number, for log lines ("SET_VRING_ADDR", or
// "request 99" for one we do not know).
std::string RequestName(uint32_t request);

// Header flags.
inline constexpr uint32_t kVersionMask = 0x3;
inline constexpr uint32_t kVersion = 0x1;
inline constexpr uint32_t kFlagReply = 1u << 2;
inline constexpr uint32_t kFlagNeedReply = 1u << 3;

inline constexpr size_t kHeaderSize = 12;
// Largest payload we accept: a memory table of 8 regions is 8 + 8 * 32
// bytes, a config message 12 + 256.
inline constexpr uint32_t kMaxPayload = 4096;
inline constexpr int kMaxFds = 8;
inline constexpr uint32_t kMaxMemRegions = 8;
inline constexpr uint32_t kMaxConfigSize = 256;

// Virtio feature bits this device deals in.
inline constexpr int kFeatureProtocolFeatures = 30;  // VHOST_USER_F_...
inline constexpr int kFeatureIndirectDesc = 28;
inline constexpr int kFeatureEventIdx = 29;
inline constexpr int kFeatureVersion1 = 32;

// Protocol feature bits (GET/SET_PROTOCOL_FEATURES).
inline constexpr int kProtocolMq = 0;
inline constexpr int kProtocolReplyAck = 3;
inline constexpr int kProtocolConfig = 9;

// SET_VRING_KICK/CALL/ERR: the queue index in bits 0-7; bit 8 set means
// no descriptor comes with the message (polling mode, or "no call").
inline constexpr uint64_t kVringIndexMask = 0xff;
inline constexpr uint64_t kVringNoFd = 1ull << 8;

struct MemRegion {
  uint64_t guest_phys_addr = 0;
  uint64_t memory_size = 0;
  uint64_t userspace_addr = 0;  // the front-end's virtual address
  uint64_t mmap_offset = 0;     // where the region starts in its fd
};

struct VringState {
  uint32_t index = 0;
  uint32_t num = 0;
};

struct VringAddr {
  uint32_t index = 0;
  uint32_t flags = 0;
  uint64_t desc = 0;  // front-end virtual addresses
  uint64_t used = 0;
  uint64_t avail = 0;
  uint64_t log = 0;
};

struct ConfigSpace {
  uint32_t offset = 0;
  uint32_t size = 0;
  uint32_t flags = 0;
  std::vector<uint8_t> data;  // `size` bytes (SET_CONFIG; GET_CONFIG's
                              // front-end fills them with zeros)
};

// One decoded front-end message. Only the fields of its request are set.
struct Message {
  uint32_t request = 0;
  uint32_t flags = 0;
  uint64_t u64 = 0;                  // features, KICK/CALL/ERR index word
  VringState state;                  // SET_VRING_NUM/BASE/ENABLE, GET_VRING_BASE
  VringAddr addr;                    // SET_VRING_ADDR
  std::vector<MemRegion> regions;    // SET_MEM_TABLE
  ConfigSpace config;                // GET/SET_CONFIG
  std::vector<int> fds;              // descriptors, owned by the caller

  bool need_reply() const { return (flags & kFlagNeedReply) != 0; }
};

// Decodes the 12-byte header: the request, flags and payload size.
// kInvalidArgument when the version is not 1, the reply flag is set (a
// front-end never sends replies) or the size exceeds kMaxPayload.
struct Header {
  uint32_t request = 0;
  uint32_t flags = 0;
  uint32_t size = 0;
};
absl::StatusOr<Header> DecodeHeader(absl::Span<const uint8_t> bytes);

// Decodes a whole message: `payload` must be header.size bytes, `fds` the
// descriptors that came with it (not closed here: the caller owns them).
// kInvalidArgument naming the request and what is wrong otherwise;
// kUnimplemented for a request this back-end does not handle.
absl::StatusOr<Message> DecodeMessage(const Header& header,
                                      absl::Span<const uint8_t> payload,
                                      absl::Span<const int> fds);

// Reply encodings: a header with the reply flag and the payload.
std::vector<uint8_t> EncodeU64Reply(uint32_t request, uint64_t value);
std::vector<uint8_t> EncodeStateReply(uint32_t request, VringState state);
std::vector<uint8_t> EncodeConfigReply(const ConfigSpace& config);

}  // namespace qcow2::vhost

#endif  // QCOW2_SERVE_VHOST_PROTOCOL_H_
