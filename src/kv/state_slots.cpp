#include "kv/state_slots.h"

#include <string>

#include "util/error.h"

namespace tandem {

StateSlots::StateSlots(int64_t n_slots) : used_(static_cast<size_t>(n_slots), false) {
  TANDEM_ASSERT(n_slots >= 0);
  for (int64_t s = n_slots - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
}

std::optional<std::vector<int32_t>> StateSlots::allocate(int64_t n) {
  if (n > n_free()) return std::nullopt;
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = free_.back();
    free_.pop_back();
    used_[static_cast<size_t>(s)] = true;
    out.push_back(s);
  }
  check_invariants();
  return out;
}

void StateSlots::free(int32_t slot) {
  TANDEM_ASSERT(slot >= 0 && slot < n_total() && used_[static_cast<size_t>(slot)],
                "state slot " + std::to_string(slot) + " freed but not in use");
  used_[static_cast<size_t>(slot)] = false;
  free_.push_back(slot);
  check_invariants();
}

void StateSlots::free(const std::vector<int32_t>& slots) {
  for (int32_t s : slots) free(s);
}

void StateSlots::check_invariants() const {
#ifdef TANDEM_KV_CHECKS
  int64_t used = 0;
  for (bool u : used_) used += u ? 1 : 0;
  TANDEM_ASSERT(used + n_free() == n_total(), "state slot accounting: used + free != total");
  for (int32_t s : free_) TANDEM_ASSERT(!used_[static_cast<size_t>(s)], "a free state slot is marked used");
#endif
}

}  // namespace tandem
