// SPDX-License-Identifier: Apache-2.0
#include "tools/image_info.h"

#include <cstdio>
#include <ctime>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/cli_util.h"

namespace qcow2::tool {

const char* FormatName(ImageFormat f) {
  return f == ImageFormat::kQcow2 ? "qcow2" : "raw";
}

namespace {

// The persistent bitmaps of a qcow2 layer as QEMU lists them
// (Qcow2BitmapInfo: name, granularity, flags "in-use" then "auto"), or
// nullopt when it has none. A bitmap directory that cannot be read is
// reported on stderr and left out (qemu-img refuses to open such images).
std::optional<Json> BitmapsJson(const LayerInfo& info) {
  if (!info.bitmaps_error.empty()) {
    std::fprintf(stderr, "qcowtool: warning: %s\n",
                 info.bitmaps_error.c_str());
    return std::nullopt;
  }
  if (info.bitmaps.empty()) return std::nullopt;
  Json out = Json::Array();
  for (const BitmapInfo& b : info.bitmaps) {
    Json flags = Json::Array();
    if (b.in_use) flags.Append(Json::String("in-use"));
    if (b.enabled) flags.Append(Json::String("auto"));
    Json j = Json::Object();
    j.Set("flags", std::move(flags));
    j.Set("name", Json::String(b.name));
    j.Set("granularity", Json::Uint(b.granularity));
    out.Append(std::move(j));
  }
  return out;
}

// QEMU's ImageInfoSpecificQCow2Encryption for LUKS: the format, then
// QCryptoBlockInfoLUKS's members (slots: QCryptoBlockInfoLUKSSlot, iters
// and stripes of active ones only), in QAPI order.
Json EncryptJson(const EncryptionInfo& e) {
  Json j = Json::Object();
  j.Set("format", Json::String(e.format));
  j.Set("cipher-alg", Json::String(e.cipher_alg));
  j.Set("cipher-mode", Json::String(e.cipher_mode));
  j.Set("ivgen-alg", Json::String(e.ivgen_alg));
  if (!e.ivgen_hash_alg.empty()) {
    j.Set("ivgen-hash-alg", Json::String(e.ivgen_hash_alg));
  }
  j.Set("hash-alg", Json::String(e.hash_alg));
  j.Set("payload-offset", Json::Uint(e.payload_offset));
  j.Set("master-key-iters", Json::Uint(e.master_key_iters));
  j.Set("uuid", Json::String(e.uuid));
  Json slots = Json::Array();
  for (const LuksSlotInfo& s : e.slots) {
    Json slot = Json::Object();
    slot.Set("active", Json::Bool(s.active));
    if (s.active) {
      slot.Set("iters", Json::Uint(s.iterations));
      slot.Set("stripes", Json::Uint(s.stripes));
    }
    slot.Set("key-offset", Json::Uint(s.key_offset));
    slots.Append(std::move(slot));
  }
  j.Set("slots", std::move(slots));
  return j;
}

// QEMU's ImageInfoSpecificQCow2, fields in QAPI order (the printed order
// is QDict order anyway).
Json Qcow2SpecificData(const LayerInfo& info) {
  Json data = Json::Object();
  const bool v3 = info.version >= 3;
  data.Set("compat", Json::String(v3 ? "1.1" : "0.10"));
  if (v3) {
    data.Set("lazy-refcounts", Json::Bool(info.lazy_refcounts));
    data.Set("corrupt", Json::Bool(info.corrupt));
  }
  data.Set("refcount-bits", Json::Uint(info.refcount_bits));
  data.Set(
      "compression-type",
      Json::String(info.compression_type == CompressionType::kZstd ? "zstd"
                                                                   : "zlib"));
  if (v3) data.Set("extended-l2", Json::Bool(info.extended_l2));
  // As QEMU: the stored name whenever there is one, the raw flag only
  // when the image uses its data file.
  if (!info.data_file.empty()) {
    data.Set("data-file", Json::String(info.data_file));
  }
  if (info.has_data_file) {
    data.Set("data-file-raw", Json::Bool(info.data_file_raw));
  }
  if (info.encryption) data.Set("encrypt", EncryptJson(*info.encryption));
  if (std::optional<Json> bitmaps = BitmapsJson(info)) {
    data.Set("bitmaps", std::move(*bitmaps));
  }
  return data;
}

std::string ScalarText(const Json& v) {
  switch (v.kind()) {
    case Json::Kind::kString:
      return v.string_value();
    case Json::Kind::kUint:
      return std::to_string(v.uint_value());
    case Json::Kind::kBool:
      return v.bool_value() ? "true" : "false";
    default:
      return "";
  }
}

void DumpValue(const Json& v, int indent, std::string* out);

// QEMU's dump_qdict(): "key: value" lines in QDict order, dashes in keys
// shown as spaces, nested containers indented by 4 more.
void DumpObject(const Json& obj, int indent, std::string* out) {
  for (const auto* m : QemuMemberOrder(obj)) {
    std::string key = m->first;
    for (char& c : key) {
      if (c == '-') c = ' ';
    }
    absl::StrAppend(out, std::string(indent * 4, ' '), key, ":");
    DumpValue(m->second, indent, out);
  }
}

// The value after "key:" or "[i]:": composite ones on the lines below,
// indented by one more level (QEMU's dump_qobject and dump_qlist).
void DumpValue(const Json& v, int indent, std::string* out) {
  if (v.kind() == Json::Kind::kObject) {
    out->append("\n");
    DumpObject(v, indent + 1, out);
  } else if (v.kind() == Json::Kind::kArray) {
    out->append("\n");
    for (size_t i = 0; i < v.elements().size(); ++i) {
      absl::StrAppend(out, std::string((indent + 1) * 4, ' '), "[", i, "]:");
      DumpValue(v.elements()[i], indent + 1, out);
    }
  } else {
    absl::StrAppend(out, " ", ScalarText(v), "\n");
  }
}

std::string FullBackingName(const ImageFacts& f) {
  return QemuPathCombine(f.name, f.info.backing_file);
}

// One line of QEMU's bdrv_snapshot_dump(); null for the column header.
std::string SnapshotLine(const SnapshotInfo* sn) {
  char line[512];
  if (sn == nullptr) {
    std::snprintf(line, sizeof line, "%-10s%-17s%8s%20s%13s%11s", "ID", "TAG",
                  "VM SIZE", "DATE", "VM CLOCK", "ICOUNT");
    return line;
  }
  const time_t date = sn->date_sec;
  struct tm tm;
  char date_buf[64] = "";
  if (localtime_r(&date, &tm) != nullptr) {
    std::strftime(date_buf, sizeof date_buf, "%Y-%m-%d %H:%M:%S", &tm);
  }
  const uint64_t secs = sn->vm_clock_nsec / 1000000000;
  char clock_buf[64];
  std::snprintf(clock_buf, sizeof clock_buf, "%02d:%02d:%02d.%03d",
                static_cast<int>(secs / 3600),
                static_cast<int>((secs / 60) % 60), static_cast<int>(secs % 60),
                static_cast<int>((sn->vm_clock_nsec / 1000000) % 1000));
  const std::string icount =
      sn->icount ? std::to_string(static_cast<int64_t>(*sn->icount)) : "";
  // The id and the name as C strings, as QEMU prints them.
  return absl::StrCat(absl::StrFormat(
      "%-9s %-16s %8s%20s%13s%11s", sn->id.c_str(), sn->name.c_str(),
      FormatSize(sn->vm_state_size), date_buf, clock_buf, icount));
}

}  // namespace

std::string SnapshotListText(const std::vector<SnapshotInfo>& snapshots) {
  if (snapshots.empty()) return "";
  std::string out = "Snapshot list:\n" + SnapshotLine(nullptr) + "\n";
  for (const SnapshotInfo& sn : snapshots) {
    absl::StrAppend(&out, SnapshotLine(&sn), "\n");
  }
  return out;
}

Json SnapshotJson(const SnapshotInfo& sn) {
  Json j = Json::Object();
  j.Set("id", Json::String(sn.id));
  j.Set("name", Json::String(sn.name));
  j.Set("vm-state-size", Json::Uint(sn.vm_state_size));
  j.Set("date-sec", Json::Uint(sn.date_sec));
  j.Set("date-nsec", Json::Uint(sn.date_nsec));
  j.Set("vm-clock-sec", Json::Uint(sn.vm_clock_nsec / 1000000000));
  j.Set("vm-clock-nsec", Json::Uint(sn.vm_clock_nsec % 1000000000));
  if (sn.icount) j.Set("icount", Json::Uint(*sn.icount));
  return j;
}

Json ImageInfoJson(const ImageFacts& f) {
  const LayerInfo& info = f.info;
  const bool qcow2 = info.format == ImageFormat::kQcow2;
  Json j = Json::Object();
  j.Set("filename", Json::String(f.name));
  j.Set("format", Json::String(FormatName(info.format)));
  j.Set("dirty-flag", Json::Bool(info.dirty));
  if (f.actual_size) j.Set("actual-size", Json::Uint(*f.actual_size));
  j.Set("virtual-size", Json::Uint(info.virtual_size));
  if (qcow2) j.Set("cluster-size", Json::Uint(info.cluster_size));
  if (!info.backing_file.empty()) {
    j.Set("backing-filename", Json::String(info.backing_file));
    j.Set("full-backing-filename", Json::String(FullBackingName(f)));
    if (!info.backing_format.empty()) {
      j.Set("backing-filename-format", Json::String(info.backing_format));
    }
  }
  if (info.encrypted) j.Set("encrypted", Json::Bool(true));
  if (!info.snapshots.empty()) {
    Json list = Json::Array();
    for (const SnapshotInfo& sn : info.snapshots) {
      list.Append(SnapshotJson(sn));
    }
    j.Set("snapshots", std::move(list));
  }
  if (qcow2) {
    Json spec = Json::Object();
    spec.Set("type", Json::String("qcow2"));
    spec.Set("data", Qcow2SpecificData(info));
    j.Set("format-specific", std::move(spec));
  }
  return j;
}

std::string ImageInfoHuman(const ImageFacts& f) {
  const LayerInfo& info = f.info;
  std::string out = absl::StrCat(
      "image: ", f.name, "\n", "file format: ", FormatName(info.format), "\n",
      "virtual size: ", FormatSize(info.virtual_size), " (", info.virtual_size,
      " bytes)\n",
      "disk size: ", f.actual_size ? FormatSize(*f.actual_size) : "unavailable",
      "\n");
  if (info.encrypted) out.append("encrypted: yes\n");
  if (info.format == ImageFormat::kQcow2) {
    absl::StrAppend(&out, "cluster_size: ", info.cluster_size, "\n");
  }
  if (info.dirty) out.append("cleanly shut down: no\n");
  if (!info.backing_file.empty()) {
    absl::StrAppend(&out, "backing file: ", info.backing_file);
    std::string full = FullBackingName(f);
    if (full != info.backing_file) {
      absl::StrAppend(&out, " (actual path: ", full, ")");
    }
    out.append("\n");
    if (!info.backing_format.empty()) {
      absl::StrAppend(&out, "backing file format: ", info.backing_format, "\n");
    }
  }
  out += SnapshotListText(info.snapshots);
  if (info.format == ImageFormat::kQcow2) {
    out.append("Format specific information:\n");
    DumpObject(Qcow2SpecificData(info), 1, &out);
  }
  return out;
}

}  // namespace qcow2::tool
