// SPDX-License-Identifier: Apache-2.0
#include "lib/base/events.h"

namespace qcow2::internal {

std::atomic<EventHook*> g_event_hook{nullptr};

namespace {
thread_local EventCapture* t_capture = nullptr;
}  // namespace

void SetEventHook(EventHook* hook) {
  g_event_hook.store(hook, std::memory_order_release);
}

EventCapture* SetThreadEventCapture(EventCapture* capture) {
  EventCapture* old = t_capture;
  t_capture = capture;
  return old;
}

void DispatchEvent(EventHook* hook, std::string_view event) {
  if (t_capture != nullptr) {
    t_capture->Captured(event);
  } else {
    (*hook)(event);
  }
}

}  // namespace qcow2::internal
