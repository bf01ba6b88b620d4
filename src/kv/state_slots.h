// Ownership of a hybrid model's recurrent-state slots (the second region of
// the KV pool, KvPool::state_slot): one slot per live sequence, handed out at
// admission and given back on every exit path (finish, abort, preemption,
// the end of a transfer). Every slot is free or used; free + used == total
// and a slot is never freed twice, checked after every change.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace tandem {

class StateSlots {
 public:
  explicit StateSlots(int64_t n_slots);

  int64_t n_total() const { return static_cast<int64_t>(used_.size()); }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_used() const { return n_total() - n_free(); }

  // n slots, all or nothing (lowest ids first).
  std::optional<std::vector<int32_t>> allocate(int64_t n);
  void free(int32_t slot);
  void free(const std::vector<int32_t>& slots);

  // Aborts with a message if the accounting is inconsistent.
  void check_invariants() const;

 private:
  std::vector<int32_t> free_;  // a stack: back() goes next
  std::vector<bool> used_;
};

}  // namespace tandem
