// SPDX-License-Identifier: Apache-2.0
// The vhost-user-blk device as the front-end sees it over one connection:
// negotiated features, the memory table, and the state of each virtqueue
// until it is handed to its loop (Worker) to run. It runs on the control
// thread and acts on decoded messages only (protocol.h decodes them).
#ifndef QCOW2_SERVE_VHOST_DEVICE_H_
#define QCOW2_SERVE_VHOST_DEVICE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "serve/vhost/guest_memory.h"
#include "serve/vhost/protocol.h"
#include "serve/vhost/worker.h"

namespace qcow2::vhost {

class Device {
 public:
  // `workers` serve virtqueue i on workers[i % size]; both outlive this.
  Device(DeviceShared* shared, std::vector<Worker*> workers);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // Acts on one message and returns the bytes to send back (none for most
  // requests without REPLY_ACK). Descriptors the device keeps are set to
  // -1 in m->fds; the caller closes the rest. An error means the front-end
  // broke the protocol: close the connection (and call Reset()).
  absl::StatusOr<std::vector<uint8_t>> Handle(Message* m);

  // Back to a fresh device: every virtqueue stopped after completing what
  // it took from the guest, memory unmapped, descriptors closed, features
  // cleared. For a closed connection and RESET_OWNER.
  void Reset();

  uint64_t offered_features() const;
  static uint64_t OfferedProtocolFeatures();

 private:
  struct VqControl {
    uint16_t num = 0;
    bool has_addr = false;
    VringAddr addr;
    uint16_t base = 0;
    int kick = -1;
    int call = -1;
    int err = -1;
    // SET_VRING_ENABLE 0 came. A ring is not held back waiting for an
    // ENABLE 1: front-ends before QEMU 7.2 never send one for a block
    // device, though they negotiate protocol features.
    bool disabled = false;
    bool running = false;
  };

  absl::Status Dispatch(Message* m, std::vector<uint8_t>* reply);
  absl::Status CheckIndex(const Message& m, uint32_t index) const;
  absl::Status MaybeStart(int index);
  void Stop(int index);
  absl::Status SetMemTable(Message* m);
  absl::Status SetVringFd(Message* m);
  absl::Status SetConfig(const Message& m);
  Worker* WorkerFor(int index) { return workers_[index % workers_.size()]; }

  DeviceShared* shared_;
  std::vector<Worker*> workers_;
  uint64_t features_ = 0;
  uint64_t protocol_features_ = 0;
  std::shared_ptr<const GuestMemory> mem_;
  std::vector<VqControl> vqs_;
};

}  // namespace qcow2::vhost

#endif  // QCOW2_SERVE_VHOST_DEVICE_H_
