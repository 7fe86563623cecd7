// SPDX-License-Identifier: Apache-2.0
// vhost_bench: a vhost-user-blk front-end for measuring back-ends without
// a VMM (no KVM needed): it shares a memfd as guest memory, sets up N
// split virtqueues of depth D, keeps them full of virtio-blk requests
// from one thread per queue, and reports IOPS and the back-end's CPU
// time per request (from /proc/PID/stat, all its threads).
//
//   vhost_bench --socket S --pid P [--queues N] [--depth D] [--bs B]
//               [--rw randread|randwrite|read|write] [--seconds T]
//   vhost_bench --socket S --verify     writes a pattern through every
//               queue (batches of neighbouring blocks, each under one
//               kick), flushes, reads it back and compares (exit 1 on a
//               mismatch); the image then holds the pattern (see
//               bench/vhost_bench.sh, which checks it with qemu-img).
//
// Output: one line "iops=... mbps=... cpu_us_per_req=... requests=...".
#include <linux/virtio_blk.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "serve/vhost/protocol.h"
#include "serve/vhost/wire.h"

namespace qcow2::vhost {
namespace {

struct Args {
  std::string socket;
  int pid = 0;
  int queues = 1;
  int depth = 32;
  uint32_t bs = 4096;
  std::string rw = "randread";
  double seconds = 5;
  bool verify = false;
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "vhost_bench: %s\n", what.c_str());
  std::exit(2);
}

int sock_fd = -1;

void Send(uint32_t request, const std::vector<uint8_t>& payload,
          const std::vector<int>& fds = {}) {
  std::vector<uint8_t> msg(kHeaderSize);
  StoreLe32(msg.data(), request);
  StoreLe32(msg.data() + 4, kVersion);
  StoreLe32(msg.data() + 8, static_cast<uint32_t>(payload.size()));
  msg.insert(msg.end(), payload.begin(), payload.end());
  iovec iov{msg.data(), msg.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  if (!fds.empty()) {
    mh.msg_control = control;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  if (::sendmsg(sock_fd, &mh, MSG_NOSIGNAL) != static_cast<ssize_t>(msg.size())) {
    Die("sendmsg: " + std::string(std::strerror(errno)));
  }
}

std::vector<uint8_t> Receive(uint32_t request) {
  uint8_t h[kHeaderSize];
  if (::recv(sock_fd, h, sizeof h, MSG_WAITALL) != sizeof h) Die("no reply");
  if (LoadLe32(h) != request) Die("reply to another request");
  std::vector<uint8_t> p(LoadLe32(h + 8));
  if (!p.empty() && ::recv(sock_fd, p.data(), p.size(), MSG_WAITALL) !=
                        static_cast<ssize_t>(p.size())) {
    Die("short reply");
  }
  return p;
}

std::vector<uint8_t> U64(uint64_t v) {
  std::vector<uint8_t> p(8);
  StoreLe64(p.data(), v);
  return p;
}

std::vector<uint8_t> State(uint32_t index, uint32_t num) {
  std::vector<uint8_t> p(8);
  StoreLe32(p.data(), index);
  StoreLe32(p.data() + 4, num);
  return p;
}

// One virtqueue and its requests' buffers in the shared memory.
struct Vq {
  uint8_t* desc = nullptr;
  uint8_t* avail = nullptr;
  uint8_t* used = nullptr;
  uint8_t* bufs = nullptr;  // per slot: 16-byte header, status, data
  int kick = -1, call = -1;
  uint16_t num = 0, avail_idx = 0, used_seen = 0;
  uint64_t done = 0;
  uint64_t rng = 0;
  uint64_t next_seq = 0;
};

uint8_t* base = nullptr;
uint64_t capacity = 0;
size_t slot_bytes = 0;

uint64_t Gpa(const void* p) { return static_cast<const uint8_t*>(p) - base; }

uint8_t* Slot(Vq& q, int i) { return q.bufs + slot_bytes * i; }

// Descriptors 3i..3i+2 make request i: header, data, status.
void Fill(Vq& q, int i, uint32_t type, uint64_t offset, uint32_t len) {
  uint8_t* s = Slot(q, i);
  StoreLe32(s, type);
  StoreLe32(s + 4, 0);
  StoreLe64(s + 8, offset / 512);
  s[16] = 0xff;
  const bool in = type == VIRTIO_BLK_T_IN;
  auto desc = [&](int d, uint64_t addr, uint32_t l, uint16_t flags, uint16_t next) {
    uint8_t* p = q.desc + 16 * d;
    StoreLe64(p, addr);
    StoreLe32(p + 8, l);
    StoreLe16(p + 12, flags);
    StoreLe16(p + 14, next);
  };
  const int d0 = 3 * i;
  if (len == 0) {
    desc(d0, Gpa(s), 16, 1, d0 + 2);
  } else {
    desc(d0, Gpa(s), 16, 1, d0 + 1);
    desc(d0 + 1, Gpa(s + 64), len, (in ? 2 : 0) | 1, d0 + 2);
  }
  desc(d0 + 2, Gpa(s + 16), 1, 2, 0);
  StoreLe16(q.avail + 4 + 2 * (q.avail_idx % q.num), d0);
  ++q.avail_idx;
}

void Publish(Vq& q) {
  __atomic_store_n(reinterpret_cast<uint16_t*>(q.avail + 2), q.avail_idx,
                   __ATOMIC_RELEASE);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  uint64_t one = 1;
  (void)!::write(q.kick, &one, sizeof one);
}

// Reaps used entries; returns the slots freed.
int Reap(Vq& q, std::vector<int>* freed, bool check) {
  const uint16_t idx =
      __atomic_load_n(reinterpret_cast<uint16_t*>(q.used + 2), __ATOMIC_ACQUIRE);
  int n = 0;
  while (q.used_seen != idx) {
    const uint32_t id = LoadLe32(q.used + 4 + 8 * (q.used_seen % q.num));
    const int slot = static_cast<int>(id / 3);
    if (check && Slot(q, slot)[16] != VIRTIO_BLK_S_OK) Die("request failed");
    freed->push_back(slot);
    ++q.used_seen;
    ++n;
  }
  return n;
}

void WaitCall(Vq& q) {
  pollfd p{q.call, POLLIN, 0};
  ::poll(&p, 1, 100);
  uint64_t n;
  (void)!::read(q.call, &n, sizeof n);
}

uint64_t NextOffset(Vq& q, const Args& a, int qi) {
  const uint64_t blocks = capacity / a.bs;
  if (a.rw == "randread" || a.rw == "randwrite") {
    q.rng ^= q.rng << 13;
    q.rng ^= q.rng >> 7;
    q.rng ^= q.rng << 17;
    return (q.rng % blocks) * a.bs;
  }
  // Sequential: each queue its own stripe of the disk.
  const uint64_t per = blocks / a.queues;
  return ((qi * per) + (q.next_seq++ % per)) * a.bs;
}

void RunQueue(Vq& q, const Args& a, int qi, std::atomic<bool>* stop) {
  const uint32_t type = (a.rw == "randwrite" || a.rw == "write")
                            ? VIRTIO_BLK_T_OUT : VIRTIO_BLK_T_IN;
  std::vector<int> freed;
  for (int i = 0; i < a.depth; ++i) Fill(q, i, type, NextOffset(q, a, qi), a.bs);
  Publish(q);
  int in_flight = a.depth;
  while (in_flight > 0) {
    freed.clear();
    if (Reap(q, &freed, true) == 0) {
      WaitCall(q);
      continue;
    }
    q.done += freed.size();
    in_flight -= freed.size();
    if (stop->load(std::memory_order_relaxed)) continue;
    for (int s : freed) Fill(q, s, type, NextOffset(q, a, qi), a.bs);
    in_flight += freed.size();
    Publish(q);
  }
}

// One request on queue q, waited for.
void RunOne(Vq& q, uint32_t type, uint64_t off, uint32_t len) {
  Fill(q, 0, type, off, len);
  Publish(q);
  std::vector<int> freed;
  while (Reap(q, &freed, true) == 0) WaitCall(q);
}

uint8_t PatternByte(uint64_t off) { return static_cast<uint8_t>((off >> 9) * 7 + (off & 511)); }

int Verify(std::vector<Vq>& vqs, uint32_t bs, int depth) {
  const uint64_t span = std::min<uint64_t>(capacity, 8 << 20);
  // Batches of up to 8 writes of neighbouring blocks under one kick (which
  // the back-end may merge), one queue after another; within a batch the
  // blocks go 0, 1, 3, 2, 4, ...: a run broken by a gap, then filled.
  const int batch = std::min(depth, 8);
  constexpr int kOrder[8] = {0, 1, 3, 2, 4, 5, 6, 7};
  std::vector<int> freed;
  for (uint64_t off = 0, b = 0; off < span; ++b) {
    Vq& q = vqs[b % vqs.size()];
    const uint64_t blocks = std::min<uint64_t>(batch, (span - off) / bs);
    if (blocks == 0) break;
    int put = 0;
    for (int i = 0; i < batch; ++i) {
      const uint64_t k = blocks == static_cast<uint64_t>(batch) ? kOrder[i] : i;
      if (k >= blocks) continue;
      const uint64_t at = off + k * bs;
      uint8_t* data = Slot(q, put) + 64;
      for (uint32_t j = 0; j < bs; ++j) data[j] = PatternByte(at + j);
      Fill(q, put++, VIRTIO_BLK_T_OUT, at, bs);
    }
    Publish(q);
    for (int got = 0; got < put;) {
      freed.clear();
      const int n = Reap(q, &freed, true);
      if (n == 0) WaitCall(q);
      got += n;
    }
    off += blocks * bs;
  }
  RunOne(vqs[0], VIRTIO_BLK_T_FLUSH, 0, 0);
  for (uint64_t off = 0, i = 0; off < span; off += bs, ++i) {
    Vq& q = vqs[(i + 1) % vqs.size()];
    uint8_t* data = Slot(q, 0) + 64;
    std::memset(data, 0, bs);
    RunOne(q, VIRTIO_BLK_T_IN, off, bs);
    for (uint32_t j = 0; j < bs; ++j) {
      if (data[j] != PatternByte(off + j)) {
        std::fprintf(stderr, "vhost_bench: byte %llu reads %u, wrote %u\n",
                     static_cast<unsigned long long>(off + j), data[j],
                     PatternByte(off + j));
        return 1;
      }
    }
  }
  std::printf("verified %llu bytes\n", static_cast<unsigned long long>(span));
  return 0;
}

double CpuSeconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), {});
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> f;
  size_t pos = close + 2;
  while (pos < s.size()) {
    size_t sp = s.find(' ', pos);
    f.push_back(s.substr(pos, sp - pos));
    if (sp == std::string::npos) break;
    pos = sp + 1;
  }
  // Fields 14 and 15 (utime, stime) are f[11] and f[12] here.
  return (std::stod(f[11]) + std::stod(f[12])) / sysconf(_SC_CLK_TCK);
}

