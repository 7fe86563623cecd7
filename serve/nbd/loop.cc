// SPDX-License-Identifier: Apache-2.0
// The event loop: one thread, one io_uring for its sockets and the
// readiness of its qcow2::Queue, and the requests it runs.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "serve/nbd/conn.h"
#include "serve/nbd/protocol.h"
#include "serve/nbd/server.h"

namespace qcow2::nbd {
namespace {

constexpr unsigned kRingEntries = 1024;
// How long a stopping server waits for clients to take their replies.
constexpr int kDrainSeconds = 10;
// Descriptors per BLOCK_STATUS chunk at most; the client asks again for
// the rest.
constexpr size_t kMaxExtents = 1024;
// Request buffers kept for reuse per loop, in bytes at most.
constexpr size_t kMaxSpareBytes = 64u << 20;

}  // namespace

uint32_t NbdError(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return kEinval;
    case absl::StatusCode::kResourceExhausted:
      return kEnospc;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
      return kEperm;
    case absl::StatusCode::kUnimplemented:
      return kEnotsup;
    default:
      return kEio;
  }
}

Loop::Loop(Server* server, Image* image, int index)
    : server_(server), image_(image), index_(index) {}

absl::StatusOr<std::unique_ptr<Loop>> Loop::Create(Server* server,
                                                   Image* image, int index) {
  std::unique_ptr<Loop> loop(new Loop(server, image, index));
  io_uring_params params{};
  params.flags = IORING_SETUP_SUBMIT_ALL;
  int ret = io_uring_queue_init_params(kRingEntries, &loop->ring_, &params);
  if (ret < 0) {
    params.flags = 0;
    ret = io_uring_queue_init_params(kRingEntries, &loop->ring_, &params);
  }
  if (ret < 0) {
    return absl::ErrnoToStatus(-ret, "io_uring_queue_init for the NBD server");
  }
  loop->ring_ok_ = true;
  QueueOptions qopts;
  qopts.depth = server->options().queue_depth;
  auto queue = image->CreateQueue(qopts);
  if (!queue.ok()) return queue.status();
  loop->queue_ = std::move(queue).value();
  loop->queue_efd_ = loop->queue_->EventFd();
  if (loop->queue_efd_ < 0) {
    return absl::ErrnoToStatus(-loop->queue_efd_, "the queue's eventfd");
  }
  loop->stop_efd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (loop->stop_efd_ < 0) return absl::ErrnoToStatus(errno, "eventfd");
  const auto& fds = server->options().listen_fds;
  for (size_t i = 0; i < fds.size(); ++i) {
    loop->accept_ops_.push_back(Op{Op::kAccept, nullptr, static_cast<int>(i)});
  }
  return loop;
}

Loop::~Loop() {
  while (!conns_.empty()) delete *conns_.begin(), conns_.erase(conns_.begin());
  for (auto& list : spare_buffers_) {
    for (uint8_t* p : list) std::free(p);
  }
  if (ring_ok_) io_uring_queue_exit(&ring_);
  queue_.reset();
  if (stop_efd_ >= 0) ::close(stop_efd_);
}

// Request buffers come from per-loop free lists by power-of-two size:
// allocating a fresh 1 MiB buffer per request costs a mmap, 256 page
// faults (zeroing the pages) and a munmap each time, more than the copy
// of its bytes into the socket. Page-aligned, so O_DIRECT images need no
// bounce buffer. What the lists keep is bounded (kMaxSpareBytes).
uint8_t* Loop::TakeBuffer(size_t len, size_t* cap) {
  size_t size = kMinBuffer;
  int cls = 0;
  while (size < len) size <<= 1, ++cls;
  *cap = size;
  if (cls < kBufferClasses && !spare_buffers_[cls].empty()) {
    uint8_t* p = spare_buffers_[cls].back();
    spare_buffers_[cls].pop_back();
    spare_bytes_ -= size;
    return p;
  }
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(4096, size));
  if (p == nullptr) std::abort();  // as operator new would
  return p;
}

