#include "cli/tensor_parallel.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/child_process.h"
#include "kernels/dtype.h"
#include "parallel/frame.h"
#include "parallel/lockstep_group.h"
#include "transport/shm_frames.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/shared_file.h"

namespace tandem::cli {

using parallel::BroadcastRing;
using parallel::RingError;
using parallel::RingWait;

namespace {

constexpr uint32_t kStepSlots = 4;
constexpr uint32_t kReplySlots = 2;
constexpr uint64_t kReplyTextBytes = 64 << 10;

// The process state letter of /proc/<pid>/stat (R, S, D, T, Z, ...), '?' if unknown.
char process_state(pid_t pid) {
  if (pid <= 0) return '?';
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return '?';
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
}

const char* state_word(char s) {
  switch (s) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "in uninterruptible I/O";
    case 'T': case 't': return "STOPPED";
    case 'Z': return "a zombie";
    default: return "unknown";
  }
}

const char* phase_name(int32_t p) {
  switch (static_cast<WorkerPhase>(p)) {
    case WorkerPhase::kStarting: return "starting";
    case WorkerPhase::kIdle: return "idle";
    case WorkerPhase::kInStep: return "in a step";
    case WorkerPhase::kFailed: return "failed";
  }
  return "unknown";
}

}  // namespace

TensorParallelDir::TensorParallelDir() {
  static std::atomic<int> counter{0};
  const std::string base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : std::filesystem::temp_directory_path().string();
  path_ = base + "/tandem-tp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TensorParallelDir::~TensorParallelDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

LoadOptions tensor_parallel_core_load(int size) {
  LoadOptions o;
  o.tensor_ranks = size;
  o.prefault = false;
  o.interleave_weights = false;
  return o;
}

void size_tensor_parallel(TensorParallelOptions& o, const std::string& model_path, int64_t n_vocab, int64_t max_tokens,
                          int64_t max_seqs, int64_t max_len, int block_size, int threads) {
  o.model_path = model_path;
  o.n_vocab = n_vocab;
  o.max_num_batched_tokens = max_tokens;
  o.max_num_seqs = max_seqs;
  o.max_model_len = max_len;
  o.block_size = block_size;
  if (o.threads_per_worker == 0 && threads > 0) o.threads_per_worker = std::max(1, threads / o.size);
}

TensorParallelExecutor::TensorParallelExecutor(const TensorParallelOptions& options, const KvPool& kv,
                                               const std::string& kv_path)
    : options_(options), kv_shape_(kv.shape()), kv_path_(kv_path) {
  TANDEM_ASSERT(options.size >= 2 && options.size <= parallel::kMaxRingReaders && options.n_vocab > 0);
  dir_ = std::filesystem::path(kv_path).parent_path().string();
  status_bytes_ = sizeof(WorkerStatus) * static_cast<size_t>(options.size);
  std::string error;
  status_ = static_cast<WorkerStatus*>(map_shared_file(dir_ + "/status", status_bytes_, true, &error));
  if (status_ == nullptr) throw Error("the tensor-parallel status page: " + error);
  workers_.resize(static_cast<size_t>(options.size));
  start_workers();
}

TensorParallelExecutor::~TensorParallelExecutor() {
  stop_workers(true);
  if (status_ != nullptr) ::munmap(status_, status_bytes_);
}

void TensorParallelExecutor::start_workers() {
  const int n = options_.size;
  int generation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation = ++generation_;
    // Fresh rings for a fresh set of workers: nothing of a failed set's
    // messages can be read by the next.
    steps_ = BroadcastRing::create(
        dir_ + "/steps.ring",
        parallel::RingShape{kStepSlots,
                            max_batch_bytes(options_.max_num_batched_tokens, options_.max_num_seqs,
                                            (options_.max_model_len + options_.block_size - 1) / options_.block_size + 1),
                            n},
        BroadcastRing::kWriter, "steps");
    const uint64_t reply_bytes =
        static_cast<uint64_t>(options_.max_num_seqs) * static_cast<uint64_t>(options_.n_vocab) * sizeof(float) + kReplyTextBytes;
    for (int r = 0; r < n; ++r)
      workers_[static_cast<size_t>(r)].replies =
          BroadcastRing::create(dir_ + "/reply." + std::to_string(r) + ".ring", parallel::RingShape{kReplySlots, reply_bytes, 1},
                                0, "replies of worker " + std::to_string(r));
    std::memset(static_cast<void*>(status_), 0, status_bytes_);
  }
  const std::string group_dir = dir_ + "/g" + std::to_string(generation);
  std::filesystem::create_directories(group_dir);
  int threads = options_.threads_per_worker;
  if (threads <= 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / n);
  for (int r = 0; r < n; ++r) {
    const std::vector<std::string> args = {self_exe(), "tensor-worker", "--model", options_.model_path,
                                           "--rank", std::to_string(r), "--size", std::to_string(n),
                                           "--dir", dir_, "--generation", std::to_string(generation),
                                           "--threads", std::to_string(threads),
                                           "--kv-blocks", std::to_string(kv_shape_.n_blocks),
                                           "--block-size", std::to_string(kv_shape_.block_size),
                                           "--kv-dtype", kernels::dtype_name(kv_shape_.dtype),
                                           "--state-slots", std::to_string(kv_shape_.n_state_slots),
                                           "--timeout-ms", std::to_string(options_.timeout_ms),
                                           "--core-pid", std::to_string(::getpid())};
    workers_[static_cast<size_t>(r)].pid = spawn_child(args, {}, SIGKILL);
  }
  // Each worker answers once loaded and met: a kReady on its ring.
  const int64_t deadline = monotonic_ns() + options_.start_timeout_ms * 1'000'000;
  try {
    for (int r = 0; r < n; ++r) {
      RingWait w = reply_wait(r, deadline);
      w.soft_deadline_ms = 0;
      BroadcastRing::ReadGuard g = workers_[static_cast<size_t>(r)].replies->read(w);
      const auto kind = static_cast<ReplyKind>(g.message().kind);
      if (kind != ReplyKind::kReady) {
        const auto& p = g.message().payload;
        throw Error("tensor-parallel worker " + std::to_string(r) + " did not start: " +
                    std::string(p.begin() + std::min<size_t>(p.size(), 4), p.end()));
      }
    }
  } catch (const std::exception& e) {
    stop_workers(false);
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = e.what();
    throw Error(std::string("the tensor-parallel workers did not start: ") + e.what());
  }
  for (auto& w : workers_) w.replies->unlink();
  steps_->unlink();
  step_id_ = 0;
  std::lock_guard<std::mutex> lock(mu_);
  ready_ = true;
  std::fprintf(stderr, "tandem: tensor parallelism: %d workers ready (generation %d, %d threads each)\n", n, generation,
               threads);
}

