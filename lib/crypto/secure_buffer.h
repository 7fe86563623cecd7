// SPDX-License-Identifier: Apache-2.0
// SecureBuffer: bytes that hold key material (passphrases, derived keys,
// master keys, decrypted key-slot material). They are wiped with
// explicit_bzero when the buffer dies or is resized away, so a key does not
// outlive its use in freed heap memory (a core dump, a later allocation).
// Never log the contents.
#ifndef QCOW2_LIB_CRYPTO_SECURE_BUFFER_H_
#define QCOW2_LIB_CRYPTO_SECURE_BUFFER_H_

#include <string.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/types/span.h"

namespace qcow2::internal {

class SecureBuffer {
 public:
  SecureBuffer() = default;
  explicit SecureBuffer(size_t size)
      : data_(size ? new uint8_t[size]() : nullptr), size_(size) {}
  explicit SecureBuffer(absl::Span<const uint8_t> bytes)
      : SecureBuffer(bytes.size()) {
    if (size_ != 0) memcpy(data_.get(), bytes.data(), size_);
  }
  ~SecureBuffer() { Wipe(); }

  SecureBuffer(SecureBuffer&& other) noexcept
      : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}
  SecureBuffer& operator=(SecureBuffer&& other) noexcept {
    if (this != &other) {
      Wipe();
      data_ = std::move(other.data_);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  SecureBuffer(const SecureBuffer&) = delete;
  SecureBuffer& operator=(const SecureBuffer&) = delete;

  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  absl::Span<uint8_t> span() { return {data_.get(), size_}; }
  absl::Span<const uint8_t> span() const { return {data_.get(), size_}; }
  uint8_t& operator[](size_t i) { return data_[i]; }
  const uint8_t& operator[](size_t i) const { return data_[i]; }

 private:
  void Wipe() {
    if (data_ != nullptr) explicit_bzero(data_.get(), size_);
  }

  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
};

// Overwrites a string that held a secret (a copy of OpenOptions::
// key_secret) and empties it.
inline void WipeString(std::string* s) {
  if (!s->empty()) explicit_bzero(s->data(), s->size());
  s->clear();
}

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_CRYPTO_SECURE_BUFFER_H_
