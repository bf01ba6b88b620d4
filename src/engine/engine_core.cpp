#include "engine/engine_core.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "engine/stop_checker.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "util/block_budget.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace tandem {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "";
}

struct EngineCore::SeqState : Sequence {
  RequestState* owner = nullptr;
  IncrementalDetokenizer detok;
  StopChecker stop;
  SequenceDelta pending;
  bool reported_finish = false;
  int32_t n_generated = 0;
  double cumulative_logprob = 0;

  SeqState(const Tokenizer& tok, const SamplingParams& p)
      : detok(tok), stop(p.stop, p.include_stop_str_in_output) {}
};

struct EngineCore::RequestState {
  EngineRequest req;
  std::vector<SequenceSampler> samplers;  // one per sibling (best_of)
  std::vector<std::unique_ptr<SeqState>> seqs;
  bool forked = false;  // the prompt is computed and the siblings exist
  bool cached_reported = false;
  int32_t cached_tokens = 0;
  bool touched = false;
  int64_t arrival_ns = 0;
  int64_t first_token_ns = 0;
};

EngineCore::EngineCore(Model& model, const Tokenizer& tokenizer, const EngineConfig& config)
    : model_(model), tokenizer_(tokenizer), config_(config) {
  const ModelConfig& mc = model.config();
  max_model_len_ = config.max_model_len > 0 ? std::min<int64_t>(config.max_model_len, mc.n_ctx_train) : mc.n_ctx_train;
  // A hybrid model's state slots: one per sequence the running set can hold
  // (siblings reserve theirs at admission), beside the KV budget.
  KvPoolShape shape = model.kv_shape(1, config.block_size, config.kv_dtype, config.max_num_seqs);
  n_blocks_ = std::max<int64_t>(1, config.kv_cache_bytes / static_cast<int64_t>(KvPool::bytes_per_block(shape)));
  shape.n_blocks = n_blocks_;
  // Left to default, the context is what one sequence can hold in the pool:
  // a longer one only turns a request without max_tokens (whose completion
  // fills the context) into a "too large for the cache" refusal.
  if (const int64_t pool_tokens = n_blocks_ * config.block_size; config.max_model_len <= 0 && max_model_len_ > pool_tokens) {
    max_model_len_ = pool_tokens;
    max_model_len_capped_ = true;
  }
  pool_ = std::make_unique<ThreadPool>(config.threads);
  kv_ = std::make_unique<KvPool>(shape, config.kv_backing);
  if (mc.hybrid()) states_ = std::make_unique<StateSlots>(shape.n_state_slots);
  BlockManagerConfig bc;
  bc.n_blocks = n_blocks_;
  bc.block_size = config.block_size;
  // A cached block holds KV, not the recurrent state after it: a hybrid
  // model's prefix hit would start from a state it does not have.
  bc.enable_prefix_caching = config.enable_prefix_caching && !mc.hybrid();
  metrics_.prefix_caching_off_for_recurrent_state = config.enable_prefix_caching && mc.hybrid();
  metrics_.state_slots_total = states_ ? states_->n_total() : 0;
  bc.salt = std::hash<std::string>{}(mc.arch + "/" + mc.name + "/" + std::to_string(mc.n_vocab) + "/" +
                                     std::to_string(mc.n_layer) + "/" + kernels::dtype_name(config.kv_dtype));
  blocks_ = std::make_unique<BlockManager>(bc);
  scheduler_ = std::make_unique<Scheduler>(SchedulerConfig{config.max_num_batched_tokens, config.max_num_seqs}, *blocks_,
                                           states_.get());
  metrics_.kv_blocks_total = n_blocks_;
  kv_stats_ = blocks_->stats();
}

EngineCore::~EngineCore() { stop(); }

void EngineCore::set_lockstep(LockstepHooks hooks) {
  TANDEM_ASSERT(!running_.load() && hooks.connect, "set_lockstep before start(), with a connect hook");
  lockstep_ = std::move(hooks);
  lockstep_enabled_ = true;
  if (lockstep_.expert_parallel) {
    TANDEM_ASSERT(model_.n_expert_layers() > 0, "expert parallelism needs a model with expert layers");
    experts_ = std::make_unique<LockstepExpertExchange>(lockstep_.rank, lockstep_.size);
    model_.set_expert_exchange(experts_.get());
  }
  std::lock_guard<std::mutex> lock(lockstep_mu_);
  lockstep_info_.enabled = true;
}

void EngineCore::start() {
  if (running_.exchange(true)) return;
  thread_ = std::thread([this] { lockstep_enabled_ ? lockstep_loop() : loop(); });
}

