// A qcow2 image file as one layer of a chain: open-time validation, the
// read-side mapping and, when opened writable, the write path
// (qcow2_write.cc) and refcounts (lib/refcount).
#ifndef QCOW2_LIB_IMAGE_QCOW2_LAYER_H_
#define QCOW2_LIB_IMAGE_QCOW2_LAYER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/chain/layer.h"
#include "lib/cluster/cluster_map.h"
#include "lib/format/header.h"
#include "lib/refcount/refcounts.h"
#include "qcow2/options.h"

namespace qcow2::internal {

class Qcow2Layer : public Layer {
 public:
  // Reads and validates the header and loads the L1 table. With
  // `opts.read_write`, also refuses images that must not be written.
  static absl::StatusOr<std::unique_ptr<Qcow2Layer>> Open(
      std::unique_ptr<File> file, const OpenOptions& opts);

  ~Qcow2Layer() override;

  uint64_t size() const override { return header_.size; }
  File* file() override { return file_.get(); }
  const std::string& filename() const override { return file_->name(); }
  absl::StatusOr<Extent> Map(uint64_t offset, uint64_t max_len) override;
  absl::Status ReadExtent(const Extent& e, uint64_t extent_start,
                          uint64_t offset, absl::Span<uint8_t> buf) override;
  LayerInfo Info() const override;
  std::string backing_file() const override { return header_.backing_file; }
  std::string backing_format() const override {
    return header_.backing_format.value_or("");
  }

  const Header& header() const { return header_; }
  const Geometry& geometry() const { return map_->geometry(); }
  ClusterMap& cluster_map() { return *map_; }
  Refcounts* refcounts() { return refcounts_.get(); }
  bool writable() const { return writable_; }

  // --- Write side (qcow2_write.cc, qcow2_zero.cc). REQUIRES: writable().

  // Reads guest bytes from the chain below this layer (for copy-on-write).
  using BackingReader =
      std::function<absl::Status(uint64_t offset, absl::Span<uint8_t> buf)>;
  void set_backing(BackingReader reader) { backing_ = std::move(reader); }
  bool has_backing() const { return static_cast<bool>(backing_); }

  absl::Status Write(uint64_t offset, absl::Span<const uint8_t> data);
  // Makes the range read as zeros; with `free_clusters`, host clusters of
  // fully covered clusters are released.
  absl::Status Zero(uint64_t offset, uint64_t len, bool free_clusters);
  absl::Status Flush() override;
  absl::Status Close() override;
  // Grows the virtual size, reallocating the L1 table if needed.
  absl::Status Grow(uint64_t new_size);

  // Allocates every guest cluster (metadata) and, for kFalloc/kFull, the
  // host space under it. For freshly created images.
  absl::Status Preallocate(Preallocation mode);

  // Rewrites the fixed header fields (not the extensions) and flushes.
  absl::Status WriteHeaderFields();

 private:
  Qcow2Layer(std::unique_ptr<File> file, Header header, uint64_t file_size);

  // Maps within one cluster starting at `offset`.
  absl::StatusOr<Extent> MapInCluster(const L2Ref& ref, uint64_t offset,
                                      uint64_t max_len);
  absl::Status ReadCompressed(uint64_t entry, uint8_t* cluster_out);
  // Copies guest bytes out of a compressed cluster through the one-cluster
  // memo below (decompressing only when the entry differs).
  absl::Status ReadFromCompressed(uint64_t entry, uint64_t offset,
                                  absl::Span<uint8_t> buf);

  absl::Status OpenForWriting(const OpenOptions& opts);
  // Recomputes every refcount from the metadata (dirty images).
  static absl::Status RebuildRefcounts(File* file);

  // Write helpers.
  absl::Status PrepareWrite();
  absl::Status Fail(absl::Status s);
  absl::StatusOr<L2Ref> L2ForWrite(uint64_t cluster);
  absl::Status WriteCluster(uint64_t cluster, uint64_t in_cluster,
                            absl::Span<const uint8_t> data);
  absl::Status WriteSubclusters(L2Ref& ref, uint64_t cluster,
                                uint64_t in_cluster,
                                absl::Span<const uint8_t> data);
  // Fills `buf` with the current contents of guest range [offset, +size)
  // inside one cluster whose L2 entry is `entry`/`bitmap`.
  absl::Status ReadOld(uint64_t entry, uint64_t bitmap, uint64_t offset,
                       absl::Span<uint8_t> buf);
  absl::Status ReleaseHost(uint64_t entry);
  absl::Status CheckDataTarget(uint64_t host, uint64_t len) const;
  absl::Status WriteL1Entry(uint64_t index);
  absl::Status OrderL2AfterAllocation();
  absl::Status ZeroCluster(uint64_t cluster, bool free_clusters);
  absl::Status ZeroSubclusters(uint64_t cluster, uint64_t in_cluster,
                               uint64_t len);

  std::unique_ptr<File> file_;
  Header header_;
  uint64_t file_size_;
  std::unique_ptr<ClusterMap> map_;
  std::unique_ptr<Refcounts> refcounts_;
  BackingReader backing_;
  bool writable_ = false;
  bool prepared_ = false;  // dirty bit / autoclear handled
  bool lazy_refcounts_ = false;
  bool closed_ = false;
  bool marked_corrupt_ = false;  // by Fail(); caches were abandoned

  // The most recently decompressed cluster, for small sequential reads.
  uint64_t decompressed_entry_ = 0;
  std::vector<uint8_t> decompressed_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_IMAGE_QCOW2_LAYER_H_
