// SPDX-License-Identifier: Apache-2.0
// I/O accounting: what guest requests cost in host I/O.
//
// Every queue (and the synchronous API) keeps its own counters, written only
// by the thread that drives it, so counting costs no shared atomic
// read-modify-write on the hot path. Image::GetStats() adds them up.
//
// "Host" bytes are bytes moved to or from the image files of the chain
// (every layer, not only the top), split by why they moved.
#ifndef QCOW2_STATS_H_
#define QCOW2_STATS_H_

#include <cstdint>

#include "qcow2/export.h"

namespace qcow2 {

struct QCOW2_EXPORT IoStats {
  // Guest requests as submitted.
  uint64_t guest_read_ops = 0;
  uint64_t guest_read_bytes = 0;
  uint64_t guest_write_ops = 0;
  uint64_t guest_write_bytes = 0;
  uint64_t guest_zero_ops = 0;  // WriteZeroes
  uint64_t guest_zero_bytes = 0;
  uint64_t guest_discard_ops = 0;
  uint64_t guest_discard_bytes = 0;
  uint64_t guest_flush_ops = 0;

  // Host bytes carrying guest data: reads of stored data (any layer,
  // compressed bytes as stored) and writes of the guest's own bytes.
  uint64_t host_data_read_bytes = 0;
  uint64_t host_data_write_bytes = 0;
  // Copy-on-write: bytes read to fill the rest of a cluster or subcluster,
  // and the bytes written besides the guest's own (head and tail padding).
  uint64_t cow_read_bytes = 0;
  uint64_t cow_write_bytes = 0;
  // Metadata I/O.
  uint64_t header_write_bytes = 0;
  uint64_t l1_write_bytes = 0;
  uint64_t l2_read_bytes = 0;
  uint64_t l2_write_bytes = 0;
  uint64_t refcount_read_bytes = 0;
  uint64_t refcount_write_bytes = 0;
  // Zero-range / punch-hole / preallocation calls on host files.
  uint64_t host_zero_ops = 0;
  uint64_t host_zero_bytes = 0;
  uint64_t host_discard_ops = 0;
  uint64_t host_discard_bytes = 0;
  uint64_t host_flushes = 0;  // fsync/fdatasync calls
  // Host file calls (reads, writes, flushes, size changes, zeroing,
  // discards, SEEK_DATA lookups; of any File, an embedder's own included)
  // made while the image's metadata lock was held. Each holds up the planning of every queue's requests
  // for its length. What is left of them: metadata misses no probe
  // foresaw, a read's write-outs past its budget, table growth outside a
  // write, and some whole-cluster operations (see docs/architecture.md).
  uint64_t host_calls_under_lock = 0;

  // Data clusters allocated in the top image.
  uint64_t cluster_allocations = 0;
  uint64_t l2_table_allocations = 0;
  // Copy-on-write events: a head (bytes before the guest data) or tail
  // (after it) was copied; a copy was skipped because the write covered the
  // whole cluster or subcluster, or because the range reads as zeros.
  uint64_t cow_head_copies = 0;
  uint64_t cow_tail_copies = 0;
  uint64_t cow_skipped_full = 0;
  uint64_t cow_skipped_zero = 0;
  // Small writes that follow one another into clusters the top does not
  // own: clusters given a host cluster with their L2 entry (and, with
  // standard L2 entries, their copy-on-write) put off, and those of them
  // that a flush (or a wider request) had to fill from the chain below
  // because writes did not cover them whole (standard L2 only).
  uint64_t cow_deferred = 0;
  uint64_t cow_deferred_filled = 0;

  uint64_t metadata_read_bytes() const {
    return l2_read_bytes + refcount_read_bytes;
  }
  uint64_t metadata_write_bytes() const {
    return header_write_bytes + l1_write_bytes + l2_write_bytes +
           refcount_write_bytes;
  }
  uint64_t host_read_bytes() const {
    return host_data_read_bytes + cow_read_bytes + metadata_read_bytes();
  }
  uint64_t host_write_bytes() const {
    return host_data_write_bytes + cow_write_bytes + metadata_write_bytes();
  }

  IoStats& operator+=(const IoStats& o);
  // Counters that grew from `before` to `*this` (for one phase of a run).
  IoStats Since(const IoStats& before) const;
};

}  // namespace qcow2

#endif  // QCOW2_STATS_H_
