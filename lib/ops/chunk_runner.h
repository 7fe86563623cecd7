// SPDX-License-Identifier: Apache-2.0
// Moves data between images in chunks, many at once: each chunk goes
// through a list of stages (read, compare, write ...), each stage
// submitting requests on the images' Queues; the next stage starts when
// the last request of the one before has completed. Up to `depth` chunks
// are in flight; the first error stops new chunks, lets those in flight
// finish, and is returned.
//
//   ChunkRunner runner({queue.get()}, 16, 1 << 20);
//   absl::Status s = runner.Run(next_chunk, {read_stage, write_stage});
//
// Single-threaded: Run() polls the queues on the calling thread, and the
// stages run there (inside Poll, from the requests' completions).
#ifndef QCOW2_LIB_OPS_CHUNK_RUNNER_H_
#define QCOW2_LIB_OPS_CHUNK_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "qcow2/live.h"
#include "qcow2/queue.h"

namespace qcow2::ops {

// One piece of the work, as the chunk source hands it out.
struct Chunk {
  uint64_t offset = 0;  // guest offset
  uint64_t len = 0;     // bytes, at most the runner's chunk size
  int depth = 0;        // the chain layer that holds it (when it matters)
  bool zero = false;    // reads as zeros (no need to read it)
};

// A chunk in flight, with two buffers of the runner's chunk size.
struct Slot {
  Chunk chunk;
  std::vector<uint8_t> a, b;
  int pending = 0;      // requests submitted and not completed
  size_t stage = 0;     // the next stage to run
  absl::Status status;  // the first error of the chunk's requests
  bool busy = false;
};

class ChunkRunner {
 public:
  // Fills `*c` with the next chunk and returns true, or returns false when
  // there is none left.
  using NextFn = std::function<absl::StatusOr<bool>(Chunk* c)>;
  // Submits a stage's requests for `slot` through Issue().
  using StageFn = std::function<absl::Status(Slot& slot)>;

  // `queues` are polled while chunks are in flight; they must outlive the
  // runner.
  ChunkRunner(std::vector<Queue*> queues, int depth, uint64_t chunk_bytes);

  // Runs every chunk `next` gives through `stages`. `progress`, if set,
  // is called with the bytes of each chunk that finished.
  absl::Status Run(const NextFn& next, std::vector<StageFn> stages,
                   const std::function<void(uint64_t)>& progress = {});

  // Stops handing out chunks once `control` is cancelled (Run then
  // returns kCancelled after the chunks in flight). May be null.
  void set_control(const LiveJobControl* control) { control_ = control; }

  // Submits one request of `slot`'s current stage: `submit` is called with
  // the completion to pass to the Queue's Submit call.
  absl::Status Issue(Slot& slot,
                     const std::function<absl::Status(Completion)>& submit);

 private:
  // Runs `slot`'s stages while none has requests in flight; frees the
  // slot after the last one (or an error).
  void Advance(Slot& slot);
  void Free(Slot& slot);

  std::vector<Queue*> queues_;
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t chunk_bytes_;
  std::vector<StageFn> stages_;
  std::function<void(uint64_t)> progress_;
  int busy_ = 0;
  absl::Status error_;
  const LiveJobControl* control_ = nullptr;
};

// Whether `data` holds only zero bytes.
bool AllZero(const uint8_t* data, uint64_t len);

}  // namespace qcow2::ops

#endif  // QCOW2_LIB_OPS_CHUNK_RUNNER_H_
