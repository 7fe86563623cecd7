// SPDX-License-Identifier: Apache-2.0
// The server's insides: an event loop (one thread, one io_uring, one
// qcow2::Queue) and the connections it carries. Private to serve/nbd/.
#ifndef QCOW2_SERVE_NBD_CONN_H_
#define QCOW2_SERVE_NBD_CONN_H_

#include <liburing.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"
#include "serve/nbd/codec.h"
#include "serve/nbd/tls.h"

namespace qcow2::nbd {

class Conn;
class Loop;
class Server;

// What an io_uring completion is about (its user_data).
struct Op {
  enum Kind : uint8_t { kAccept, kQueueReady, kStop, kRecv, kSend, kDeadline };
  Kind kind;
  Conn* conn = nullptr;
  int index = 0;  // kAccept: which listening socket
};

// One request from parse to reply. Its buffer holds a WRITE's payload or a
// READ's data, and lives until the reply carrying it has been sent.
struct Req {
  ~Req();
  // Returns the buffer to the loop's free lists.
  void FreeBuffer();
  Conn* conn = nullptr;
  Request r;
  RequestCheck check;
  uint8_t* buf = nullptr;  // see Conn::Allocate
  size_t buf_len = 0;
  size_t buf_cap = 0;  // its size class
  bool flush_stage = false;  // FUA: the write is done, the flush runs
  // CACHE: the Queue requests not finished yet, and the first error.
  int pending = 0;
  absl::Status cache_status;
};

// One reply waiting to be sent: header bytes, then maybe a payload.
struct OutItem {
  std::string head;
  std::unique_ptr<Req> req;  // owns `payload` (READ data)
  const uint8_t* payload = nullptr;
  size_t payload_len = 0;
  size_t size() const { return head.size() + payload_len; }
};

class Conn {
 public:
  Conn(Loop* loop, int fd, uint64_t id);
  ~Conn();

  // Received `n` bytes (or 0 at EOF, or -errno) for the posted recv.
  void OnRecv(int n);
  // The posted sendmsg sent `n` bytes (or -errno).
  void OnSend(int n);
  // The server stops: read no more requests.
  void StopReading();
  // The drain deadline passed: drop whatever is left.
  void Abort();
  // Posts the recv and send the connection is ready for; frees the
  // connection when it has nothing left to do. Returns false if freed.
  bool Pump();

  void Reply(std::unique_ptr<Req> req, uint32_t error, const std::string& why);
  void ReplyRead(std::unique_ptr<Req> req);
  void Queue(OutItem item);
  void RequestDone() { --inflight_; }
  // Gives `req` a buffer of `len` bytes, counted against the connection's
  // memory bound until the Req is destroyed.
  void Allocate(Req* req, size_t len);
  void Release(size_t len) { buf_bytes_ -= len; }
  bool dirty = false;

  Loop* loop() const { return loop_; }
  uint64_t id() const { return id_; }
  const Handshake& handshake() const { return hs_; }

 private:
  void Process();
  void ProcessHandshake();
  void ProcessRequests();
  void ReceivedPayload();
  void DropPayload();
  void Log(const std::string& what);
  void Fail(const std::string& why);
  void PostRecv();
  void GatherOutput();
  size_t MsgBytes() const;
  void SendNow();
  void PostSend();
  void Sent(int n);
  bool CanClose() const;
  void CompactInput();
  // TLS: after STARTTLS's ACK, the handshake, then every byte in and out
  // through the session.
  void StartTls();
  void TlsInput();
  bool TlsDecrypt();
  void QueueRaw(std::string bytes);

  Loop* loop_;
  int fd_;
  uint64_t id_;
  Handshake hs_;
  bool transmission_ = false;

  std::vector<uint8_t> in_;
  size_t in_start_ = 0, in_end_ = 0;
  std::unique_ptr<Req> payload_req_;  // a WRITE whose payload is arriving
  size_t payload_got_ = 0;

  std::deque<OutItem> out_;
  size_t out_front_sent_ = 0;  // bytes of out_.front() already sent
  size_t out_bytes_ = 0;
  std::vector<iovec> iov_;
  msghdr msg_{};

  int inflight_ = 0;
  size_t buf_bytes_ = 0;  // payload buffers of this connection's requests
  bool recv_posted_ = false;
  bool send_posted_ = false;
  bool socket_full_ = false;   // the last send was short: the ring sends
  bool reading_done_ = false;  // EOF, DISC, a fatal error or the server stops
  bool dead_ = false;          // the socket failed: drop output
  bool shut_ = false;          // shutdown() called to end a posted recv
  Op recv_op_, send_op_;

  std::unique_ptr<TlsSession> tls_;
  bool tls_ready_ = false;       // handshake done: encrypt everything
  std::vector<uint8_t> cipher_;  // where ciphertext is received
};

class Loop {
 public:
  static absl::StatusOr<std::unique_ptr<Loop>> Create(Server* server,
                                                      Image* image, int index);
  ~Loop();

  void Run();
  void Stop();
  absl::Status Finish();

  // Runs a parsed, checked request.
  void Start(std::unique_ptr<Req> req);
  void ConnClosed(Conn* conn);
  // `conn` has something to do (output, freed capacity): pumped after the
  // current batch of completions.
  void MarkDirty(Conn* conn);

  io_uring_sqe* Sqe();
  // A page-aligned buffer of at least `len` bytes (its size in *cap), and
  // back; see loop.cc.
  uint8_t* TakeBuffer(size_t len, size_t* cap);
  void GiveBuffer(uint8_t* p, size_t cap);
  Server* server() const { return server_; }
  Image* image() const { return image_; }
  bool verbose() const;

 private:
  Loop(Server* server, Image* image, int index);
  void PostAccept(int i);
  void PostQueuePoll();
  void OnAccept(int i, int fd);
  void OnQueueReady();
  void BeginStop();
  void PumpDirty();
  void Dispatch(Op* op, int res);
  void Submit(std::unique_ptr<Req> req);
  absl::Status SubmitCache(Req* req);
  void CacheDone(Req* raw, absl::Status s);
  void Done(Req* req, absl::Status s);
  void BlockStatus(std::unique_ptr<Req> req);
  bool ReadIsHole(const Req& req);

  Server* server_;
  Image* image_;
  int index_;
  io_uring ring_{};
  bool ring_ok_ = false;
  std::unique_ptr<qcow2::Queue> queue_;
  int queue_efd_ = -1;
  int stop_efd_ = -1;
  uint64_t efd_buf_ = 0, stop_buf_ = 0;
  std::vector<Op> accept_ops_;
  Op queue_op_{Op::kQueueReady}, stop_op_{Op::kStop}, deadline_op_{Op::kDeadline};
  __kernel_timespec deadline_{};
  std::unordered_set<Conn*> conns_;
  std::vector<Conn*> dirty_;
  std::deque<std::unique_ptr<Req>> waiting_;  // the Queue was full
  bool stopping_ = false;
  bool aborting_ = false;
  uint64_t next_id_ = 0;
  // Free lists of request buffers: 4 KiB, 8 KiB, ... 32 MiB.
  static constexpr size_t kMinBuffer = 4096;
  static constexpr int kBufferClasses = 14;
  std::vector<uint8_t*> spare_buffers_[kBufferClasses];
  size_t spare_bytes_ = 0;
  absl::Status error_;
};

// The NBD error value for a library status.
uint32_t NbdError(const absl::Status& s);

}  // namespace qcow2::nbd

#endif  // QCOW2_SERVE_NBD_CONN_H_
