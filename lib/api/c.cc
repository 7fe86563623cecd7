// SPDX-License-Identifier: Apache-2.0
// The C API (include/qcow2/c.h) over the C++ one: handles wrap an Image and
// a Queue, errors become negative errnos plus a malloc'd message, option
// strings become OpenOptions and CreateOptions.
#include "qcow2/c.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "lib/crypto/secure_buffer.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"
#include "qcow2/version.h"
#include "lib/api/c_internal.h"

using qcow2::c_api::CheckSize;
using qcow2::c_api::CopyOut;
using qcow2::c_api::Invalid;
using qcow2::c_api::NullArg;
using qcow2::c_api::Report;
using qcow2::c_api::SetError;
using qcow2::c_api::ToErrno;

namespace {

// A size as qemu-img writes it: digits with an optional k, M, G, T suffix
// (powers of 1024, either case).
bool ParseSizeValue(absl::string_view text, uint64_t* out) {
  int shift = 0;
  if (!text.empty()) {
    switch (text.back()) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      case 't': case 'T': shift = 40; break;
      case 'b': case 'B': shift = 0; break;
      default: shift = -1; break;
    }
    if (shift >= 0) text.remove_suffix(1);
  }
  uint64_t v = 0;
  if (text.empty() || !absl::SimpleAtoi(text, &v)) return false;
  if (shift > 0 && v > (UINT64_MAX >> shift)) return false;
  *out = v << (shift > 0 ? shift : 0);
  return true;
}

bool ParseSwitch(absl::string_view v, bool* out) {
  if (v == "on" || v == "true" || v == "yes") {
    *out = true;
  } else if (v == "off" || v == "false" || v == "no") {
    *out = false;
  } else {
    return false;
  }
  return true;
}

// Calls fn(key, value) for each key=value of a comma-separated list;
// returns its first error. Empty items are skipped.
template <typename Fn>
absl::Status ForEachOption(const char* options, absl::string_view what,
                           Fn&& fn) {
  if (options == nullptr) return absl::OkStatus();
  for (absl::string_view item : absl::StrSplit(options, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": '", item, "' is not key=value (in \"", options, "\")"));
    }
    absl::Status s = fn(item.substr(0, eq), item.substr(eq + 1));
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", s.message(), " (in \"", options, "\")"));
    }
  }
  return absl::OkStatus();
}

absl::Status BadValue(absl::string_view key, absl::string_view value,
                      absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(
      "option ", key, "='", value, "': expected ", expected));
}

// The bytes of a key-secret file (the secret itself never travels in an
// option string).
absl::Status ReadSecretFile(absl::string_view key, absl::string_view path,
                            std::string* out) {
  std::ifstream in(std::string(path), std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option ", key, ": cannot read '", path, "': ", std::strerror(errno)));
  }
  out->assign(std::istreambuf_iterator<char>(in), {});
  return absl::OkStatus();
}

