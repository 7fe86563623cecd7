// SPDX-License-Identifier: Apache-2.0
// Puts a qcow2 layer's metadata on disk in crash-safe order
// (docs/crash-consistency.md): flushes (L2 and refcount write-back, the L1
// entries of new L2 tables after the tables, then the references those
// entries let go of), and the switch to a larger L1 table on Grow.
#ifndef QCOW2_LIB_DRIVER_FLUSH_SEQUENCER_H_
#define QCOW2_LIB_DRIVER_FLUSH_SEQUENCER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/driver/header_writer.h"
#include "lib/driver/qcow2_state.h"

namespace qcow2::internal {

class FlushSequencer {
 public:
  // The parts are the layer's and outlive this.
  FlushSequencer(Qcow2State* s, HeaderWriter* header_writer)
      : s_(s), header_writer_(header_writer) {}

  // Flushes the metadata, blocking (BeginFlush, the write-back, the file
  // flush, FinishFlush). Pending clusters are not this part's: the
  // layer's flush settles them first (PendingClusters::SettleAndFlush).
  // No-op for a read-only or closed layer; kDataLoss once the image was
  // marked corrupt.
  absl::Status Flush();

  // Flush in three steps, so that the metadata write-back and the file
  // flush run without the caller's lock:
  //  - BeginFlush (under the lock) records the metadata write-back: the
  //    writes and file flushes it takes, in order (WriteBackFile);
  //  - the caller, with no lock held, calls meta->WriteBack(ticket), then
  //    flushes the file;
  //  - FinishFlush(generation), under the lock again, releases the clusters
  //    freed before BeginFlush. With `to_discard`, their discard is left
  //    to the caller: DiscardReleased(*to_discard) with no lock held, then
  //    EndDiscard(*to_discard) under it, which makes them reusable.
  struct FlushTicket {
    uint64_t generation = 0;  // the refcounts' quarantine, for FinishFlush
    uint64_t write_back = 0;  // the WriteBackFile log to write back
  };
  // kDataLoss once the image was marked corrupt; an empty ticket for a
  // read-only or closed layer.
  absl::StatusOr<FlushTicket> BeginFlush();
  void FinishFlush(
      uint64_t generation,
      std::vector<std::pair<uint64_t, uint64_t>>* to_discard = nullptr);
  void DiscardReleased(
      const std::vector<std::pair<uint64_t, uint64_t>>& ranges);
  void EndDiscard(const std::vector<std::pair<uint64_t, uint64_t>>& ranges);

  // Before an L2 entry names a newly allocated (or newly written) cluster:
  // the L2 cache is written only after the refcounts that count the
  // cluster (unless lazy) and after a file flush that makes the data
  // durable.
  absl::Status OrderL2AfterAllocation();

  // Records that in-memory L1 entry `index` now names a new L2 table, a
  // private copy of the shared table `old_table` (0: a fresh table). The
  // next flush writes the entry after the table and its refcount are
  // durable; until then the disk's entry still names `old_table`, whose
  // reference is dropped only then.
  void NoteNewL2Table(uint64_t index, uint64_t old_table);

  // Drops one reference to host range [host, +len), let go of by the L2
  // entry of guest offset `guest`: now, or, when that entry lies in a
  // private copy of a shared table whose L1 entry is not yet written (the
  // shared table, still named on disk, names the range too), right after
  // the next flush writes that entry.
  absl::Status Release(uint64_t guest, uint64_t host, uint64_t len);

  // Grows the virtual size, reallocating the L1 table if needed: the new
  // table is written and durable (with its refcounts) before one header
  // write switches to it; the old one is freed last.
  // REQUIRES: the layer is writable.
  absl::Status Grow(uint64_t new_size);

 private:
  // Makes every new L2 table and its refcount durable, then writes the L1
  // entries that name them (the L1 part of a flush), then drops the
  // references Release() deferred.
  absl::Status WriteL1Entries();
  absl::Status WriteL1Entry(uint64_t index);

  // The layer's state, and the parts this one calls (not owned).
  Qcow2State* const s_;
  HeaderWriter* const header_writer_;
  // L1 indices of new L2 tables whose entry is set in memory but not yet
  // written (WriteL1Entries writes them at the next flush).
  std::vector<uint64_t> unwritten_l1_entries_;
  // Private copies of shared L2 tables (an internal snapshot's) among
  // them: until the new entry is durable, the disk's L1 entry still names
  // the shared table. So the shared tables, and every host cluster an entry
  // of a copy lets go of (named by the shared table too), lose their
  // reference only then (WriteL1Entries).
  absl::flat_hash_set<uint64_t> unlinked_copies_;  // L1 indices
  // (host offset, length) of each reference dropped at that point.
  std::vector<std::pair<uint64_t, uint64_t>> deferred_releases_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_DRIVER_FLUSH_SEQUENCER_H_
