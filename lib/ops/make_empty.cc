// SPDX-License-Identifier: Apache-2.0
#include "lib/ops/make_empty.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/base/math.h"
#include "lib/base/status_macros.h"
#include "lib/driver/metadata_guard.h"
#include "lib/driver/write_planner.h"
#include "lib/format/entries.h"

namespace qcow2::internal {

absl::Status MakeEmpty(Qcow2Layer* layer) {
  RETURN_IF_ERROR(layer->header_writer().PrepareWrite());
  if (layer->header().nb_snapshots > 0) {
    return absl::UnimplementedError(absl::StrCat(
        layer->filename(),
        ": emptying an image with internal snapshots is not supported"));
  }
  // Deferred copy-on-write clusters get their entries first, so that none
  // is set after the walk below cleared it.
  RETURN_IF_ERROR(layer->Flush());
  ClusterMap& map = layer->cluster_map();
  const Geometry& g = map.geometry();
  const uint64_t end = DivRoundUp(layer->size(), g.cluster_size);
  // Host runs in an external data file (offset, bytes), discarded once the
  // cleared entries are durable, as QEMU's make_empty does.
  std::vector<std::pair<uint64_t, uint64_t>> data_runs;
  for (uint64_t c = 0; c < end;) {
    const uint64_t idx = c / g.l2_entries;
    const uint64_t table_end = std::min(end, (idx + 1) * g.l2_entries);
    if (idx >= map.l1().size() || map.l1()[idx] == 0) {
      c = table_end;
      continue;
    }
    for (; c < table_end; ++c) {
      ASSIGN_OR_RETURN(L2Ref ref, map.Lookup(c));
      const uint64_t entry = ref.entry(), bitmap = ref.bitmap();
      if (entry == 0 && bitmap == 0) continue;
      const uint64_t guest = c << g.cluster_bits;
      RETURN_IF_ERROR(layer->guard().ValidateEntry(entry, bitmap, guest));
      RETURN_IF_ERROR(layer->guard().CheckNotMetadata(entry, guest));
      if (!(map.l1()[idx] & kOflagCopied)) {
        ASSIGN_OR_RETURN(ref, layer->writer().L2ForWrite(c));
      }
      ref.Set(0, 0);
      RETURN_IF_ERROR(layer->writer().ReleaseHost(entry, bitmap, guest));
      const uint64_t host = entry & kEntryOffsetMask;
      if (layer->has_data_file() && host != 0) {
        if (!data_runs.empty() &&
            data_runs.back().first + data_runs.back().second == host) {
          data_runs.back().second += g.cluster_size;
        } else {
          data_runs.push_back({host, g.cluster_size});
        }
      }
    }
  }
  // The flush writes the cleared entries before the refcounts they let go
  // of (FlushSequencer's order).
  RETURN_IF_ERROR(layer->Flush());
  // Only now, with no entry naming them, may the data clusters go: a
  // power cut before leaves the top reading its old (committed) data.
  // Advisory, as any discard: a file system without hole punching keeps
  // the bytes, which nothing reads any more.
  for (const auto& [host, len] : data_runs) {
    layer->data_file()->Discard(host, len).IgnoreError();
  }
  return absl::OkStatus();
}

}  // namespace qcow2::internal
