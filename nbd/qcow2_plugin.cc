// SPDX-License-Identifier: Apache-2.0
// nbdkit-libqcow2-plugin: serves a qcow2 (or raw) image and its backing
// chain over NBD through libqcow2's public API.
//
//   nbdkit libqcow2 [file=]IMAGE [format=qcow2|raw] [readonly=true]
//          [queue=auto|true|false] [direct=true] [force-share=true]
//          [backing-root=DIR] [export=NAME]
//
// One Image per server process: it is opened (and locked, see
// OpenOptions::lock) in .get_ready, before nbdkit forks or accepts a
// client, and closed in .cleanup once every connection has ended. Every
// connection shares it, which is what makes multi-conn safe: a flush on
// any connection covers the writes completed on all of them.
//
// Thread model parallel. With queue=true each nbdkit worker thread gets
// its own qcow2::Queue (io_uring) the first time it serves a request; the
// queue lives in a per-thread holder that destroys it when the thread
// exits, and .cleanup destroys the ones still alive (threads that outlive
// their connections, the -s connection's main thread) before the image
// is closed. queue=false runs the synchronous Image calls instead.
// queue=auto (the default) picks queues with direct=true and synchronous
// calls through the page cache: there io_uring cannot write a regular
// file without handing the write to a kernel worker of the submitting
// thread's ring (and one worker at a time per file), so with a ring per
// nbdkit thread a 4 KiB write cost 60-135 us of CPU against 14 us for a
// synchronous call (bench/results/2026-12-03-nbd-serving.md). Synchronous
// writes through the page cache run at most two per CPU at a time
// (WriteGate).
#define NBDKIT_API_VERSION 2
#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
#include <nbdkit-plugin.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <semaphore>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "qcow2/image.h"
#include "qcow2/options.h"
#include "qcow2/queue.h"
#include "qcow2/version.h"

namespace {

// --- Configuration (set by .config before any thread exists) ---

struct Config {
  std::string file;          // absolute path of the image
  std::string format;        // "", "qcow2" or "raw"
  std::string export_name;   // "" accepts any name
  std::string backing_root;  // OpenOptions::backing_root
  bool readonly = false;
  int queue = -1;  // queue=: 1 true, 0 false, -1 auto (queues with direct)
  bool use_queue = true;  // what ConfigComplete decided
  bool direct = false;
  bool force_share = false;
  // key-secret-fd= and backing.key-secret-fd=, ...: OpenOptions::key_secret
  // and backing_key_secrets, wiped once the image is open.
  std::string key_secret;
  std::vector<std::string> backing_key_secrets;
};

Config g_config;

// --- The served image ---

std::unique_ptr<qcow2::Image> g_image;
uint64_t g_zero_align = 0;   // fast zero: granularity of the zero flag
bool g_fast_zero = false;    // the image has a zero flag at all
uint32_t g_preferred = 4096; // block size hint: the cluster size

// --- Per-thread queues ---

struct ThreadQueue;

// Every live holder, so .cleanup can destroy their queues before the image
// is closed. Leaked on purpose: thread exits may run after static
// destructors.
struct QueueRegistry {
  std::mutex mu;
  std::unordered_set<ThreadQueue*> holders;
  bool closed = false;  // .cleanup ran: create no more queues
};

QueueRegistry& Registry() {
  static QueueRegistry* registry = new QueueRegistry;
  return *registry;
}

struct ThreadQueue {
  std::unique_ptr<qcow2::Queue> queue;
  bool registered = false;
  ~ThreadQueue() {
    if (!registered) return;
    QueueRegistry& r = Registry();
    std::lock_guard<std::mutex> lock(r.mu);
    queue.reset();  // idle: the thread served its last request
    r.holders.erase(this);
  }
};

// This thread's queue, created on first use. nullptr with the error set
// when it cannot be created.
qcow2::Queue* ThisThreadQueue(absl::Status* error) {
  thread_local ThreadQueue holder;
  if (holder.queue != nullptr) return holder.queue.get();
  QueueRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.closed || g_image == nullptr) {
    *error = absl::FailedPreconditionError("the image is closed");
    return nullptr;
  }
  auto queue = g_image->CreateQueue(qcow2::QueueOptions{});
  if (!queue.ok()) {
    *error = queue.status();
    return nullptr;
  }
  holder.queue = std::move(queue).value();
  if (!holder.registered) {
    r.holders.insert(&holder);
    holder.registered = true;
  }
  return holder.queue.get();
}

void DestroyAllQueues() {
  QueueRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.closed = true;
  for (ThreadQueue* h : r.holders) h->queue.reset();
}

