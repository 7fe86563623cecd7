// SPDX-License-Identifier: Apache-2.0
// One split virtqueue (virtio 1.x, 2.7) seen from the device: the ring
// walker that turns the guest's descriptor chains into checked iovecs, and
// the used ring that hands them back.
//
// The guest owns the ring memory and may change it at any moment, so each
// field is read once into a local copy and checked there: every buffer
// address and length against the memory table, heads and `next` indices
// against the queue size, chains bounded (a loop or a chain longer than the
// queue is an error, as is an indirect table inside an indirect table).
// Any error means a broken guest driver or a hostile one: the caller
// stops serving the connection and logs the message.
#ifndef QCOW2_SERVE_VHOST_SPLIT_RING_H_
#define QCOW2_SERVE_VHOST_SPLIT_RING_H_

#include <sys/uio.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "serve/vhost/guest_memory.h"

namespace qcow2::vhost {

// The buffers of one popped chain: device-readable segments first, then
// device-writable ones (the order the spec requires of the driver).
struct Chain {
  uint16_t head = 0;
  std::vector<iovec> readable;
  std::vector<iovec> writable;
  uint64_t readable_bytes = 0;
  uint64_t writable_bytes = 0;
  void Clear() {
    readable.clear();
    writable.clear();
    readable_bytes = writable_bytes = 0;
  }
};

struct RingConfig {
  uint16_t num = 0;          // queue size: a power of two, 1 to 32768
  uint64_t desc = 0;         // front-end addresses (SET_VRING_ADDR)
  uint64_t avail = 0;
  uint64_t used = 0;
  uint16_t last_avail = 0;   // SET_VRING_BASE
  bool event_idx = false;    // VIRTIO_RING_F_EVENT_IDX negotiated
  bool indirect = false;     // VIRTIO_RING_F_INDIRECT_DESC negotiated
};

class SplitRing {
 public:
  // Most iovecs one chain may produce (descriptors split where regions
  // meet); beyond it the chain is refused.
  static constexpr size_t kMaxIov = 1024;
  // Longest indirect table accepted, whatever the queue size (Linux sizes
  // them by seg_max + 2).
  static constexpr uint32_t kMaxIndirect = 1024;

  // Translates and checks the three areas (size and alignment, all inside
  // the memory table). kInvalidArgument naming what is wrong.
  static absl::StatusOr<SplitRing> Create(const GuestMemory* mem,
                                          const RingConfig& config);

  // Whether a chain is waiting. Error when the guest's avail index runs
  // more than the queue size ahead of us.
  absl::StatusOr<bool> HasPending();
  // Pops the next available chain into `chain` (REQUIRES: HasPending()).
  absl::Status Pop(Chain* chain);
  // Records a finished chain in the used ring; the guest sees it after
  // PublishUsed().
  void PushUsed(uint16_t head, uint32_t written);
  // Makes the pushed entries visible. Returns whether the guest wants an
  // interrupt for them (EVENT_IDX's used_event, or the NO_INTERRUPT flag).
  bool PublishUsed();
  // Asks for a kick when the guest adds past what was popped; returns
  // true when chains arrived meanwhile (pop them before sleeping).
  absl::StatusOr<bool> ArmKick();

  uint16_t last_avail() const { return last_avail_; }
  uint16_t num() const { return num_; }

 private:
  absl::Status Walk(const uint8_t* table, uint32_t count, uint16_t first,
                    bool in_indirect, Chain* chain);
  absl::Status AddBuffer(uint64_t addr, uint32_t len, bool writable,
                         Chain* chain);

  const GuestMemory* mem_ = nullptr;
  uint8_t* desc_ = nullptr;
  uint8_t* avail_ = nullptr;
  uint8_t* used_ = nullptr;
  uint16_t num_ = 0;
  uint16_t last_avail_ = 0;
  uint16_t used_idx_ = 0;         // next used entry (ours)
  uint16_t signalled_used_ = 0;   // used index at the last interrupt
  bool signalled_valid_ = false;
  bool event_idx_ = false;
  bool indirect_ = false;
};

}  // namespace qcow2::vhost

#endif  // QCOW2_SERVE_VHOST_SPLIT_RING_H_