absl::Status ApplyCreateOption(absl::string_view key, absl::string_view v,
                               qcow2::CreateOptions* o) {
  using qcow2::Preallocation;
  bool b = false;
  uint64_t n = 0;
  if (key == "cluster_size") {
    if (!ParseSizeValue(v, &n) || n < 512 || n > (2u << 20) ||
        (n & (n - 1)) != 0) {
      return BadValue(key, v, "a power of two from 512 to 2M");
    }
    o->cluster_size = static_cast<uint32_t>(n);
  } else if (key == "compat") {
    if (v == "v3") v = "1.1";
    if (v == "v2") v = "0.10";
    if (v != "1.1" && v != "0.10") return BadValue(key, v, "1.1 or 0.10");
    o->compat = std::string(v);
  } else if (key == "extended_l2") {
    if (!ParseSwitch(v, &b)) return BadValue(key, v, "on or off");
    o->extended_l2 = b;
  } else if (key == "lazy_refcounts") {
    if (!ParseSwitch(v, &b)) return BadValue(key, v, "on or off");
    o->lazy_refcounts = b;
  } else if (key == "refcount_bits") {
    if (!absl::SimpleAtoi(v, &n) || n == 0 || n > 64 || (n & (n - 1)) != 0) {
      return BadValue(key, v, "a power of two from 1 to 64");
    }
    o->refcount_bits = static_cast<uint32_t>(n);
  } else if (key == "compression_type") {
    if (v == "zlib") {
      o->compression_type = qcow2::CompressionType::kZlib;
    } else if (v == "zstd") {
      o->compression_type = qcow2::CompressionType::kZstd;
    } else {
      return BadValue(key, v, "zlib or zstd");
    }
  } else if (key == "preallocation") {
    if (v == "off") {
      o->preallocation = Preallocation::kOff;
    } else if (v == "metadata") {
      o->preallocation = Preallocation::kMetadata;
    } else if (v == "falloc") {
      o->preallocation = Preallocation::kFalloc;
    } else if (v == "full") {
      o->preallocation = Preallocation::kFull;
    } else {
      return BadValue(key, v, "off, metadata, falloc or full");
    }
  } else if (key == "backing_fmt") {
    if (v != "qcow2" && v != "raw") return BadValue(key, v, "qcow2 or raw");
    o->backing_format = std::string(v);
  } else if (key == "backing_file") {
    o->backing_file = std::string(v);
  } else if (key == "size") {
    if (!ParseSizeValue(v, &n)) return BadValue(key, v, "a size (e.g. 10G)");
    o->size = n;
  } else if (key == "encrypt.format") {
    o->encrypt.format = std::string(v);
  } else if (key == "encrypt.key-secret-file") {
    return ReadSecretFile(key, v, &o->encrypt.key_secret);
  } else if (key == "encrypt.cipher-alg") {
    o->encrypt.cipher_alg = std::string(v);
  } else if (key == "encrypt.cipher-mode") {
    o->encrypt.cipher_mode = std::string(v);
  } else if (key == "encrypt.ivgen-alg") {
    o->encrypt.ivgen_alg = std::string(v);
  } else if (key == "encrypt.ivgen-hash-alg") {
    o->encrypt.ivgen_hash_alg = std::string(v);
  } else if (key == "encrypt.hash-alg") {
    o->encrypt.hash_alg = std::string(v);
  } else if (key == "encrypt.iter-time") {
    if (!absl::SimpleAtoi(v, &n) || n == 0 || n > 1000000) {
      return BadValue(key, v, "milliseconds from 1 to 1000000");
    }
    o->encrypt.iter_time_ms = static_cast<uint32_t>(n);
  } else if (key == "encrypt.iterations") {
    if (!absl::SimpleAtoi(v, &n) || n < 1000 || n > (1u << 30)) {
      return BadValue(key, v, "a PBKDF2 count of at least 1000");
    }
    o->encrypt.iterations = static_cast<uint32_t>(n);
  } else if (key == "format") {
    if (v == "qcow2") {
      o->format = qcow2::ImageFormat::kQcow2;
    } else if (v == "raw") {
      o->format = qcow2::ImageFormat::kRaw;
    } else {
      return BadValue(key, v, "qcow2 or raw");
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown option '", key,
        "' (known: cluster_size, compat, extended_l2, lazy_refcounts, "
        "refcount_bits, compression_type, preallocation, backing_fmt, "
        "backing_file, size, format, encrypt.*)"));
  }
  return absl::OkStatus();
}

// The depth of a `backing.` key-secret-file key (QEMU's
// backing.encrypt.key-secret naming: 1 for "backing.key-secret-file", 2
// for "backing.backing.key-secret-file", ...), 0 for any other key.
size_t BackingSecretDepth(absl::string_view key) {
  size_t depth = 0;
  while (absl::ConsumePrefix(&key, "backing.")) ++depth;
  return key == "key-secret-file" ? depth : 0;
}

