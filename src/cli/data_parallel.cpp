#include "cli/data_parallel.h"

#include "cli/child_process.h"

#include <fcntl.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "server/api_error.h"
#include "server/openai_protocol.h"
#include "server/upstream_relay.h"
#include "transport/gloo_transport.h"
#include "util/clock.h"
#include "util/error.h"

namespace tandem::cli {

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int read_int(const fs::path& p, int otherwise) {
  const std::string text = read_text(p);
  if (text.empty()) return otherwise;
  try {
    return std::stoi(text);
  } catch (const std::exception&) {
    return otherwise;
  }
}

// Readers never see a half-written file: write aside, then rename.
void write_atomically(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out) throw Error("cannot write " + tmp.string());
  }
  fs::rename(tmp, p);
}

}  // namespace

int RendezvousDir::generation() const { return read_int(dir_ / "generation", 0); }

void RendezvousDir::raise_generation(int g) const {
  // Several processes raise it at once: one at a time, under a lock file.
  const int fd = ::open((dir_ / "generation.lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("cannot open " + (dir_ / "generation.lock").string());
  ::flock(fd, LOCK_EX);
  if (generation() < g) write_atomically(dir_ / "generation", std::to_string(g));
  ::flock(fd, LOCK_UN);
  ::close(fd);
}

int RendezvousDir::rank_generation(int rank) const {
  return read_int(dir_ / ("rank" + std::to_string(rank) + ".generation"), -1);
}

void RendezvousDir::set_rank_generation(int rank, int g) const {
  write_atomically(dir_ / ("rank" + std::to_string(rank) + ".generation"), std::to_string(g));
}

void RendezvousDir::publish_http(int rank, const std::string& host, int port) const {
  write_atomically(dir_ / ("rank" + std::to_string(rank) + ".http"), host + ":" + std::to_string(port));
}

std::string RendezvousDir::http_of(int rank) const { return read_text(dir_ / ("rank" + std::to_string(rank) + ".http")); }

// ---------------------------------------------------------------- the rank

DataParallelRank::DataParallelRank(const DataParallelOptions& options, int rank, parallel::LockstepConfig config)
    : options_(options), rank_(rank), config_(config), dir_(options.rendezvous_dir) {}

DataParallelRank::~DataParallelRank() {
  watching_ = false;
  if (watcher_.joinable()) watcher_.join();
}

LockstepHooks DataParallelRank::hooks(int expert_layers) {
  LockstepHooks h;
  h.expert_parallel = expert_layers > 0;
  h.rank = rank_;
  h.size = options_.size;
  config_.n_expert_layers = expert_layers;
  h.connect = [this]() -> std::unique_ptr<parallel::LockstepGroup> {
    if (!stopping_.load()) abandon_group_ = false;
    const int g = std::max(dir_.generation(), next_generation_);
    dir_.set_rank_generation(rank_, g);
    GlooGroupOptions o;
    o.rank = rank_;
    o.size = options_.size;
    o.rendezvous_dir = dir_.path().string();
    o.generation = "g" + std::to_string(g);
    o.bind_host = options_.host;
    o.timeout_ms = options_.timeout_ms;
    o.interrupted = &abandon_group_;
    o.shared_memory_frames = options_.local_count() == options_.size && options_.start_rank == 0;
    try {
      auto transport = std::make_unique<GlooTransport>(o);
      current_generation_ = g;
      return std::make_unique<parallel::LockstepGroup>(std::move(transport), config_);
    } catch (const std::exception& e) {
      // A rendezvous that did not complete leaves its keys: the next attempt
      // of every rank uses the next generation.
      next_generation_ = g + 1;
      dir_.raise_generation(g + 1);
      std::fprintf(stderr, "tandem: data-parallel rank %d: the group did not form (generation %d): %s\n", rank_, g,
                   e.what());
      throw;
    }
  };
  h.interrupt = [this] {
    stopping_ = true;
    abandon_group_ = true;
  };
  h.on_connected = [this] {
    std::fprintf(stderr, "tandem: data-parallel rank %d of %d: group formed (generation %d)\n", rank_, options_.size,
                 current_generation_);
  };
  h.on_failure = [this](const parallel::LockstepError& e) {
    std::fprintf(stderr, "tandem: data-parallel rank %d: %s; the in-flight requests failed, the group re-forms\n", rank_,
                 e.what());
    next_generation_ = current_generation_ + 1;
    dir_.raise_generation(next_generation_);
  };
  return h;
}

void DataParallelRank::watch(const EngineCore& engine) {
  watching_ = true;
  watcher_ = std::thread([this, &engine] {
    int64_t reported_seq = -1;
    while (watching_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const LockstepStatus st = engine.lockstep_status();
      const parallel::InFlightOp& op = st.in_flight;
      if (op.kind == 0 || op.seq == reported_seq) continue;
      const int64_t waited_ms = (monotonic_ns() - op.since_ns) / 1'000'000;
      if (waited_ms < options_.soft_deadline_ms) continue;
      reported_seq = op.seq;
      std::string arrived, missing;
      for (int r = 0; r < st.size; ++r) {
        std::string& list = ((op.arrived_mask >> r) & 1) ? arrived : missing;
        list += (list.empty() ? "" : ",") + std::to_string(r);
      }
      std::fprintf(stderr,
                   "tandem: data-parallel rank %d has waited %lld ms in op #%lld (%s) of step %lld; arrived {%s}, "
                   "missing {%s}\n",
                   rank_, static_cast<long long>(waited_ms), static_cast<long long>(op.seq),
                   parallel::op_kind_name(op.kind), static_cast<long long>(op.step_id), arrived.c_str(),
                   missing.c_str());
    }
  });
}

// ---------------------------------------------------------------- the front

DataParallelFront::DataParallelFront(const DataParallelOptions& options, const EngineCore& engine,
                                     const RendezvousDir& dir, std::string api_key)
    : options_(options), engine_(engine), dir_(dir), api_key_(std::move(api_key)), loads_(std::make_shared<RankLoads>()) {
  loads_->in_flight.assign(static_cast<size_t>(options.size), 0);
}

int64_t DataParallelFront::relayed_in_flight() const {
  std::lock_guard<std::mutex> lock(loads_->mu);
  int64_t n = 0;
  for (size_t r = 1; r < loads_->in_flight.size(); ++r) n += loads_->in_flight[r];
  return n;
}

void DataParallelFront::cut_off_relays(const std::string& why) {
  std::lock_guard<std::mutex> lock(relays_mu_);
  for (const auto& relay : relays_)
    if (auto up = relay.lock()) up->stop(why);
}

server::DpPlacement DataParallelFront::pick() {
  // While the group is not formed the request stays here, where it gets
  // the 503 that says so.
  const bool ready = engine_.ready();
  std::vector<std::string> address(static_cast<size_t>(options_.size));  // empty: not reachable
  for (int r = 1; ready && r < options_.size; ++r) address[static_cast<size_t>(r)] = dir_.http_of(r);
  int best = 0;
  {
    std::lock_guard<std::mutex> lock(loads_->mu);
    auto& load = loads_->in_flight;
    for (int r = 1; r < options_.size; ++r)
      if (!address[static_cast<size_t>(r)].empty() && load[static_cast<size_t>(r)] < load[static_cast<size_t>(best)]) best = r;
    ++load[static_cast<size_t>(best)];
  }
  // Counted until the response is over (served, relayed, refused, or failed).
  auto hold = std::shared_ptr<void>(nullptr, [loads = loads_, best](void*) {
    std::lock_guard<std::mutex> lock(loads->mu);
    --loads->in_flight[static_cast<size_t>(best)];
  });
  return {best, std::move(hold), std::move(address[static_cast<size_t>(best)])};
}

void DataParallelFront::forward(server::DpPlacement placement, const httplib::Request& req, httplib::Response& res) {
  const int rank = placement.rank;
  const std::string who = "data-parallel rank " + std::to_string(rank);
  const std::string& address = placement.address;
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    const server::ApiError e = server::engine_unavailable(who + " has no HTTP listener yet; retry");
    res.status = e.status;
    res.set_content(server::dump_body(e.to_json()), "application/json");
    return;
  }
  server::UpstreamCall call;
  call.host = address.substr(0, colon);
  call.port = std::atoi(address.c_str() + colon + 1);
  call.path = req.path;
  call.body = req.body;
  call.who = who;
  if (!api_key_.empty()) call.headers.emplace_back("Authorization", "Bearer " + api_key_);
  const int wait_ms = call.read_timeout_s * 1000;
  auto up = std::make_shared<server::Upstream>();
  {
    std::lock_guard<std::mutex> lock(relays_mu_);
    std::erase_if(relays_, [](const std::weak_ptr<server::Upstream>& r) { return r.expired(); });
    relays_.push_back(up);
  }
  up->start(std::move(call));
  const int status = up->wait_status(wait_ms);
  if (status != 200) {
    // The rank's own answer (a 4xx on the request, a 503) goes back as is;
    // one that could not be reached is a 503 naming it.
    const std::string body = status > 0 ? up->wait_body(5000) : std::string();
    if (status > 0) {
      res.status = status;
      res.set_content(body, "application/json");
      return;
    }
    server::ApiError e = server::engine_unavailable(up->error());
    res.status = e.status;
    res.set_content(server::dump_body(e.to_json()), "application/json");
    return;
  }
  const nlohmann::json body = nlohmann::json::parse(req.body, nullptr, false);
  const bool stream = body.is_object() && body.value("stream", false);
  server::Upstream::relay(res, up, stream, [hold = std::move(placement.hold)](bool) {});
}

server::DpHook DataParallelFront::hook() {
  server::DpHook h;
  h.self = 0;
  h.pick = [this] { return pick(); };
  h.forward = [this](server::DpPlacement placement, const httplib::Request& req, httplib::Response& res) {
    forward(std::move(placement), req, res);
  };
  h.ranks_json = [this] {
    std::vector<int64_t> in_flight;
    {
      std::lock_guard<std::mutex> lock(loads_->mu);
      in_flight = loads_->in_flight;
    }
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < options_.size; ++r)
      ranks.push_back({{"rank", r}, {"http", dir_.http_of(r)}, {"in_flight", in_flight[static_cast<size_t>(r)]}});
    return ranks.dump();
  };
  return h;
}