void EngineCore::stop() {
  if (!running_.exchange(false)) return;
  cv_.notify_all();
  if (lockstep_.interrupt) lockstep_.interrupt();
  if (thread_.joinable()) thread_.join();
  // The group goes with the loop, so peers still in an op with this rank
  // learn at once that it left (their connections close).
  std::lock_guard<std::mutex> lock(lockstep_mu_);
  if (experts_) experts_->bind(nullptr);
  group_.reset();
  lockstep_info_.connected = false;
}

std::optional<std::string> EngineCore::add_request(EngineRequest request, Refusal* why) {
  const auto refuse = [why](Refusal r, std::string message) {
    if (why != nullptr) *why = r;
    return std::optional<std::string>(std::move(message));
  };
  if (why != nullptr) *why = Refusal::kNone;
  const SamplingParams& p = request.params;
  const auto n_prompt = static_cast<int64_t>(request.prompt.size());
  if (n_prompt == 0) return refuse(Refusal::kInvalid, "the prompt is empty");
  if (std::string err = p.validate(model_.config().n_vocab); !err.empty()) return refuse(Refusal::kInvalid, err);
  for (int32_t t : request.prompt)
    if (t < 0 || t >= model_.config().n_vocab)
      return refuse(Refusal::kInvalid, "prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " +
             std::to_string(model_.config().n_vocab) + ")");
  if (n_prompt + p.max_tokens > max_model_len_)
    return refuse(Refusal::kContextTooLong, "this model's maximum context length is " + std::to_string(max_model_len_) + " tokens, but " +
           std::to_string(n_prompt + p.max_tokens) + " were requested (" + std::to_string(n_prompt) +
           " in the prompt, " + std::to_string(p.max_tokens) + " in the completion); shorten the prompt or lower max_tokens");
  // Worst case without any prefix sharing beyond the prompt.
  const int64_t need = worst_case_request_blocks(n_prompt, p.best_of, p.max_tokens, config_.block_size);
  if (need > n_blocks_)
    return refuse(Refusal::kTooLargeForCache, "the request needs up to " + std::to_string(need) + " KV blocks but the cache holds " +
           std::to_string(n_blocks_) + "; lower max_tokens, n or best_of, or give the server more KV cache memory");
  if (states_ && p.best_of > states_->n_total())
    return refuse(Refusal::kTooLargeForCache, "the request needs " + std::to_string(p.best_of) +
                                                  " recurrent-state slots (one per sequence of n/best_of) but the "
                                                  "server has " + std::to_string(states_->n_total()) +
                                                  "; lower n or best_of, or raise --max-num-seqs");
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t queued = static_cast<int64_t>(pending_adds_.size()) + metrics_.waiting.load();
    if (queued >= config_.max_waiting_requests)
      return refuse(Refusal::kQueueFull, "the server's admission queue is full (" +
                                             std::to_string(config_.max_waiting_requests) +
                                             " waiting requests); retry later");
    pending_adds_.push_back(std::move(request));
  }
  cv_.notify_all();
  return std::nullopt;
}

void EngineCore::abort_request(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_aborts_.emplace_back(id, std::string());
  }
  cv_.notify_all();
}

void EngineCore::fail_request(uint64_t id, std::string message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_aborts_.emplace_back(id, message.empty() ? std::string("the request failed") : std::move(message));
  }
  cv_.notify_all();
}

void EngineCore::fail_all_requests(std::string message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_fail_all_ = message.empty() ? std::string("the request failed") : std::move(message);
  }
  cv_.notify_all();
}

void EngineCore::remote_kv_arrived(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_arrivals_.push_back(id);
  }
  cv_.notify_all();
}

void EngineCore::release_transfer_blocks(std::vector<int32_t> blocks) {
  if (blocks.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_releases_.push_back(std::move(blocks));
  }
  cv_.notify_all();
}

bool EngineCore::has_work() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_->has_work() || !pending_adds_.empty() || !pending_aborts_.empty() ||
         !pending_arrivals_.empty() || !pending_releases_.empty() || !pending_fail_all_.empty();
}

BlockManagerStats EngineCore::kv_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kv_stats_;
}

int64_t EngineCore::state_slots_total() const { return states_ ? states_->n_total() : 0; }

int64_t EngineCore::state_slots_used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_slots_used_;
}

bool EngineCore::has_input_locked() const {
  return !pending_adds_.empty() || !pending_aborts_.empty() || !pending_arrivals_.empty() || !pending_releases_.empty() ||
         !pending_fail_all_.empty() || !running_.load(std::memory_order_acquire);
}

