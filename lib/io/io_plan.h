// SPDX-License-Identifier: Apache-2.0
// The I/O a request needs, worked out under the image's metadata lock and
// carried out without it: reads (copy-on-write sources, guest reads), steps
// to run once the reads are in (decompression), writes, and the metadata
// changes to make once the writes are done (or to undo if they failed).
#ifndef QCOW2_LIB_IO_IO_PLAN_H_
#define QCOW2_LIB_IO_IO_PLAN_H_

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "qcow2/file.h"
#include "lib/base/io_context.h"
#include "lib/io/data_cipher.h"
#include "qcow2/stats.h"

namespace qcow2::internal {

// Which counter an I/O's bytes go to.
enum class IoCategory : uint8_t {
  kGuestData,  // guest reads, or guest bytes written
  kCow,        // copy-on-write reads, or padding written around guest bytes
  kMetadata,   // the read of a deferred cache miss (the cache counts it)
};

struct IoOp {
  File* file = nullptr;
  uint64_t offset = 0;
  std::vector<iovec> iov;
  uint64_t bytes = 0;
  // Bytes of a write that are the guest's own; the rest count as COW.
  uint64_t guest_bytes = 0;
  IoCategory category = IoCategory::kGuestData;
  // A write of `bytes` zeros with a zero-range call (no iovecs).
  bool zero_range = false;
  // With zero_range: the range is let go instead (File::Discard, a hole
  // punched with the file's size kept), for bytes nothing maps any more.
  bool punch = false;
  // Bytes stored as they are even in an encrypted file, never through its
  // cipher (data_cipher.h): compressed clusters, which QEMU 7.2 writes
  // unencrypted into LUKS images (qemu-io write -c does).
  bool plain = false;
  // Data into a host cluster never written before (past the file's
  // written end): in a buffered file these writes make the page cache's
  // folios for the range, and CoalesceWrites keeps them small (io_plan.cc).
  bool first_fill = false;
  // Executor state: progress (short transfers are resubmitted), the
  // request, the kind of operation, and the iovecs still to do.
  uint64_t done = 0;
  void* request = nullptr;
  uint8_t type = 0;  // 0 read, 1 write, 2 flush
  int fd = -1;
  std::vector<iovec> rest;
  // An aligned buffer of `bytes` standing in for `iov` on the ring when
  // the file wants O_DIRECT alignment and only the caller's memory lacks
  // it; `caller_iov` holds the caller's iovecs meanwhile.
  void* bounce = nullptr;
  size_t bounce_size = 0;  // the buffer's size, at least `bytes`
  std::vector<iovec> caller_iov;

  void Add(const void* base, size_t len) {
    iov.push_back({const_cast<void*>(base), len});
    bytes += len;
  }
};

class IoPlan {
 public:
  IoPlan() = default;
  IoPlan(const IoPlan&) = delete;
  IoPlan& operator=(const IoPlan&) = delete;

  std::vector<IoOp> reads;
  std::vector<std::function<absl::Status()>> after_reads;
  std::vector<IoOp> writes;
  // Run under the metadata lock after every write succeeded, in order.
  // (A plan holds one commit and one abort or none in the common cases: a
  // recycled request would otherwise allocate both vectors per write.)
  absl::InlinedVector<std::function<absl::Status()>, 1> commits;
  // Run under the metadata lock when the plan is abandoned.
  absl::InlinedVector<std::function<void()>, 1> aborts;
  // Compressed clusters this plan decompresses (one buffer each).
  struct Decompressed {
    const void* layer;
    uint64_t entry;
    uint8_t* cluster;
  };
  std::vector<Decompressed> decompressed;
  // The file grown ahead for the writes: [grow_from, grow_to) of
  // grow_file is reserved (File::Reserve) with no lock held, before the
  // writes are issued, failed or not (Qcow2Layer::GrowAhead). nullptr:
  // nothing to grow.
  File* grow_file = nullptr;
  uint64_t grow_from = 0;
  uint64_t grow_to = 0;

  // A buffer owned by the plan, aligned for O_DIRECT, zero-filled.
  uint8_t* Buffer(size_t len);

  // Adds a read of `len` bytes at `offset` of `file` into `dest`, merged
  // with the previous read when it continues it.
  void Read(File* file, uint64_t offset, uint8_t* dest, size_t len,
            IoCategory category, bool plain = false);

  // Merges writes that continue each other in the same file into single
  // vectored operations. First fills of a buffered file (IoOp::first_fill)
  // are merged up to kFirstFillMaxBytes only.
  void CoalesceWrites();
  static constexpr uint64_t kFirstFillMaxBytes = 256 << 10;

  void Clear();

  // Whether the plan holds I/O, steps, commits or aborts (anything that
  // dropping it would waste or have to undo).
  bool HasWork() const {
    return !reads.empty() || !writes.empty() || !commits.empty() ||
           !aborts.empty() || !after_reads.empty();
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::vector<std::unique_ptr<uint8_t, Free>> buffers_;
};

// How far a probe of what planning needs (Qcow2Layer::ProbeChange) got in
// the rounds of one request that stopped at deferred misses: the next
// round goes on from there.
struct ProbeProgress {
  uint64_t clusters_done = 0;
  uint64_t allocations = 0;  // clusters probed so far that may allocate
};

// A vectored write is planned against a stand-in buffer of its length at
// ScatterBase(): an address no allocation can have (above every user
// address of x86-64 and arm64), so that nothing else in a plan points
// into [ScatterBase(), ScatterBase() + len). Planning only records where
// the guest bytes go (iovec pointers); it never reads them. Should an op
// reach the kernel unmapped, the call fails with EFAULT.
const uint8_t* ScatterBase();

// Points the iovecs of `ops` that fall in [ScatterBase(), ScatterBase() +
// total of `segs`) into the caller's segments `segs` instead (the guest
// bytes are then written from where the caller has them, never copied),
// splitting them at segment boundaries, and an op whose iovecs grow past
// IOV_MAX into several ops. Iovecs elsewhere (copy-on-write buffers) are
// kept.
void MapIntoSegments(std::vector<IoOp>* ops, absl::Span<const iovec> segs);

// Counts a finished I/O into `stats`.
void CountIo(const IoOp& op, bool write, IoStats* stats);

// The cipher of op's data (lib/io/data_cipher.h), or null: metadata ops,
// plain ops (compressed clusters), files with none. Costs nothing (no
// cast) while no file in the process has a cipher.
const DataCipher* CipherOf(const IoOp& op);

// Copies op's bytes (op.iov; zeros for a zero-range op) into `out`
// (op.bytes long) and encrypts them there for op.offset.
absl::Status EncryptOpInto(const DataCipher& c, const IoOp& op, uint8_t* out);

// Carries out one op with blocking calls on its File.
absl::Status RunOp(IoOp& op, bool write);

// Carries out the reads, after-read steps and writes with blocking calls
// (no commit, no abort).
absl::Status RunPlanIo(IoPlan& plan, IoStats* stats);

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_IO_IO_PLAN_H_
