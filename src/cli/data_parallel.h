// `serve --data-parallel-size N`: N engine ranks, each a process with its own
// scheduler and KV pool, stepping in lockstep by consensus over gloo.
//
// Rank 0 is the front: it serves the public port and hands each completion
// or chat request to the least loaded rank (its own engine, or another
// rank's HTTP listener, relayed). The process of a host's first rank spawns
// the host's other ranks as child processes and restarts one that dies.
// Ranks meet through a rendezvous directory: gloo's FileStore keys, each
// rank's HTTP address, and the group's generation (every rebuild of the
// group uses the next one, so it never reads a dead group's keys).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_core.h"
#include "parallel/step_plan.h"
#include "server/http_server.h"
#include "server/upstream_relay.h"

namespace tandem::cli {

struct DataParallelOptions {
  int size = 1;
  int size_local = 0;   // ranks this host runs, from start_rank on (0: all of them)
  int start_rank = 0;   // the first rank on this host (this process runs it)
  std::string rendezvous_dir;         // shared by every rank (empty: a fresh one when all ranks are local)
  std::string host = "127.0.0.1";     // this host's address for gloo and the ranks' HTTP listeners
  int timeout_ms = 30'000;            // gloo: rendezvous and every exchange
  int soft_deadline_ms = 5'000;       // a rank parked in an op longer than this is reported
  bool expert_parallel = false;       // split every MoE layer's experts over the ranks
  bool enabled() const { return size > 1; }
  int local_count() const { return size_local > 0 ? size_local : size - start_rank; }
};

// The rendezvous directory's small files, written atomically (rename).
class RendezvousDir {
 public:
  explicit RendezvousDir(std::filesystem::path dir) : dir_(std::move(dir)) {}
  const std::filesystem::path& path() const { return dir_; }
  int generation() const;
  // Raises the group's generation to at least `g` (never lowers it).
  void raise_generation(int g) const;
  int rank_generation(int rank) const;  // the generation `rank` last connected under (-1: none)
  void set_rank_generation(int rank, int g) const;
  void publish_http(int rank, const std::string& host, int port) const;
  // The rank's HTTP listener as "host:port" (empty: not published yet).
  std::string http_of(int rank) const;

 private:
  std::filesystem::path dir_;
};

// This process's rank: the engine's lockstep hooks over gloo, and the report
// of a wait past the soft deadline.
class DataParallelRank {
 public:
  DataParallelRank(const DataParallelOptions& options, int rank, parallel::LockstepConfig config);
  ~DataParallelRank();
  int rank() const { return rank_; }
  // expert_layers: the model's MoE layers when expert parallel (0 otherwise).
  LockstepHooks hooks(int expert_layers);
  // Starts the thread that reports an op waited in past the soft deadline.
  void watch(const EngineCore& engine);
  const RendezvousDir& dir() const { return dir_; }
  // A rank of this group is known gone (its supervisor reaped it): the group
  // in use is abandoned at once (its waits give up) and re-forms, instead of
  // waiting out a collective's timeout while it still reports itself ready.
  void peer_lost() { abandon_group_ = true; }

 private:
  DataParallelOptions options_;
  int rank_;
  parallel::LockstepConfig config_;
  RendezvousDir dir_;
  int next_generation_ = 0;
  int current_generation_ = 0;
  // Raised to make the group's waits give up: by stop() for good (stopping_),
  // by peer_lost() until the next connect.
  std::atomic<bool> abandon_group_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> watching_{false};
  std::thread watcher_;
};

// Rank 0's hand-over of requests to ranks: each goes to the rank with the
// fewest requests in flight, ties to the lowest rank. Every request enters
// here and is counted at its rank from the moment it is picked until its
// response is over (DpPlacement), so the counts are exact, and a burst of
// requests spreads even before the first of them is parsed.
class DataParallelFront {
 public:
  DataParallelFront(const DataParallelOptions& options, const EngineCore& engine, const RendezvousDir& dir,
                    std::string api_key);
  server::DpHook hook();
  // The requests handed to other ranks and not yet over (the shutdown
  // drain waits for them as for its own server's).
  int64_t relayed_in_flight() const;
  // Ends every relayed request with `why` as the error its client sees
  // (a shutdown past its timeout).
  void cut_off_relays(const std::string& why);

 private:
  // Requests in flight per rank; shared with the holds, which may outlive
  // the front (a response still relayed while the server stops).
  struct RankLoads {
    std::mutex mu;
    std::vector<int64_t> in_flight;
  };

  server::DpPlacement pick();
  void forward(server::DpPlacement placement, const httplib::Request& req, httplib::Response& res);

  DataParallelOptions options_;
  const EngineCore& engine_;
  const RendezvousDir& dir_;
  std::string api_key_;
  std::shared_ptr<RankLoads> loads_;
  std::mutex relays_mu_;
  std::vector<std::weak_ptr<server::Upstream>> relays_;  // the calls under way (and some ended)
};

// The other ranks of this host, as child processes: started, watched,
// restarted when one dies (the group's generation raised first), and
// stopped with this process.
class RankSupervisor {
 public:
  // on_lost(rank): a child died (reaped, the generation raised), before it is restarted.
  RankSupervisor(const DataParallelOptions& options, const RendezvousDir& dir, std::vector<std::string> argv,
                 std::function<void(int)> on_lost);
  ~RankSupervisor();
  // Started children so far (restarts included), for logs and tests.
  int64_t spawned() const { return spawned_.load(); }

 private:
  pid_t spawn(int rank);
  void monitor();

  DataParallelOptions options_;
  const RendezvousDir& dir_;
  std::vector<std::string> argv_;
  std::function<void(int)> on_lost_;
  std::mutex mu_;
  std::map<int, pid_t> children_;  // rank -> pid
  std::atomic<bool> running_{true};
  std::atomic<int64_t> spawned_{0};
  std::thread monitor_;
};

// The environment a spawned rank finds its rank and rendezvous in.
inline constexpr const char* kRankEnv = "TANDEM_DP_RANK";
inline constexpr const char* kRendezvousEnv = "TANDEM_DP_RENDEZVOUS";

}  // namespace tandem::cli
