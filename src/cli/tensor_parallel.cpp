#include "cli/tensor_parallel.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli/child_process.h"
#include "gguf/gguf.h"
#include "instance/fingerprint.h"
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
constexpr const char* kKvLostMessage =
    "the KV cache was lost with a tensor-parallel worker on another host that was replaced by a new process: "
    "resend the request";

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

// A joined worker's link: a reader thread takes its status into the core's
// page (as a spawned worker's own writes would) and queues its replies.
struct TensorParallelExecutor::RemoteLink {
  std::unique_ptr<TensorLink> link;
  int32_t pid = 0;
  std::thread reader;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<LinkMessage> replies;
  std::string gone;  // why the link ended; empty while it is up

  RemoteLink(std::unique_ptr<TensorLink> l, int32_t p, WorkerStatus& status, uint64_t max_reply_bytes)
      : link(std::move(l)), pid(p) {
    reader = std::thread([this, &status, max_reply_bytes] {
      for (;;) {
        LinkMessage m;
        std::string error;
        try {
          if (!link->receive(m, 200, max_reply_bytes)) continue;
          if (m.kind == static_cast<uint32_t>(LinkKind::kStatus)) {
            decode_status(m.payload, status, monotonic_ns());
            continue;
          }
          if (m.kind < static_cast<uint32_t>(ReplyKind::kReady) || m.kind > static_cast<uint32_t>(ReplyKind::kFailed))
            error = "it sent a message of kind " + std::to_string(m.kind) + ", which is no reply";
        } catch (const std::exception& e) {
          error = e.what();
        }
        std::lock_guard<std::mutex> lock(mu);
        if (!error.empty()) {
          gone = error;
          cv.notify_all();
          return;
        }
        replies.push_back(std::move(m));
        cv.notify_all();
      }
    });
  }
  ~RemoteLink() {
    link->close_now();
    reader.join();
  }
};

TensorParallelExecutor::Worker::Worker() = default;
TensorParallelExecutor::Worker::~Worker() = default;
TensorParallelExecutor::Worker::Worker(Worker&&) noexcept = default;

TensorParallelExecutor::TensorParallelExecutor(const TensorParallelOptions& options, const KvPool& kv,
                                               const std::string& kv_path)
    : options_(options), kv_shape_(kv.shape()), kv_path_(kv_path) {
  TANDEM_ASSERT(options.size >= 2 && options.size <= parallel::kMaxRanks && options.n_local() >= 1 &&
                options.n_local() <= std::min(options.size, parallel::kMaxRingReaders) && options.n_vocab > 0);
  dir_ = std::filesystem::path(kv_path).parent_path().string();
  group_base_ = dir_;
  // The status page before any thread: a throw below leaves nothing running.
  status_bytes_ = sizeof(WorkerStatus) * static_cast<size_t>(options.size);
  std::string error;
  status_ = static_cast<WorkerStatus*>(map_shared_file(dir_ + "/status", status_bytes_, true, &error));
  if (status_ == nullptr) throw Error("the tensor-parallel status page: " + error);
  if (options.cross_host()) {
    if (options.rendezvous_dir.empty())
      throw Error("workers on other hosts (--tensor-parallel-local-workers " + std::to_string(options.n_local()) +
                  " of " + std::to_string(options.size) +
                  ") meet in a directory every host reaches: give --tensor-parallel-rendezvous DIR");
    group_base_ = options.rendezvous_dir + "/tandem-tp-" + std::to_string(::getpid());
    std::filesystem::create_directories(group_base_);
    model_hash_ = instance::model_hash(gguf::File::open(options.model_path));
    joins_.resize(static_cast<size_t>(options.size));
    listener_ = std::make_unique<LinkListener>(options.host, options.port);
    accept_thread_ = std::thread([this] { accept_joins(); });
    const std::string at = options.host + ":" + std::to_string(listener_->port());
    std::fprintf(stderr,
                 "tandem: tensor parallelism: ranks %d..%d join at %s (on their hosts: tandem tensor-worker --join %s "
                 "--rank R --model FILE --host THEIR_ADDRESS)\n",
                 options.n_local(), options.size - 1, at.c_str(), at.c_str());
  }
  workers_.resize(static_cast<size_t>(options.size));
  try {
    start_workers(options.start_timeout_ms);
  } catch (...) {
    stop_joins();
    throw;
  }
}

TensorParallelExecutor::~TensorParallelExecutor() {
  stop_workers(true);
  stop_joins();
  if (status_ != nullptr) ::munmap(status_, status_bytes_);
}

void TensorParallelExecutor::stop_joins() {
  stopping_ = true;
  if (accept_thread_.joinable()) accept_thread_.join();
  std::lock_guard<std::mutex> lock(joins_mu_);
  joins_.clear();
  std::error_code ec;
  if (options_.cross_host()) std::filesystem::remove_all(group_base_, ec);
}