void TensorParallelExecutor::stop_workers(bool graceful) {
  if (graceful && steps_) {
    try {
      RingWait w;
      w.soft_deadline_ms = 0;
      w.hard_deadline_ms = 1000;
      steps_->publish(step_id_ + 1, static_cast<uint32_t>(StepKind::kShutdown), {}, w);
    } catch (const std::exception&) {
    }
    const int64_t deadline = monotonic_ns() + 3'000'000'000;
    for (auto& w : workers_)
      while (w.pid > 0 && monotonic_ns() < deadline) {
        if (::waitpid(w.pid, nullptr, WNOHANG) == w.pid) w.pid = -1;
        else std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
  }
  for (auto& w : workers_) {
    if (w.pid <= 0) continue;
    ::kill(w.pid, SIGKILL);
    ::waitpid(w.pid, nullptr, 0);
    w.pid = -1;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ready_ = false;
  for (auto& w : workers_) w.replies.reset();
  steps_.reset();
  // The group's rendezvous files, and its shared-memory frame ring (which
  // its rank 0 unlinks once every worker attached, unless the set died first).
  std::error_code ec;
  const std::string g = "g" + std::to_string(generation_);
  ::unlink(ShmFrames::path_for(dir_ + "/" + g, g).c_str());
  std::filesystem::remove_all(dir_ + "/" + g, ec);
}

std::string TensorParallelExecutor::dead_worker() {
  for (size_t r = 0; r < workers_.size(); ++r) {
    Worker& w = workers_[r];
    int st = 0;
    if (w.pid <= 0 || ::waitpid(w.pid, &st, WNOHANG) != w.pid) continue;
    const pid_t pid = w.pid;
    w.pid = -1;
    const std::string how = WIFSIGNALED(st) ? "was killed by signal " + std::to_string(WTERMSIG(st))
                                            : "exited with status " + std::to_string(WEXITSTATUS(st));
    return "tensor-parallel worker " + std::to_string(r) + " (pid " + std::to_string(pid) + ") " + how;
  }
  return {};
}

std::string TensorParallelExecutor::describe_workers() const {
  const int64_t now = monotonic_ns();
  std::string s;
  for (int r = 0; r < options_.size; ++r) {
    const WorkerStatus& st = status_[r];
    const pid_t pid = workers_[static_cast<size_t>(r)].pid;
    const char ps = process_state(pid);
    s += (r == 0 ? "" : "; ");
    s += "worker " + std::to_string(r) + ((replied_mask_ >> r) & 1 ? " (replied)" : " (no reply)") + ": pid " +
         std::to_string(pid) + " " + state_word(ps) + ", " + phase_name(st.phase.load()) + ", step " +
         std::to_string(st.step_id.load()) + ", heartbeat " +
         (st.heartbeat_ns.load() == 0 ? std::string("never") : std::to_string((now - st.heartbeat_ns.load()) / 1'000'000) + " ms ago");
    const int64_t kind = st.op_kind.load();
    if (kind != 0 && st.phase.load() == static_cast<int32_t>(WorkerPhase::kInStep)) {
      s += ", inside " + std::string(parallel::op_kind_name(kind)) + " seq " + std::to_string(st.op_seq.load()) +
           " for " + std::to_string((now - st.op_since_ns.load()) / 1'000'000) + " ms";
      if (st.op_data_phase.load() != 0)
        s += " (its data phase: the frames of every worker arrived)";
      else
        s += ", arrived " + parallel::ranks_in(st.op_arrived.load(), options_.size, true) + ", missing " +
             parallel::ranks_in(st.op_arrived.load(), options_.size, false);
    }
  }
  return s;
}

RingWait TensorParallelExecutor::reply_wait(int rank, int64_t deadline_ns) {
  RingWait w;
  w.soft_deadline_ms = options_.soft_deadline_ms;
  w.hard_deadline_ms = std::max<int64_t>(1, (deadline_ns - monotonic_ns()) / 1'000'000);
  w.peer_gone = [this] { return dead_worker(); };
  w.report = [this, rank](const std::string& ring_report) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++soft_reports_;
    }
    std::fprintf(stderr, "tandem: tensor-parallel step %lld: the engine core (reader) waits for the reply of worker %d: %s; %s; %s\n",
                 static_cast<long long>(step_id_), rank, describe_workers().c_str(), ring_report.c_str(),
                 steps_ ? steps_->dump().c_str() : "");
  };
  return w;
}

