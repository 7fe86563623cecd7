// SPDX-License-Identifier: Apache-2.0
// The value types of libqcow2's public API: what Image, Queue and the
// maintenance calls (qcow2/maintenance.h) take and return. Plain structs,
// no behaviour; qcow2/image.h includes this header, and the library's
// lower layers use it without the facades.
#ifndef QCOW2_TYPES_H_
#define QCOW2_TYPES_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "qcow2/options.h"

namespace qcow2 {

struct QueueOptions {
  // Maximum requests in flight (flushes included); Submit* fails with
  // kResourceExhausted beyond it.
  int depth = 128;
  // false: never try io_uring (run requests synchronously).
  bool use_io_uring = true;
};

// Called once per request with its result.
using Completion = std::function<void(absl::Status)>;

// One persistent dirty bitmap of a qcow2 image, as `qemu-img info` lists
// it (QEMU's Qcow2BitmapInfo).
struct BitmapInfo {
  std::string name;
  uint64_t granularity = 0;  // bytes of guest disk per bit (a power of 2)
  // The auto flag: guest writes, write-zeroes and discards set its bits.
  bool enabled = false;
  // Inconsistent: the bitmap was found in use (an earlier writer did not
  // close the image cleanly, or another one has it open), so its bits
  // cannot be trusted; it can only be removed. On an image open
  // read-write, the bitmaps this process maintains are not in use in this
  // sense (on disk they are flagged in use until Close()).
  bool in_use = false;
};

// The dirty state of one range of a bitmap (Image::GetBitmapStatus).
struct BitmapStatus {
  uint64_t offset = 0;  // guest offset of the range
  uint64_t length = 0;  // bytes with this state
  bool dirty = false;   // some write touched it since the bitmap was cleared
};

// What one range of the virtual disk reads from, as `qemu-img map` reports
// it.
struct BlockStatus {
  uint64_t offset = 0;  // guest offset of the range
  uint64_t length = 0;  // bytes with this status
  // Index in the chain of the layer that decides the contents (0 = top).
  // For ranges allocated nowhere, the depth of the deepest layer searched.
  int depth = 0;
  bool present = false;     // some layer allocates it (data or zero)
  bool zero = false;        // reads as zeros
  bool data = false;        // reads from stored data
  bool compressed = false;  // stored in a compressed cluster
  // Host byte offset in the file of layer `depth` (uncompressed data only).
  std::optional<uint64_t> host_offset;
};

// One internal snapshot, as `qemu-img snapshot -l` lists it (QEMU's
// SnapshotInfo).
struct SnapshotInfo {
  std::string id;              // unique in the image; QEMU picks "1", "2", ...
  std::string name;            // need not be unique
  uint64_t vm_state_size = 0;  // bytes of saved VM state (0: disk only)
  uint32_t date_sec = 0;       // when it was taken (Unix time)
  uint32_t date_nsec = 0;
  uint64_t vm_clock_nsec = 0;  // guest clock at the time
  // Instruction count (record/replay); absent when the entry has none.
  std::optional<uint64_t> icount;
  uint64_t disk_size = 0;  // virtual size of the disk it holds
};

// One LUKS key slot as `qemu-img info` shows it (QEMU's
// QCryptoBlockInfoLUKSSlot); iterations and stripes only when active.
struct LuksSlotInfo {
  bool active = false;
  uint32_t iterations = 0;
  uint32_t stripes = 0;
  uint64_t key_offset = 0;  // bytes from the start of the LUKS area
};

// The LUKS header of an encrypted qcow2 image, read without its key
// (QEMU's QCryptoBlockInfoLUKS, names as QEMU spells them).
struct EncryptionInfo {
  std::string format;          // "luks"
  std::string cipher_alg;      // "aes-256"
  std::string cipher_mode;     // "xts"
  std::string ivgen_alg;       // "plain64"
  std::string ivgen_hash_alg;  // essiv only, else empty
  std::string hash_alg;        // "sha256"
  uint64_t payload_offset = 0;  // bytes
  uint32_t master_key_iters = 0;
  std::string uuid;
  std::vector<LuksSlotInfo> slots;
};

// Facts about one image file of a chain, for `info`.
struct LayerInfo {
  std::string filename;  // path as opened
  ImageFormat format = ImageFormat::kRaw;
  uint64_t virtual_size = 0;
  uint64_t file_size = 0;  // logical size of the host file
  // qcow2 only below.
  uint32_t version = 0;
  uint32_t cluster_size = 0;
  uint32_t refcount_bits = 0;
  bool extended_l2 = false;
  CompressionType compression_type = CompressionType::kZlib;
  bool lazy_refcounts = false;
  bool dirty = false;
  bool corrupt = false;
  uint64_t incompatible_features = 0;
  uint64_t compatible_features = 0;
  uint64_t autoclear_features = 0;
  uint32_t snapshot_count = 0;
  // The snapshot table (empty when it cannot be read; snapshot_count
  // still gives the header's count).
  std::vector<SnapshotInfo> snapshots;
  std::string backing_file;           // as stored in the header
  std::string backing_format;         // from the header extension, if any
  std::string full_backing_filename;  // resolved path of the backing file
  // The external data file's name as stored (the name extension, even
  // when the incompatible bit that makes it used is clear), whether the
  // image uses one (that bit), and whether it is a valid raw image of
  // the disk (autoclear bit "raw external data").
  std::string data_file;
  bool has_data_file = false;
  bool data_file_raw = false;
  // The data file as opened (its path, resolved as a backing name is):
  // where data extents of this layer are, as `qemu-img map` names it.
  // Empty without one (or when it is not open).
  std::string data_file_path;
  // The persistent bitmaps as stored in the file (for a top open
  // read-write, flagged in use until Close(): Image::ListBitmaps() gives
  // their live state). Empty when there are none or the directory cannot
  // be read; bitmaps_error then says why.
  std::vector<BitmapInfo> bitmaps;
  std::string bitmaps_error;
  // crypt_method is not 0 (qemu-img's "encrypted: yes").
  bool encrypted = false;
  // The LUKS header of a LUKS-encrypted image, key or no key.
  std::optional<EncryptionInfo> encryption;
};

// --- Check and repair (qcow2/maintenance.h).

// What a check repairs (qemu-img check -r): nothing; leaks (refcounts
// that are too high); all (also too-low refcounts, COPIED flags, and a
// rebuilt refcount structure when it is broken; guest data is never moved
// or overwritten).
enum class RepairMode { kNone, kLeaks, kAll };

// What a check concluded, and qemu-img check's exit status for it.
enum class CheckVerdict {
  kClean = 0,        // no errors
  kFailed = 1,       // the check did not complete (failure, check_errors)
  kCorrupt = 2,      // corruptions remain
  kLeaks = 3,        // only leaked clusters remain
};

// qemu-img check's report (QEMU's ImageCheck), counters of the image as
// found or, after a repair that changed something, as checked again.
struct CheckReport {
  uint64_t corruptions = 0, leaks = 0, check_errors = 0;
  uint64_t corruptions_fixed = 0, leaks_fixed = 0;
  uint64_t image_end_offset = 0, total_clusters = 0, allocated_clusters = 0,
           fragmented_clusters = 0, compressed_clusters = 0;
  // Human lines, in order, as qemu-img prints them to stderr ("ERROR
  // cluster 5 refcount=1 reference=2", "Leaked cluster 9 refcount=1
  // reference=0", "Repairing ...").
  std::vector<std::string> messages;
  // Non-empty when the check stopped before the end (qemu-img prints
  // "Check failed: <this>" and exits 1); the counters are then partial.
  std::string failure;
  // True when a repair changed something and the image was checked a
  // second time; messages from recheck_first_message on are that check's.
  bool rechecked = false;
  size_t recheck_first_message = 0;

