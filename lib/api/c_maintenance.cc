// SPDX-License-Identifier: Apache-2.0
// The C API's persistent bitmaps, internal snapshots and offline
// maintenance (include/qcow2/c.h) over Image and qcow2/maintenance.h.
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/api/c_internal.h"
#include "qcow2/c.h"
#include "qcow2/maintenance.h"

using qcow2::c_api::CheckSize;
using qcow2::c_api::CopyOut;
using qcow2::c_api::Invalid;
using qcow2::c_api::NullArg;
using qcow2::c_api::Report;

namespace {

// A malloc'd copy of `s`, for a string the caller frees with qcow2_free.
char* CopyString(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

std::string Str(const char* s) { return s == nullptr ? "" : s; }

// Checks the image and the named strings of a bitmap call.
bool BadBitmapCall(qcow2_image_t* img, const char* name, char** errptr) {
  return NullArg(img, "image", errptr) || NullArg(name, "name", errptr);
}

// Element `index` of a listing, or -ENOENT.
template <typename T>
int Pick(const absl::StatusOr<std::vector<T>>& list, int index,
         const char* what, const T** out, char** errptr) {
  if (!list.ok()) return Report(list.status(), errptr);
  if (index < 0 || static_cast<size_t>(index) >= list->size()) {
    return Report(absl::NotFoundError(absl::StrCat(
                      "no ", what, " number ", index, " (there are ",
                      list->size(), ")")),
                  errptr);
  }
  *out = &(*list)[static_cast<size_t>(index)];
  return 0;
}

// The chain operations' options of a C caller (`in` may be NULL; only the
// fields inside in->size are read; zeros keep the defaults).
int ChainOptions(const qcow2_chain_op_options_t* in, const std::string& path,
                 qcow2::ChainOpOptions* out, char** errptr) {
  if (in == nullptr) return 0;
  if (int rc = CheckSize(in, "chain operation options", errptr); rc != 0) {
    return rc;
  }
  qcow2_chain_op_options_t o;
  std::memset(&o, 0, sizeof o);
  std::memcpy(&o, in, std::min(in->size, sizeof o));
  absl::Status s = qcow2::c_api::ParseOpenOptions(
      o.open_options, absl::StrCat("opening ", path), &out->open);
  if (!s.ok()) return Report(s, errptr);
  if (o.depth != 0) out->depth = o.depth;
  if (o.chunk != 0) out->chunk = o.chunk;
  if (o.progress != nullptr) {
    out->progress = [fn = o.progress, data = o.progress_data](double f) {
      fn(data, f);
    };
  }
  if (o.control != nullptr) out->control = &o.control->control;
  return 0;
}

}  // namespace

// --- Bitmaps.

int qcow2_image_bitmap_count(qcow2_image_t* img, char** errptr) {
  if (NullArg(img, "image", errptr)) return -EINVAL;
  auto list = img->image->ListBitmaps();
  if (!list.ok()) return Report(list.status(), errptr);
  return static_cast<int>(list->size());
}

int qcow2_image_bitmap_info(qcow2_image_t* img, int index,
                            qcow2_bitmap_info_t* out, char** errptr) {
  if (NullArg(img, "image", errptr) || NullArg(out, "out", errptr)) {
    return -EINVAL;
  }
  if (int rc = CheckSize(out, "bitmap info", errptr); rc != 0) return rc;
  const auto list = img->image->ListBitmaps();  // outlives `b`
  const qcow2::BitmapInfo* b = nullptr;
  if (int rc = Pick(list, index, "bitmap", &b, errptr); rc != 0) return rc;
  qcow2_bitmap_info_t info;
  std::memset(&info, 0, sizeof info);
  info.granularity = b->granularity;
  info.enabled = b->enabled;
  info.in_use = b->in_use;
  // The name only when the caller's struct holds the pointer.
  if (out->size >= offsetof(qcow2_bitmap_info_t, name) + sizeof(char*)) {
    info.name = CopyString(b->name);
  }
  CopyOut(info, out);
  return 0;
}

int qcow2_image_bitmap_status(qcow2_image_t* img, const char* name,
                              uint64_t offset, uint64_t max_len,
                              qcow2_bitmap_status_t* out, char** errptr) {
  if (BadBitmapCall(img, name, errptr) || NullArg(out, "out", errptr)) {
    return -EINVAL;
  }
  if (int rc = CheckSize(out, "bitmap status", errptr); rc != 0) return rc;
  auto st = img->image->GetBitmapStatus(name, offset, max_len);
  if (!st.ok()) return Report(st.status(), errptr);
  qcow2_bitmap_status_t b;
  std::memset(&b, 0, sizeof b);
  b.offset = st->offset;
  b.length = st->length;
  b.dirty = st->dirty;
  CopyOut(b, out);
  return 0;
}

int qcow2_image_bitmap_add(qcow2_image_t* img, const char* name,
                           uint64_t granularity, int enabled, char** errptr) {
  if (BadBitmapCall(img, name, errptr)) return -EINVAL;
  return Report(img->image->AddBitmap(name, granularity, enabled != 0),
                errptr);
}

int qcow2_image_bitmap_remove(qcow2_image_t* img, const char* name,
                              char** errptr) {
  if (BadBitmapCall(img, name, errptr)) return -EINVAL;
  return Report(img->image->RemoveBitmap(name), errptr);
}

int qcow2_image_bitmap_clear(qcow2_image_t* img, const char* name,
                             char** errptr) {
  if (BadBitmapCall(img, name, errptr)) return -EINVAL;
  return Report(img->image->ClearBitmap(name), errptr);
}

int qcow2_image_bitmap_enable(qcow2_image_t* img, const char* name,
                              char** errptr) {
  if (BadBitmapCall(img, name, errptr)) return -EINVAL;
  return Report(img->image->EnableBitmap(name), errptr);
}

int qcow2_image_bitmap_disable(qcow2_image_t* img, const char* name,
                               char** errptr) {
  if (BadBitmapCall(img, name, errptr)) return -EINVAL;
  return Report(img->image->DisableBitmap(name), errptr);
}

int qcow2_image_bitmap_merge(qcow2_image_t* img, const char* target,
                             const char* source, qcow2_image_t* source_img,
                             char** errptr) {
  if (BadBitmapCall(img, target, errptr) ||
      NullArg(source, "source", errptr)) {
    return -EINVAL;
  }
  return Report(
      img->image->MergeBitmap(
          target, source, source_img ? source_img->image.get() : nullptr),
      errptr);
}

// --- Internal snapshots.

int qcow2_image_snapshot_count(qcow2_image_t* img, char** errptr) {
  if (NullArg(img, "image", errptr)) return -EINVAL;
  auto list = img->image->ListSnapshots();
  if (!list.ok()) return Report(list.status(), errptr);
  return static_cast<int>(list->size());
}

int qcow2_image_snapshot_info(qcow2_image_t* img, int index,
                              qcow2_snapshot_info_t* out, char** errptr) {
  if (NullArg(img, "image", errptr) || NullArg(out, "out", errptr)) {
    return -EINVAL;
  }
  if (int rc = CheckSize(out, "snapshot info", errptr); rc != 0) return rc;
  const auto list = img->image->ListSnapshots();  // outlives `sn`
  const qcow2::SnapshotInfo* sn = nullptr;
  if (int rc = Pick(list, index, "snapshot", &sn, errptr); rc != 0) return rc;
  qcow2_snapshot_info_t info;
  std::memset(&info, 0, sizeof info);
  if (out->size >= offsetof(qcow2_snapshot_info_t, name) + sizeof(char*)) {
    info.id = CopyString(sn->id);
    info.name = CopyString(sn->name);
  }
  info.vm_state_size = sn->vm_state_size;
  info.date_sec = sn->date_sec;
  info.date_nsec = sn->date_nsec;
  info.vm_clock_nsec = sn->vm_clock_nsec;
  info.disk_size = sn->disk_size;
  info.has_icount = sn->icount.has_value();
  info.icount = sn->icount.value_or(0);
  CopyOut(info, out);
  return 0;
}

int qcow2_image_snapshot_create(qcow2_image_t* img, const char* name,
                                const char* id, char** errptr) {
  if (BadBitmapCall(img, name, errptr)) return -EINVAL;
  return Report(img->image->CreateSnapshot(name, Str(id)).status(), errptr);
}

int qcow2_image_snapshot_apply(qcow2_image_t* img, const char* name_or_id,
                               char** errptr) {
  if (BadBitmapCall(img, name_or_id, errptr)) return -EINVAL;
  return Report(img->image->ApplySnapshot(name_or_id), errptr);
}

int qcow2_image_snapshot_delete(qcow2_image_t* img, const char* name_or_id,
                                char** errptr) {
  if (BadBitmapCall(img, name_or_id, errptr)) return -EINVAL;
  return Report(img->image->DeleteSnapshot(name_or_id), errptr);
}

// --- Check, measure, chain operations.

int qcow2_check(const char* path, int repair, qcow2_check_report_t* out,
                char** messages, char** errptr) {
  if (NullArg(path, "path", errptr) || NullArg(out, "out", errptr)) {
    return -EINVAL;
  }
  if (int rc = CheckSize(out, "check report", errptr); rc != 0) return rc;
  qcow2::CheckOptions opts;
  switch (repair) {
    case QCOW2_REPAIR_NONE: opts.repair = qcow2::RepairMode::kNone; break;
    case QCOW2_REPAIR_LEAKS: opts.repair = qcow2::RepairMode::kLeaks; break;
    case QCOW2_REPAIR_ALL: opts.repair = qcow2::RepairMode::kAll; break;
    default:
      return Invalid(errptr, absl::StrCat("repair mode ", repair,
                                          ": expected 0, 1 or 2"));
  }
  auto r = qcow2::CheckImage(path, opts);
  if (!r.ok()) return Report(r.status(), errptr);
  qcow2_check_report_t c;
  std::memset(&c, 0, sizeof c);
  c.corruptions = r->corruptions;
  c.leaks = r->leaks;
  c.check_errors = r->check_errors;
  c.corruptions_fixed = r->corruptions_fixed;
  c.leaks_fixed = r->leaks_fixed;
  c.image_end_offset = r->image_end_offset;
  c.total_clusters = r->total_clusters;
  c.allocated_clusters = r->allocated_clusters;
  c.fragmented_clusters = r->fragmented_clusters;
  c.compressed_clusters = r->compressed_clusters;
  c.verdict = static_cast<int32_t>(r->verdict());
  c.rechecked = r->rechecked;
  CopyOut(c, out);
  if (messages != nullptr) {
    std::string text;
    for (const std::string& m : r->messages) absl::StrAppend(&text, m, "\n");
    if (!r->failure.empty()) {
      absl::StrAppend(&text, "Check failed: ", r->failure, "\n");
    }
    *messages = CopyString(text);
  }
  return 0;
}

int qcow2_measure(const char* options, uint64_t size, qcow2_image_t* source,
                  qcow2_measure_t* out, char** errptr) {
  if (NullArg(out, "out", errptr)) return -EINVAL;
  if (int rc = CheckSize(out, "measure", errptr); rc != 0) return rc;
  qcow2::CreateOptions co;
  co.size = size;
  absl::Status s =
      qcow2::c_api::ParseCreateOptions(options, "measuring", &co);
  if (!s.ok()) return Report(s, errptr);
  const qcow2::MeasureTarget target = qcow2::MeasureTargetFor(co);
  qcow2::MeasureSource src;
  if (source != nullptr) {
    auto got = qcow2::MeasureSourceOf(*source->image, target);
    if (!got.ok()) return Report(got.status(), errptr);
    src = std::move(got).value();
  }
  auto r = qcow2::Measure(target, source != nullptr ? &src : nullptr);
  if (!r.ok()) return Report(r.status(), errptr);
  qcow2_measure_t m;
  std::memset(&m, 0, sizeof m);
  m.required = r->required;
  m.fully_allocated = r->fully_allocated;
  m.has_bitmaps = r->bitmaps.has_value();
  m.bitmaps = r->bitmaps.value_or(0);
  CopyOut(m, out);
  return 0;
}

int qcow2_commit(const char* path, const char* base, int keep_top,
                 const qcow2_chain_op_options_t* opts, int* emptied,
                 char** errptr) {
  if (NullArg(path, "path", errptr)) return -EINVAL;
  qcow2::ChainOpOptions o;
  qcow2::c_api::ScopedSecretWipe wipe(&o.open);
  if (int rc = ChainOptions(opts, path, &o, errptr); rc != 0) return rc;
  qcow2::CommitSpec spec;
  spec.image = path;
  spec.base = Str(base);
  spec.keep_top = keep_top != 0;
  auto r = qcow2::Commit(spec, o);
  if (!r.ok()) return Report(r.status(), errptr);
  if (emptied != nullptr) *emptied = r->emptied;
  return 0;
}

int qcow2_rebase(const char* path, const char* backing,
                 const char* backing_format, int unsafe,
                 const qcow2_chain_op_options_t* opts, char** errptr) {
  if (NullArg(path, "path", errptr)) return -EINVAL;
  qcow2::ChainOpOptions o;
  qcow2::c_api::ScopedSecretWipe wipe(&o.open);
  if (int rc = ChainOptions(opts, path, &o, errptr); rc != 0) return rc;
  qcow2::RebaseSpec spec;
  spec.image = path;
  spec.backing = Str(backing);
  spec.backing_format = Str(backing_format);
  spec.unsafe = unsafe != 0;
  return Report(qcow2::Rebase(spec, o), errptr);
}

int qcow2_stream(const char* path, const char* base,
                 const qcow2_chain_op_options_t* opts, char** errptr) {
  if (NullArg(path, "path", errptr)) return -EINVAL;
  qcow2::ChainOpOptions o;
  qcow2::c_api::ScopedSecretWipe wipe(&o.open);
  if (int rc = ChainOptions(opts, path, &o, errptr); rc != 0) return rc;
  qcow2::StreamSpec spec;
  spec.image = path;
  spec.base = Str(base);
  return Report(qcow2::StreamChain(spec, o), errptr);
}
