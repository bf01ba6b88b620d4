#include "engine/scheduler.h"

#include <algorithm>

#include "util/error.h"

namespace tandem {

namespace {
bool arrived_before(const Sequence* a, const Sequence* b) {
  return a->arrival != b->arrival ? a->arrival < b->arrival : a->index < b->index;
}
}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager& blocks, StateSlots* states)
    : config_(config), blocks_(blocks), states_(states) {
  TANDEM_ASSERT(config.max_num_batched_tokens > 0 && config.max_num_seqs > 0);
}

void Scheduler::add_waiting(Sequence* seq) {
  auto it = std::upper_bound(waiting_.begin(), waiting_.end(), seq, arrived_before);
  waiting_.insert(it, seq);
}

void Scheduler::add_running_after(Sequence* sibling, const Sequence* parent) {
  auto it = std::find(running_.begin(), running_.end(), parent);
  TANDEM_ASSERT(it != running_.end(), "a sibling forks from a running sequence");
  // Keep siblings in index order right after the parent's earlier siblings.
  auto pos = it + 1;
  while (pos != running_.end() && (*pos)->request_id == parent->request_id) ++pos;
  running_.insert(pos, sibling);
}

void Scheduler::add_running(Sequence* seq) {
  TANDEM_ASSERT(!seq->blocks.empty() || seq->n_computed == 0, "a running sequence's computed tokens have blocks");
  auto it = std::upper_bound(running_.begin(), running_.end(), seq, arrived_before);
  running_.insert(it, seq);
}

void Scheduler::release_blocks(Sequence& seq) {
  if (!seq.blocks.empty()) blocks_.release(seq.blocks);
  seq.blocks.clear();
  seq.hashes.clear();
}

bool Scheduler::reserve_states(Sequence& seq) {
  if (states_ == nullptr) return true;
  const int64_t need = (seq.state_slot < 0 ? 1 : 0) + seq.n_forks - static_cast<int64_t>(seq.fork_slots.size());
  if (need <= 0) return true;
  auto got = states_->allocate(need);
  if (!got) return false;
  size_t next = 0;
  if (seq.state_slot < 0) seq.state_slot = (*got)[next++];
  for (; next < got->size(); ++next) seq.fork_slots.push_back((*got)[next]);
  return true;
}

void Scheduler::release_states(Sequence& seq) {
  if (states_ == nullptr) return;
  if (seq.state_slot >= 0) states_->release(seq.state_slot);
  states_->release(seq.fork_slots);
  seq.state_slot = -1;
  seq.fork_slots.clear();
}

void Scheduler::remove(Sequence* seq) {
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) running_.erase(r);
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
  release_blocks(*seq);
  release_states(*seq);
}

void Scheduler::detach(Sequence* seq) {
  auto r = std::find(running_.begin(), running_.end(), seq);
  TANDEM_ASSERT(r != running_.end(), "only a running sequence is detached");
  running_.erase(r);
}

void Scheduler::preempt(Sequence* seq) {
  release_blocks(*seq);
  release_states(*seq);
  seq->n_computed = 0;
  add_waiting(seq);
}

bool Scheduler::reserve(Sequence& seq, int64_t start, int64_t length, SchedulerOutput& out) {
  const int bs = blocks_.block_size();
  const auto first_block = static_cast<size_t>(start / bs);
  // Copy-on-write: the block receiving position `start` may be shared with a
  // sibling (a partly filled last prompt block after a fork).
  const bool needs_copy = first_block < seq.blocks.size() && blocks_.refcount(seq.blocks[first_block]) > 1;
  const int64_t blocks_needed = (start + length + bs - 1) / bs;
  const int64_t new_blocks = std::max<int64_t>(0, blocks_needed - static_cast<int64_t>(seq.blocks.size()));
  const int64_t total = new_blocks + (needs_copy ? 1 : 0);
  if (total == 0) return true;
  auto got = blocks_.allocate(total);
  if (!got) return false;
  size_t next = 0;
  if (needs_copy) {
    const int32_t shared = seq.blocks[first_block];
    const int32_t copy = (*got)[next++];
    out.block_copies.emplace_back(shared, copy);
    blocks_.release(std::span<const int32_t>(&shared, 1));
    seq.blocks[first_block] = copy;
    // The copy will diverge from the cached content: it is no longer that hash.
    if (seq.hashes.size() > first_block) seq.hashes.resize(first_block);
  }
  for (; next < got->size(); ++next) seq.blocks.push_back((*got)[next]);
  return true;
}