void EngineCore::loop() {
  while (running_.load(std::memory_order_acquire)) {
    heartbeat_.fetch_add(1, std::memory_order_acq_rel);
    if (step()) continue;
    if (executor_ != nullptr) {
      executor_->idle();
      forget_lost_kv("");
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(config_.idle_wait_ms), [&] { return has_input_locked(); });
  }
}

void EngineCore::drain_inputs() {
  std::deque<EngineRequest> adds;
  std::vector<std::pair<uint64_t, std::string>> aborts;
  std::vector<uint64_t> arrivals;
  std::vector<std::vector<int32_t>> releases;
  std::string fail_all_message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    adds.swap(pending_adds_);
    aborts.swap(pending_aborts_);
    arrivals.swap(pending_arrivals_);
    releases.swap(pending_releases_);
    fail_all_message.swap(pending_fail_all_);
  }
  for (auto& r : adds) admit(std::move(r));
  for (auto& [id, error] : aborts) abort_now(id, std::move(error));
  if (!fail_all_message.empty()) fail_all(fail_all_message);
  for (uint64_t id : arrivals) {
    auto it = awaiting_remote_kv_.find(id);
    if (it == awaiting_remote_kv_.end()) continue;  // aborted meanwhile
#ifdef TANDEM_PD_MUTATIONS
    // Test-only: recompute the last moved token over the moved state (a
    // recurrent state advanced twice by it), for the P/D tests to catch.
    if (config_.mutation_advance_state_twice && it->second->n_computed > 0) --it->second->n_computed;
#endif
    scheduler_->add_running(it->second);
    awaiting_remote_kv_.erase(it);
  }
  for (auto& blocks : releases) {
    metrics_.transfer_blocks_held -= static_cast<int64_t>(blocks.size());
    // A hybrid model's state slot travels as the blocks after the KV ones: its
    // first block stands for the transfer's reference on the slot.
    std::erase_if(blocks, [&](int32_t b) {
      const int32_t slot = kv_->slot_of_block(b);
      if (slot >= 0 && b == kv_->state_slot_block(slot)) states_->release(slot);
      return slot >= 0;
    });
    blocks_->release(blocks);
  }
  // New transfers get blocks only once no request already here waits for
  // some (preempted ones first, as a single instance admits them).
  while (!awaiting_allocation_.empty() && scheduler_->n_waiting() == 0) {
    auto it = requests_.find(awaiting_allocation_.front());
    if (it != requests_.end() && !allocate_remote(*it->second)) break;
    awaiting_allocation_.pop_front();  // allocated, or aborted meanwhile
  }
  metrics_.waiting_remote_kv = static_cast<int64_t>(awaiting_remote_kv_.size() + awaiting_allocation_.size());
}

void EngineCore::admit(EngineRequest&& req) {
  auto r = std::make_unique<RequestState>();
  r->arrival_ns = monotonic_ns();
  const SamplingParams& p = req.params;
  static std::atomic<uint64_t> entropy_counter{0};
  const uint64_t entropy = std::random_device{}() ^ (entropy_counter.fetch_add(1) * 0x9e3779b97f4a7c15ull);
  for (int32_t i = 0; i < p.best_of; ++i)
    r->samplers.emplace_back(p, SequenceSampler::derive_seed(p, i, entropy), req.prompt);
  auto s = std::make_unique<SeqState>(tokenizer_, p);
  s->owner = r.get();
  s->request_id = req.id;
  s->index = 0;
  s->arrival = arrivals_++;
  s->tokens = req.prompt;
  s->n_prompt = static_cast<int32_t>(req.prompt.size());
  metrics_.prompt_tokens += s->n_prompt;
  r->req = std::move(req);
  const uint64_t id = r->req.id;
  TANDEM_ASSERT(requests_.count(id) == 0, "request ids must be unique");
  SeqState* seq = s.get();
  r->seqs.push_back(std::move(s));
  switch (r->req.kv_role) {
    case KvRole::kLocal:
      seq->n_forks = r->req.params.best_of - 1;  // their state slots are taken at admission
      scheduler_->add_waiting(seq);
      break;
    case KvRole::kPrefillOnly:
      // Only the first N-1 tokens: the decode computes token N itself.
      seq->tokens.pop_back();
      if (seq->tokens.empty()) {
        finish_prefill_only(*r, *seq);  // nothing to compute, nothing to move
        return;
      }
      scheduler_->add_waiting(seq);
      break;
    case KvRole::kRemoteKv:
      return admit_remote(std::move(r));
  }
  requests_[id] = std::move(r);
}

