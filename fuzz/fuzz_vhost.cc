// SPDX-License-Identifier: Apache-2.0
// libFuzzer target over what a vhost-user-blk back-end takes from its
// peers (serve/vhost/): the front-end's messages and the guest's rings.
// The first input byte picks the part:
//   even: a stream of vhost-user messages (header, payload, a descriptor
//         count) for DecodeHeader/DecodeMessage, replies encoded back;
//   odd:  guest memory (two regions with a hole between them) holding a
//         split ring and virtio-blk requests, walked with SplitRing and
//         taken apart with ParseBlkRequest/ParseRanges until the ring
//         errs or runs dry.
// Invariants checked beyond "no crash, no sanitizer report": every iovec
// a chain yields lies inside a region, chains are no longer than the
// iovec bound, and the status byte is inside guest memory.
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "serve/vhost/blk.h"
#include "serve/vhost/guest_memory.h"
#include "serve/vhost/protocol.h"
#include "serve/vhost/split_ring.h"
#include "serve/vhost/wire.h"

namespace qcow2::vhost {
namespace {

// A broken invariant: abort, which libFuzzer records as a crash.
[[noreturn]] void Die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "\nFUZZ INVARIANT BROKEN: ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
  std::abort();
}

void FuzzMessages(const uint8_t* data, size_t size) {
  const int fds[kMaxFds] = {-1, -1, -1, -1, -1, -1, -1, -1};
  while (size >= kHeaderSize + 1) {
    auto h = DecodeHeader(absl::MakeConstSpan(data, kHeaderSize));
    const size_t nfds = data[kHeaderSize] % (kMaxFds + 1);
    data += kHeaderSize + 1;
    size -= kHeaderSize + 1;
    if (!h.ok()) continue;
    const size_t n = std::min<size_t>(h->size, size);
    Header hh = *h;
    hh.size = static_cast<uint32_t>(n);  // a torn payload is a short one
    auto m = DecodeMessage(hh, absl::MakeConstSpan(data, n),
                           absl::MakeConstSpan(fds, nfds));
    data += n;
    size -= n;
    if (!m.ok()) continue;
    if (m->request == kGetConfig) {
      std::vector<uint8_t> r = EncodeConfigReply(m->config);
      if (r.size() != kHeaderSize + 12 + m->config.size) {
        Die("config reply of %zu bytes", r.size());
      }
    }
    if (m->request == kSetMemTable && m->regions.size() != m->fds.size()) {
      Die("%zu regions, %zu fds", m->regions.size(), m->fds.size());
    }
  }
}

constexpr size_t kRegion = 32 * 1024;
constexpr uint64_t kGpa0 = 0, kGpa1 = 0x100000;  // a hole in between
constexpr uint64_t kVa0 = 0x7f0000000000, kVa1 = 0x7f0000100000;

bool Inside(const void* p, size_t len, const std::vector<uint8_t>& a,
            const std::vector<uint8_t>& b) {
  auto in = [&](const std::vector<uint8_t>& v) {
    const uint8_t* q = static_cast<const uint8_t*>(p);
    return q >= v.data() && len <= v.size() &&
           static_cast<size_t>(q - v.data()) <= v.size() - len;
  };
  return in(a) || in(b);
}

void CheckIov(const std::vector<iovec>& iov, const std::vector<uint8_t>& a,
              const std::vector<uint8_t>& b) {
  for (const iovec& v : iov) {
    if (!Inside(v.iov_base, v.iov_len, a, b)) {
      Die("iovec %p+%zu outside guest memory", v.iov_base, v.iov_len);
    }
  }
}

void FuzzRing(const uint8_t* data, size_t size) {
  if (size < 16) return;
  RingConfig c;
  c.num = uint16_t{1} << (data[0] % 9);  // 1 to 256
  c.event_idx = data[1] & 1;
  c.indirect = data[1] & 2;
  c.last_avail = LoadLe16(data + 2);
  // Ring areas somewhere in the regions (or not: Create must refuse).
  c.desc = (data[4] & 1 ? kVa1 : kVa0) + LoadLe16(data + 5) % (kRegion + 64);
  c.avail = (data[7] & 1 ? kVa1 : kVa0) + LoadLe16(data + 8) % (kRegion + 64);
  c.used = (data[10] & 1 ? kVa1 : kVa0) + LoadLe16(data + 11) % (kRegion + 64);
  data += 16;
  size -= 16;
  std::vector<uint8_t> r0(kRegion, 0), r1(kRegion, 0);
  std::memcpy(r0.data(), data, std::min(size, kRegion));
  if (size > kRegion) {
    std::memcpy(r1.data(), data + kRegion, std::min(size - kRegion, kRegion));
  }
  const MemRegion regions[2] = {{kGpa0, kRegion, kVa0, 0},
                                {kGpa1, kRegion, kVa1, 0}};
  uint8_t* const bases[2] = {r0.data(), r1.data()};
  auto mem = GuestMemory::Borrow(regions, bases);
  auto ring = SplitRing::Create(mem.get(), c);
  if (!ring.ok()) return;
  Chain chain;
  std::vector<BlkRange> ranges;
  for (int i = 0; i < 512; ++i) {
    auto pending = ring->HasPending();
    if (!pending.ok()) return;
    if (!*pending) {
      pending = ring->ArmKick();
      if (!pending.ok() || !*pending) break;
    }
    if (!ring->Pop(&chain).ok()) return;
    if (chain.readable.size() + chain.writable.size() > SplitRing::kMaxIov) {
      Die("chain of %zu iovecs",
                chain.readable.size() + chain.writable.size());
    }
    CheckIov(chain.readable, r0, r1);
    CheckIov(chain.writable, r0, r1);
    auto req = ParseBlkRequest(chain);
    if (req.ok()) {
      CheckIov(req->data, r0, r1);
      if (!Inside(req->status, 1, r0, r1)) Die("status outside memory");
      ParseRanges(*req, &ranges);
      *req->status = 0;
    }
    ring->PushUsed(chain.head, 1);
    if (i % 3 == 0) ring->PublishUsed();
  }
  ring->PublishUsed();
}

}  // namespace
}  // namespace qcow2::vhost

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    qcow2::vhost::FuzzMessages(data + 1, size - 1);
  } else {
    qcow2::vhost::FuzzRing(data + 1, size - 1);
  }
  return 0;
}
