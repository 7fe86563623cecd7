// SPDX-License-Identifier: Apache-2.0
#include "serve/vhost/split_ring.h"


#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "serve/vhost/wire.h"

namespace qcow2::vhost {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the ring's atomics below read little-endian fields natively");

constexpr uint64_t kDescSize = 16;
// virtio 1.x, 2.7.5 and 2.7.6 (linux/virtio_ring.h does not compile as
// C++).
constexpr uint16_t kDescNext = 1;
constexpr uint16_t kDescWrite = 2;
constexpr uint16_t kDescIndirect = 4;
constexpr uint16_t kAvailNoInterrupt = 1;

absl::Status RingError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("virtqueue: ", what));
}

uint16_t LoadAcquire16(const uint8_t* p) {
  return __atomic_load_n(reinterpret_cast<const uint16_t*>(p), __ATOMIC_ACQUIRE);
}

void StoreRelease16(uint8_t* p, uint16_t v) {
  __atomic_store_n(reinterpret_cast<uint16_t*>(p), v, __ATOMIC_RELEASE);
}

}  // namespace

absl::StatusOr<SplitRing> SplitRing::Create(const GuestMemory* mem,
                                            const RingConfig& c) {
  if (c.num == 0 || (c.num & (c.num - 1)) != 0 || c.num > 32768) {
    return RingError(absl::StrCat("queue size ", c.num,
                                  " is not a power of two up to 32768"));
  }
  SplitRing r;
  r.mem_ = mem;
  r.num_ = c.num;
  r.desc_ = mem->TranslateFrontEnd(c.desc, kDescSize * c.num);
  r.avail_ = mem->TranslateFrontEnd(c.avail, 6 + 2ull * c.num);
  r.used_ = mem->TranslateFrontEnd(c.used, 6 + 8ull * c.num);
  if (r.desc_ == nullptr || r.avail_ == nullptr || r.used_ == nullptr) {
    return RingError(absl::StrCat(
        "ring of ", c.num, " entries (desc 0x", absl::Hex(c.desc), ", avail 0x",
        absl::Hex(c.avail), ", used 0x", absl::Hex(c.used),
        ") not inside the guest's memory"));
  }
  if (reinterpret_cast<uintptr_t>(r.avail_) % 2 != 0 ||
      reinterpret_cast<uintptr_t>(r.used_) % 4 != 0) {
    return RingError("misaligned avail or used ring");
  }
  r.last_avail_ = c.last_avail;
  r.event_idx_ = c.event_idx;
  r.indirect_ = c.indirect;
  // Everything popped before a stop was completed (the device drains
  // first), so the used index the guest sees is where we go on.
  r.used_idx_ = LoadAcquire16(r.used_ + 2);
  return r;
}

absl::StatusOr<bool> SplitRing::HasPending() {
  const uint16_t idx = LoadAcquire16(avail_ + 2);
  const uint16_t ahead = static_cast<uint16_t>(idx - last_avail_);
  if (ahead > num_) {
    return RingError(absl::StrCat("avail index ", idx, " is ", ahead,
                                  " entries ahead of ", last_avail_,
                                  " in a queue of ", num_));
  }
  return ahead != 0;
}

absl::Status SplitRing::Pop(Chain* chain) {
  chain->Clear();
  const uint16_t slot = last_avail_ & (num_ - 1);
  const uint16_t head = LoadLe16(avail_ + 4 + 2 * slot);
  if (head >= num_) {
    return RingError(absl::StrCat("avail entry ", slot, " names descriptor ",
                                  head, " of ", num_));
  }
  ++last_avail_;
  chain->head = head;
  return Walk(desc_, num_, head, /*in_indirect=*/false, chain);
}

absl::Status SplitRing::Walk(const uint8_t* table, uint32_t count,
                             uint16_t first, bool in_indirect, Chain* chain) {
  uint32_t i = first;
  for (uint32_t seen = 1;; ++seen) {
    if (seen > count) {
      return RingError(absl::StrCat("chain from descriptor ", first,
                                    " longer than its table of ", count,
                                    " (a loop?)"));
    }
    uint8_t d[kDescSize];
    std::memcpy(d, table + kDescSize * i, kDescSize);  // read once
    const uint64_t addr = LoadLe64(d);
    const uint32_t len = LoadLe32(d + 8);
    const uint16_t flags = LoadLe16(d + 12);
    const uint16_t next = LoadLe16(d + 14);
    if (flags & kDescIndirect) {
      if (!indirect_) return RingError("indirect descriptor not negotiated");
      if (in_indirect) return RingError("indirect table inside an indirect table");
      if (seen != 1 || (flags & kDescNext)) {
        return RingError("indirect descriptor chained with others");
      }
      if (len == 0 || len % kDescSize != 0 || len / kDescSize > kMaxIndirect) {
        return RingError(absl::StrCat("indirect table of ", len, " bytes"));
      }
      const uint8_t* t = mem_->Translate(addr, len);
      if (t == nullptr) {
        return RingError(absl::StrCat("indirect table at 0x", absl::Hex(addr),
                                      "+", len, " outside guest memory"));
      }
      return Walk(t, len / kDescSize, 0, /*in_indirect=*/true, chain);
    }
    if (absl::Status s = AddBuffer(addr, len, flags & kDescWrite, chain);
        !s.ok()) {
      return s;
    }
    if (!(flags & kDescNext)) return absl::OkStatus();
    if (next >= count) {
      return RingError(absl::StrCat("descriptor ", i, " chains to ", next,
                                    " of ", count));
    }
    i = next;
  }
}

absl::Status SplitRing::AddBuffer(uint64_t addr, uint32_t len, bool writable,
                                  Chain* chain) {
  if (!writable && !chain->writable.empty()) {
    return RingError("device-readable buffer after a writable one");
  }
  if (len == 0) return absl::OkStatus();
  std::vector<iovec>* iov = writable ? &chain->writable : &chain->readable;
  const size_t room = kMaxIov - chain->readable.size() - chain->writable.size();
  if (!mem_->AppendIov(addr, len, iov->size() + room, iov)) {
    return RingError(absl::StrCat("buffer 0x", absl::Hex(addr), "+", len,
                                  " outside guest memory (or over ", kMaxIov,
                                  " segments)"));
  }
  uint64_t& bytes = writable ? chain->writable_bytes : chain->readable_bytes;
  bytes += len;
  if (bytes > UINT32_MAX) return RingError("chain over 4 GiB");
  return absl::OkStatus();
}

void SplitRing::PushUsed(uint16_t head, uint32_t written) {
  uint8_t* e = used_ + 4 + 8 * (used_idx_ & (num_ - 1));
  StoreLe32(e, head);
  StoreLe32(e + 4, written);
  ++used_idx_;
}

bool SplitRing::PublishUsed() {
  StoreRelease16(used_ + 2, used_idx_);
  // The index store must be visible before we read the guest's wish.
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  if (!event_idx_) {
    return (LoadAcquire16(avail_) & kAvailNoInterrupt) == 0;
  }
  const uint16_t used_event = LoadAcquire16(avail_ + 4 + 2 * num_);
  const uint16_t old = signalled_used_;
  const bool was_valid = signalled_valid_;
  signalled_used_ = used_idx_;
  signalled_valid_ = true;
  return !was_valid ||
         static_cast<uint16_t>(used_idx_ - used_event - 1) <
             static_cast<uint16_t>(used_idx_ - old);
}

absl::StatusOr<bool> SplitRing::ArmKick() {
  if (event_idx_) StoreRelease16(used_ + 4 + 8 * num_, last_avail_);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return HasPending();
}

}  // namespace qcow2::vhost