void Loop::GiveBuffer(uint8_t* p, size_t cap) {
  int cls = 0;
  for (size_t size = kMinBuffer; size < cap; size <<= 1) ++cls;
  if (cls >= kBufferClasses || spare_bytes_ + cap > kMaxSpareBytes) {
    std::free(p);
    return;
  }
  spare_buffers_[cls].push_back(p);
  spare_bytes_ += cap;
}

bool Loop::verbose() const { return server_->options().verbose; }

io_uring_sqe* Loop::Sqe() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  while (sqe == nullptr) {
    io_uring_submit(&ring_);
    sqe = io_uring_get_sqe(&ring_);
  }
  return sqe;
}

void Loop::PostAccept(int i) {
  io_uring_sqe* sqe = Sqe();
  io_uring_prep_accept(sqe, server_->options().listen_fds[i], nullptr,
                       nullptr, SOCK_CLOEXEC);
  io_uring_sqe_set_data(sqe, &accept_ops_[i]);
}

// A read of the queue's eventfd completes when it was readable and has
// reset it: what finishes later makes it readable again, so no wake-up is
// lost (the pattern of qcow2/queue.h, with the read on the ring).
void Loop::PostQueuePoll() {
  io_uring_sqe* sqe = Sqe();
  io_uring_prep_read(sqe, queue_efd_, &efd_buf_, sizeof efd_buf_, 0);
  io_uring_sqe_set_data(sqe, &queue_op_);
}

void Loop::Stop() {
  const uint64_t one = 1;
  // Async-signal-safe; nothing to do if it fails (the counter is set).
  [[maybe_unused]] ssize_t n = ::write(stop_efd_, &one, sizeof one);
}

void Loop::Run() {
  // Before this thread's first io_uring call (its ring's first submit).
  PrepareIoThread();
  for (size_t i = 0; i < accept_ops_.size(); ++i) PostAccept(i);
  PostQueuePoll();
  io_uring_sqe* sqe = Sqe();
  io_uring_prep_read(sqe, stop_efd_, &stop_buf_, sizeof stop_buf_, 0);
  io_uring_sqe_set_data(sqe, &stop_op_);
  std::vector<std::pair<Op*, int>> batch;
  while (!(stopping_ && conns_.empty() && queue_->in_flight() == 0 &&
           waiting_.empty())) {
    int ret = io_uring_submit_and_wait(&ring_, 1);
    if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
      error_ = absl::ErrnoToStatus(-ret, "io_uring_submit_and_wait");
      break;
    }
    batch.clear();
    io_uring_cqe* cqe;
    unsigned head;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      batch.emplace_back(static_cast<Op*>(io_uring_cqe_get_data(cqe)),
                         cqe->res);
    }
    io_uring_cq_advance(&ring_, batch.size());
    for (auto [op, res] : batch) Dispatch(op, res);
    PumpDirty();
  }
}

void Loop::Dispatch(Op* op, int res) {
  switch (op->kind) {
    case Op::kAccept:
      return OnAccept(op->index, res);
    case Op::kQueueReady:
      return OnQueueReady();
    case Op::kStop:
      return BeginStop();
    case Op::kDeadline:
      if (stopping_) {
        aborting_ = true;
        for (Conn* c : conns_) c->Abort();
      }
      return;
    case Op::kRecv:
      op->conn->OnRecv(res);
      return MarkDirty(op->conn);
    case Op::kSend:
      op->conn->OnSend(res);
      return MarkDirty(op->conn);
  }
}

void Loop::MarkDirty(Conn* conn) {
  if (conn->dirty) return;
  conn->dirty = true;
  dirty_.push_back(conn);
}

void Loop::PumpDirty() {
  std::vector<Conn*> now;
  while (!dirty_.empty()) {
    now.swap(dirty_);
    for (Conn*& c : now) {
      if (c == nullptr) continue;
      c->dirty = false;
      Conn* conn = c;
      c = nullptr;
      conn->Pump();  // may free it (ConnClosed clears it from the lists)
    }
    now.clear();
  }
}