absl::Status ApplyOpenOption(absl::string_view key, absl::string_view v,
                             qcow2::OpenOptions* o) {
  bool b = false;
  uint64_t n = 0;
  if (key == "read-only") {
    if (!ParseSwitch(v, &b)) return BadValue(key, v, "on or off");
    o->read_write = !b;
  } else if (key == "format") {
    if (v != "qcow2" && v != "raw") return BadValue(key, v, "qcow2 or raw");
    o->format = std::string(v);
  } else if (key == "direct") {
    if (!ParseSwitch(v, &b)) return BadValue(key, v, "on or off");
    o->direct_io = b;
  } else if (key == "cache-size" || key == "l2-cache-size") {
    if (!ParseSizeValue(v, &n)) return BadValue(key, v, "a size (e.g. 32M)");
    o->l2_cache_bytes = n;
  } else if (key == "refcount-cache-size") {
    if (!ParseSizeValue(v, &n)) return BadValue(key, v, "a size (e.g. 1M)");
    o->refcount_cache_bytes = n;
  } else if (key == "backing") {
    if (!ParseSwitch(v, &b)) return BadValue(key, v, "on or off");
    o->open_backing = b;
  } else if (key == "backing-root") {
    if (v.empty()) return BadValue(key, v, "a directory");
    o->backing_root = std::string(v);
  } else if (key == "force-share") {
    if (!ParseSwitch(v, &b)) return BadValue(key, v, "on or off");
    o->force_share = b;
  } else if (key == "no-flush") {
    if (!ParseSwitch(v, &b)) return BadValue(key, v, "on or off");
    o->no_flush = b;
  } else if (key == "locking") {
    if (!ParseSwitch(v, &b)) return BadValue(key, v, "on or off");
    o->lock = b;
  } else if (key == "key-secret-file") {
    return ReadSecretFile(key, v, &o->key_secret);
  } else if (size_t depth = BackingSecretDepth(key); depth != 0) {
    if (depth > 4096) return BadValue(key, v, "a chain at most 4096 deep");
    if (o->backing_key_secrets.size() < depth) {
      o->backing_key_secrets.resize(depth);
    }
    return ReadSecretFile(key, v, &o->backing_key_secrets[depth - 1]);
  } else if (key == "metadata-only") {
    if (!ParseSwitch(v, &b)) return BadValue(key, v, "on or off");
    o->metadata_only = b;
  } else if (key == "max-chain") {
    if (!absl::SimpleAtoi(v, &n) || n == 0 || n > 4096) {
      return BadValue(key, v, "a depth from 1 to 4096");
    }
    o->max_chain_depth = static_cast<int>(n);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown option '", key,
        "' (known: read-only, format, direct, cache-size, "
        "refcount-cache-size, backing, backing-root, force-share, locking, "
        "no-flush, max-chain, key-secret-file, backing.key-secret-file, "
        "metadata-only)"));
  }
  return absl::OkStatus();
}

// The live job options of a C caller (`in` may be NULL: the defaults;
// only the fields inside in->size are read; zeros keep the defaults).
int LiveOptions(const qcow2_live_options_t* in, qcow2::LiveJobOptions* out,
                char** errptr) {
  if (in == nullptr) return 0;
  if (int rc = CheckSize(in, "live job options", errptr); rc != 0) return rc;
  qcow2_live_options_t o;
  std::memset(&o, 0, sizeof o);
  std::memcpy(&o, in, std::min(in->size, sizeof o));
  if (o.chunk != 0) out->chunk = o.chunk;
  if (o.depth != 0) out->depth = o.depth;
  out->rate_limit = o.rate_limit;
  if (o.progress != nullptr) {
    out->progress = [fn = o.progress, data = o.progress_data](
                        uint64_t done, uint64_t total) {
      fn(data, done, total);
    };
  }
  if (o.control != nullptr) out->control = &o.control->control;
  return 0;
}

// Runs one of Image's live jobs for a C caller.
int RunLiveJob(absl::Status (qcow2::Image::*job)(int,
                                                 const qcow2::LiveJobOptions&),
               qcow2_image_t* img, int base, const qcow2_live_options_t* opts,
               char** errptr) {
  if (NullArg(img, "image", errptr)) return -EINVAL;
  qcow2::LiveJobOptions o;
  if (int rc = LiveOptions(opts, &o, errptr); rc != 0) return rc;
  return Report((img->image.get()->*job)(base, o), errptr);
}