std::string TensorParallelExecutor::who(int rank) const {
  std::string s = "tensor-parallel worker " + std::to_string(rank);
  const Worker& w = workers_[static_cast<size_t>(rank)];
  if (w.remote) s += " on " + w.remote->link->peer() + " (pid " + std::to_string(w.remote->pid) + ")";
  return s;
}

void TensorParallelExecutor::accept_joins() {
  while (!stopping_.load()) {
    std::unique_ptr<TensorLink> link = listener_->accept(200);
    if (!link) continue;
    // Its hello: "rank=R\npid=P\nkv_fresh=0|1\n", within a bound.
    int rank = -1;
    long long pid = 0;
    int fresh = 1;
    try {
      LinkMessage m;
      if (!link->receive(m, 5000, 4096) || m.kind != static_cast<uint32_t>(LinkKind::kHello))
        throw Error("no hello within 5 s");
      const std::string hello(m.payload.begin(), m.payload.end());
      if (std::sscanf(hello.c_str(), "rank=%d\npid=%lld\nkv_fresh=%d", &rank, &pid, &fresh) != 3)
        throw Error("a malformed hello");
      if (rank < options_.n_local() || rank >= options_.size)
        throw Error("rank " + std::to_string(rank) + " is not one that joins here: ranks " +
                    std::to_string(options_.n_local()) + ".." + std::to_string(options_.size - 1) + " do");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem: a tensor-parallel join from %s refused: %s\n", link->peer().c_str(), e.what());
      try {
        const std::string why = e.what();
        link->send(static_cast<uint32_t>(ReplyKind::kFailed), 0, {reinterpret_cast<const uint8_t*>(why.data()), why.size()},
                   1000);
      } catch (const std::exception&) {
      }
      continue;
    }
    std::fprintf(stderr, "tandem: tensor-parallel worker %d joined from %s (pid %lld)\n", rank, link->peer().c_str(), pid);
    std::lock_guard<std::mutex> lock(joins_mu_);
    joins_[static_cast<size_t>(rank)] = Join{std::move(link), static_cast<int32_t>(pid), fresh != 0};
  }
}