void Loop::ConnClosed(Conn* conn) {
  std::replace(dirty_.begin(), dirty_.end(), conn, static_cast<Conn*>(nullptr));
  conns_.erase(conn);
  server_->connections().fetch_sub(1);
  delete conn;
}

void Loop::OnAccept(int i, int fd) {
  if (fd < 0) {
    if (fd != -ECANCELED) {
      std::fprintf(stderr, "qcowtool serve: accept: %s\n", std::strerror(-fd));
    }
    if (!stopping_ && fd != -EINVAL && fd != -EBADF) PostAccept(i);
    return;
  }
  if (stopping_) {
    ::close(fd);
    return;
  }
  PostAccept(i);
  const int limit = server_->options().max_connections;
  if (limit > 0 && server_->connections().fetch_add(1) >= limit) {
    server_->connections().fetch_sub(1);
    std::fprintf(stderr,
                 "qcowtool serve: refusing a client: %d connected already "
                 "(--shared %d)\n", limit, limit);
    ::close(fd);
    return;
  }
  if (limit <= 0) server_->connections().fetch_add(1);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // TCP only
  Conn* conn = new Conn(this, fd, (next_id_++) * 64 + index_);
  conns_.insert(conn);
  MarkDirty(conn);
}

void Loop::OnQueueReady() {
  while (queue_->Poll(0) > 0) {
  }
  while (!waiting_.empty() && queue_->in_flight() < queue_->depth()) {
    std::unique_ptr<Req> req = std::move(waiting_.front());
    waiting_.pop_front();
    Submit(std::move(req));
  }
  PostQueuePoll();
}

void Loop::BeginStop() {
  if (stopping_) return;
  stopping_ = true;
  for (Conn* c : conns_) {
    c->StopReading();
    MarkDirty(c);
  }
  deadline_.tv_sec = kDrainSeconds;
  io_uring_sqe* sqe = Sqe();
  io_uring_prep_timeout(sqe, &deadline_, 0, 0);
  io_uring_sqe_set_data(sqe, &deadline_op_);
}

absl::Status Loop::Finish() {
  if (ring_ok_) io_uring_queue_exit(&ring_);
  ring_ok_ = false;
  queue_.reset();  // before the caller closes the image
  return error_;
}

void Loop::Start(std::unique_ptr<Req> req) {
  Conn* conn = req->conn;
  if (req->check.error != 0) {
    const RequestCheck check = req->check;
    conn->Reply(std::move(req), check.error, check.why);
    if (check.disconnect) conn->StopReading();
    return;
  }
  switch (req->r.type) {
    case kCmdDisc:
      conn->RequestDone();
      conn->StopReading();
      return;
    case kCmdCache:
      if (req->r.length == 0) return conn->Reply(std::move(req), 0, "");
      conn->Allocate(req.get(), req->r.length);
      break;
    case kCmdBlockStatus:
      return BlockStatus(std::move(req));
    case kCmdRead:
      if (req->r.length == 0) return conn->Reply(std::move(req), 0, "");
      if (ReadIsHole(*req)) {
        OutItem item;
        PutOffsetHole(&item.head, kReplyFlagDone, req->r.cookie, req->r.offset,
                      req->r.length);
        conn->RequestDone();
        return conn->Queue(std::move(item));
      }
      conn->Allocate(req.get(), req->r.length);
      break;
    default:
      break;
  }
  if (!waiting_.empty()) {  // keep the order requests came in
    waiting_.push_back(std::move(req));
    return;
  }
  Submit(std::move(req));
}

// A read of a range that is all zeros with no data is answered with one
// OFFSET_HOLE chunk (when structured replies allow it and the client did
// not ask for one chunk), without reading.
bool Loop::ReadIsHole(const Req& req) {
  if (!req.conn->handshake().structured() || (req.r.flags & kCmdFlagDf)) {
    return false;
  }
  auto st = image_->GetBlockStatus(req.r.offset, req.r.length);
  return st.ok() && st->length >= req.r.length && !st->data &&
         (st->zero || !st->present);
}

