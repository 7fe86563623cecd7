// SPDX-License-Identifier: Apache-2.0
// The public Queue: a thin facade over internal::QueueImpl.
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/engine/queue_impl.h"
#include "lib/io/ring.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"

namespace qcow2 {

using internal::Request;

namespace {

std::unique_ptr<Request> NewRequest(internal::QueueImpl* q, Request::Kind kind,
                                    uint64_t offset, uint64_t len) {
  std::unique_ptr<Request> r = q->NewRequest();
  r->kind = kind;
  r->offset = offset;
  r->len = len;
  return r;
}

}  // namespace

Queue::Queue(std::unique_ptr<internal::QueueImpl> impl)
    : impl_(std::move(impl)) {}
Queue::~Queue() = default;

void PrepareIoThread() { internal::JoinSharedIoWorkers(); }

absl::Status Queue::SubmitRead(uint64_t offset, absl::Span<uint8_t> buf,
                               Completion done) {
  auto r = NewRequest(impl_.get(), Request::Kind::kRead, offset, buf.size());
  r->rbuf = buf.data();
  r->done = std::move(done);
  return impl_->Submit(std::move(r));
}

absl::Status Queue::SubmitWrite(uint64_t offset, absl::Span<const uint8_t> data,
                                Completion done) {
  auto r = NewRequest(impl_.get(), Request::Kind::kWrite, offset, data.size());
  r->wbuf = data.data();
  r->done = std::move(done);
  return impl_->Submit(std::move(r));
}

absl::Status Queue::SubmitWriteCompressed(uint64_t offset,
                                          absl::Span<const uint8_t> data,
                                          Completion done) {
  auto r = NewRequest(impl_.get(), Request::Kind::kWrite, offset, data.size());
  r->wbuf = data.data();
  r->compressed = true;
  if (absl::Status s = impl_->engine()->PrepareCompressed(r.get()); !s.ok()) {
    return s;
  }
  r->done = std::move(done);
  return impl_->Submit(std::move(r));
}

namespace {

// The request of a vectored read or write: one segment is a plain request.
absl::Status ScatterRequest(Request* r, uint64_t offset,
                            absl::Span<const iovec> iov) {
  r->offset = offset;
  uint64_t len = 0;
  for (const iovec& v : iov) {
    if (v.iov_len > 0 && v.iov_base == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vectored request at ", offset, ": segment ", &v - iov.data(),
          " of ", iov.size(), " has no buffer (", v.iov_len, " bytes)"));
    }
    if (__builtin_add_overflow(len, uint64_t{v.iov_len}, &len)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "vectored request at ", offset, ": segment lengths overflow"));
    }
  }
  r->len = len;
  size_t used = 0;
  const iovec* only = nullptr;
  for (const iovec& v : iov) {
    if (v.iov_len == 0) continue;
    ++used;
    only = &v;
  }
  if (used <= 1) {
    auto* base = only != nullptr ? static_cast<uint8_t*>(only->iov_base)
                                 : nullptr;
    if (r->kind == Request::Kind::kRead) {
      r->rbuf = base;
    } else {
      r->wbuf = base;
    }
    return absl::OkStatus();
  }
  r->segs.reserve(used);
  for (const iovec& v : iov) {
    if (v.iov_len > 0) r->segs.push_back(v);
  }
  if (r->kind == Request::Kind::kWrite) r->wbuf = internal::ScatterBase();
  return absl::OkStatus();
}

}  // namespace

absl::Status Queue::SubmitReadv(uint64_t offset, absl::Span<const iovec> iov,
                                Completion done) {
  auto r = impl_->NewRequest();
  r->kind = Request::Kind::kRead;
  if (absl::Status s = ScatterRequest(r.get(), offset, iov); !s.ok()) {
    return s;
  }
  r->done = std::move(done);
  return impl_->Submit(std::move(r));
}

absl::Status Queue::SubmitWritev(uint64_t offset, absl::Span<const iovec> iov,
                                 Completion done) {
  auto r = impl_->NewRequest();
  r->kind = Request::Kind::kWrite;
  if (absl::Status s = ScatterRequest(r.get(), offset, iov); !s.ok()) {
    return s;
  }
  r->done = std::move(done);
  return impl_->Submit(std::move(r));
}

absl::Status Queue::SubmitWriteZeroes(uint64_t offset, uint64_t len,
                                      bool unmap, Completion done) {
  auto r = NewRequest(impl_.get(), Request::Kind::kWriteZeroes, offset, len);
  r->unmap = unmap;
  r->done = std::move(done);
  return impl_->Submit(std::move(r));
}

absl::Status Queue::SubmitDiscard(uint64_t offset, uint64_t len,
                                  Completion done) {
  auto r = NewRequest(impl_.get(), Request::Kind::kDiscard, offset, len);
  r->done = std::move(done);
  return impl_->Submit(std::move(r));
}

absl::Status Queue::SubmitFlush(Completion done) {
  auto r = impl_->NewRequest();
  r->kind = Request::Kind::kFlush;
  r->done = std::move(done);
  return impl_->Submit(std::move(r));
}

int Queue::Poll(int min_complete) { return impl_->Poll(min_complete); }
void Queue::Drain() {
  while (impl_->in_flight() > 0) impl_->Poll(impl_->in_flight());
}
int Queue::EventFd() { return impl_->EventFd(); }
int Queue::in_flight() const { return impl_->in_flight(); }
int Queue::depth() const { return impl_->depth(); }
bool Queue::uses_io_uring() const { return impl_->uses_io_uring(); }
IoStats Queue::stats() const { return impl_->Snapshot(); }

absl::StatusOr<std::unique_ptr<Queue>> Image::CreateQueue(
    const QueueOptions& opts) {
  if (absl::Status s = engine_->Validate(internal::Request{}); !s.ok()) {
    return s;
  }
  return std::unique_ptr<Queue>(
      new Queue(std::make_unique<internal::QueueImpl>(engine_.get(), opts)));
}

IoStats Image::GetStats() const { return engine_->stats().Total(); }

}  // namespace qcow2
