// Ownership of a hybrid model's recurrent-state slots (the tail of the KV
// pool, KvPool::state_slot): one slot per live sequence, handed out at
// admission, referenced once more by a P/D transfer that may still move it
// (as blocks are), and free again when the last reference is dropped (finish,
// abort, preemption, the transfer's Free). Every slot is free (refcount 0)
// or used; free + used == total, and dropping a reference nobody holds
// aborts.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace tandem {

class StateSlots {
 public:
  explicit StateSlots(int64_t n_slots);

  int64_t n_total() const { return static_cast<int64_t>(refcount_.size()); }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_used() const { return n_total() - n_free(); }

  // n slots with one reference each, all or nothing (lowest ids first).
  std::optional<std::vector<int32_t>> allocate(int64_t n);
  void add_ref(int32_t slot);
  void release(int32_t slot);
  void release(const std::vector<int32_t>& slots);
  int32_t refcount(int32_t slot) const;

  // Aborts with a message if the accounting is inconsistent.
  void check_invariants() const;

 private:
  std::vector<int32_t> free_;  // a stack: back() goes next
  std::vector<int32_t> refcount_;
};

}  // namespace tandem
