// A qcow2 image file as one layer of a chain: open-time validation, the
// read-side mapping and, when opened writable, the write path
// (qcow2_write.cc) and refcounts (lib/refcount).
#ifndef QCOW2_LIB_IMAGE_QCOW2_LAYER_H_
#define QCOW2_LIB_IMAGE_QCOW2_LAYER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/chain/layer.h"
#include "lib/cluster/cluster_map.h"
#include "lib/format/header.h"
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

 private:
  Qcow2Layer(std::unique_ptr<File> file, Header header, uint64_t file_size);

  // Maps within one cluster starting at `offset`.
  absl::StatusOr<Extent> MapInCluster(const L2Ref& ref, uint64_t offset,
                                      uint64_t max_len);
  absl::Status ReadCompressed(uint64_t entry, uint8_t* cluster_out);

  std::unique_ptr<File> file_;
  Header header_;
  uint64_t file_size_;
  std::unique_ptr<ClusterMap> map_;

  // The most recently decompressed cluster, for small sequential reads.
  uint64_t decompressed_entry_ = 0;
  std::vector<uint8_t> decompressed_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_IMAGE_QCOW2_LAYER_H_
