// Continuous batching: which tokens of which sequences run in the next step.
//
// Each step has a token budget (max_num_batched_tokens) and a sequence cap
// (max_num_seqs). Running sequences go first, in arrival order: a decoding
// sequence takes one token, a sequence still in its prompt takes a chunk of
// what is left of the budget (chunked prefill, mixed with decode in one
// batch). Then waiting sequences are admitted first-come first-served, each
// reusing its longest cached prefix, until the budget, the cap or the KV
// blocks run out. When a running sequence needs a block and none is
// available, the most recently arrived running sequence is preempted by
// recompute: its blocks are released and it returns to the front of the
// waiting queue with its tokens (prompt and output so far), to be prefilled
// again later. A sequence about to write into a block it shares with a
// sibling first gets a private copy (copy-on-write).
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "kv/block_manager.h"
#include "kv/state_slots.h"

namespace tandem {

struct Sequence {
  uint64_t request_id = 0;
  int32_t index = 0;          // sibling index
  uint64_t arrival = 0;       // admission order of its request (lower = earlier)
  std::vector<int32_t> tokens;  // prompt then generated tokens
  int32_t n_prompt = 0;
  int64_t n_computed = 0;     // leading tokens whose K/V are in the pool
  std::vector<int32_t> blocks;
  std::vector<BlockHash> hashes;  // hashes of blocks[0 .. hashes.size()), committed to the cache
  bool finished = false;
  // Hybrid models: the sequence's state slot, and the slots reserved for the
  // n_forks siblings it will fork once its prompt is computed.
  int32_t state_slot = -1;
  int32_t n_forks = 0;
  std::vector<int32_t> fork_slots;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t start = 0;  // first position computed
  int64_t length = 0;
  bool want_logits = false;  // the chunk ends at the sequence's last known token
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;
  std::vector<std::pair<int32_t, int32_t>> block_copies;  // (from, to), before the forward
  int64_t n_tokens = 0;
  int64_t n_preempted = 0;
};

// How many of a step's positions are prompt (or recomputed) tokens and how
// many are decode rows: one-position chunks past a sequence's prompt.
struct StepComposition {
  int64_t prefill_tokens = 0;
  int64_t decode_rows = 0;
};
StepComposition composition_of(const SchedulerOutput& out);

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 512;
  int64_t max_num_seqs = 64;
};

class Scheduler {
 public:
  // `states`: the state slots of a hybrid model (null: none needed).
  Scheduler(const SchedulerConfig& config, BlockManager& blocks, StateSlots* states = nullptr);

  // A new sequence (a request's prompt) joins the waiting queue.
  void add_waiting(Sequence* seq);
  // A sibling forked from a running sequence joins the running set right after it.
  void add_running_after(Sequence* sibling, const Sequence* parent);
  // A sequence whose prompt KV is already in its blocks (P/D: it arrived from
  // a prefill) joins the running set in arrival order. It must not wait
  // behind others holding its blocks: a waiting queue whose head needs
  // blocks that a later entry holds would never move.
  void add_running(Sequence* seq);
  // Removes a sequence from whichever queue holds it and releases its blocks
  // and state slots.
  void remove(Sequence* seq);
  // Removes a sequence from the running set and leaves its blocks and state
  // slot to the caller (a P/D transfer takes over their references).
  void detach(Sequence* seq);

  SchedulerOutput schedule();
  // After the forward: marks the chunks computed and commits full blocks to the
  // prefix cache.
  void on_computed(const SchedulerOutput& out);

  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t n_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }

 private:
  // Gives `seq` blocks for positions [start, start + length) (and a private
  // copy of a shared block it will write into). False when not enough blocks.
  bool reserve(Sequence& seq, int64_t start, int64_t length, SchedulerOutput& out);
  void preempt(Sequence* seq);
  void release_blocks(Sequence& seq);
  // Takes the state slots `seq` still lacks (its own, its forks'); false when too few are free.
  bool reserve_states(Sequence& seq);
  void release_states(Sequence& seq);

  SchedulerConfig config_;
  BlockManager& blocks_;
  StateSlots* states_;
  std::vector<Sequence*> running_;  // arrival order
  std::deque<Sequence*> waiting_;   // arrival order
};

}  // namespace tandem