void TensorParallelExecutor::start_workers(int64_t join_wait_ms) {
  const int n = options_.size;
  const int n_local = options_.n_local();
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
                            n_local},
        BroadcastRing::kWriter, "steps");
    const uint64_t reply_bytes =
        static_cast<uint64_t>(options_.max_num_seqs) * static_cast<uint64_t>(options_.n_vocab) * sizeof(float) + kReplyTextBytes;
    for (int r = 0; r < n_local; ++r)
      workers_[static_cast<size_t>(r)].replies =
          BroadcastRing::create(dir_ + "/reply." + std::to_string(r) + ".ring", parallel::RingShape{kReplySlots, reply_bytes, 1},
                                0, "replies of worker " + std::to_string(r));
    std::memset(static_cast<void*>(status_), 0, status_bytes_);
  }
  const std::string group_dir = group_base_ + "/g" + std::to_string(generation);
  std::filesystem::create_directories(group_dir);
  int threads = options_.threads_per_worker;
  if (threads <= 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / n_local);
  TensorJob job;
  job.model_path = options_.model_path;
  job.model_hash = model_hash_;
  job.size = n;
  job.generation = generation;
  job.threads = threads;
  job.dir = dir_;
  job.rendezvous_dir = group_dir;
  job.bind_host = options_.host;
  job.shared_memory_frames = !options_.cross_host();
  job.kv_blocks = kv_shape_.n_blocks;
  job.block_size = kv_shape_.block_size;
  job.kv_dtype = kernels::dtype_name(kv_shape_.dtype);
  job.state_slots = kv_shape_.n_state_slots;
  job.timeout_ms = options_.timeout_ms;
  job.core_pid = static_cast<int>(::getpid());
  // The joined workers first: a set that lacks one does not start at all.
  std::vector<Join> joined(static_cast<size_t>(n));
  const int64_t join_deadline = monotonic_ns() + join_wait_ms * 1'000'000;
  for (int r = n_local; r < n; ++r) {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(joins_mu_);
        if (joins_[static_cast<size_t>(r)].link) {
          joined[static_cast<size_t>(r)] = std::move(joins_[static_cast<size_t>(r)]);
          break;
        }
      }
      if (monotonic_ns() >= join_deadline) {
        std::lock_guard<std::mutex> lock(mu_);
        last_error_ = "tensor-parallel worker " + std::to_string(r) + " has not joined at " + options_.host + ":" +
                      std::to_string(listener_->port()) + " (start tandem tensor-worker --join " + options_.host + ":" +
                      std::to_string(listener_->port()) + " --rank " + std::to_string(r) + " on its host)";
        steps_.reset();
        for (auto& w : workers_) w.replies.reset();
        throw Error(last_error_);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  for (int r = 0; r < n_local; ++r) {
    job.rank = r;
    workers_[static_cast<size_t>(r)].pid = spawn_child(tensor_worker_args(job), {}, SIGKILL);
  }
  const uint64_t reply_bytes =
      static_cast<uint64_t>(options_.max_num_seqs) * static_cast<uint64_t>(options_.n_vocab) * sizeof(float) + kReplyTextBytes;
  bool fresh_kv = false;
  for (int r = n_local; r < n; ++r) {
    Join& j = joined[static_cast<size_t>(r)];
    fresh_kv = fresh_kv || j.kv_fresh;
    job.rank = r;
    TensorJob remote = job;
    remote.dir.clear();
    const std::vector<uint8_t> bytes = encode_job(remote);
    try {
      j.link->send(static_cast<uint32_t>(LinkKind::kJob), 0, bytes, 5000);
    } catch (const std::exception&) {
      // Its link broke since it joined: the wait for its kReady says so.
    }
    auto link = std::make_unique<RemoteLink>(std::move(j.link), j.pid, status_[r], reply_bytes);
    std::lock_guard<std::mutex> lock(mu_);  // snapshot() reads who is remote
    workers_[static_cast<size_t>(r)].remote = std::move(link);
  }
  // A joined worker whose process is new holds none of the KV the blocks
  // had: once a set ran before, the engine must forget them.
  if (generation > 1 && fresh_kv) kv_lost_ = true;
  // Each worker answers once loaded and met: a kReady on its ring.
  const int64_t deadline = monotonic_ns() + options_.start_timeout_ms * 1'000'000;
  try {
    for (int r = 0; r < n; ++r) {
      RingWait w = reply_wait(r, deadline);
      w.soft_deadline_ms = 0;
      const Reply reply = read_reply(r, w);
      if (static_cast<ReplyKind>(reply.kind) != ReplyKind::kReady) {
        const auto& p = reply.payload;
        throw Error(who(r) + " did not start: " + std::string(p.begin() + std::min<size_t>(p.size(), 4), p.end()));
      }
    }
  } catch (const std::exception& e) {
    // A worker that could not start said why before it exited, maybe after
    // the wait for an earlier one's reply saw it go: its own words first.
    std::string why = e.what();
    for (int r = 0; r < n_local; ++r) {
      BroadcastRing* ring = workers_[static_cast<size_t>(r)].replies.get();
      if (ring == nullptr || !ring->readable()) continue;
      try {
        RingWait w;
        w.soft_deadline_ms = 0;
        w.hard_deadline_ms = 100;
        BroadcastRing::ReadGuard g = ring->read(w);
        const auto& p = g.message().payload;
        if (static_cast<ReplyKind>(g.message().kind) != ReplyKind::kFailed) continue;
        why = who(r) + " did not start: " + std::string(p.begin() + std::min<size_t>(p.size(), 4), p.end());
        break;
      } catch (const std::exception&) {
      }
    }
    stop_workers(false);
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = why;
    throw Error("the tensor-parallel workers did not start: " + why);
  }
  for (auto& w : workers_)
    if (w.replies) w.replies->unlink();
  steps_->unlink();
  step_id_ = 0;
  std::lock_guard<std::mutex> lock(mu_);
  ready_ = true;
  std::fprintf(stderr, "tandem: tensor parallelism: %d workers ready (generation %d, %d threads each on this host%s)\n", n,
               generation, threads, options_.cross_host() ? (", " + std::to_string(n - n_local) + " joined").c_str() : "");
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
    for (auto& w : workers_) {
      if (!w.remote) continue;
      try {
        w.remote->link->send(static_cast<uint32_t>(StepKind::kShutdown), step_id_ + 1, {}, 1000);
      } catch (const std::exception&) {
      }
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
  // A joined worker's link closes: the worker joins again, for the next set.
  for (auto& w : workers_) w.remote.reset();
  ready_ = false;
  for (auto& w : workers_) w.replies.reset();
  steps_.reset();
  // The group's rendezvous files, and its shared-memory frame ring (which
  // its rank 0 unlinks once every worker attached, unless the set died first).
  std::error_code ec;
  const std::string g = "g" + std::to_string(generation_);
  ::unlink(ShmFrames::path_for(group_base_ + "/" + g, g).c_str());
  std::filesystem::remove_all(group_base_ + "/" + g, ec);
}

std::string TensorParallelExecutor::dead_worker() {
  for (size_t r = 0; r < workers_.size(); ++r) {
    Worker& w = workers_[r];
    if (w.remote) {
      std::lock_guard<std::mutex> lock(w.remote->mu);
      if (!w.remote->gone.empty()) return who(static_cast<int>(r)) + " is gone: " + w.remote->gone;
      continue;
    }
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
    const Worker& w = workers_[static_cast<size_t>(r)];
    // A joined worker's process is on its host: what the core knows of it is its status over the link.
    const std::string process = w.remote ? "on " + w.remote->link->peer() + " pid " + std::to_string(w.remote->pid)
                                         : "pid " + std::to_string(w.pid) + " " + state_word(process_state(w.pid));
    s += (r == 0 ? "" : "; ");
    s += "worker " + std::to_string(r) + ((replied_mask_ >> r) & 1 ? " (replied)" : " (no reply)") + ": " + process +
         ", " + phase_name(st.phase.load()) + ", step " +
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

TensorParallelExecutor::Reply TensorParallelExecutor::read_reply(int rank, const RingWait& wait) {
  Worker& w = workers_[static_cast<size_t>(rank)];
  Reply reply;
  if (!w.remote) {
    reply.guard = w.replies->read(wait);
    const parallel::RingMessage& m = reply.guard.message();
    reply.step_id = m.step_id;
    reply.kind = m.kind;
    reply.payload = m.payload;
    return reply;
  }
  // The same bounds as a ring's wait: a report past the soft deadline, an
  // error past the hard one or once a worker is gone.
  RemoteLink& link = *w.remote;
  const int64_t start = monotonic_ns();
  bool reported = false;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(link.mu);
      link.cv.wait_for(lock, std::chrono::milliseconds(10), [&] { return !link.replies.empty() || !link.gone.empty(); });
      if (!link.replies.empty()) {
        LinkMessage m = std::move(link.replies.front());
        link.replies.pop_front();
        reply.step_id = m.step_id;
        reply.kind = m.kind;
        reply.owned = std::move(m.payload);
        reply.payload = reply.owned;
        return reply;
      }
    }
    if (wait.peer_gone) {
      const std::string gone = wait.peer_gone();
      if (!gone.empty()) throw RingError(RingError::Kind::kPeerGone, gone);
    }
    const int64_t waited_ms = (monotonic_ns() - start) / 1'000'000;
    const std::string what = "the reply of " + who(rank) + " over its link";
    if (!reported && wait.soft_deadline_ms > 0 && waited_ms >= wait.soft_deadline_ms) {
      reported = true;
      if (wait.report) wait.report(what + ": nothing for " + std::to_string(waited_ms) + " ms");
    }
    if (wait.hard_deadline_ms > 0 && waited_ms >= wait.hard_deadline_ms)
      throw RingError(RingError::Kind::kTimeout, what + ": nothing for " + std::to_string(waited_ms) +
                                                     " ms, past the hard deadline of " +
                                                     std::to_string(wait.hard_deadline_ms) + " ms");
  }
}

bool TensorParallelExecutor::take_kv_lost() {
  const bool lost = kv_lost_;
  kv_lost_ = false;
  return lost;
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
    // This step's KV (and every other request's) went with the worker
    // that was replaced: nothing may run on it (take_kv_lost tells the engine).
    if (kv_lost_) throw ExecutorError(kKvLostMessage);
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
    for (int r = options_.n_local(); r < options_.size; ++r) {
      try {
        workers_[static_cast<size_t>(r)].remote->link->send(static_cast<uint32_t>(StepKind::kStep), step, bytes,
                                                             options_.timeout_ms);
      } catch (const std::exception& e) {
        throw RingError(RingError::Kind::kPeerGone, who(r) + ": its step could not be sent: " + e.what());
      }
    }
    const size_t logit_bytes = batch.logit_rows.size() * static_cast<size_t>(options_.n_vocab) * sizeof(float);
    for (int r = 0; r < options_.size; ++r) {
      const Reply m = read_reply(r, reply_wait(r, deadline));
      if (m.step_id != step) {
        protocol_error = "tensor-parallel step " + std::to_string(step) + ": worker " + std::to_string(r) +
                         " replied for step " + std::to_string(m.step_id);
        break;
      }
      replied_mask_ |= uint64_t{1} << r;
      if (m.kind != static_cast<uint32_t>(ReplyKind::kDone) && m.kind != static_cast<uint32_t>(ReplyKind::kFailed)) {
        protocol_error = "tensor-parallel step " + std::to_string(step) + ": worker " + std::to_string(r) +
                         " replied with a message of kind " + std::to_string(m.kind);
        break;
      }
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
    start_workers(options_.rejoin_wait_ms);
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
  if (listener_) s.join_address = options_.host + ":" + std::to_string(listener_->port());
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
    const Worker& worker = workers_[static_cast<size_t>(r)];
    if (worker.remote) w.host = worker.remote->link->peer();
    else w.process_state = process_state(w.pid);
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
