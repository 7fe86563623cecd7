// SPDX-License-Identifier: Apache-2.0
#include "bench/micro_util.h"

#include "absl/strings/str_cat.h"
#include "lib/base/endian.h"
#include "qcow2/image.h"

namespace qcow2::bench {

absl::Status BuildChain(MemChain* chain, int depth, uint64_t size,
                        uint32_t cluster_size, uint64_t stride) {
  for (int i = 0; i <= depth; ++i) {
    const std::string path = absl::StrCat("/mem/layer", i, ".qcow2");
    CreateOptions c;
    c.opener = &chain->fs;
    c.size = size;
    c.cluster_size = cluster_size;
    if (i > 0) {
      c.backing_file = absl::StrCat("layer", i - 1, ".qcow2");
      c.backing_format = "qcow2";
    }
    if (absl::Status s = CreateImage(path, c); !s.ok()) return s;
    chain->paths.push_back(path);

    OpenOptions o;
    o.read_write = true;
    o.opener = &chain->fs;
    auto image = Image::Open(path, o);
    if (!image.ok()) return image.status();
    std::vector<uint8_t> data(4096, static_cast<uint8_t>(0x40 + i));
    for (uint64_t c = i; c * cluster_size < size; c += stride) {
      absl::Status s = (*image)->Write(c * cluster_size, data);
      if (!s.ok()) return s;
    }
    if (absl::Status s = (*image)->Close(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<HeaderAndL1> ReadHeaderAndL1(internal::MemoryFileSystem& fs,
                                            const std::string& path) {
  std::shared_ptr<internal::MemoryStore> store = fs.Store(path);
  std::vector<uint8_t> bytes = store->bytes;
  if (bytes.size() < 512) {
    return absl::DataLossError(absl::StrCat(path, " is too short"));
  }
  absl::StatusOr<internal::Header> h = internal::DecodeHeader(bytes, path);
  if (!h.ok()) return h.status();
  HeaderAndL1 out{*h, {}};
  for (uint32_t i = 0; i < h->l1_size; ++i) {
    const uint64_t at = h->l1_table_offset + uint64_t{i} * 8;
    out.l1.push_back(at + 8 <= bytes.size() ? internal::LoadBE64(&bytes[at])
                                            : 0);
  }
  return out;
}

}  // namespace qcow2::bench