void EngineCore::admit_remote(std::unique_ptr<RequestState> r) {
  const uint64_t id = r->req.id;
  RequestState& state = *r;
  requests_[id] = std::move(r);
  // A pool full of other requests' blocks is a wait, not a failure (report
  // 000: admission took 78 s): it is retried as blocks come free, in arrival
  // order, until the transfer's deadline ends it (an abort from the agent).
  if (!awaiting_allocation_.empty() || scheduler_->n_waiting() > 0 || !allocate_remote(state))
    awaiting_allocation_.push_back(id);
}

bool EngineCore::allocate_remote(RequestState& rs) {
  RequestState* r = &rs;
  SeqState& s = *r->seqs.front();
  const int64_t n_moved_tokens = s.n_prompt - 1;
  const int64_t bs = config_.block_size;
  const int64_t n_blocks = (n_moved_tokens + bs - 1) / bs;
  // The leading full blocks this instance already holds need not move.
  BlockManager::PrefixMatch match = blocks_->acquire_prefix(s.tokens, n_moved_tokens);
  RequestOutput out;
  out.request_id = r->req.id;
  out.prompt_tokens = s.n_prompt;
  auto fresh = blocks_->allocate(n_blocks - static_cast<int64_t>(match.blocks.size()));
  // A hybrid model's sequence needs its state slot (the moved state lands in
  // it) and one per sibling it will fork.
  std::optional<std::vector<int32_t>> slots;
  if (fresh && states_) slots = states_->allocate(r->req.params.best_of);
  if (!fresh || (states_ && !slots)) {
    if (!match.blocks.empty()) blocks_->release(match.blocks);
    if (fresh) blocks_->release(*fresh);
    return false;
  }
  s.blocks = match.blocks;
  s.blocks.insert(s.blocks.end(), fresh->begin(), fresh->end());
  s.hashes = match.hashes;
  s.n_computed = n_moved_tokens;
  r->cached_tokens = static_cast<int32_t>(match.n_tokens);
  r->cached_reported = true;
  // One more reference per block for the transfer: the blocks outlive the
  // sequence while the peer may still reach them.
  for (int32_t b : s.blocks) blocks_->add_ref(b);
  out.kv_blocks = s.blocks;
  if (slots) {
    s.state_slot = slots->front();
    s.fork_slots.assign(slots->begin() + 1, slots->end());
    s.n_forks = r->req.params.best_of - 1;
    if (n_moved_tokens > 0) {
      states_->add_ref(s.state_slot);  // the transfer's reference, as on the blocks
      append_state_blocks(s.state_slot, out.kv_blocks);
    }
  }
  metrics_.transfer_blocks_held += static_cast<int64_t>(out.kv_blocks.size());
  out.kv_event = KvEvent::kAllocated;
  out.kv_cached_blocks = static_cast<int32_t>(match.blocks.size());
  awaiting_remote_kv_[r->req.id] = &s;
  if (r->req.sink) r->req.sink(std::move(out));
  return true;
}

void EngineCore::append_state_blocks(int32_t slot, std::vector<int32_t>& blocks) {
  if (slot < 0) return;
  const int32_t first = kv_->state_slot_block(slot);
  for (int32_t i = 0; i < kv_->state_slot_blocks(); ++i) blocks.push_back(first + i);
}

void EngineCore::finish_prefill_only(RequestState& r, SeqState& s) {
  RequestOutput out;
  out.request_id = r.req.id;
  out.prompt_tokens = s.n_prompt;
  out.cached_tokens = r.cached_tokens;
  out.kv_event = KvEvent::kPrefillComputed;
  out.kv_blocks = s.blocks;  // the sequence's references become the transfer's
  if (s.state_slot >= 0) {
    // So does its state slot's: the state after the N-1 tokens moves with their KV.
    append_state_blocks(s.state_slot, out.kv_blocks);
    s.state_slot = -1;
  }
  metrics_.transfer_blocks_held += static_cast<int64_t>(out.kv_blocks.size());
  s.blocks.clear();
  s.hashes.clear();
  s.finished = true;
  out.finished = true;
  if (r.req.sink) r.req.sink(std::move(out));
}

void EngineCore::abort_now(uint64_t id, std::string error) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;  // finished already, or never admitted
  RequestState& r = *it->second;
  awaiting_remote_kv_.erase(id);
  std::erase(awaiting_allocation_, id);
  for (auto& s : r.seqs) {
    if (!s->finished) {
      scheduler_->remove(s.get());
      s->finished = true;
      s->pending.finish = error.empty() ? FinishReason::kAbort : FinishReason::kError;
    }
  }
  emit(r, std::move(error));
  ++metrics_.requests_aborted;
  requests_.erase(it);
}