  CheckVerdict verdict() const {
    if (!failure.empty() || check_errors != 0) return CheckVerdict::kFailed;
    if (corruptions != 0) return CheckVerdict::kCorrupt;
    if (leaks != 0) return CheckVerdict::kLeaks;
    return CheckVerdict::kClean;
  }
};

// --- Measure (qcow2/maintenance.h).

// The new image, as its creation options describe it.
struct MeasureTarget {
  ImageFormat format = ImageFormat::kQcow2;
  uint64_t cluster_size = 65536;
  bool extended_l2 = false;
  int version = 3;
  uint32_t refcount_bits = 16;
  Preallocation preallocation = Preallocation::kOff;
  bool has_backing_file = false;
  uint64_t size = 0;  // virtual size, when there is no source image
};

// The source image's part: its size and which of its bytes hold data.
struct MeasureSource {
  uint64_t size = 0;
  // Bytes of data clusters the copy needs, rounded out to whole clusters
  // of the new image (QEMU's walk over the source's block status).
  uint64_t data_bytes = 0;
  // Persistent bitmaps (name length, granularity), when the source can
  // carry them (qcow2 v3); nullopt when it cannot.
  struct Bitmap {
    size_t name_length = 0;
    uint64_t granularity = 0;
  };
  std::optional<std::vector<Bitmap>> bitmaps;
};

// What `qemu-img measure` prints.
struct MeasureReport {
  uint64_t required = 0;
  uint64_t fully_allocated = 0;
  std::optional<uint64_t> bitmaps;  // shown only when both sides carry them
};

}  // namespace qcow2

#endif  // QCOW2_TYPES_H_