// --- Errors ---

// NBD carries only a few errno values (EPERM EIO ENOMEM EINVAL ENOSPC
// EOVERFLOW ENOTSUP ESHUTDOWN); pick the closest.
int NbdErrno(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return EINVAL;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
      return EPERM;
    case absl::StatusCode::kResourceExhausted:
      return ENOSPC;
    case absl::StatusCode::kUnimplemented:
      return ENOTSUP;
    default:
      return EIO;
  }
}

// Reports a failed request: the image, the operation and the range.
int Fail(const char* op, uint64_t offset, uint64_t count,
         const absl::Status& s) {
  const std::string msg(s.message());
  nbdkit_error("%s: %s of %" PRIu64 " bytes at offset %" PRIu64 ": %s",
               g_config.file.c_str(), op, count, offset, msg.c_str());
  nbdkit_set_error(NbdErrno(s));
  return -1;
}

// --- Running one request ---

enum class Op { kRead, kWrite, kZero, kZeroUnmap, kDiscard, kFlush };

absl::Status RunOnQueue(qcow2::Queue* q, Op op, void* buf, uint64_t count,
                        uint64_t offset) {
  absl::Status result;
  bool done = false;
  auto callback = [&result, &done](absl::Status s) {
    result = std::move(s);
    done = true;
  };
  absl::Status submitted;
  switch (op) {
    case Op::kRead:
      submitted = q->SubmitRead(
          offset, absl::MakeSpan(static_cast<uint8_t*>(buf), count), callback);
      break;
    case Op::kWrite:
      submitted = q->SubmitWrite(
          offset,
          absl::MakeConstSpan(static_cast<const uint8_t*>(buf), count),
          callback);
      break;
    case Op::kZero:
    case Op::kZeroUnmap:
      submitted =
          q->SubmitWriteZeroes(offset, count, op == Op::kZeroUnmap, callback);
      break;
    case Op::kDiscard:
      submitted = q->SubmitDiscard(offset, count, callback);
      break;
    case Op::kFlush:
      submitted = q->SubmitFlush(callback);
      break;
  }
  if (!submitted.ok()) return submitted;
  while (!done) q->Poll(1);
  return result;
}

// Synchronous writes through the page cache, at most two per CPU at a
// time; the other threads wait here, asleep. Such a write is a copy into
// the page cache under the file's inode lock (and the engine's lock
// before it): CPU work, one writer at a time in the kernel. With 16
// connections of 16 nbdkit threads, up to 256 writers queued on those
// locks and spun there for owners that were not running; gated, 4 KiB
// random writes from 16 fio jobs went from 0.77-0.82 to 0.89-0.97 of
// nbdkit's file plugin (bench/results/2026-12-05-nbd-serving.md). Reads are not
// gated: one that misses the page cache waits for the disk. Nor are
// writes with direct=true, which wait for the disk too.
// Leaked on purpose: threads may outlive static destructors.
std::counting_semaphore<>& WriteGate() {
  static auto* gate = new std::counting_semaphore<>(
      2 * std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN)));
  return *gate;
}

absl::Status RunSync(Op op, void* buf, uint64_t count, uint64_t offset) {
  qcow2::Image* img = g_image.get();
  switch (op) {
    case Op::kRead:
      return img->Read(offset,
                       absl::MakeSpan(static_cast<uint8_t*>(buf), count));
    case Op::kWrite: {
      const auto data =
          absl::MakeConstSpan(static_cast<const uint8_t*>(buf), count);
      if (g_config.direct) return img->Write(offset, data);
      WriteGate().acquire();
      absl::Status s = img->Write(offset, data);
      WriteGate().release();
      return s;
    }
    case Op::kZero:
    case Op::kZeroUnmap:
      return img->WriteZeroes(offset, count, op == Op::kZeroUnmap);
    case Op::kDiscard:
      return img->Discard(offset, count);
    case Op::kFlush:
      return img->Flush();
  }
  return absl::InternalError("unknown operation");
}

absl::Status Run(Op op, void* buf, uint64_t count, uint64_t offset) {
  if (!g_config.use_queue) return RunSync(op, buf, count, offset);
  absl::Status error;
  qcow2::Queue* q = ThisThreadQueue(&error);
  if (q == nullptr) return error;
  return RunOnQueue(q, op, buf, count, offset);
}

