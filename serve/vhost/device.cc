// SPDX-License-Identifier: Apache-2.0
#include "serve/vhost/device.h"

#include <linux/virtio_blk.h>
#include <unistd.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace qcow2::vhost {
namespace {

void CloseFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

absl::Status Refused(const Message& m, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(RequestName(m.request), ": ", why));
}

}  // namespace

Device::Device(DeviceShared* shared, std::vector<Worker*> workers)
    : shared_(shared),
      workers_(std::move(workers)),
      vqs_(shared->geometry.num_queues) {}

Device::~Device() { Reset(); }

uint64_t Device::offered_features() const {
  return BlkFeatures(shared_->geometry) | (1ull << kFeatureVersion1) |
         (1ull << kFeatureIndirectDesc) | (1ull << kFeatureEventIdx) |
         (1ull << kFeatureProtocolFeatures);
}

uint64_t Device::OfferedProtocolFeatures() {
  return (1ull << kProtocolMq) | (1ull << kProtocolReplyAck) |
         (1ull << kProtocolConfig);
}

void Device::Reset() {
  for (size_t i = 0; i < vqs_.size(); ++i) {
    Stop(static_cast<int>(i));
    VqControl& q = vqs_[i];
    CloseFd(&q.kick);
    CloseFd(&q.call);
    CloseFd(&q.err);
    q = VqControl{};
  }
  mem_.reset();
  features_ = 0;
  protocol_features_ = 0;
  shared_->writeback.store(true);
}

absl::StatusOr<std::vector<uint8_t>> Device::Handle(Message* m) {
  std::vector<uint8_t> reply;
  absl::Status s = Dispatch(m, &reply);
  const bool soft = absl::IsFailedPrecondition(s);  // refused, not broken
  if (!s.ok() && !soft) return s;
  if (reply.empty() && m->need_reply() &&
      (protocol_features_ & (1ull << kProtocolReplyAck))) {
    reply = EncodeU64Reply(m->request, s.ok() ? 0 : 1);
  }
  return reply;
}

absl::Status Device::CheckIndex(const Message& m, uint32_t index) const {
  if (index >= vqs_.size()) {
    return Refused(m, absl::StrCat("queue ", index, " of ", vqs_.size()));
  }
  return absl::OkStatus();
}

absl::Status Device::Dispatch(Message* m, std::vector<uint8_t>* reply) {
  switch (m->request) {
    case kGetFeatures:
      *reply = EncodeU64Reply(m->request, offered_features());
      return absl::OkStatus();
    case kSetFeatures:
      if (m->u64 & ~offered_features()) {
        return Refused(*m, absl::StrCat("features 0x", absl::Hex(m->u64),
                                        " not offered"));
      }
      features_ = m->u64;
      return absl::OkStatus();
    case kGetProtocolFeatures:
      *reply = EncodeU64Reply(m->request, OfferedProtocolFeatures());
      return absl::OkStatus();
    case kSetProtocolFeatures:
      if (m->u64 & ~OfferedProtocolFeatures()) {
        return Refused(*m, absl::StrCat("protocol features 0x",
                                        absl::Hex(m->u64), " not offered"));
      }
      protocol_features_ = m->u64;
      return absl::OkStatus();
    case kGetQueueNum:
      *reply = EncodeU64Reply(m->request, vqs_.size());
      return absl::OkStatus();
    case kSetOwner:
      return absl::OkStatus();
    case kResetOwner:
      Reset();
      return absl::OkStatus();
    case kSetMemTable:
      return SetMemTable(m);
    case kSetVringNum: {
      if (auto s = CheckIndex(*m, m->state.index); !s.ok()) return s;
      const uint32_t n = m->state.num;
      if (n == 0 || n > 32768 || (n & (n - 1)) != 0) {
        return Refused(*m, absl::StrCat("queue size ", n,
                                        " is not a power of two up to 32768"));
      }
      Stop(m->state.index);
      vqs_[m->state.index].num = static_cast<uint16_t>(n);
      return MaybeStart(m->state.index);
    }
    case kSetVringAddr: {
      if (auto s = CheckIndex(*m, m->addr.index); !s.ok()) return s;
      Stop(m->addr.index);
      vqs_[m->addr.index].addr = m->addr;
      vqs_[m->addr.index].has_addr = true;
      return MaybeStart(m->addr.index);
    }
    case kSetVringBase:
      if (auto s = CheckIndex(*m, m->state.index); !s.ok()) return s;
      if (m->state.num > 0xffff) {
        return Refused(*m, absl::StrCat("base ", m->state.num, " over 65535"));
      }
      Stop(m->state.index);
      vqs_[m->state.index].base = static_cast<uint16_t>(m->state.num);
      return MaybeStart(m->state.index);
    case kGetVringBase: {
      if (auto s = CheckIndex(*m, m->state.index); !s.ok()) return s;
      VqControl& q = vqs_[m->state.index];
      Stop(m->state.index);
      // The ring is stopped until a new kick descriptor comes.
      CloseFd(&q.kick);
      *reply = EncodeStateReply(m->request, {m->state.index, q.base});
      return absl::OkStatus();
    }
    case kSetVringKick:
    case kSetVringCall:
    case kSetVringErr:
      return SetVringFd(m);
    case kSetVringEnable: {
      if (auto s = CheckIndex(*m, m->state.index); !s.ok()) return s;
      if (m->state.num > 1) return Refused(*m, "enable is neither 0 nor 1");
      vqs_[m->state.index].disabled = m->state.num == 0;
      if (m->state.num == 0) {
        Stop(m->state.index);
        return absl::OkStatus();
      }
      return MaybeStart(m->state.index);
    }
    case kGetConfig: {
      const std::vector<uint8_t> cfg =
          BlkConfig(shared_->geometry, shared_->writeback.load());
      ConfigSpace out = m->config;
      out.data.assign(m->config.size, 0);
      for (uint32_t i = 0; i < m->config.size; ++i) {
        const uint32_t at = m->config.offset + i;
        if (at < cfg.size()) out.data[i] = cfg[at];
      }
      *reply = EncodeConfigReply(out);
      return absl::OkStatus();
    }
    case kSetConfig:
      return SetConfig(*m);
    default:
      return Refused(*m, "not supported");
  }
}