void EngineCore::finish_sequence(RequestState& r, SeqState& s, FinishReason reason, std::string stop_reason) {
  s.finished = true;
  s.pending.finish = reason;
  s.pending.stop_reason = std::move(stop_reason);
  scheduler_->remove(&s);
  r.touched = true;
}

void EngineCore::append_token(RequestState& r, SeqState& s, const SampleResult& sample) {
  const SamplingParams& p = r.req.params;
  const int32_t tok = sample.token;
  s.tokens.push_back(tok);
  r.samplers[static_cast<size_t>(s.index)].accept(tok);
  s.cumulative_logprob += sample.logprob;
  ++s.n_generated;
  ++metrics_.generation_tokens;
  s.pending.tokens.push_back(tok);
  if (p.logprobs >= 0) s.pending.logprobs.push_back(sample);
  r.touched = true;

  if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end())
    return finish_sequence(r, s, FinishReason::kStop, std::to_string(tok));
  if (!p.ignore_eos && tokenizer_.is_end_of_generation(tok)) return finish_sequence(r, s, FinishReason::kStop);
  StopChecker::Result res = s.stop.push(s.detok.push(tok));
  s.pending.text += res.text;
  if (res.stopped) return finish_sequence(r, s, FinishReason::kStop, res.matched);
  if (s.n_generated >= p.max_tokens || static_cast<int64_t>(s.tokens.size()) >= max_model_len_) {
    StopChecker::Result tail = s.stop.push(s.detok.flush());
    s.pending.text += tail.text;
    if (tail.stopped) return finish_sequence(r, s, FinishReason::kStop, tail.matched);
    s.pending.text += s.stop.flush();
    return finish_sequence(r, s, FinishReason::kLength);
  }
}

void EngineCore::process_logits(SeqState& s, const float* logits, std::vector<RequestState*>& touched) {
  RequestState& r = *s.owner;
  const std::span<const float> row(logits, static_cast<size_t>(model_.config().n_vocab));
  if (!r.touched) touched.push_back(&r);
  r.touched = true;
  if (r.forked) {
    append_token(r, s, r.samplers[static_cast<size_t>(s.index)].sample(row));
    return;
  }
  // The prompt is computed: every sibling samples its first token from these
  // logits, and siblings 1.. fork the block table by reference.
  TANDEM_ASSERT(s.index == 0 && r.seqs.size() == 1);
  // (Sampled first: logits that are not finite throw here, before the
  // request counts as having its first token.)
  const int32_t best_of = r.req.params.best_of;
  std::vector<SampleResult> firsts;
  for (int32_t i = 0; i < best_of; ++i) firsts.push_back(r.samplers[static_cast<size_t>(i)].sample(row));
  r.forked = true;
  r.first_token_ns = monotonic_ns();
  metrics_.ttft_s.observe(static_cast<double>(r.first_token_ns - r.arrival_ns) * 1e-9);
  for (int32_t i = 1; i < best_of; ++i) {
    auto child = std::make_unique<SeqState>(tokenizer_, r.req.params);
    child->owner = &r;
    child->request_id = s.request_id;
    child->index = i;
    child->arrival = s.arrival;
    child->tokens = s.tokens;
    child->n_prompt = s.n_prompt;
    child->n_computed = s.n_computed;
    child->blocks = s.blocks;
    child->hashes = s.hashes;
    for (int32_t b : child->blocks) blocks_->add_ref(b);
    if (states_) {
      // The sibling's state: a copy of the prompt's, in a slot reserved at admission.
      TANDEM_ASSERT(!s.fork_slots.empty(), "a fork's state slot is reserved at admission");
      child->state_slot = s.fork_slots.back();
      s.fork_slots.pop_back();
      std::memcpy(kv_->state_slot(child->state_slot), kv_->state_slot(s.state_slot), kv_->shape().state_slot_bytes);
      pending_state_copies_.push_back(s.state_slot);
      pending_state_copies_.push_back(child->state_slot);
    }
    scheduler_->add_running_after(child.get(), &s);
    r.seqs.push_back(std::move(child));
  }
  TANDEM_ASSERT(s.fork_slots.empty(), "every reserved state slot went to a sibling");
  s.n_forks = 0;
  for (int32_t i = 0; i < best_of; ++i) append_token(r, *r.seqs[static_cast<size_t>(i)], firsts[static_cast<size_t>(i)]);
}

