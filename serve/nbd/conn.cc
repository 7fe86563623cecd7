// SPDX-License-Identifier: Apache-2.0
// One client connection: receive, parse, send.
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "serve/nbd/conn.h"
#include "serve/nbd/protocol.h"
#include "serve/nbd/server.h"

namespace qcow2::nbd {
namespace {

// Handshake options reach 16 + 64 KiB; requests are 28 bytes.
constexpr size_t kInputBuffer = 128 << 10;
// Memory bound per connection: requests parsed but not yet answered, and
// payload bytes held (WRITE data being written, READ data being sent).
// Past either, the connection reads no more requests until replies go
// out, so a client that stops reading its replies stalls only itself.
constexpr int kMaxInflight = 128;
constexpr size_t kMaxBufferBytes = 64u << 20;
constexpr size_t kMaxIov = 64;

}  // namespace

Req::~Req() { FreeBuffer(); }

void Req::FreeBuffer() {
  if (buf == nullptr) return;
  conn->loop()->GiveBuffer(buf, buf_cap);
  conn->Release(buf_len);
  buf = nullptr;
  buf_len = buf_cap = 0;
}

Conn::Conn(Loop* loop, int fd, uint64_t id)
    : loop_(loop),
      fd_(fd),
      id_(id),
      hs_(&loop->server()->options().export_config,
          loop->server()->options().tls != nullptr),
      in_(kInputBuffer),
      recv_op_{Op::kRecv, this},
      send_op_{Op::kSend, this} {
  iov_.reserve(kMaxIov);
  OutItem greeting;
  Handshake::Greeting(&greeting.head);
  Queue(std::move(greeting));
  if (loop_->verbose()) Log("connected");
}

Conn::~Conn() {
  out_.clear();
  DropPayload();
  ::close(fd_);
}

void Conn::Log(const std::string& what) {
  std::fprintf(stderr, "qcowtool serve: client %llu: %s\n",
               static_cast<unsigned long long>(id_), what.c_str());
}

// A protocol violation: the stream cannot be trusted any further.
void Conn::Fail(const std::string& why) {
  Log(why + "; closing the connection");
  StopReading();
}

void Conn::Allocate(Req* req, size_t len) {
  req->buf = loop_->TakeBuffer(len, &req->buf_cap);
  req->buf_len = len;
  buf_bytes_ += len;
}

// A WRITE whose payload will never arrive whole is not run (nor answered).
void Conn::DropPayload() {
  if (payload_req_ == nullptr) return;
  payload_req_.reset();
  payload_got_ = 0;
  --inflight_;
}

void Conn::StopReading() {
  reading_done_ = true;
  DropPayload();
  if (recv_posted_ && !shut_) {
    ::shutdown(fd_, SHUT_RD);  // ends the posted recv
  }
  loop_->MarkDirty(this);
}

void Conn::Abort() {
  dead_ = true;
  reading_done_ = true;
  DropPayload();
  ::shutdown(fd_, SHUT_RDWR);
  shut_ = true;
  if (!send_posted_) {
    out_.clear();
    out_front_sent_ = 0;
    out_bytes_ = 0;
  }
  loop_->MarkDirty(this);
}

void Conn::OnRecv(int n) {
  recv_posted_ = false;
  if (n <= 0) {
    if (n < 0 && n != -ECONNRESET && !reading_done_) {
      Log(absl::StrCat("receiving: ", std::strerror(-n)));
    }
    if (payload_req_ != nullptr && !reading_done_) {
      Log("the client went away in the middle of a write payload");
    }
    reading_done_ = true;
    DropPayload();
    return;
  }
  if (reading_done_) return;  // stopping: what comes now is not served
  if (tls_ != nullptr) {
    tls_->Feed(cipher_.data(), n);
    return TlsInput();
  }
  if (payload_req_ != nullptr) {
    payload_got_ += n;
    if (payload_got_ < payload_req_->r.length) return;
    ReceivedPayload();
  } else {
    in_end_ += n;
  }
  Process();
}

void Conn::Process() {
  if (!transmission_) ProcessHandshake();
  if (transmission_) ProcessRequests();
}

void Conn::ProcessHandshake() {
  OutItem item;
  const size_t used = hs_.Consume(in_.data() + in_start_, in_end_ - in_start_,
                                  &item.head);
  in_start_ += used;
  if (!item.head.empty()) Queue(std::move(item));
  switch (hs_.phase()) {
    case Handshake::Phase::kClosed:
      if (!hs_.error().empty()) Log(hs_.error() + "; closing the connection");
      reading_done_ = true;
      break;
    case Handshake::Phase::kStartTls:
      StartTls();
      break;
    case Handshake::Phase::kTransmission:
      transmission_ = true;
      if (loop_->verbose()) {
        Log(absl::StrCat("negotiated; structured replies ",
                         hs_.structured() ? "on" : "off", ", ",
                         hs_.contexts().size(), " meta context(s)"));
      }
      break;
    default:
      break;
  }
}

void Conn::StartTls() {
  auto session = loop_->server()->options().tls->NewSession();
  if (!session.ok()) return Fail(std::string(session.status().message()));
  tls_ = std::move(session).value();
  cipher_.resize(64 << 10);
  // Whatever followed STARTTLS is the client's first TLS bytes.
  tls_->Feed(in_.data() + in_start_, in_end_ - in_start_);
  in_start_ = in_end_ = 0;
  TlsInput();
}

// New ciphertext: the handshake first; afterwards Pump decrypts.
void Conn::TlsInput() {
  if (tls_ready_) return;
  std::string err;
  const int rc = tls_->Handshake(&err);
  QueueRaw(tls_->TakeOutput());
  if (rc < 0) return Fail(err);
  if (rc == 0) return;
  tls_ready_ = true;
  hs_.TlsStarted();
  if (loop_->verbose()) Log("TLS session up");
}

// Decrypts what fits into the input buffer, or straight into a WRITE's
// payload. Returns whether anything came out.
bool Conn::TlsDecrypt() {
  bool progress = false;
  std::string err;
  while (!reading_done_) {
    uint8_t* target;
    size_t len;
    if (payload_req_ != nullptr) {
      target = payload_req_->buf + payload_got_;
      len = payload_req_->r.length - payload_got_;
    } else {
      CompactInput();
      target = in_.data() + in_end_;
      len = in_.size() - in_end_;
      if (len == 0) break;
    }
    const long n = tls_->Read(target, len, &err);
    QueueRaw(tls_->TakeOutput());
    if (n == 0) break;
    if (n < 0) {
      if (!err.empty()) Log(err + "; closing the connection");
      reading_done_ = true;
      DropPayload();
      break;
    }
    progress = true;
    if (payload_req_ != nullptr) {
      payload_got_ += n;
      if (payload_got_ == payload_req_->r.length) ReceivedPayload();
    } else {
      in_end_ += n;
    }
  }
  return progress;
}

void Conn::QueueRaw(std::string bytes) {
  if (bytes.empty() || dead_) return;
  OutItem item;
  item.head = std::move(bytes);
  out_bytes_ += item.size();
  out_.push_back(std::move(item));
  loop_->MarkDirty(this);
}

void Conn::ProcessRequests() {
  const ExportConfig& cfg = loop_->server()->options().export_config;
  while (!reading_done_ && payload_req_ == nullptr &&
         in_end_ - in_start_ >= kRequestSize && inflight_ < kMaxInflight &&
         buf_bytes_ < kMaxBufferBytes) {
    auto req = std::make_unique<Req>();
    req->conn = this;
    if (!ParseRequest(in_.data() + in_start_, &req->r)) {
      return Fail("bad request magic");
    }
    in_start_ += kRequestSize;
    req->check = CheckRequest(req->r, cfg, hs_.structured(),
                              !hs_.contexts().empty());
    ++inflight_;
    if (req->check.error != 0) {
      Log(absl::StrCat("request type ", req->r.type, " at ", req->r.offset,
                       "+", req->r.length, " flags 0x",
                       absl::Hex(req->r.flags), ": ", req->check.why));
    }
    const uint32_t payload = req->check.payload;
    if (payload > 0) {
      Allocate(req.get(), payload);
      const size_t have = std::min<size_t>(in_end_ - in_start_, payload);
      std::memcpy(req->buf, in_.data() + in_start_, have);
      in_start_ += have;
      payload_got_ = have;
      payload_req_ = std::move(req);
      // The rest is received straight into the buffer (PostRecv).
      if (payload_got_ < payload) return;
      ReceivedPayload();
      continue;
    }
    loop_->Start(std::move(req));
  }
}

void Conn::ReceivedPayload() {
  std::unique_ptr<Req> req = std::move(payload_req_);
  payload_got_ = 0;
  loop_->Start(std::move(req));
}

void Conn::Reply(std::unique_ptr<Req> req, uint32_t error,
                 const std::string& why) {
  OutItem item;
  const Request& r = req->r;
  const bool chunk = hs_.structured() &&
                     (r.type == kCmdRead || r.type == kCmdBlockStatus);
  if (chunk && error != 0) {
    const uint64_t offset = r.offset;
    PutErrorChunk(&item.head, r.cookie, error, why,
                  r.type == kCmdRead && r.length > 0 ? &offset : nullptr);
  } else if (chunk) {
    PutChunkHeader(&item.head, kReplyFlagDone, kReplyNone, r.cookie, 0);
  } else {
    PutSimpleReply(&item.head, r.cookie, error);
  }
  --inflight_;
  Queue(std::move(item));
}

void Conn::ReplyRead(std::unique_ptr<Req> req) {
  OutItem item;
  const Request& r = req->r;
  if (hs_.structured()) {
    PutOffsetDataHeader(&item.head, kReplyFlagDone, r.cookie, r.offset,
                        r.length);
  } else {
    PutSimpleReply(&item.head, r.cookie, 0);
  }
  item.payload = req->buf;
  item.payload_len = r.length;
  item.req = std::move(req);
  --inflight_;
  Queue(std::move(item));
}

void Conn::Queue(OutItem item) {
  loop_->MarkDirty(this);
  if (dead_) return;  // the socket failed: nobody to tell
  if (tls_ready_) {
    const bool ok = tls_->Write(item.head.data(), item.head.size()) &&
                    tls_->Write(item.payload, item.payload_len);
    if (!ok) return Fail("TLS: cannot encrypt a reply");
    return QueueRaw(tls_->TakeOutput());  // the payload buffer goes now
  }
  out_bytes_ += item.size();
  out_.push_back(std::move(item));
}

void Conn::CompactInput() {
  if (in_start_ == in_end_) {
    in_start_ = in_end_ = 0;
  } else if (in_start_ > 0 && in_.size() - in_end_ < kRequestSize * 64) {
    std::memmove(in_.data(), in_.data() + in_start_, in_end_ - in_start_);
    in_end_ -= in_start_;
    in_start_ = 0;
  }
}

void Conn::PostRecv() {
  uint8_t* target;
  size_t len;
  int flags = 0;
  if (payload_req_ != nullptr) {
    target = payload_req_->buf + payload_got_;
    len = payload_req_->r.length - payload_got_;
    // One completion for the whole payload (io_uring retries short
    // receives itself), not one per segment that arrives.
    flags = MSG_WAITALL;
  } else {
    CompactInput();
    target = in_.data() + in_end_;
    len = in_.size() - in_end_;
    if (len == 0) return Fail("an option or request larger than the buffer");
  }
  if (tls_ != nullptr) {  // ciphertext, decrypted in Pump
    target = cipher_.data();
    len = cipher_.size();
    flags = 0;
  }
  io_uring_sqe* sqe = loop_->Sqe();
  io_uring_prep_recv(sqe, fd_, target, len, flags);
  io_uring_sqe_set_data(sqe, &recv_op_);
  recv_posted_ = true;
}

// The queued replies, as many as fit in kMaxIov segments, into msg_.
void Conn::GatherOutput() {
  iov_.clear();
  size_t skip = out_front_sent_;
  for (const OutItem& item : out_) {
    if (iov_.size() + 2 > kMaxIov) break;
    if (skip < item.head.size()) {
      iov_.push_back({const_cast<char*>(item.head.data()) + skip,
                      item.head.size() - skip});
      skip = 0;
    } else {
      skip -= item.head.size();
    }
    if (item.payload_len > skip) {
      iov_.push_back({const_cast<uint8_t*>(item.payload) + skip,
                      item.payload_len - skip});
    }
    skip = 0;
  }
  msg_ = msghdr{};
  msg_.msg_iov = iov_.data();
  msg_.msg_iovlen = iov_.size();
}

// The replies gathered in this turn go out in one sendmsg, right away:
// a send posted on the ring would complete at once too, but its
// completion costs the loop one more turn (one more io_uring_enter) per
// request at queue depth 1. Only what the socket cannot take now (its
// buffer is full) is left to a sendmsg on the ring, which waits for room;
// while the socket stays full, the ring sends without trying here first.
void Conn::SendNow() {
  while (!out_.empty() && !dead_ && !socket_full_) {
    GatherOutput();
    const ssize_t n = ::sendmsg(fd_, &msg_, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      socket_full_ = true;
      break;
    }
    const size_t wanted = MsgBytes();
    Sent(n < 0 ? -errno : static_cast<int>(n));
    if (n >= 0 && static_cast<size_t>(n) < wanted) socket_full_ = true;
  }
  if (!out_.empty() && !dead_) PostSend();
}

size_t Conn::MsgBytes() const {
  size_t total = 0;
  for (size_t i = 0; i < msg_.msg_iovlen; ++i) total += iov_[i].iov_len;
  return total;
}

void Conn::PostSend() {
  GatherOutput();
  io_uring_sqe* sqe = loop_->Sqe();
  // MSG_WAITALL: the ring retries a short send itself (kernels since
  // 5.19; older ones complete it short, and OnSend posts the rest).
  io_uring_prep_sendmsg(sqe, fd_, &msg_, MSG_NOSIGNAL | MSG_WAITALL);
  io_uring_sqe_set_data(sqe, &send_op_);
  send_posted_ = true;
}

void Conn::OnSend(int n) {
  send_posted_ = false;
  // All of it went: the socket has room again (as far as we know).
  if (n >= 0 && static_cast<size_t>(n) == MsgBytes()) socket_full_ = false;
  Sent(n);
}

// Accounts for `n` bytes sent (or -errno) from the front of out_.
void Conn::Sent(int n) {
  if (n < 0) {
    if (n != -EPIPE && n != -ECONNRESET && !dead_) {
      Log(absl::StrCat("sending: ", std::strerror(-n)));
    }
    dead_ = true;
    reading_done_ = true;
    DropPayload();
    out_.clear();
    out_front_sent_ = 0;
    out_bytes_ = 0;
    return;
  }
  if (dead_) {
    out_.clear();
    out_front_sent_ = 0;
    out_bytes_ = 0;
    return;
  }
  size_t left = n;
  out_bytes_ -= left;
  while (left > 0) {
    const size_t rest = out_.front().size() - out_front_sent_;
    if (left < rest) {
      out_front_sent_ += left;
      break;
    }
    left -= rest;
    out_.pop_front();
    out_front_sent_ = 0;
  }
}

bool Conn::CanClose() const {
  return reading_done_ && inflight_ == 0 && payload_req_ == nullptr &&
         !send_posted_ && (out_.empty() || dead_);
}

bool Conn::Pump() {
  if (tls_ready_) {
    while (!reading_done_ && TlsDecrypt()) Process();
  }
  if (transmission_ && !reading_done_ && payload_req_ == nullptr) {
    ProcessRequests();  // requests held back by the bounds may go now
  }
  if (!reading_done_ && !recv_posted_ && inflight_ < kMaxInflight &&
      buf_bytes_ < kMaxBufferBytes && out_bytes_ < kMaxBufferBytes) {
    PostRecv();
  }
  if (!send_posted_ && !out_.empty() && !dead_) SendNow();
  if (!CanClose()) return true;
  if (recv_posted_) {
    if (!shut_) {
      ::shutdown(fd_, SHUT_RDWR);  // ends the posted recv; then we close
      shut_ = true;
    }
    return true;
  }
  if (loop_->verbose()) Log("disconnected");
  loop_->ConnClosed(this);
  return false;
}

}  // namespace qcow2::nbd