// ---------------------------------------------------------------- the supervisor

RankSupervisor::RankSupervisor(const DataParallelOptions& options, const RendezvousDir& dir, std::vector<std::string> argv,
                               std::function<void(int)> on_lost)
    : options_(options), dir_(dir), argv_(std::move(argv)), on_lost_(std::move(on_lost)) {
  for (int k = 1; k < options.local_count(); ++k) {
    const int rank = options.start_rank + k;
    children_[rank] = spawn(rank);
  }
  monitor_ = std::thread([this] { monitor(); });
}

RankSupervisor::~RankSupervisor() {
  running_ = false;
  if (monitor_.joinable()) monitor_.join();
  std::lock_guard<std::mutex> lock(mu_);
  // SIGCONT too: a stopped rank (SIGSTOP, a debugger) acts on SIGTERM only
  // once it runs again.
  for (auto& [rank, pid] : children_) ::kill(pid, SIGTERM), ::kill(pid, SIGCONT);
  // Bounded: SIGKILL whatever has not exited within 10 s.
  const int64_t deadline = monotonic_ms() + 10'000;
  for (auto& [rank, pid] : children_) {
    while (::waitpid(pid, nullptr, WNOHANG) == 0) {
      if (monotonic_ms() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

pid_t RankSupervisor::spawn(int rank) {
  // SIGKILL, not SIGTERM, when the parent goes: a rank without its front has
  // no one to drain for.
  const pid_t pid = spawn_child(argv_,
                                {std::string(kRankEnv) + "=" + std::to_string(rank),
                                 std::string(kRendezvousEnv) + "=" + dir_.path().string()},
                                SIGKILL);
  ++spawned_;
  std::fprintf(stderr, "tandem: data-parallel rank %d started (pid %d)\n", rank, static_cast<int>(pid));
  return pid;
}

void RankSupervisor::monitor() {
  while (running_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [rank, pid] : children_) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) != pid) continue;
      if (WIFSIGNALED(status))
        std::fprintf(stderr, "tandem: data-parallel rank %d (pid %d) was killed by signal %d; restarting it\n", rank,
                     static_cast<int>(pid), WTERMSIG(status));
      else
        std::fprintf(stderr, "tandem: data-parallel rank %d (pid %d) exited with status %d; restarting it\n", rank,
                     static_cast<int>(pid), WEXITSTATUS(status));
      // Its group is gone: every rank re-forms under the next generation.
      dir_.raise_generation(dir_.rank_generation(rank) + 1);
      if (on_lost_) on_lost_(rank);
      if (running_.load()) pid = spawn(rank);
    }
  }
}

}  // namespace tandem::cli