void EngineCore::emit(RequestState& r, std::string error) {
  RequestOutput out;
  out.error = std::move(error);
  out.request_id = r.req.id;
  out.step = step_.load(std::memory_order_relaxed);
  out.prompt_tokens = static_cast<int32_t>(r.req.prompt.size());
  out.cached_tokens = r.cached_tokens;
  bool all_finished = true;
  for (auto& s : r.seqs) {
    all_finished &= s->finished;
    const bool news = !s->pending.tokens.empty() || !s->pending.text.empty() ||
                      (s->finished && !s->reported_finish);
    if (!news) continue;
    s->pending.index = s->index;
    s->pending.cumulative_logprob = s->cumulative_logprob;
    if (s->finished) s->reported_finish = true;
    out.sequences.push_back(std::move(s->pending));
    s->pending = SequenceDelta{};
  }
  // Before the fork only sibling 0 exists, and it can only have finished by
  // an abort; after it every sibling exists. Either way: done when all are.
  out.finished = all_finished;
  if (out.finished && r.first_token_ns > 0) {
    const int64_t now = monotonic_ns();
    metrics_.e2e_s.observe(static_cast<double>(now - r.arrival_ns) * 1e-9);
    int32_t generated = 0;
    for (auto& s : r.seqs) generated = std::max(generated, s->n_generated);
    if (generated > 1) metrics_.tpot_s.observe(static_cast<double>(now - r.first_token_ns) * 1e-9 / (generated - 1));
  }
  if (r.req.sink) r.req.sink(std::move(out));
}

void EngineCore::publish() {
  // The KV snapshot and the gauges: refreshed after every step, and also when
  // there is nothing to step, since aborts alone can release the last owned
  // blocks and no step would follow to show it.
  const BlockManagerStats st = blocks_->stats();
  const int64_t slots_used = states_ ? states_->n_used() : 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    kv_stats_ = st;
    state_slots_used_ = slots_used;
  }
  metrics_.state_slots_used = slots_used;
  metrics_.running = scheduler_->n_running();
  metrics_.waiting = scheduler_->n_waiting();
  metrics_.kv_blocks_used = st.owned;
  metrics_.kv_blocks_cached = st.cached;
  metrics_.prefix_query_tokens = st.prefix_queries_tokens;
  metrics_.prefix_hit_tokens = st.prefix_hits_tokens;
}

bool EngineCore::step() {
  TANDEM_ASSERT(!lockstep_enabled_, "a lockstep engine steps with its group");
  drain_inputs();
  if (!scheduler_->has_work()) {
    publish();
    return false;
  }
  Stopwatch step_sw;
  const uint64_t step_no = step_.load(std::memory_order_relaxed) + 1;
  SchedulerOutput out = scheduler_->schedule();
  const auto schedule_ns = static_cast<int64_t>(step_sw.elapsed_s() * 1e9);
  metrics_.preemptions += out.n_preempted;
  if (out.chunks.empty()) {
    // Only P/D can leave nothing schedulable: blocks held for transfers still
    // in flight (allocated for KV that is on its way). Their KV arrives, or
    // their transfer ends, and frees the way; until then there is no step.
    TANDEM_ASSERT(!awaiting_remote_kv_.empty() || !awaiting_allocation_.empty() || metrics_.transfer_blocks_held > 0,
                  "a scheduler with work must schedule something (admission bounds requests)");
    publish();
    return false;
  }
  run_step(out, step_no, step_sw, schedule_ns);
  return true;
}