void Loop::Submit(std::unique_ptr<Req> req) {
  Req* raw = req.get();
  Completion done = [this, raw](absl::Status s) { Done(raw, std::move(s)); };
  const Request& r = raw->r;
  absl::Status s;
  std::shared_lock<std::shared_mutex> cor;
  if (server_->many_loops() && !raw->flush_stage &&
      (r.type == kCmdWrite || r.type == kCmdTrim ||
       r.type == kCmdWriteZeroes)) {
    cor = std::shared_lock<std::shared_mutex>(server_->cor_mutex());
  }
  if (r.type == kCmdCache) {
    s = SubmitCache(raw);
  } else if (raw->flush_stage || r.type == kCmdFlush) {
    s = queue_->SubmitFlush(std::move(done));
  } else if (r.type == kCmdRead) {
    s = queue_->SubmitRead(r.offset, absl::MakeSpan(raw->buf, r.length),
                           std::move(done));
  } else if (r.type == kCmdWrite) {
    s = queue_->SubmitWrite(r.offset, absl::MakeConstSpan(raw->buf, r.length),
                            std::move(done));
  } else if (r.type == kCmdTrim) {
    s = queue_->SubmitDiscard(r.offset, r.length, std::move(done));
  } else {  // kCmdWriteZeroes
    s = queue_->SubmitWriteZeroes(r.offset, r.length,
                                  (r.flags & kCmdFlagNoHole) == 0,
                                  std::move(done));
  }
  if (s.ok()) {
    req.release();  // Done() takes it back
    return;
  }
  if (s.code() == absl::StatusCode::kResourceExhausted &&
      queue_->in_flight() > 0) {
    waiting_.push_front(std::move(req));
    return;
  }
  Conn* conn = raw->conn;
  conn->Reply(std::move(req), NbdError(s), std::string(s.message()));
}

// CACHE, as qemu-nbd does it: copy-on-read. The range is read through the
// chain into the request's buffer, and what of it comes from a backing
// layer is written into the top from that buffer, so later reads find it
// there. The writes are submitted right after the read: overlapping
// requests run in the order they were submitted, so each write starts
// when the read has filled the buffer, and any client write submitted
// after them wins. A read-only export, or a top with no backing file,
// only reads (a prefetch: the metadata and the page cache warm up).
absl::Status Loop::SubmitCache(Req* req) {
  const uint64_t start = req->r.offset, end = start + req->r.length;
  std::vector<std::pair<uint64_t, uint64_t>> copy;  // (offset, length)
  const bool writable = !server_->options().export_config.read_only &&
                        image_->writable() && image_->chain_length() > 1;
  for (uint64_t pos = start; writable && pos < end;) {
    auto st = image_->GetBlockStatus(pos, end - pos);
    if (!st.ok() || st->length == 0) break;  // the read reports errors
    if (st->depth > 0 && st->present && st->data) {
      if (!copy.empty() && copy.back().first + copy.back().second == pos) {
        copy.back().second += st->length;
      } else {
        copy.emplace_back(pos, st->length);
      }
    }
    pos += st->length;
  }
  // All or nothing when the Queue is nearly full: the caller waits.
  const size_t room = queue_->depth() - queue_->in_flight();
  if (room < 1 + copy.size()) {
    if (queue_->in_flight() > 0) {
      return absl::ResourceExhaustedError("the queue is full");
    }
    copy.resize(room - 1);
  }
  std::unique_lock<std::shared_mutex> cor;
  if (server_->many_loops() && !copy.empty()) {
    cor = std::unique_lock<std::shared_mutex>(server_->cor_mutex());
  }
  auto done = [this, req](absl::Status s) { CacheDone(req, std::move(s)); };
  absl::Status s = queue_->SubmitRead(
      start, absl::MakeSpan(req->buf, req->r.length), done);
  if (!s.ok()) return s;
  req->pending = 1;
  for (const auto& [offset, length] : copy) {
    const uint8_t* data = req->buf + (offset - start);
    if (queue_->SubmitWrite(offset, absl::MakeConstSpan(data, length), done)
            .ok()) {
      ++req->pending;
    }  // else the range stays in the backing file: CACHE is advisory
  }
  return absl::OkStatus();
}