void TensorParallelExecutor::fail(const std::string& message) {
  std::fprintf(stderr, "tandem: %s; the workers are restarted\n", message.c_str());
  stop_workers(false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = message;
    ++failures_;
  }
  next_restart_ns_ = 0;
  waiting_since_ns_.store(0);
  throw ExecutorError(message);
}

void TensorParallelExecutor::forward(const Batch& batch, float* logits) {
  if (!steps_) {
    // A failed set of workers is replaced before the next step runs.
    const std::string error = restart_workers();
    if (!error.empty()) throw ExecutorError("tensor-parallel workers are not running: " + error);
  }
  const int64_t step = ++step_id_;
  const std::vector<uint8_t> bytes = encode_batch(batch);
  const int64_t start = monotonic_ns();
  waiting_since_ns_.store(start);
  const int64_t deadline = start + options_.timeout_ms * 1'000'000;
  replied_mask_ = 0;
  std::string own_error, others, protocol_error;
  int own_rank = -1;
  try {
    RingWait w = reply_wait(0, deadline);
    w.report = nullptr;
    steps_->publish(step, static_cast<uint32_t>(StepKind::kStep), bytes, w);
    const size_t logit_bytes = batch.logit_rows.size() * static_cast<size_t>(options_.n_vocab) * sizeof(float);
    for (int r = 0; r < options_.size; ++r) {
      BroadcastRing::ReadGuard g = workers_[static_cast<size_t>(r)].replies->read(reply_wait(r, deadline));
      const parallel::RingMessage& m = g.message();
      if (m.step_id != step) {
        protocol_error = "tensor-parallel step " + std::to_string(step) + ": worker " + std::to_string(r) +
                         " replied for step " + std::to_string(m.step_id);
        break;
      }
      replied_mask_ |= uint64_t{1} << r;
      if (static_cast<ReplyKind>(m.kind) == ReplyKind::kFailed) {
        // [int32 own][text]: `own` when the error is the worker's own, not
        // the group's verdict on another's.
        int32_t own = 0;
        if (m.payload.size() >= 4) std::memcpy(&own, m.payload.data(), 4);
        const std::string text(m.payload.begin() + std::min<size_t>(4, m.payload.size()), m.payload.end());
        if (own != 0 && own_error.empty()) {
          own_error = text;
          own_rank = r;
        } else {
          others += (others.empty() ? "" : "; ") + std::string("worker ") + std::to_string(r) + ": " + text;
        }
        continue;
      }
      if (r == 0) {
        if (m.payload.size() != logit_bytes) {
          protocol_error = "tensor-parallel step " + std::to_string(step) + ": worker 0 returned " +
                           std::to_string(m.payload.size()) + " bytes of logits, not " + std::to_string(logit_bytes);
          break;
        }
        if (logit_bytes > 0) std::memcpy(logits, m.payload.data(), logit_bytes);
      }
    }
  } catch (const RingError& e) {
    protocol_error = "tensor-parallel step " + std::to_string(step) + " failed: " + e.what() +
                     (e.kind() == RingError::Kind::kTimeout ? "; " + describe_workers() : std::string());
  }
  // (Every reply's slot is released by now: the rings may go.)
  waiting_since_ns_.store(0);
  if (!protocol_error.empty()) fail(protocol_error);
  if (!own_error.empty())
    fail("tensor-parallel step " + std::to_string(step) + " failed on worker " + std::to_string(own_rank) + ": " +
         own_error + (others.empty() ? std::string() : " (after the vote: " + others + ")"));
  if (!others.empty()) fail("tensor-parallel step " + std::to_string(step) + " failed: " + others);
  std::lock_guard<std::mutex> lock(mu_);
  ++steps_done_;
  forward_ns_ += monotonic_ns() - start;
}

