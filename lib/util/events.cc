#include "lib/util/events.h"

namespace qcow2::internal {

std::atomic<EventHook*> g_event_hook{nullptr};

void SetEventHook(EventHook* hook) {
  g_event_hook.store(hook, std::memory_order_release);
}

}  // namespace qcow2::internal