void Loop::CacheDone(Req* raw, absl::Status s) {
  if (raw->cache_status.ok()) raw->cache_status = std::move(s);
  if (--raw->pending > 0) return;
  std::unique_ptr<Req> req(raw);
  absl::Status status = std::move(req->cache_status);
  Conn* conn = req->conn;
  conn->Reply(std::move(req), NbdError(status), std::string(status.message()));
}

void Loop::Done(Req* raw, absl::Status s) {
  std::unique_ptr<Req> req(raw);
  Conn* conn = req->conn;
  if (!s.ok()) {
    std::fprintf(stderr, "qcowtool serve: client %llu: request type %u at %llu+%u: %s\n",
                 static_cast<unsigned long long>(conn->id()), req->r.type,
                 static_cast<unsigned long long>(req->r.offset), req->r.length,
                 std::string(s.message()).c_str());
    return conn->Reply(std::move(req), NbdError(s), std::string(s.message()));
  }
  const uint16_t type = req->r.type;
  if ((req->r.flags & kCmdFlagFua) && !req->flush_stage &&
      (type == kCmdWrite || type == kCmdTrim || type == kCmdWriteZeroes)) {
    req->flush_stage = true;  // FUA: durable before the reply
    req->FreeBuffer();        // the data is written; keep no payload
    if (!waiting_.empty()) return waiting_.push_back(std::move(req));
    return Submit(std::move(req));
  }
  if (type == kCmdRead) return conn->ReplyRead(std::move(req));
  conn->Reply(std::move(req), 0, "");
}

void Loop::BlockStatus(std::unique_ptr<Req> req) {
  Conn* conn = req->conn;
  const std::vector<uint32_t>& contexts = conn->handshake().contexts();
  const ExportConfig& cfg = server_->options().export_config;
  const bool one = req->r.flags & kCmdFlagReqOne;
  OutItem item;
  for (size_t i = 0; i < contexts.size(); ++i) {
    const uint32_t id = contexts[i];
    std::vector<Extent> extents;
    uint64_t pos = req->r.offset;
    const uint64_t end = pos + req->r.length;
    while (pos < end && extents.size() < kMaxExtents) {
      uint64_t len = 0;
      uint32_t flags = 0;
      if (id == kContextBaseAllocation || id == kContextAllocationDepth) {
        auto st = image_->GetBlockStatus(pos, end - pos);
        if (!st.ok()) {
          return conn->Reply(std::move(req), NbdError(st.status()),
                             std::string(st.status().message()));
        }
        len = st->length;
        if (id == kContextBaseAllocation) {
          if (!st->data) flags |= kStateHole;
          if (st->zero || !st->present) flags |= kStateZero;
        } else {
          flags = st->present ? st->depth + 1 : 0;
        }
      } else {
        const std::string& name = cfg.bitmaps[id - kContextFirstBitmap];
        auto st = image_->GetBitmapStatus(name, pos, end - pos);
        if (!st.ok()) {
          return conn->Reply(std::move(req), NbdError(st.status()),
                             std::string(st.status().message()));
        }
        len = st->length;
        flags = st->dirty ? kStateDirty : 0;
      }
      if (len == 0) break;
      if (!extents.empty() && extents.back().flags == flags) {
        extents.back().length += static_cast<uint32_t>(len);
      } else if (one && !extents.empty()) {
        break;
      } else {
        extents.push_back(Extent{static_cast<uint32_t>(len), flags});
      }
      pos += len;
    }
    PutBlockStatus(&item.head, i + 1 == contexts.size() ? kReplyFlagDone : 0,
                   req->r.cookie, id, extents);
  }
  conn->RequestDone();
  conn->Queue(std::move(item));
}

}  // namespace qcow2::nbd