int Main(const Args& a) {
  sock_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  a.socket.copy(addr.sun_path, sizeof addr.sun_path - 1);
  if (::connect(sock_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    Die("connect " + a.socket + ": " + std::strerror(errno));
  }
  uint16_t num = 1;
  while (num < 3 * a.depth) num <<= 1;
  slot_bytes = 64 + ((a.bs + 4095) & ~4095u);
  const size_t ring_bytes = 16 * num + 4096 + 8 * num + 4096 + 4096;
  const size_t per_q = ((ring_bytes + 4095) & ~4095ul) + slot_bytes * a.depth;
  const size_t mem_bytes = per_q * a.queues;
  const int memfd = ::memfd_create("vhost_bench", MFD_CLOEXEC);
  if (memfd < 0 || ::ftruncate(memfd, mem_bytes) != 0) Die("memfd");
  base = static_cast<uint8_t*>(
      ::mmap(nullptr, mem_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0));
  if (base == MAP_FAILED) Die("mmap");

  Send(kSetOwner, {});
  Send(kGetFeatures, {});
  const uint64_t offered = LoadLe64(Receive(kGetFeatures).data());
  const uint64_t want = (1ull << kFeatureVersion1) | (1ull << kFeatureProtocolFeatures);
  if ((offered & want) != want) Die("back-end lacks VERSION_1 or PROTOCOL_FEATURES");
  Send(kSetFeatures, U64(want | (offered & (1ull << VIRTIO_BLK_F_FLUSH))));
  Send(kGetProtocolFeatures, {});
  const uint64_t proto = LoadLe64(Receive(kGetProtocolFeatures).data());
  Send(kSetProtocolFeatures,
       U64(proto & ((1ull << kProtocolMq) | (1ull << kProtocolConfig))));
  Send(kGetQueueNum, {});
  if (LoadLe64(Receive(kGetQueueNum).data()) < static_cast<uint64_t>(a.queues)) {
    Die("back-end offers fewer queues");
  }
  std::vector<uint8_t> cfg(12 + 60, 0);
  StoreLe32(cfg.data() + 4, 60);
  Send(kGetConfig, cfg);
  capacity = LoadLe64(Receive(kGetConfig).data() + 12) * 512;
  std::vector<uint8_t> mt(8 + 32, 0);
  StoreLe32(mt.data(), 1);
  StoreLe64(mt.data() + 8, 0);
  StoreLe64(mt.data() + 16, mem_bytes);
  StoreLe64(mt.data() + 24, reinterpret_cast<uint64_t>(base));
  StoreLe64(mt.data() + 32, 0);
  Send(kSetMemTable, mt, {memfd});

  std::vector<Vq> vqs(a.queues);
  for (int i = 0; i < a.queues; ++i) {
    Vq& q = vqs[i];
    uint8_t* p = base + per_q * i;
    q.num = num;
    q.desc = p;
    q.avail = p + ((16 * num + 4095) & ~4095ul);
    q.used = q.avail + 8192;  // avail (6 + 2 * num bytes) fits below
    q.bufs = p + ((ring_bytes + 4095) & ~4095ul);
    q.kick = ::eventfd(0, EFD_CLOEXEC);
    q.call = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    q.rng = 0x9e3779b97f4a7c15ull * (i + 1);
    Send(kSetVringNum, State(i, num));
    Send(kSetVringBase, State(i, 0));
    std::vector<uint8_t> va(40, 0);
    StoreLe32(va.data(), i);
    StoreLe64(va.data() + 8, reinterpret_cast<uint64_t>(q.desc));
    StoreLe64(va.data() + 16, reinterpret_cast<uint64_t>(q.used));
    StoreLe64(va.data() + 24, reinterpret_cast<uint64_t>(q.avail));
    Send(kSetVringAddr, va);
    Send(kSetVringCall, U64(i), {q.call});
    Send(kSetVringKick, U64(i), {q.kick});
    Send(kSetVringEnable, State(i, 1));
  }
  if (a.verify) return Verify(vqs, a.bs, a.depth);

  std::atomic<bool> stop{false};
  const double cpu0 = a.pid ? CpuSeconds(a.pid) : 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < a.queues; ++i) {
    threads.emplace_back([&, i] { RunQueue(vqs[i], a, i, &stop); });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(a.seconds));
  stop = true;
  for (auto& t : threads) t.join();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = a.pid ? CpuSeconds(a.pid) - cpu0 : 0;
  uint64_t reqs = 0;
  for (const Vq& q : vqs) reqs += q.done;
  std::printf("iops=%.0f mbps=%.1f cpu_us_per_req=%.2f requests=%llu\n",
              reqs / secs, reqs * double(a.bs) / secs / 1e6,
              reqs ? cpu * 1e6 / reqs : 0.0, static_cast<unsigned long long>(reqs));
  return 0;
}

}  // namespace
}  // namespace qcow2::vhost

int main(int argc, char** argv) {
  qcow2::vhost::Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&] {
      if (i + 1 >= argc) qcow2::vhost::Die(k + " needs a value");
      return std::string(argv[++i]);
    };
    if (k == "--socket") a.socket = val();
    else if (k == "--pid") a.pid = std::stoi(val());
    else if (k == "--queues") a.queues = std::stoi(val());
    else if (k == "--depth") a.depth = std::stoi(val());
    else if (k == "--bs") a.bs = std::stoul(val());
    else if (k == "--rw") a.rw = val();
    else if (k == "--seconds") a.seconds = std::stod(val());
    else if (k == "--verify") a.verify = true;
    else qcow2::vhost::Die("unknown option " + k);
  }
  if (a.socket.empty()) qcow2::vhost::Die("--socket is required");
  return qcow2::vhost::Main(a);
}