// The callback of a C submit: queues the completion for poll.
qcow2::Completion Deliver(qcow2_queue_t* q, void* user_data, int64_t bytes) {
  return [q, user_data, bytes](absl::Status s) {
    q->ready.push_back(
        {user_data, s.ok() ? bytes : -static_cast<int64_t>(ToErrno(s))});
  };
}

// Checks a submit's queue and room; -EAGAIN when it is full.
int CheckRoom(qcow2_queue_t* q, char** errptr) {
  if (NullArg(q, "queue", errptr)) return -EINVAL;
  if (q->queue->in_flight() >= q->queue->depth()) {
    SetError(errptr, absl::StrCat("queue is full (", q->queue->in_flight(),
                                  " requests in flight, depth ",
                                  q->queue->depth(), ")"));
    return -EAGAIN;
  }
  return 0;
}

int Vectored(qcow2_queue_t* q, bool write, uint64_t offset,
             const struct iovec* iov, int iovcnt, void* user_data,
             char** errptr) {
  if (int rc = CheckRoom(q, errptr); rc != 0) return rc;
  if (iovcnt < 0 || (iovcnt > 0 && iov == nullptr)) {
    return Invalid(errptr,
                   absl::StrCat(write ? "writev" : "readv", " at ", offset,
                                ": iovcnt ", iovcnt,
                                iov == nullptr ? " with iov NULL" : ""));
  }
  const auto segs = absl::MakeConstSpan(iov, static_cast<size_t>(iovcnt));
  int64_t bytes = 0;
  for (const iovec& v : segs) bytes += static_cast<int64_t>(v.iov_len);
  return Report(write ? q->queue->SubmitWritev(offset, segs,
                                               Deliver(q, user_data, bytes))
                      : q->queue->SubmitReadv(offset, segs,
                                              Deliver(q, user_data, bytes)),
                errptr);
}

// Moves up to `max` ready completions to `out`; tells the notifier when
// some are left (poll returned early: they must not wait for an event).
int TakeReady(qcow2_queue_t* q, qcow2_completion_t* out, int max) {
  int n = 0;
  while (n < max && !q->ready.empty()) {
    out[n++] = q->ready.front();
    q->ready.pop_front();
  }
  if (!q->ready.empty() && q->event_fd >= 0) {
    uint64_t one = 1;
    if (::write(q->event_fd, &one, sizeof(one)) < 0) {
      // EAGAIN: readable already.
    }
  }
  return n;
}

}  // namespace

namespace qcow2::c_api {

absl::Status ParseOpenOptions(const char* options, absl::string_view what,
                              OpenOptions* out) {
  return ForEachOption(options, what,
                       [&](absl::string_view k, absl::string_view v) {
                         return ApplyOpenOption(k, v, out);
                       });
}

void WipeOpenSecrets(OpenOptions* o) {
  internal::WipeString(&o->key_secret);
  for (std::string& s : o->backing_key_secrets) internal::WipeString(&s);
}

absl::Status ParseCreateOptions(const char* options, absl::string_view what,
                                CreateOptions* out) {
  return ForEachOption(options, what,
                       [&](absl::string_view k, absl::string_view v) {
                         return ApplyCreateOption(k, v, out);
                       });
}

}  // namespace qcow2::c_api