void EngineCore::run_step(SchedulerOutput& out, uint64_t step_no, Stopwatch& step_sw, int64_t schedule_ns) {
  Batch batch;
  for (const auto& [from, to] : out.block_copies) {
    std::memcpy(kv_->block(to), kv_->block(from), kv_->block_bytes());
    batch.block_copies.push_back(from);
    batch.block_copies.push_back(to);
  }
  batch.state_copies.swap(pending_state_copies_);
  for (const ScheduledChunk& c : out.chunks) {
    auto* s = static_cast<SeqState*>(c.seq);
    const bool prefill_only = s->owner->req.kv_role == KvRole::kPrefillOnly;
    batch.add_sequence(std::span<const int32_t>(c.seq->tokens).subspan(static_cast<size_t>(c.start), static_cast<size_t>(c.length)),
                       static_cast<int32_t>(c.start), c.seq->blocks, c.want_logits && !prefill_only,
                       c.seq->state_slot);
    if (s->index == 0 && !s->owner->forked && !s->owner->cached_reported) {
      // The first chunk of a prompt starts after its cached prefix.
      s->owner->cached_reported = true;
      s->owner->cached_tokens = static_cast<int32_t>(c.start);
    }
  }
  const int64_t n_vocab = model_.config().n_vocab;
  logits_.resize(batch.logit_rows.size() * static_cast<size_t>(n_vocab));
  const StepComposition composition = composition_of(out);
  Stopwatch forward_sw;
  if (executor_ != nullptr) {
    try {
      executor_->forward(batch, logits_.data());
    } catch (const ExecutorError& e) {
      // The step is lost: its requests (their KV of this step may be half
      // written) end with the executor's error; the others keep their KV
      // and go on once the executor has recovered.
      std::vector<uint64_t> ids;
      for (const ScheduledChunk& c : out.chunks) ids.push_back(static_cast<SeqState*>(c.seq)->owner->req.id);
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      for (uint64_t id : ids) abort_now(id, e.what());
      forget_lost_kv(e.what());
      ++metrics_.executor_failures;
      publish();
      return;
    }
  } else {
    model_.forward(batch, *kv_, *pool_, logits_.data());
  }
  const auto forward_ns = static_cast<int64_t>(forward_sw.elapsed_s() * 1e9);
  scheduler_->on_computed(out);
  step_.store(step_no, std::memory_order_release);

  std::vector<RequestState*> touched;
  std::vector<uint64_t> done;
  // Requests whose logits were not finite, with the error they end with.
  std::vector<std::pair<uint64_t, std::string>> failed;
  size_t row = 0;
  for (const ScheduledChunk& c : out.chunks) {
    if (!c.want_logits) continue;
    auto* s = static_cast<SeqState*>(c.seq);
    if (std::any_of(failed.begin(), failed.end(), [&](const auto& f) { return f.first == s->owner->req.id; })) {
      ++row;  // (a sibling's row: its request ends already)
      continue;
    }
    if (s->owner->req.kv_role == KvRole::kPrefillOnly) {
      // Its whole prompt (less the last token) is computed: the blocks leave
      // the scheduler, held for the transfer.
      scheduler_->detach(s);
      finish_prefill_only(*s->owner, *s);
      done.push_back(s->request_id);
      continue;
    }
    try {
      process_logits(*s, logits_.data() + row * static_cast<size_t>(n_vocab), touched);
    } catch (const NonFiniteLogits& e) {
      failed.emplace_back(s->owner->req.id, std::string(e.what()) + " (at position " +
                                                std::to_string(s->tokens.size()) + " of the sequence)");
    }
    ++row;
  }
  for (const auto& [id, error] : failed) {
    std::erase(touched, requests_.at(id).get());
    abort_now(id, error);
    ++metrics_.nonfinite_logits;
  }
  for (RequestState* r : touched) {
    r->touched = false;
    emit(*r);
    bool all = r->forked;
    for (auto& s : r->seqs) all &= s->finished;
    if (all) done.push_back(r->req.id);
  }
  for (uint64_t id : done) {
    requests_.erase(id);
    ++metrics_.requests_finished;
  }

  publish();
  metrics_.steps = static_cast<int64_t>(step_no);
  const auto step_ns = static_cast<int64_t>(step_sw.elapsed_s() * 1e9);
  metrics_.step_time_ns_total += step_ns;
  metrics_.schedule_time_ns_total += schedule_ns;
  const StepKind kind = composition.decode_rows == 0   ? StepKind::kPrefill
                        : composition.prefill_tokens == 0 ? StepKind::kDecode
                                                          : StepKind::kMixed;
  StepKindCounters& k = metrics_.step_kinds[static_cast<size_t>(kind)];
  ++k.steps;
  k.step_time_ns += step_ns;
  k.forward_time_ns += forward_ns;
  k.prefill_tokens += composition.prefill_tokens;
  k.decode_rows += composition.decode_rows;
}

bool EngineCore::ready(std::string* why) const {
  if (executor_ != nullptr && !executor_->ready(why)) return false;
  if (!lockstep_enabled_) return true;
  std::lock_guard<std::mutex> lock(lockstep_mu_);
  if (lockstep_info_.connected) return true;
  if (why != nullptr)
    *why = "the data-parallel group of rank " + std::to_string(lockstep_info_.rank) + " is not formed" +
           (lockstep_info_.last_error.empty() ? std::string() : " (last error: " + lockstep_info_.last_error + ")");
  return false;
}

LockstepStatus EngineCore::lockstep_status() const {
  std::lock_guard<std::mutex> lock(lockstep_mu_);
  LockstepStatus st = lockstep_info_;
  if (group_) {
    st.counters = group_->counters();
    st.in_flight = group_->in_flight();
  }
  return st;
}

