// SPDX-License-Identifier: Apache-2.0
#include "serve/vhost/protocol.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "serve/vhost/wire.h"

namespace qcow2::vhost {
namespace {

absl::Status Malformed(uint32_t request, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(RequestName(request), ": ", what));
}

// The payload is exactly `want` bytes, with exactly `fds` descriptors.
absl::Status ExpectShape(const Header& h, absl::Span<const int> fds,
                         uint32_t want, size_t want_fds) {
  if (h.size != want) {
    return Malformed(h.request, absl::StrCat("payload of ", h.size,
                                             " bytes, expected ", want));
  }
  if (fds.size() != want_fds) {
    return Malformed(h.request, absl::StrCat(fds.size(), " descriptors, expected ",
                                             want_fds));
  }
  return absl::OkStatus();
}

absl::Status DecodeMemTable(const Header& h, absl::Span<const uint8_t> p,
                            absl::Span<const int> fds, Message* m) {
  if (p.size() < 8) return Malformed(h.request, "payload shorter than 8 bytes");
  const uint32_t n = LoadLe32(p.data());
  if (n == 0 || n > kMaxMemRegions) {
    return Malformed(h.request, absl::StrCat(n, " regions (1 to ",
                                             kMaxMemRegions, " allowed)"));
  }
  // QEMU sends the whole 8-slot table; other front-ends only `n` slots.
  const uint32_t need = 8 + 32 * n;
  if (p.size() != need && p.size() != 8 + 32 * kMaxMemRegions) {
    return Malformed(h.request, absl::StrCat("payload of ", p.size(),
                                             " bytes for ", n, " regions"));
  }
  if (fds.size() != n) {
    return Malformed(h.request, absl::StrCat(fds.size(), " descriptors for ",
                                             n, " regions"));
  }
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* r = p.data() + 8 + 32 * i;
    MemRegion region{LoadLe64(r), LoadLe64(r + 8), LoadLe64(r + 16),
                     LoadLe64(r + 24)};
    if (region.memory_size == 0) {
      return Malformed(h.request, absl::StrCat("region ", i, " is empty"));
    }
    uint64_t end;
    if (__builtin_add_overflow(region.guest_phys_addr, region.memory_size,
                               &end) ||
        __builtin_add_overflow(region.userspace_addr, region.memory_size,
                               &end) ||
        __builtin_add_overflow(region.mmap_offset, region.memory_size, &end)) {
      return Malformed(h.request,
                       absl::StrCat("region ", i, " wraps the address space"));
    }
    for (const MemRegion& o : m->regions) {
      if (region.guest_phys_addr < o.guest_phys_addr + o.memory_size &&
          o.guest_phys_addr < region.guest_phys_addr + region.memory_size) {
        return Malformed(h.request, absl::StrCat("region ", i,
                                                 " overlaps another"));
      }
    }
    m->regions.push_back(region);
  }
  return absl::OkStatus();
}

absl::Status DecodeConfig(const Header& h, absl::Span<const uint8_t> p,
                          absl::Span<const int> fds, Message* m) {
  if (!fds.empty()) return Malformed(h.request, "unexpected descriptors");
  if (p.size() < 12) return Malformed(h.request, "payload shorter than 12 bytes");
  ConfigSpace& c = m->config;
  c.offset = LoadLe32(p.data());
  c.size = LoadLe32(p.data() + 4);
  c.flags = LoadLe32(p.data() + 8);
  if (c.size > kMaxConfigSize || c.offset > kMaxConfigSize ||
      c.offset + c.size > kMaxConfigSize) {
    return Malformed(h.request, absl::StrCat("config range ", c.offset, "+",
                                             c.size, " past ", kMaxConfigSize,
                                             " bytes"));
  }
  if (p.size() != 12 + c.size) {
    return Malformed(h.request, absl::StrCat("payload of ", p.size(),
                                             " bytes for ", c.size,
                                             " config bytes"));
  }
  c.data.assign(p.begin() + 12, p.end());
  return absl::OkStatus();
}

// KICK/CALL/ERR: a u64 of index and "no fd" flag, one descriptor unless
// the flag says none comes.
absl::Status DecodeVringFd(const Header& h, absl::Span<const uint8_t> p,
                           absl::Span<const int> fds, Message* m) {
  if (h.size != 8) {
    return Malformed(h.request, absl::StrCat("payload of ", h.size,
                                             " bytes, expected 8"));
  }
  m->u64 = LoadLe64(p.data());
  if ((m->u64 & ~(kVringIndexMask | kVringNoFd)) != 0) {
    return Malformed(h.request, absl::StrCat("unknown bits in 0x",
                                             absl::Hex(m->u64)));
  }
  const size_t want = (m->u64 & kVringNoFd) ? 0 : 1;
  if (fds.size() != want) {
    return Malformed(h.request, absl::StrCat(fds.size(),
                                             " descriptors, expected ", want));
  }
  m->state.index = static_cast<uint32_t>(m->u64 & kVringIndexMask);
  return absl::OkStatus();
}

}  // namespace