void TensorParallelExecutor::idle() {
  if (steps_) {
    // A worker that died between steps is replaced now, not at the next request.
    const std::string dead = dead_worker();
    if (dead.empty()) return;
    std::fprintf(stderr, "tandem: %s while idle; the workers are restarted\n", dead.c_str());
    stop_workers(false);
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = dead;
    ++failures_;
    return;
  }
  if (monotonic_ns() < next_restart_ns_) return;
  const std::string error = restart_workers();
  if (!error.empty()) std::fprintf(stderr, "tandem: %s\n", error.c_str());
}

std::string TensorParallelExecutor::restart_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++restarts_;
  }
  try {
    start_workers();
    return {};
  } catch (const std::exception& e) {
    next_restart_ns_ = monotonic_ns() + 1'000'000'000;  // the next try, if this set did not start
    return e.what();
  }
}

bool TensorParallelExecutor::ready(std::string* why) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (ready_) return true;
  if (why != nullptr)
    *why = "the tensor-parallel workers are restarting" + (last_error_.empty() ? std::string() : " (last error: " + last_error_ + ")");
  return false;
}

TensorParallelSnapshot TensorParallelExecutor::snapshot() const {
  TensorParallelSnapshot s;
  const int64_t now = monotonic_ns();
  std::lock_guard<std::mutex> lock(mu_);
  s.enabled = true;
  s.ready = ready_;
  s.size = options_.size;
  s.generation = generation_;
  s.step_id = step_id_;
  s.steps = steps_done_;
  s.failures = failures_;
  s.restarts = restarts_;
  s.soft_deadline_reports = soft_reports_;
  s.forward_ns = forward_ns_;
  const int64_t since = waiting_since_ns_.load();
  s.waiting_since_ms = since == 0 ? -1 : (now - since) / 1'000'000;
  s.last_error = last_error_;
  if (steps_) s.ring = steps_->counters();
  for (int r = 0; r < options_.size; ++r) {
    const WorkerStatus& st = status_[r];
    TensorWorkerSnapshot w;
    w.rank = r;
    w.pid = st.pid.load();
    w.process_state = process_state(w.pid);
    w.phase = st.phase.load();
    w.step_id = st.step_id.load();
    w.steps_done = st.steps_done.load();
    const int64_t hb = st.heartbeat_ns.load();
    w.heartbeat_age_ms = hb == 0 ? -1 : (now - hb) / 1'000'000;
    w.op_kind = st.op_kind.load();
    w.op_seq = st.op_seq.load();
    w.op_age_ms = w.op_kind == 0 ? -1 : (now - st.op_since_ns.load()) / 1'000'000;
    w.op_arrived = st.op_arrived.load();
    w.op_data_phase = st.op_data_phase.load() != 0;
    w.ops = st.ops.load();
    w.gathers = st.gathers.load();
    w.gather_bytes = st.gather_bytes.load();
    w.gather_ns = st.gather_ns.load();
    w.consensus_ns = st.consensus_ns.load();
    w.step_ns = st.step_ns.load();
    s.workers.push_back(w);
  }
  return s;
}

}  // namespace tandem::cli
