// SPDX-License-Identifier: Apache-2.0
// Seed corpora for the fuzz targets (used by scripts/fuzz.sh):
//
//   fuzz_seed_tool extract IMAGE OUTDIR PREFIX
//       Writes every compressed cluster of the qcow2 IMAGE (the
//       descriptor's sector span, up to 16 per image) as an input for
//       fuzz_decompress: OUTDIR/PREFIX-N.
//   fuzz_seed_tool synth OUTDIR
//       Compressed clusters made with CompressCluster, zlib and zstd, for
//       several cluster sizes and contents (for machines without qemu-img).
//   fuzz_seed_tool random OUTDIR COUNT
//       COUNT pseudo-random inputs of 16 B .. 2 KiB (fuzz_ops seeds),
//       the same every run.
//
// The qcow2 parsing here is deliberately independent of lib/: it only walks
// the active L1/L2 tables of a well-formed image.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "fuzz/fuzz_util.h"
#include "lib/format/compress.h"
#include "qcow2/options.h"

namespace {

using Bytes = std::vector<uint8_t>;

uint32_t BE32(const Bytes& b, uint64_t off) {
  if (off + 4 > b.size()) return 0;
  return uint32_t{b[off]} << 24 | uint32_t{b[off + 1]} << 16 |
         uint32_t{b[off + 2]} << 8 | b[off + 3];
}
uint64_t BE64(const Bytes& b, uint64_t off) {
  return uint64_t{BE32(b, off)} << 32 | BE32(b, off + 4);
}

bool WriteFile(const std::string& path, const Bytes& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data.data()),
          static_cast<std::streamsize>(data.size()));
  return static_cast<bool>(f);
}

// fuzz_decompress's first byte: codec in bit 0, cluster_bits - 9 above it.
uint8_t Selector(uint32_t cluster_bits, bool zstd) {
  return static_cast<uint8_t>(((cluster_bits - 9) << 1) | (zstd ? 1 : 0));
}

int Extract(const std::string& image, const std::string& outdir,
            const std::string& prefix) {
  std::ifstream f(image, std::ios::binary);
  if (!f) {
    fprintf(stderr, "cannot read %s\n", image.c_str());
    return 1;
  }
  Bytes b((std::istreambuf_iterator<char>(f)),
          std::istreambuf_iterator<char>());
  if (BE32(b, 0) != 0x514649fb) {
    fprintf(stderr, "%s is not qcow2\n", image.c_str());
    return 1;
  }
  const uint32_t version = BE32(b, 4);
  const uint32_t bits = BE32(b, 20);
  if (bits < 9 || bits > 21) return 1;
  const uint64_t cs = 1ull << bits;
  const uint32_t l1_size = BE32(b, 36);
  const uint64_t l1_off = BE64(b, 40);
  bool ext = false, zstd = false;
  if (version >= 3) {
    ext = (BE64(b, 72) >> 4) & 1;
    const uint32_t header_length = BE32(b, 100);
    zstd = header_length > 104 && b.size() > 104 && b[104] == 1;
  }
  const uint64_t entry_size = ext ? 16 : 8;
  const uint32_t shift = 62 - (bits - 8);
  int n = 0;
  for (uint32_t i = 0; i < l1_size && n < 16; ++i) {
    const uint64_t l2 = BE64(b, l1_off + 8ull * i) & 0x00fffffffffffe00ull;
    if (l2 == 0) continue;
    for (uint64_t j = 0; j < cs / entry_size && n < 16; ++j) {
      const uint64_t e = BE64(b, l2 + j * entry_size);
      if (((e >> 62) & 1) == 0) continue;
      const uint64_t off = e & ((1ull << shift) - 1);
      const uint64_t sectors = ((e >> shift) & ((1ull << (bits - 8)) - 1)) + 1;
      const uint64_t len = sectors * 512 - (off & 511);
      Bytes seed{Selector(bits, zstd)};
      for (uint64_t k = 0; k < len; ++k) {
        seed.push_back(off + k < b.size() ? b[off + k] : 0);
      }
      const std::string out = outdir + "/" + prefix + "-" + std::to_string(n++);
      if (!WriteFile(out, seed)) return 1;
    }
  }
  printf("%s: %d compressed clusters\n", image.c_str(), n);
  return 0;
}

int Synth(const std::string& outdir) {
  int n = 0;
  for (uint32_t bits : {9u, 12u, 16u, 21u}) {
    const size_t cs = size_t{1} << bits;
    for (int content = 0; content < 3; ++content) {
      Bytes cluster(cs, 0);
      if (content == 1) {
        for (size_t i = 0; i < cs; ++i) cluster[i] = "qcow2 fuzz seed "[i % 16];
      } else if (content == 2) {
        qcow2::fuzz::FillPattern(bits, absl::MakeSpan(cluster.data(), cs / 4));
      }
      for (bool zstd : {false, true}) {
        const auto type = zstd ? qcow2::CompressionType::kZstd
                               : qcow2::CompressionType::kZlib;
        Bytes comp(cs);
        auto len = qcow2::internal::CompressCluster(type, cluster,
                                                    absl::MakeSpan(comp));
        if (!len.ok() || *len == 0) continue;
        Bytes seed{Selector(bits, zstd)};
        // Padded to whole sectors as in an image.
        const size_t padded = (*len + 511) / 512 * 512;
        comp.resize(std::max(comp.size(), padded), 0);
        seed.insert(seed.end(), comp.begin(), comp.begin() + padded);
        if (!WriteFile(outdir + "/synth-" + std::to_string(n++), seed))
          return 1;
      }
    }
  }
  printf("synth: %d compressed clusters\n", n);
  return 0;
}

int Random(const std::string& outdir, int count) {
  uint64_t state = 0x5eed;
  for (int i = 0; i < count; ++i) {
    const size_t len = 16 + qcow2::fuzz::SplitMix64(&state) % 2033;
    Bytes seed(len);
    for (auto& b : seed)
      b = static_cast<uint8_t>(qcow2::fuzz::SplitMix64(&state));
    if (!WriteFile(outdir + "/random-" + std::to_string(i), seed)) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "extract" && argc == 5) return Extract(argv[2], argv[3], argv[4]);
  if (cmd == "synth" && argc == 3) return Synth(argv[2]);
  if (cmd == "random" && argc == 4) return Random(argv[2], atoi(argv[3]));
  fprintf(stderr,
          "usage: %s extract IMAGE OUTDIR PREFIX | synth OUTDIR | "
          "random OUTDIR COUNT\n",
          argv[0]);
  return 2;
}