absl::Status Device::SetMemTable(Message* m) {
  std::vector<int> was_running;
  for (size_t i = 0; i < vqs_.size(); ++i) {
    if (vqs_[i].running) {
      was_running.push_back(static_cast<int>(i));
      Stop(static_cast<int>(i));
    }
  }
  auto mem = GuestMemory::Map(m->regions, m->fds);
  if (!mem.ok()) return mem.status();
  mem_ = *std::move(mem);  // the old table is unmapped once no loop holds it
  for (int i : was_running) {
    if (auto s = MaybeStart(i); !s.ok()) return s;
  }
  return absl::OkStatus();  // the descriptors are closed by the caller
}

absl::Status Device::SetVringFd(Message* m) {
  if (auto s = CheckIndex(*m, m->state.index); !s.ok()) return s;
  const int index = static_cast<int>(m->state.index);
  VqControl& q = vqs_[index];
  const int fd = m->fds.empty() ? -1 : m->fds[0];
  if (!m->fds.empty()) m->fds[0] = -1;  // ours now
  switch (m->request) {
    case kSetVringKick:
      if (fd < 0) {
        return Refused(*m, "no kick descriptor (polling mode is not supported)");
      }
      Stop(index);
      CloseFd(&q.kick);
      q.kick = fd;
      return MaybeStart(index);
    case kSetVringCall:
      if (q.running) WorkerFor(index)->SetCall(index, fd);
      CloseFd(&q.call);
      q.call = fd;
      return absl::OkStatus();
    default:
      CloseFd(&q.err);
      q.err = fd;
      return absl::OkStatus();
  }
}

absl::Status Device::SetConfig(const Message& m) {
  constexpr uint32_t kWce = offsetof(virtio_blk_config, wce);
  if (m.config.offset != kWce || m.config.size != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SET_CONFIG: only the writeback byte may be written (offset ",
        m.config.offset, ", size ", m.config.size, ")"));
  }
  shared_->writeback.store(m.config.data[0] != 0);
  return absl::OkStatus();
}

absl::Status Device::MaybeStart(int index) {
  VqControl& q = vqs_[index];
  if (q.running || q.kick < 0 || !q.has_addr || q.num == 0 || !mem_ ||
      q.disabled) {
    return absl::OkStatus();
  }
  VqStart v;
  v.index = index;
  v.ring.num = q.num;
  v.ring.desc = q.addr.desc;
  v.ring.avail = q.addr.avail;
  v.ring.used = q.addr.used;
  v.ring.last_avail = q.base;
  v.ring.event_idx = features_ & (1ull << kFeatureEventIdx);
  v.ring.indirect = features_ & (1ull << kFeatureIndirectDesc);
  v.mem = mem_;
  v.kick_fd = q.kick;
  v.call_fd = q.call;
  if (absl::Status s = WorkerFor(index)->StartVq(v); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue ", index, ": ", s.message()));
  }
  q.running = true;
  return absl::OkStatus();
}

void Device::Stop(int index) {
  VqControl& q = vqs_[index];
  if (!q.running) return;
  q.base = WorkerFor(index)->StopVq(index);
  q.running = false;
}

}  // namespace qcow2::vhost