StepComposition composition_of(const SchedulerOutput& out) {
  StepComposition c;
  for (const ScheduledChunk& chunk : out.chunks) {
    if (chunk.length == 1 && chunk.start >= chunk.seq->n_prompt)
      ++c.decode_rows;
    else
      c.prefill_tokens += chunk.length;
  }
  return c;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int64_t budget = config_.max_num_batched_tokens;

  // Running sequences, oldest first; preemption victims come from the back.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    const int64_t remaining = static_cast<int64_t>(seq->tokens.size()) - seq->n_computed;
    TANDEM_ASSERT(remaining >= 1, "a running sequence always has a token to compute");
    const int64_t length = std::min(remaining, budget);
    bool scheduled = false;
    while (!scheduled) {
      if (reserve(*seq, seq->n_computed, length, out)) {
        scheduled = true;
        break;
      }
      Sequence* victim = running_.back();
      running_.pop_back();
      preempt(victim);
      ++out.n_preempted;
      if (victim == seq) break;
    }
    if (!scheduled) break;  // `seq` itself was the last one and got preempted
    out.chunks.push_back({seq, seq->n_computed, length, seq->n_computed + length == static_cast<int64_t>(seq->tokens.size())});
    out.n_tokens += length;
    budget -= length;
    ++i;
  }

  // Waiting sequences, first come first served, only while nothing was preempted
  // this step (a preempted sequence must not overtake by re-entering at once).
  while (out.n_preempted == 0 && budget > 0 && !waiting_.empty() &&
         static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    BlockManager::PrefixMatch match;
    if (seq->blocks.empty()) {
      TANDEM_ASSERT(seq->n_computed == 0);
      match = blocks_.acquire_prefix(seq->tokens, static_cast<int64_t>(seq->tokens.size()) - 1);
      seq->blocks = match.blocks;
      seq->hashes = match.hashes;
      seq->n_computed = match.n_tokens;
    }
    const int64_t remaining = static_cast<int64_t>(seq->tokens.size()) - seq->n_computed;
    const int64_t length = std::min(remaining, budget);
    if (!reserve_states(*seq) || !reserve(*seq, seq->n_computed, length, out)) {
      // Not enough blocks or state slots: give back the cached prefix and
      // the slots, and wait for a later step.
      release_blocks(*seq);
      release_states(*seq);
      seq->n_computed = 0;
      break;
    }
    waiting_.pop_front();
    running_.push_back(seq);
    out.chunks.push_back({seq, seq->n_computed, length, seq->n_computed + length == static_cast<int64_t>(seq->tokens.size())});
    out.n_tokens += length;
    budget -= length;
  }
  return out;
}

void Scheduler::on_computed(const SchedulerOutput& out) {
  const int bs = blocks_.block_size();
  for (const ScheduledChunk& c : out.chunks) {
    Sequence& seq = *c.seq;
    TANDEM_ASSERT(seq.n_computed == c.start, "chunks are computed in order");
    seq.n_computed += c.length;
    // Register every block that is now full of computed tokens.
    while (static_cast<int64_t>(seq.hashes.size() + 1) * bs <= seq.n_computed) {
      const size_t b = seq.hashes.size();
      const BlockHash parent = b == 0 ? kNoParentHash : seq.hashes[b - 1];
      const std::span<const int32_t> toks(seq.tokens.data() + b * static_cast<size_t>(bs), static_cast<size_t>(bs));
      seq.hashes.push_back(blocks_.commit_full_block(seq.blocks[b], parent, toks));
    }
  }
}

}  // namespace tandem
