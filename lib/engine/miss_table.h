// SPDX-License-Identifier: Apache-2.0
// Deferred metadata misses being read with no lock held, by (cache, offset
// read): who reads each, and the requests of the same executor that met it
// meanwhile and wait for it.
#ifndef QCOW2_LIB_ENGINE_MISS_TABLE_H_
#define QCOW2_LIB_ENGINE_MISS_TABLE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "lib/engine/request.h"
#include "lib/meta/metadata_cache.h"

namespace qcow2::internal {

// Not thread-safe: the engine calls it under its metadata lock.
class MissTable {
 public:
  // Planning of r stopped at `deferral`'s miss with an empty plan. Either
  // r is to read it (returns true: r->miss is set, its read into a buffer
  // of r's plan), or a request of the same executor reads it already and r
  // is parked until that read is in (returns false).
  bool Claim(Request* r, const MissDeferral& deferral);
  // The read of a miss at `read_offset` of `cache` is over (whatever came
  // of it): wakes the requests parked on it.
  void Release(const MetadataCache* cache, uint64_t read_offset);

  // The read of a deferred miss, into a buffer `buffers` owns.
  static IoOp MissRead(const MissDeferral& deferral, IoPlan* buffers);
  // The error of a failed one, naming what was read.
  static absl::Status ReadError(const MetadataCache* cache, uint64_t offset,
                                const absl::Status& s);

 private:
  struct InFlight {
    const Waiter* reader = nullptr;
    std::vector<Request*> parked;
  };
  absl::flat_hash_map<std::pair<const void*, uint64_t>, InFlight> reads_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_ENGINE_MISS_TABLE_H_
