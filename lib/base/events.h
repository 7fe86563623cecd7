// SPDX-License-Identifier: Apache-2.0
// Named metadata events ("l2-update", "cow-write", ...), emitted just before
// the I/O they describe. Tests hook them to cut power or inject errors at an
// exact step and to report which steps a sweep covered. Without a hook, an
// event costs one relaxed atomic load.
#ifndef QCOW2_LIB_BASE_EVENTS_H_
#define QCOW2_LIB_BASE_EVENTS_H_

#include <atomic>
#include <functional>
#include <string_view>

namespace qcow2::internal {

using EventHook = std::function<void(std::string_view event)>;

// Installs (or with nullptr, removes) the process-wide hook. Test-only: not
// synchronised with concurrent emitters.
void SetEventHook(EventHook* hook);

extern std::atomic<EventHook*> g_event_hook;

// Takes the events emitted on one thread while installed, instead of the
// hook: for I/O that is decided now and carried out later (a flush's
// metadata write-back, recorded under the image's lock), whose events are
// emitted again when the I/O runs. Only events a hook would see are taken.
class EventCapture {
 public:
  virtual ~EventCapture() = default;
  virtual void Captured(std::string_view event) = 0;
};
// Installs `capture` on the calling thread (nullptr removes it); returns
// the one it replaces.
EventCapture* SetThreadEventCapture(EventCapture* capture);

void DispatchEvent(EventHook* hook, std::string_view event);

inline void EmitEvent(std::string_view event) {
  EventHook* hook = g_event_hook.load(std::memory_order_relaxed);
  if (hook != nullptr) DispatchEvent(hook, event);
}

}  // namespace qcow2::internal

#endif  // QCOW2_LIB_BASE_EVENTS_H_
