// SPDX-License-Identifier: Apache-2.0
#include "lib/engine/miss_table.h"

#include "absl/strings/str_cat.h"

namespace qcow2::internal {

bool MissTable::Claim(Request* r, const MissDeferral& deferral) {
  MetadataCache* cache = deferral.cache;
  auto [it, first] = reads_.try_emplace(
      std::pair<const void*, uint64_t>(cache, deferral.read_start));
  if (first) {
    it->second.reader = r->waiter;
  } else if (it->second.reader == r->waiter) {
    // A request of the same queue is reading this: wait for it. (Never
    // for another queue's read: that would make this queue's progress
    // depend on another thread polling, for requests that do not overlap.)
    it->second.parked.push_back(r);
    r->parked = true;
    return false;
  }
  r->miss.cache = cache;
  r->miss.epoch = deferral.epoch;
  r->miss.offset = deferral.offset;
  r->miss.op = MissRead(deferral, &r->plan);
  return true;
}

void MissTable::Release(const MetadataCache* cache, uint64_t read_offset) {
  if (auto node = reads_.extract(
          std::pair<const void*, uint64_t>(cache, read_offset))) {
    for (Request* w : node.mapped().parked) w->waiter->Wake(w);
  }
}

IoOp MissTable::MissRead(const MissDeferral& deferral, IoPlan* buffers) {
  IoOp op;
  op.file = deferral.cache->read_file();
  op.offset = deferral.read_start;
  op.category = IoCategory::kMetadata;
  op.Add(buffers->Buffer(deferral.read_len), deferral.read_len);
  return op;
}

absl::Status MissTable::ReadError(const MetadataCache* cache, uint64_t offset,
                                  const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("reading ", cache->what(),
                                             " at ", offset, ": ",
                                             s.message()));
}

}  // namespace qcow2::internal
