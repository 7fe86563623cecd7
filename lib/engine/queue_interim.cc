// Interim Queue: runs each request synchronously at Submit and delivers the
// completion from Poll(). Replaced by the io_uring engine.
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/chain/chain.h"
#include "qcow2/image.h"
#include "qcow2/queue.h"

namespace qcow2 {

IoStats& IoStats::operator+=(const IoStats& o) {
  const uint64_t* src = reinterpret_cast<const uint64_t*>(&o);
  uint64_t* dst = reinterpret_cast<uint64_t*>(this);
  for (size_t i = 0; i < sizeof(IoStats) / sizeof(uint64_t); ++i) {
    dst[i] += src[i];
  }
  return *this;
}

IoStats IoStats::Since(const IoStats& before) const {
  IoStats out = *this;
  const uint64_t* src = reinterpret_cast<const uint64_t*>(&before);
  uint64_t* dst = reinterpret_cast<uint64_t*>(&out);
  for (size_t i = 0; i < sizeof(IoStats) / sizeof(uint64_t); ++i) {
    dst[i] -= src[i];
  }
  return out;
}

namespace internal {
class QueueImpl {
 public:
  QueueImpl(Chain* chain, QueueOptions opts) : chain_(chain), opts_(opts) {}
  absl::Status Run(absl::Status s, Completion done) {
    if (static_cast<int>(done_.size()) >= opts_.depth) {
      return absl::ResourceExhaustedError(
          absl::StrCat("queue full (depth ", opts_.depth, ")"));
    }
    done_.emplace_back(std::move(s), std::move(done));
    return absl::OkStatus();
  }
  Chain* chain_;
  QueueOptions opts_;
  std::deque<std::pair<absl::Status, Completion>> done_;
};
}  // namespace internal

Queue::Queue(std::unique_ptr<internal::QueueImpl> impl)
    : impl_(std::move(impl)) {}
Queue::~Queue() { Drain(); }

absl::Status Queue::SubmitRead(uint64_t offset, absl::Span<uint8_t> buf,
                               Completion done) {
  return impl_->Run(impl_->chain_->Read(offset, buf), std::move(done));
}
absl::Status Queue::SubmitWrite(uint64_t offset, absl::Span<const uint8_t> data,
                                Completion done) {
  return impl_->Run(impl_->chain_->Write(offset, data), std::move(done));
}
absl::Status Queue::SubmitWriteZeroes(uint64_t offset, uint64_t len,
                                      bool unmap, Completion done) {
  return impl_->Run(impl_->chain_->WriteZeroes(offset, len, unmap),
                    std::move(done));
}
absl::Status Queue::SubmitDiscard(uint64_t offset, uint64_t len,
                                  Completion done) {
  return impl_->Run(impl_->chain_->Discard(offset, len), std::move(done));
}
absl::Status Queue::SubmitFlush(Completion done) {
  return impl_->Run(impl_->chain_->Flush(), std::move(done));
}
int Queue::Poll(int) {
  int n = 0;
  while (!impl_->done_.empty()) {
    auto item = std::move(impl_->done_.front());
    impl_->done_.pop_front();
    item.second(std::move(item.first));
    ++n;
  }
  return n;
}
void Queue::Drain() { Poll(); }
int Queue::in_flight() const { return static_cast<int>(impl_->done_.size()); }
int Queue::depth() const { return impl_->opts_.depth; }
bool Queue::uses_io_uring() const { return false; }
IoStats Queue::stats() const { return {}; }

absl::StatusOr<std::unique_ptr<Queue>> Image::CreateQueue(
    const QueueOptions& opts) {
  return std::unique_ptr<Queue>(
      new Queue(std::make_unique<internal::QueueImpl>(chain_.get(), opts)));
}
IoStats Image::GetStats() const { return {}; }

}  // namespace qcow2