extern "C" {

const char* qcow2_version_string(void) { return qcow2::VersionString(); }

void qcow2_free(void* ptr) { std::free(ptr); }

int qcow2_image_create(const char* path, const char* backing, uint64_t size,
                       const char* options, char** errptr) {
  if (NullArg(path, "path", errptr)) return -EINVAL;
  qcow2::CreateOptions opts;
  opts.size = size;
  if (backing != nullptr) opts.backing_file = backing;
  absl::Status s = qcow2::c_api::ParseCreateOptions(
      options, absl::StrCat("creating ", path), &opts);
  if (s.ok()) s = qcow2::CreateImage(path, opts);
  qcow2::internal::WipeString(&opts.encrypt.key_secret);
  return Report(s, errptr);
}

qcow2_image_t* qcow2_image_open(const char* path, int read_write,
                                char** errptr) {
  qcow2_image_t* img = nullptr;
  qcow2_image_open_ex(path, read_write != 0 ? "read-only=off" : nullptr, &img,
                      errptr);
  return img;
}

qcow2_image_t* qcow2_image_open_opts(const char* path, const char* options,
                                     char** errptr) {
  qcow2_image_t* img = nullptr;
  qcow2_image_open_ex(path, options, &img, errptr);
  return img;
}

int qcow2_image_open_ex(const char* path, const char* options,
                        qcow2_image_t** out, char** errptr) {
  if (NullArg(out, "out", errptr)) return -EINVAL;
  *out = nullptr;
  if (NullArg(path, "path", errptr)) return -EINVAL;
  qcow2::OpenOptions opts;
  qcow2::c_api::ScopedSecretWipe wipe(&opts);
  absl::Status s = qcow2::c_api::ParseOpenOptions(
      options, absl::StrCat("opening ", path), &opts);
  if (!s.ok()) return Report(s, errptr);
  auto image = qcow2::Image::Open(path, opts);
  if (!image.ok()) return Report(image.status(), errptr);
  *out = new qcow2_image_t{std::move(*image)};
  return 0;
}

int qcow2_image_close(qcow2_image_t* img, char** errptr) {
  if (img == nullptr) return 0;
  const int rc = Report(img->image->Close(), errptr);
  delete img;
  return rc;
}

void qcow2_image_destroy(qcow2_image_t* img) { delete img; }

uint64_t qcow2_image_size(const qcow2_image_t* img) {
  return img != nullptr ? img->image->size() : 0;
}

int qcow2_image_writable(const qcow2_image_t* img) {
  return img != nullptr && img->image->writable() ? 1 : 0;
}

int qcow2_image_chain_length(const qcow2_image_t* img) {
  return img != nullptr ? img->image->chain_length() : 0;
}

int qcow2_image_read(qcow2_image_t* img, uint64_t offset, void* buf,
                     size_t len, char** errptr) {
  if (NullArg(img, "image", errptr)) return -EINVAL;
  if (len > 0 && NullArg(buf, "buffer", errptr)) return -EINVAL;
  return Report(
      img->image->Read(offset, absl::MakeSpan(static_cast<uint8_t*>(buf), len)),
      errptr);
}

int qcow2_image_write(qcow2_image_t* img, uint64_t offset, const void* buf,
                      size_t len, char** errptr) {
  if (NullArg(img, "image", errptr)) return -EINVAL;
  if (len > 0 && NullArg(buf, "buffer", errptr)) return -EINVAL;
  return Report(img->image->Write(offset, absl::MakeConstSpan(
                                              static_cast<const uint8_t*>(buf),
                                              len)),
                errptr);
}

int qcow2_image_write_compressed(qcow2_image_t* img, uint64_t offset,
                                 const void* buf, size_t len, char** errptr) {
  if (NullArg(img, "image", errptr)) return -EINVAL;
  if (len > 0 && NullArg(buf, "buffer", errptr)) return -EINVAL;
  return Report(img->image->WriteCompressed(
                    offset, absl::MakeConstSpan(
                                static_cast<const uint8_t*>(buf), len)),
                errptr);
}

int qcow2_image_write_zeroes(qcow2_image_t* img, uint64_t offset, uint64_t len,
                             int unmap, char** errptr) {
  if (NullArg(img, "image", errptr)) return -EINVAL;
  return Report(img->image->WriteZeroes(offset, len, unmap != 0), errptr);
}

int qcow2_image_discard(qcow2_image_t* img, uint64_t offset, uint64_t len,
                        char** errptr) {
  if (NullArg(img, "image", errptr)) return -EINVAL;
  return Report(img->image->Discard(offset, len), errptr);
}

int qcow2_image_flush(qcow2_image_t* img, char** errptr) {
  if (NullArg(img, "image", errptr)) return -EINVAL;
  return Report(img->image->Flush(), errptr);
}

int qcow2_image_block_status(qcow2_image_t* img, uint64_t offset,
                             uint64_t max_len, qcow2_block_status_t* out,
                             char** errptr) {
  if (NullArg(img, "image", errptr) || NullArg(out, "out", errptr)) {
    return -EINVAL;
  }
  if (int rc = CheckSize(out, "block status", errptr); rc != 0) return rc;
  auto st = img->image->GetBlockStatus(offset, max_len);
  if (!st.ok()) return Report(st.status(), errptr);
  qcow2_block_status_t b;
  std::memset(&b, 0, sizeof(b));
  b.offset = st->offset;
  b.length = st->length;
  b.depth = st->depth;
  b.allocated = st->present;
  b.zero = st->zero;
  b.data = st->data;
  b.compressed = st->compressed;
  b.has_host_offset = st->host_offset.has_value();
  b.host_offset = st->host_offset.value_or(0);
  CopyOut(b, out);
  return 0;
}

int qcow2_image_get_stats(const qcow2_image_t* img, qcow2_stats_t* out,
                          char** errptr) {
  if (NullArg(img, "image", errptr) || NullArg(out, "out", errptr)) {
    return -EINVAL;
  }
  if (int rc = CheckSize(out, "stats", errptr); rc != 0) return rc;
  const qcow2::IoStats s = img->image->GetStats();
  qcow2_stats_t c;
  std::memset(&c, 0, sizeof(c));
  c.guest_read_ops = s.guest_read_ops;
  c.guest_read_bytes = s.guest_read_bytes;
  c.guest_write_ops = s.guest_write_ops;
  c.guest_write_bytes = s.guest_write_bytes;
  c.guest_zero_ops = s.guest_zero_ops;
  c.guest_zero_bytes = s.guest_zero_bytes;
  c.guest_discard_ops = s.guest_discard_ops;
  c.guest_discard_bytes = s.guest_discard_bytes;
  c.guest_flush_ops = s.guest_flush_ops;
  c.host_data_read_bytes = s.host_data_read_bytes;
  c.host_data_write_bytes = s.host_data_write_bytes;
  c.cow_read_bytes = s.cow_read_bytes;
  c.cow_write_bytes = s.cow_write_bytes;
  c.metadata_read_bytes = s.metadata_read_bytes();
  c.metadata_write_bytes = s.metadata_write_bytes();
  c.host_zero_ops = s.host_zero_ops;
  c.host_discard_ops = s.host_discard_ops;
  c.host_flushes = s.host_flushes;
  c.cluster_allocations = s.cluster_allocations;
  CopyOut(c, out);
  return 0;
}

qcow2_queue_t* qcow2_queue_create(qcow2_image_t* img, int depth,
                                  char** errptr) {
  qcow2_queue_t* q = nullptr;
  qcow2_queue_create_ex(img, depth, &q, errptr);
  return q;
}

int qcow2_queue_create_ex(qcow2_image_t* img, int depth, qcow2_queue_t** out,
                          char** errptr) {
  if (NullArg(out, "out", errptr)) return -EINVAL;
  *out = nullptr;
  if (NullArg(img, "image", errptr)) return -EINVAL;
  if (depth <= 0) {
    return Invalid(errptr,
                   absl::StrCat("queue depth ", depth, " is not positive"));
  }
  qcow2::QueueOptions opts;
  opts.depth = depth;
  auto queue = img->image->CreateQueue(opts);
  if (!queue.ok()) return Report(queue.status(), errptr);
  auto* q = new qcow2_queue_t;
  q->queue = std::move(*queue);
  *out = q;
  return 0;
}

void qcow2_queue_destroy(qcow2_queue_t* q) {
  if (q == nullptr) return;
  q->queue.reset();  // its last callbacks still fill q->ready
  delete q;
}

int qcow2_queue_eventfd(qcow2_queue_t* q) {
  if (q == nullptr) return -EINVAL;
  const int fd = q->queue->EventFd();
  if (fd >= 0) {
    q->event_fd = fd;
    if (!q->ready.empty()) TakeReady(q, nullptr, 0);  // signals it
  }
  return fd;
}

int qcow2_queue_readv(qcow2_queue_t* q, uint64_t offset,
                      const struct iovec* iov, int iovcnt, void* user_data,
                      char** errptr) {
  return Vectored(q, false, offset, iov, iovcnt, user_data, errptr);
}

int qcow2_queue_writev(qcow2_queue_t* q, uint64_t offset,
                       const struct iovec* iov, int iovcnt, void* user_data,
                       char** errptr) {
  return Vectored(q, true, offset, iov, iovcnt, user_data, errptr);
}

int qcow2_queue_write_zeroes(qcow2_queue_t* q, uint64_t offset, uint64_t len,
                             int unmap, void* user_data, char** errptr) {
  if (int rc = CheckRoom(q, errptr); rc != 0) return rc;
  return Report(q->queue->SubmitWriteZeroes(offset, len, unmap != 0,
                                            Deliver(q, user_data, 0)),
                errptr);
}

int qcow2_queue_discard(qcow2_queue_t* q, uint64_t offset, uint64_t len,
                        void* user_data, char** errptr) {
  if (int rc = CheckRoom(q, errptr); rc != 0) return rc;
  return Report(
      q->queue->SubmitDiscard(offset, len, Deliver(q, user_data, 0)), errptr);
}

int qcow2_queue_flush(qcow2_queue_t* q, void* user_data, char** errptr) {
  if (int rc = CheckRoom(q, errptr); rc != 0) return rc;
  return Report(q->queue->SubmitFlush(Deliver(q, user_data, 0)), errptr);
}

void qcow2_prepare_io_thread(void) { qcow2::PrepareIoThread(); }

int qcow2_queue_poll(qcow2_queue_t* q, qcow2_completion_t* out, int max) {
  return qcow2_queue_wait(q, out, max, 0);
}

int qcow2_queue_wait(qcow2_queue_t* q, qcow2_completion_t* out, int max,
                     int min) {
  if (q == nullptr || max < 0 || (max > 0 && out == nullptr)) return -EINVAL;
  if (min > max) min = max;
  if (static_cast<int>(q->ready.size()) < max) {
    const int want = min - static_cast<int>(q->ready.size());
    q->queue->Poll(want > 0 ? want : 0);
  }
  return TakeReady(q, out, max);
}

int qcow2_queue_in_flight(const qcow2_queue_t* q) {
  if (q == nullptr) return 0;
  return q->queue->in_flight() + static_cast<int>(q->ready.size());
}

qcow2_live_control_t* qcow2_live_control_create(void) {
  return new (std::nothrow) qcow2_live_control_t;
}

void qcow2_live_control_cancel(qcow2_live_control_t* c) {
  if (c != nullptr) c->control.Cancel();
}

void qcow2_live_control_destroy(qcow2_live_control_t* c) { delete c; }

int qcow2_image_live_stream(qcow2_image_t* img, int base,
                            const qcow2_live_options_t* opts, char** errptr) {
  return RunLiveJob(&qcow2::Image::LiveStream, img, base, opts, errptr);
}

int qcow2_image_live_commit(qcow2_image_t* img, int base,
                            const qcow2_live_options_t* opts, char** errptr) {
  return RunLiveJob(&qcow2::Image::LiveCommit, img, base, opts, errptr);
}

int qcow2_image_live_commit_active(qcow2_image_t* img, int base,
                                   const qcow2_live_options_t* opts,
                                   char** errptr) {
  return RunLiveJob(&qcow2::Image::LiveActiveCommit, img, base, opts, errptr);
}

}  // extern "C"
