// SPDX-License-Identifier: Apache-2.0
// The scope in which a request's planning or commits record the metadata
// write-outs they cause, for the request's executor (or Engine::Finish) to
// write with no lock held.
#ifndef QCOW2_LIB_META_EVICTION_SCOPE_H_
#define QCOW2_LIB_META_EVICTION_SCOPE_H_

#include <cstdint>

#include "lib/meta/write_back_file.h"

namespace qcow2::internal {

// While a request is planned: evictions are recorded
// (WriteBackFile::DeferEvictions), and `*ticket` is set to the ticket of
// whatever was recorded, if anything: for the request's executor to write
// before its own I/O (and then `*file` is set too), or for the engine to
// write once the lock is let go.
class EvictionScope {
 public:
  EvictionScope(WriteBackFile* meta, uint64_t* ticket,
                WriteBackFile** file = nullptr)
      : meta_(meta),
        ticket_(ticket),
        file_(file),
        before_(meta ? meta->last_queued() : 0) {}
  ~EvictionScope() {
    if (meta_ != nullptr && meta_->last_queued() != before_) {
      *ticket_ = meta_->last_queued();
      if (file_ != nullptr) *file_ = meta_;
    }
  }
  EvictionScope(const EvictionScope&) = delete;
  EvictionScope& operator=(const EvictionScope&) = delete;

 private:
  WriteBackFile::DeferEvictions defer_;
  WriteBackFile* const meta_;
  uint64_t* const ticket_;
  WriteBackFile** const file_;
  const uint64_t before_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_META_EVICTION_SCOPE_H_
