// SPDX-License-Identifier: Apache-2.0
// nbdkit-rawdirect-plugin: a bench-only nbdkit plugin that serves a raw
// file with O_DIRECT and nothing else: each request is one pread or
// pwrite on the nbdkit worker thread that received it. It is the
// ceiling of nbdkit's thread-per-request model for O_DIRECT servers,
// which bench/nbd_bench.py sets beside `qcowtool serve --direct` (the
// `raw-nbdkit-direct` server): no format, no queue, no library. Debian
// 12's nbdkit `file` plugin cannot open a file with O_DIRECT.
//
//   nbdkit bench/nbdkit-rawdirect-plugin.so [file=]RAWFILE
//
// Requests must be 4 KiB aligned in offset and length (the block size
// advertised to clients; O_DIRECT needs it); others fail with EINVAL.
// Buffers nbdkit hands us are not page aligned, so data goes through a
// 4 KiB-aligned buffer per thread. Flush is fdatasync; FUA is emulated
// by nbdkit with a flush. Not installed.
#define NBDKIT_API_VERSION 2
#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
#include <fcntl.h>
#include <nbdkit-plugin.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

constexpr uint32_t kAlign = 4096;

std::string g_file;
int g_fd = -1;
bool g_readonly = false;

int Config(const char* key, const char* value) {
  if (std::strcmp(key, "file") != 0) {
    nbdkit_error("unknown parameter '%s' (only file=RAWFILE)", key);
    return -1;
  }
  char* abs = nbdkit_absolute_path(value);
  if (abs == nullptr) return -1;
  g_file = abs;
  std::free(abs);
  return 0;
}

int ConfigComplete() {
  if (g_file.empty()) {
    nbdkit_error("no file given: file=RAWFILE is required");
    return -1;
  }
  return 0;
}

int GetReady() {
  g_fd = open(g_file.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (g_fd == -1 && errno == EACCES) {
    g_readonly = true;
    g_fd = open(g_file.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  }
  if (g_fd == -1) {
    nbdkit_error("opening %s with O_DIRECT: %m", g_file.c_str());
    return -1;
  }
  return 0;
}

void Unload() {
  if (g_fd != -1) close(g_fd);
}

int g_handle;
void* Open(int) { return &g_handle; }

int64_t GetSize(void*) {
  struct stat st;
  if (fstat(g_fd, &st) == -1) {
    nbdkit_error("fstat %s: %m", g_file.c_str());
    return -1;
  }
  return st.st_size;
}

int CanWrite(void*) { return g_readonly ? 0 : 1; }
int CanFlush(void*) { return 1; }
int CanMultiConn(void*) { return 1; }  // one fd: a flush covers all
int CanFua(void*) { return NBDKIT_FUA_EMULATE; }

int BlockSize(void*, uint32_t* minimum, uint32_t* preferred,
              uint32_t* maximum) {
  *minimum = kAlign;
  *preferred = kAlign;
  *maximum = 32 << 20;
  return 0;
}

// This thread's aligned buffer, grown to at least `count` bytes.
uint8_t* Bounce(uint32_t count) {
  thread_local void* buf = nullptr;
  thread_local uint32_t size = 0;
  if (size < count) {
    std::free(buf);
    buf = nullptr;
    size = 0;
    if (posix_memalign(&buf, kAlign, count) != 0) return nullptr;
    size = count;
  }
  return static_cast<uint8_t*>(buf);
}

bool Aligned(const char* op, uint32_t count, uint64_t offset) {
  if (offset % kAlign == 0 && count % kAlign == 0) return true;
  nbdkit_error("%s of %" PRIu32 " bytes at %" PRIu64
               ": not 4 KiB aligned (O_DIRECT)", op, count, offset);
  nbdkit_set_error(EINVAL);
  return false;
}

int Pread(void*, void* buf, uint32_t count, uint64_t offset, uint32_t) {
  if (!Aligned("read", count, offset)) return -1;
  uint8_t* b = Bounce(count);
  if (b == nullptr) {
    nbdkit_set_error(ENOMEM);
    return -1;
  }
  for (uint32_t done = 0; done < count;) {
    ssize_t r = pread(g_fd, b + done, count - done, offset + done);
    if (r == -1 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = EIO;  // past the end of the file
      nbdkit_error("pread %s at %" PRIu64 ": %m", g_file.c_str(),
                   offset + done);
      return -1;
    }
    done += static_cast<uint32_t>(r);
  }
  std::memcpy(buf, b, count);
  return 0;
}

int Pwrite(void*, const void* buf, uint32_t count, uint64_t offset,
           uint32_t) {
  if (!Aligned("write", count, offset)) return -1;
  uint8_t* b = Bounce(count);
  if (b == nullptr) {
    nbdkit_set_error(ENOMEM);
    return -1;
  }
  std::memcpy(b, buf, count);
  for (uint32_t done = 0; done < count;) {
    ssize_t r = pwrite(g_fd, b + done, count - done, offset + done);
    if (r == -1 && errno == EINTR) continue;
    if (r == -1) {
      nbdkit_error("pwrite %s at %" PRIu64 ": %m", g_file.c_str(),
                   offset + done);
      return -1;
    }
    done += static_cast<uint32_t>(r);
  }
  return 0;
}

int Flush(void*, uint32_t) {
  if (fdatasync(g_fd) == -1) {
    nbdkit_error("fdatasync %s: %m", g_file.c_str());
    return -1;
  }
  return 0;
}

nbdkit_plugin MakePlugin() {
  nbdkit_plugin p{};
  p.name = "rawdirect";
  p.longname = "raw file with O_DIRECT (qcowtool's bench ceiling)";
  p.version = "1";
  p.description = "Serves a raw file with O_DIRECT, one pread/pwrite a "
                  "request (bench only).";
  p.config = Config;
  p.config_complete = ConfigComplete;
  p.config_help = "[file=]RAWFILE   (required) the raw file to serve";
  p.magic_config_key = "file";
  p.get_ready = GetReady;
  p.unload = Unload;
  p.open = Open;
  p.get_size = GetSize;
  p.can_write = CanWrite;
  p.can_flush = CanFlush;
  p.can_multi_conn = CanMultiConn;
  p.can_fua = CanFua;
  p.block_size = BlockSize;
  p.pread = Pread;
  p.pwrite = Pwrite;
  p.flush = Flush;
  return p;
}

nbdkit_plugin plugin = MakePlugin();

}  // namespace

NBDKIT_REGISTER_PLUGIN(plugin)
