#include "kv/state_slots.h"

#include <string>

#include "util/error.h"

namespace tandem {

StateSlots::StateSlots(int64_t n_slots) : refcount_(static_cast<size_t>(n_slots), 0) {
  TANDEM_ASSERT(n_slots >= 0);
  for (int64_t s = n_slots - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
}

std::optional<std::vector<int32_t>> StateSlots::allocate(int64_t n) {
  if (n > n_free()) return std::nullopt;
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = free_.back();
    free_.pop_back();
    refcount_[static_cast<size_t>(s)] = 1;
    out.push_back(s);
  }
  check_invariants();
  return out;
}

int32_t StateSlots::refcount(int32_t slot) const {
  TANDEM_ASSERT(slot >= 0 && slot < n_total(), "state slot out of range");
  return refcount_[static_cast<size_t>(slot)];
}

void StateSlots::add_ref(int32_t slot) {
  TANDEM_ASSERT(refcount(slot) > 0, "state slot " + std::to_string(slot) + " referenced while free");
  ++refcount_[static_cast<size_t>(slot)];
}

void StateSlots::release(int32_t slot) {
  TANDEM_ASSERT(refcount(slot) > 0, "state slot " + std::to_string(slot) + " released but not in use");
  if (--refcount_[static_cast<size_t>(slot)] == 0) free_.push_back(slot);
  check_invariants();
}

void StateSlots::release(const std::vector<int32_t>& slots) {
  for (int32_t s : slots) release(s);
}

void StateSlots::check_invariants() const {
#ifdef TANDEM_KV_CHECKS
  int64_t used = 0;
  for (int32_t r : refcount_) used += r > 0 ? 1 : 0;
  TANDEM_ASSERT(used + n_free() == n_total(), "state slot accounting: used + free != total");
  for (int32_t s : free_) TANDEM_ASSERT(refcount_[static_cast<size_t>(s)] == 0, "a free state slot is referenced");
#endif
}

}  // namespace tandem
