// SPDX-License-Identifier: Apache-2.0
// The guest's memory as the front-end shared it (SET_MEM_TABLE): regions
// mapped from their descriptors, and the checked translations every guest
// address goes through. Nothing outside a region is ever reachable: each
// translation checks the whole range [addr, addr + len) first.
#ifndef QCOW2_SERVE_VHOST_GUEST_MEMORY_H_
#define QCOW2_SERVE_VHOST_GUEST_MEMORY_H_

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "serve/vhost/protocol.h"

namespace qcow2::vhost {

class GuestMemory {
 public:
  // Maps each region (MAP_SHARED, read-write) from its descriptor. The
  // descriptors are not closed. kInvalidArgument when a descriptor is too
  // small for its region (touching the missing part would raise SIGBUS);
  // the errno of mmap otherwise.
  static absl::StatusOr<std::shared_ptr<const GuestMemory>> Map(
      absl::Span<const MemRegion> regions, absl::Span<const int> fds);

  // Regions over memory the caller owns (tests, fuzzers): `bases[i]` holds
  // regions[i].memory_size bytes and outlives the object.
  static std::shared_ptr<const GuestMemory> Borrow(
      absl::Span<const MemRegion> regions, absl::Span<uint8_t* const> bases);

  ~GuestMemory();
  GuestMemory(const GuestMemory&) = delete;
  GuestMemory& operator=(const GuestMemory&) = delete;

  // The host address of guest-physical [gpa, gpa + len) when the range
  // lies within one region; nullptr otherwise (len 0 included).
  uint8_t* Translate(uint64_t gpa, uint64_t len) const;
  // The same for an address in the front-end's own address space (ring
  // addresses of SET_VRING_ADDR).
  uint8_t* TranslateFrontEnd(uint64_t addr, uint64_t len) const;
  // Appends iovecs covering guest-physical [gpa, gpa + len), split where
  // regions meet. False, with `out` unchanged, when a byte lies outside
  // every region or more than `max_iov` entries would be needed.
  bool AppendIov(uint64_t gpa, uint64_t len, size_t max_iov,
                 std::vector<iovec>* out) const;

 private:
  struct Region {
    MemRegion r;
    uint8_t* host = nullptr;  // the region's first byte
    void* map = nullptr;      // what to munmap (nullptr: borrowed)
    size_t map_len = 0;
  };
  GuestMemory() = default;
  const Region* Find(uint64_t gpa) const;
  std::vector<Region> regions_;
};

}  // namespace qcow2::vhost

#endif  // QCOW2_SERVE_VHOST_GUEST_MEMORY_H_
