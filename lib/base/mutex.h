// SPDX-License-Identifier: Apache-2.0
// A std::mutex that clang's thread-safety analysis understands, a scoped
// holder of it, and a condition variable that waits on it. libstdc++'s own
// types carry no annotations, so `ABSL_GUARDED_BY(mu_)` on a field guarded
// by a std::mutex would check nothing; these make the lock contracts
// (GUARDED_BY, EXCLUSIVE_LOCKS_REQUIRED) something `-Wthread-safety`
// verifies (scripts/thread_safety.sh).
#ifndef QCOW2_LIB_BASE_MUTEX_H_
#define QCOW2_LIB_BASE_MUTEX_H_

#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"

namespace qcow2::internal {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  // Tries for a short while before it sleeps: the library's critical
  // sections are short, and with many threads on few CPUs a waiter that
  // goes to sleep at once costs two context switches, and a convoy forms
  // behind the sleeper the holder wakes (256 NBD worker threads writing at
  // once went from about 103k to 135k IOPS:
  // bench/results/2026-12-03-nbd-serving.md). On one CPU
  // the holder cannot run while we spin, so there it sleeps at once.
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    for (int i = SpinLimit(); i > 0; --i) {
      if (mu_.try_lock()) return;
      Relax();
    }
    mu_.lock();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Tells the analysis the caller holds the lock where it cannot see it
  // (a callback run by a function that requires it). Checks nothing.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  static int SpinLimit() {
    static const int limit = std::thread::hardware_concurrency() > 1 ? 100 : 0;
    return limit;
  }
  static void Relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
  std::mutex mu_;
};

// Holds `mu` for its lifetime.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  // Releases `mu` while it waits, and holds it again on return (which may
  // be spurious: callers wait in a loop on their condition).
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's
  }
  void SignalAll() { cv_.notify_all(); }
  void Signal() { cv_.notify_one(); }

 private:
  std::condition_variable cv_;
};

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_BASE_MUTEX_H_