void EngineCore::forget_lost_kv(const std::string& why) {
  if (!executor_->take_kv_lost()) return;
  // Nothing computed before can be trusted: every request holding blocks
  // ends, and no later prompt may match a cached block.
  fail_all(why.empty() ? "the KV cache was lost with a tensor-parallel worker that was replaced: resend the request" : why);
  blocks_->forget_cached();
  publish();
}

void EngineCore::fail_all(const std::string& error) {
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : requests_) ids.push_back(id);
  for (uint64_t id : ids) abort_now(id, error);
}

void EngineCore::fail_pending_adds(const std::string& error) {
  std::deque<EngineRequest> adds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    adds.swap(pending_adds_);
  }
  for (EngineRequest& req : adds) {
    RequestOutput out;
    out.request_id = req.id;
    out.error = error;
    out.finished = true;
    ++metrics_.requests_aborted;
    if (req.sink) req.sink(std::move(out));
  }
}

void EngineCore::lockstep_loop() {
  while (running_.load(std::memory_order_acquire)) {
    heartbeat_.fetch_add(1, std::memory_order_acq_rel);
    if (!group_) {
      try {
        auto group = lockstep_.connect();
        {
          std::lock_guard<std::mutex> lock(lockstep_mu_);
          group_ = std::move(group);
          if (experts_) experts_->bind(group_.get());
          lockstep_step_ = 0;
          lockstep_info_.connected = true;
          lockstep_info_.rank = group_->rank();
          lockstep_info_.size = group_->size();
        }
        if (lockstep_.on_connected) lockstep_.on_connected();
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(lockstep_mu_);
          lockstep_info_.last_error = e.what();
        }
        // No request waits for a group that is not there: what arrived ends
        // at once with the reason (the HTTP front answers 503 meanwhile).
        fail_pending_adds("the data-parallel group is not formed: " + std::string(e.what()));
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(lockstep_.reconnect_wait_ms),
                     [&] { return !running_.load(std::memory_order_acquire); });
        continue;
      }
    }
    if (lockstep_step()) continue;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(lockstep_.idle_wait_ms), [&] { return has_input_locked(); });
  }
}

bool EngineCore::lockstep_step() {
  drain_inputs();
  Stopwatch step_sw;
  SchedulerOutput out;
  if (scheduler_->has_work()) {
    out = scheduler_->schedule();
    metrics_.preemptions += out.n_preempted;
  }
  const auto schedule_ns = static_cast<int64_t>(step_sw.elapsed_s() * 1e9);
  parallel::StepHeader header;
  for (const ScheduledChunk& c : out.chunks) {
    header.n_tokens += c.length;
    header.produces_output = header.produces_output || c.want_logits;
  }
  const StepComposition composition = composition_of(out);
  const bool prefill = composition.prefill_tokens > 0, decode = composition.decode_rows > 0;
  header.n_padded_tokens = header.n_tokens;
  header.phase = prefill && decode ? parallel::StepPhase::kMixed
                 : prefill         ? parallel::StepPhase::kPrefill
                 : decode          ? parallel::StepPhase::kDecode
                                   : parallel::StepPhase::kIdle;
  header.n_running = scheduler_->n_running();
  header.n_waiting = scheduler_->n_waiting() + static_cast<int64_t>(awaiting_allocation_.size());
  header.kv_blocks_free = blocks_->stats().free;
  try {
    const parallel::StepDecision d = group_->begin_step(++lockstep_step_, header);
    {
      std::lock_guard<std::mutex> lock(lockstep_mu_);
      lockstep_info_.step_id = d.step_id;
      lockstep_info_.loads = d.ranks;
    }
    if (!out.chunks.empty()) {
      run_step(out, step_.load(std::memory_order_relaxed) + 1, step_sw, schedule_ns);
    } else {
      // A dummy step (peers have work): with expert parallelism this rank
      // still computes its experts for their rows; an idle step runs nothing.
      if (experts_ && d.any_work) model_.run_expert_layers_empty(*pool_);
      publish();
    }
    group_->end_step();
    return d.any_work;
  } catch (const parallel::LockstepError& e) {
    // Every rank raised this error in the same op: the requests in flight here
    // end with it, the group is rebuilt, and the next requests are served.
    fail_all(e.what());
    publish();
    {
      std::lock_guard<std::mutex> lock(lockstep_mu_);
      lockstep_info_.counters = group_->counters();  // kept: what the failed group did
      if (experts_) experts_->bind(nullptr);
      group_.reset();
      lockstep_info_.connected = false;
      ++lockstep_info_.group_failures;
      lockstep_info_.last_error = e.what();
    }
    if (lockstep_.on_failure) lockstep_.on_failure(e);
    return false;
  }
}

}  // namespace tandem