// Runs `op`, then a flush when the client asked for FUA.
int RunRequest(const char* name, Op op, void* buf, uint64_t count,
               uint64_t offset, uint32_t flags) {
  absl::Status s = Run(op, buf, count, offset);
  if (!s.ok()) return Fail(name, offset, count, s);
  if (flags & NBDKIT_FLAG_FUA) {
    s = Run(Op::kFlush, nullptr, 0, 0);
    if (!s.ok()) return Fail("flush (FUA)", offset, count, s);
  }
  return 0;
}

// --- Configuration callbacks ---

// The depth of a key-secret-fd key: 0 for "key-secret-fd", 1 for
// "backing.key-secret-fd" (the top's backing file), ...; -1 for others.
int SecretDepth(std::string_view key) {
  int depth = 0;
  while (key.substr(0, 8) == "backing.") {
    key.remove_prefix(8);
    ++depth;
  }
  return key == "key-secret-fd" ? depth : -1;
}

// Reads a key secret to its end from an inherited descriptor (qcowtool
// serve passes a memfd), exactly its bytes, and closes it: the secret
// never appears on a command line, where /proc would show it.
int ReadSecretFd(const char* key, const char* value, std::string* out) {
  int fd = -1;
  if (nbdkit_parse_int(key, value, &fd) == -1) return -1;
  if (fd < 0) {
    nbdkit_error("%s=%s: expected a file descriptor", key, value);
    return -1;
  }
  char buf[4096];
  ssize_t n = 0;
  while ((n = ::read(fd, buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      nbdkit_error("%s=%d: reading the secret: %m", key, fd);
      break;
    }
    out->append(buf, static_cast<size_t>(n));
  }
  explicit_bzero(buf, sizeof buf);
  ::close(fd);
  return n < 0 ? -1 : 0;
}

void WipeSecrets() {
  explicit_bzero(g_config.key_secret.data(), g_config.key_secret.size());
  g_config.key_secret.clear();
  for (std::string& s : g_config.backing_key_secrets) {
    explicit_bzero(s.data(), s.size());
  }
  g_config.backing_key_secrets.clear();
}

int Config(const char* key, const char* value) {
  if (std::strcmp(key, "file") == 0) {
    char* abs = nbdkit_absolute_path(value);  // nbdkit may chdir("/")
    if (abs == nullptr) return -1;
    g_config.file = abs;
    std::free(abs);
    return 0;
  }
  if (std::strcmp(key, "format") == 0) {
    if (std::strcmp(value, "qcow2") != 0 && std::strcmp(value, "raw") != 0) {
      nbdkit_error("format=%s: expected qcow2 or raw", value);
      return -1;
    }
    g_config.format = value;
    return 0;
  }
  if (std::strcmp(key, "export") == 0) {
    g_config.export_name = value;
    return 0;
  }
  if (std::strcmp(key, "backing-root") == 0) {
    char* abs = nbdkit_absolute_path(value);
    if (abs == nullptr) return -1;
    g_config.backing_root = abs;
    std::free(abs);
    return 0;
  }
  if (int depth = SecretDepth(key); depth == 0) {
    return ReadSecretFd(key, value, &g_config.key_secret);
  } else if (depth > 0) {
    auto& v = g_config.backing_key_secrets;
    if (v.size() < static_cast<size_t>(depth)) v.resize(depth);
    return ReadSecretFd(key, value, &v[depth - 1]);
  }
  if (std::strcmp(key, "queue") == 0) {
    if (std::strcmp(value, "auto") == 0) {
      g_config.queue = -1;
      return 0;
    }
    int b = nbdkit_parse_bool(value);
    if (b == -1) return -1;  // nbdkit_parse_bool said why
    g_config.queue = b != 0;
    return 0;
  }
  bool* flag = nullptr;
  if (std::strcmp(key, "readonly") == 0) flag = &g_config.readonly;
  if (std::strcmp(key, "direct") == 0) flag = &g_config.direct;
  if (std::strcmp(key, "force-share") == 0) flag = &g_config.force_share;
  if (flag == nullptr) {
    nbdkit_error("unknown parameter '%s' (see nbdkit libqcow2 --help)", key);
    return -1;
  }
  int b = nbdkit_parse_bool(value);
  if (b == -1) return -1;  // nbdkit_parse_bool said why
  *flag = b != 0;
  return 0;
}

int ConfigComplete() {
  if (g_config.file.empty()) {
    nbdkit_error("no image given: file=IMAGE is required");
    return -1;
  }
  if (g_config.force_share && !g_config.readonly) {
    nbdkit_error("force-share=true needs readonly=true");
    return -1;
  }
  g_config.use_queue =
      g_config.queue == -1 ? g_config.direct : g_config.queue == 1;
  return 0;
}

// Opens the image once for the whole server. Runs before nbdkit forks and
// before any connection, so a bad image or a held lock stops the server
// at start with a message naming the image.
int GetReady() {
  qcow2::OpenOptions opts;
  opts.read_write = !g_config.readonly;
  opts.format = g_config.format;
  opts.direct_io = g_config.direct;
  opts.force_share = g_config.force_share;
  opts.backing_root = g_config.backing_root;
  opts.key_secret = g_config.key_secret;
  opts.backing_key_secrets = g_config.backing_key_secrets;
  auto image = qcow2::Image::Open(g_config.file, opts);
  explicit_bzero(opts.key_secret.data(), opts.key_secret.size());
  for (std::string& k : opts.backing_key_secrets) {
    explicit_bzero(k.data(), k.size());
  }
  WipeSecrets();
  if (!image.ok()) {
    const std::string msg(image.status().message());
    nbdkit_error("opening %s: %s", g_config.file.c_str(), msg.c_str());
    return -1;
  }
  g_image = std::move(image).value();
  std::vector<qcow2::LayerInfo> chain = g_image->GetChainInfo();
  const qcow2::LayerInfo& top = chain.front();
  if (top.format == qcow2::ImageFormat::kQcow2) {
    g_preferred = top.cluster_size;
    // Version 3 clusters (subclusters with extended L2) carry a zero flag:
    // zeroing whole ones only changes metadata.
    g_fast_zero = top.version >= 3;
    g_zero_align = top.extended_l2 ? top.cluster_size / 32 : top.cluster_size;
    if (g_zero_align < 512) g_zero_align = 512;
  }
  nbdkit_debug("libqcow2 %s: %s, %d file(s) in the chain, %s, %s",
               QCOW2_VERSION_STRING, g_config.file.c_str(),
               g_image->chain_length(),
               g_image->writable() ? "read-write" : "read-only",
               g_config.use_queue ? "one queue per thread" : "synchronous");
  return 0;
}

void Cleanup() {
  DestroyAllQueues();
  if (g_image == nullptr) return;
  absl::Status s = g_image->Close();
  if (!s.ok()) {
    const std::string msg(s.message());
    nbdkit_error("closing %s: %s", g_config.file.c_str(), msg.c_str());
  }
  g_image.reset();
}

void Unload() { Cleanup(); }

// --- Exports ---

int ListExports(int readonly, int is_tls, struct nbdkit_exports* exports) {
  return nbdkit_add_export(exports, g_config.export_name.c_str(), nullptr);
}

const char* DefaultExport(int readonly, int is_tls) {
  return g_config.export_name.c_str();
}

// Connections carry no state of their own: the handle is a marker.
int g_handle_marker;

void* Open(int readonly) {
  const char* name = nbdkit_export_name();
  if (!g_config.export_name.empty() && name != nullptr &&
      g_config.export_name != name) {
    nbdkit_error("%s: no export named '%s' (this server exports '%s')",
                 g_config.file.c_str(), name, g_config.export_name.c_str());
    nbdkit_set_error(ENOENT);
    return nullptr;
  }
  if (g_image == nullptr) {
    nbdkit_error("%s: the image is not open", g_config.file.c_str());
    return nullptr;
  }
  return &g_handle_marker;
}

// --- Capabilities ---

int64_t GetSize(void*) { return static_cast<int64_t>(g_image->size()); }
int CanWrite(void*) { return g_image->writable() ? 1 : 0; }
int CanFlush(void*) { return 1; }
int CanTrim(void*) { return g_image->writable() ? 1 : 0; }
int CanZero(void*) { return 1; }
int CanFastZero(void*) { return 1; }
int CanFua(void*) { return NBDKIT_FUA_NATIVE; }
int CanMultiConn(void*) { return 1; }  // one Image for every connection
int CanExtents(void*) { return 1; }

int BlockSize(void*, uint32_t* minimum, uint32_t* preferred,
              uint32_t* maximum) {
  *minimum = 1;
  *preferred = g_preferred < 512 ? 512 : g_preferred;
  *maximum = 0xffffffff;
  return 0;
}

// --- Data ---

int Pread(void*, void* buf, uint32_t count, uint64_t offset, uint32_t) {
  return RunRequest("read", Op::kRead, buf, count, offset, 0);
}

int Pwrite(void*, const void* buf, uint32_t count, uint64_t offset,
           uint32_t flags) {
  return RunRequest("write", Op::kWrite, const_cast<void*>(buf), count,
                    offset, flags);
}

int FlushCb(void*, uint32_t) {
  return RunRequest("flush", Op::kFlush, nullptr, 0, 0, 0);
}

int Trim(void*, uint32_t count, uint64_t offset, uint32_t flags) {
  return RunRequest("trim", Op::kDiscard, nullptr, count, offset, flags);
}

// A fast zero is one that only changes metadata: the range covers whole
// clusters (or subclusters) of a version 3 qcow2 image, up to the end of
// the disk. Anything else would write zeros, so the client is told
// ENOTSUP and may pick another way.
bool ZeroIsFast(uint32_t count, uint64_t offset) {
  if (!g_fast_zero) return false;
  const uint64_t end = offset + count;
  return offset % g_zero_align == 0 &&
         (end % g_zero_align == 0 || end == g_image->size());
}

int Zero(void*, uint32_t count, uint64_t offset, uint32_t flags) {
  if ((flags & NBDKIT_FLAG_FAST_ZERO) && !ZeroIsFast(count, offset)) {
    nbdkit_set_error(ENOTSUP);
    return -1;
  }
  const Op op = (flags & NBDKIT_FLAG_MAY_TRIM) ? Op::kZeroUnmap : Op::kZero;
  return RunRequest("write zeroes", op, nullptr, count, offset, flags);
}

int Extents(void*, uint32_t count, uint64_t offset, uint32_t flags,
            struct nbdkit_extents* extents) {
  const uint64_t end = offset + count;
  uint64_t pos = offset;
  while (pos < end) {
    auto st = g_image->GetBlockStatus(pos, end - pos);
    if (!st.ok()) return Fail("block status", pos, end - pos, st.status());
    if (st->length == 0) break;
    uint32_t type = 0;
    if (!st->data) type |= NBDKIT_EXTENT_HOLE;
    if (st->zero || !st->present) type |= NBDKIT_EXTENT_ZERO;
    if (nbdkit_add_extent(extents, st->offset, st->length, type) == -1) {
      return -1;
    }
    pos = st->offset + st->length;
    if (flags & NBDKIT_FLAG_REQ_ONE) break;
  }
  return 0;
}

void DumpPlugin() {
  std::printf("libqcow2_version=%s\n", QCOW2_VERSION_STRING);
}

nbdkit_plugin MakePlugin() {
  nbdkit_plugin p{};
  p.name = "libqcow2";
  p.longname = "libqcow2 (qcow2 images and backing chains)";
  p.version = QCOW2_VERSION_STRING;
  p.description =
      "Serves a qcow2 or raw image and its backing chain through libqcow2.";
  p.unload = Unload;
  p.config = Config;
  p.config_complete = ConfigComplete;
  p.config_help =
      "[file=]IMAGE          (required) the qcow2 or raw image to serve\n"
      "format=qcow2|raw      format of IMAGE (default: probe)\n"
      "readonly=true         open the image read-only\n"
      "force-share=true      read while another process writes (readonly)\n"
      "queue=auto|true|false one io_uring queue per thread, or synchronous\n"
      "                      calls (auto: queues with direct=true only)\n"
      "direct=true           O_DIRECT for every file of the chain\n"
      "backing-root=DIR      refuse backing files outside DIR\n"
      "key-secret-fd=FD      the secret of LUKS-encrypted images: the bytes\n"
      "                      read from inherited descriptor FD\n"
      "backing.key-secret-fd=FD, backing.backing.key-secret-fd=FD ...\n"
      "                      the secret of the backing file, of its\n"
      "                      backing file, ... (default: key-secret-fd's)\n"
      "export=NAME           the export's name (other names are refused)";
  p.magic_config_key = "file";
  p.get_ready = GetReady;
  p.cleanup = Cleanup;
  p.list_exports = ListExports;
  p.default_export = DefaultExport;
  p.open = Open;
  p.get_size = GetSize;
  p.can_write = CanWrite;
  p.can_flush = CanFlush;
  p.can_trim = CanTrim;
  p.can_zero = CanZero;
  p.can_fast_zero = CanFastZero;
  p.can_fua = CanFua;
  p.can_multi_conn = CanMultiConn;
  p.can_extents = CanExtents;
  p.block_size = BlockSize;
  p.pread = Pread;
  p.pwrite = Pwrite;
  p.flush = FlushCb;
  p.trim = Trim;
  p.zero = Zero;
  p.extents = Extents;
  p.dump_plugin = DumpPlugin;
  return p;
}

nbdkit_plugin plugin = MakePlugin();

}  // namespace

NBDKIT_REGISTER_PLUGIN(plugin)
