// SPDX-License-Identifier: Apache-2.0
#include "serve/vhost/guest_memory.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace qcow2::vhost {

absl::StatusOr<std::shared_ptr<const GuestMemory>> GuestMemory::Map(
    absl::Span<const MemRegion> regions, absl::Span<const int> fds) {
  std::shared_ptr<GuestMemory> mem(new GuestMemory);
  for (size_t i = 0; i < regions.size(); ++i) {
    const MemRegion& r = regions[i];
    const uint64_t len = r.mmap_offset + r.memory_size;  // checked by decode
    struct stat st;
    if (::fstat(fds[i], &st) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("region ", i, ": fstat"));
    }
    if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) < len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "SET_MEM_TABLE: region ", i, " ends at byte ", len,
          " of a descriptor of ", st.st_size, " bytes"));
    }
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
    if (p == MAP_FAILED) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat("SET_MEM_TABLE: mapping region ", i, " (", len,
                              " bytes)"));
    }
    mem->regions_.push_back(
        {r, static_cast<uint8_t*>(p) + r.mmap_offset, p, len});
  }
  return std::shared_ptr<const GuestMemory>(std::move(mem));
}

std::shared_ptr<const GuestMemory> GuestMemory::Borrow(
    absl::Span<const MemRegion> regions, absl::Span<uint8_t* const> bases) {
  std::shared_ptr<GuestMemory> mem(new GuestMemory);
  for (size_t i = 0; i < regions.size(); ++i) {
    mem->regions_.push_back({regions[i], bases[i], nullptr, 0});
  }
  return mem;
}

GuestMemory::~GuestMemory() {
  for (const Region& r : regions_) {
    if (r.map != nullptr) ::munmap(r.map, r.map_len);
  }
}

const GuestMemory::Region* GuestMemory::Find(uint64_t gpa) const {
  for (const Region& r : regions_) {
    if (gpa >= r.r.guest_phys_addr &&
        gpa - r.r.guest_phys_addr < r.r.memory_size) {
      return &r;
    }
  }
  return nullptr;
}

uint8_t* GuestMemory::Translate(uint64_t gpa, uint64_t len) const {
  const Region* r = len == 0 ? nullptr : Find(gpa);
  if (r == nullptr) return nullptr;
  const uint64_t off = gpa - r->r.guest_phys_addr;
  if (len > r->r.memory_size - off) return nullptr;
  return r->host + off;
}

uint8_t* GuestMemory::TranslateFrontEnd(uint64_t addr, uint64_t len) const {
  if (len == 0) return nullptr;
  for (const Region& r : regions_) {
    if (addr >= r.r.userspace_addr &&
        addr - r.r.userspace_addr < r.r.memory_size) {
      const uint64_t off = addr - r.r.userspace_addr;
      if (len > r.r.memory_size - off) return nullptr;
      return r.host + off;
    }
  }
  return nullptr;
}

bool GuestMemory::AppendIov(uint64_t gpa, uint64_t len, size_t max_iov,
                            std::vector<iovec>* out) const {
  const size_t old = out->size();
  while (len > 0) {
    const Region* r = Find(gpa);
    if (r == nullptr || out->size() >= max_iov) {
      out->resize(old);
      return false;
    }
    const uint64_t off = gpa - r->r.guest_phys_addr;
    const uint64_t n = std::min(len, r->r.memory_size - off);
    out->push_back({r->host + off, static_cast<size_t>(n)});
    gpa += n;  // cannot wrap: n ends inside a region that does not wrap
    len -= n;
  }
  return true;
}

}  // namespace qcow2::vhost