std::string RequestName(uint32_t request) {
  switch (request) {
    case kGetFeatures: return "GET_FEATURES";
    case kSetFeatures: return "SET_FEATURES";
    case kSetOwner: return "SET_OWNER";
    case kResetOwner: return "RESET_OWNER";
    case kSetMemTable: return "SET_MEM_TABLE";
    case kSetLogBase: return "SET_LOG_BASE";
    case kSetLogFd: return "SET_LOG_FD";
    case kSetVringNum: return "SET_VRING_NUM";
    case kSetVringAddr: return "SET_VRING_ADDR";
    case kSetVringBase: return "SET_VRING_BASE";
    case kGetVringBase: return "GET_VRING_BASE";
    case kSetVringKick: return "SET_VRING_KICK";
    case kSetVringCall: return "SET_VRING_CALL";
    case kSetVringErr: return "SET_VRING_ERR";
    case kGetProtocolFeatures: return "GET_PROTOCOL_FEATURES";
    case kSetProtocolFeatures: return "SET_PROTOCOL_FEATURES";
    case kGetQueueNum: return "GET_QUEUE_NUM";
    case kSetVringEnable: return "SET_VRING_ENABLE";
    case kGetConfig: return "GET_CONFIG";
    case kSetConfig: return "SET_CONFIG";
    default: return absl::StrCat("request ", request);
  }
}

absl::StatusOr<Header> DecodeHeader(absl::Span<const uint8_t> bytes) {
  if (bytes.size() != kHeaderSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("message header of ", bytes.size(), " bytes"));
  }
  Header h{LoadLe32(bytes.data()), LoadLe32(bytes.data() + 4),
           LoadLe32(bytes.data() + 8)};
  if ((h.flags & kVersionMask) != kVersion) {
    return Malformed(h.request, absl::StrCat("protocol version ",
                                             h.flags & kVersionMask,
                                             ", expected 1"));
  }
  if (h.flags & kFlagReply) {
    return Malformed(h.request, "reply flag set on a request");
  }
  if (h.size > kMaxPayload) {
    return Malformed(h.request, absl::StrCat("payload of ", h.size,
                                             " bytes (at most ", kMaxPayload,
                                             ")"));
  }
  return h;
}

absl::StatusOr<Message> DecodeMessage(const Header& h,
                                      absl::Span<const uint8_t> p,
                                      absl::Span<const int> fds) {
  if (p.size() != h.size) {
    return Malformed(h.request, absl::StrCat(p.size(), " payload bytes, header says ",
                                             h.size));
  }
  Message m;
  m.request = h.request;
  m.flags = h.flags;
  absl::Status s;
  switch (h.request) {
    case kGetFeatures:
    case kGetProtocolFeatures:
    case kGetQueueNum:
    case kSetOwner:
    case kResetOwner:
      // QEMU sends some of these with an 8-byte zero payload; allow both.
      if (h.size != 0 && h.size != 8) s = ExpectShape(h, fds, 0, 0);
      else if (!fds.empty()) s = Malformed(h.request, "unexpected descriptors");
      break;
    case kSetFeatures:
    case kSetProtocolFeatures:
      s = ExpectShape(h, fds, 8, 0);
      if (s.ok()) m.u64 = LoadLe64(p.data());
      break;
    case kSetVringNum:
    case kSetVringBase:
    case kGetVringBase:
    case kSetVringEnable:
      s = ExpectShape(h, fds, 8, 0);
      if (s.ok()) m.state = {LoadLe32(p.data()), LoadLe32(p.data() + 4)};
      break;
    case kSetVringAddr:
      s = ExpectShape(h, fds, 40, 0);
      if (s.ok()) {
        m.addr = {LoadLe32(p.data()), LoadLe32(p.data() + 4),
                  LoadLe64(p.data() + 8), LoadLe64(p.data() + 16),
                  LoadLe64(p.data() + 24), LoadLe64(p.data() + 32)};
      }
      break;
    case kSetVringKick:
    case kSetVringCall:
    case kSetVringErr:
      s = DecodeVringFd(h, p, fds, &m);
      break;
    case kSetMemTable:
      s = DecodeMemTable(h, p, fds, &m);
      break;
    case kGetConfig:
    case kSetConfig:
      s = DecodeConfig(h, p, fds, &m);
      break;
    default:
      return absl::UnimplementedError(
          absl::StrCat(RequestName(h.request), ": not supported"));
  }
  if (!s.ok()) return s;
  m.fds.assign(fds.begin(), fds.end());
  return m;
}

namespace {

std::vector<uint8_t> ReplyHeader(uint32_t request, uint32_t size) {
  std::vector<uint8_t> out(kHeaderSize + size);
  StoreLe32(out.data(), request);
  StoreLe32(out.data() + 4, kVersion | kFlagReply);
  StoreLe32(out.data() + 8, size);
  return out;
}

}  // namespace

std::vector<uint8_t> EncodeU64Reply(uint32_t request, uint64_t value) {
  std::vector<uint8_t> out = ReplyHeader(request, 8);
  StoreLe64(out.data() + kHeaderSize, value);
  return out;
}

std::vector<uint8_t> EncodeStateReply(uint32_t request, VringState state) {
  std::vector<uint8_t> out = ReplyHeader(request, 8);
  StoreLe32(out.data() + kHeaderSize, state.index);
  StoreLe32(out.data() + kHeaderSize + 4, state.num);
  return out;
}

std::vector<uint8_t> EncodeConfigReply(const ConfigSpace& c) {
  std::vector<uint8_t> out =
      ReplyHeader(kGetConfig, 12 + static_cast<uint32_t>(c.data.size()));
  StoreLe32(out.data() + kHeaderSize, c.offset);
  StoreLe32(out.data() + kHeaderSize + 4, static_cast<uint32_t>(c.data.size()));
  StoreLe32(out.data() + kHeaderSize + 8, c.flags);
  if (!c.data.empty()) {
    std::memcpy(out.data() + kHeaderSize + 12, c.data.data(), c.data.size());
  }
  return out;
}

}  // namespace qcow2::vhost
