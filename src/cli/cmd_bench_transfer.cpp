// `tandem bench transfer`: KV transfer bandwidth of the UCX transport between
// two transports in this process (each owned and progressed by its own
// thread, as two instances would be), for runs of a fixed size and for
// request-shaped transfers of scattered blocks. bench/transfer_vs_perftest.sh
// runs it beside ucx_perftest on the same machine and transport.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <thread>

#include "cli/commands.h"
#include "transport/ucx_transport.h"
#include "util/clock.h"
#include "util/error.h"

namespace tandem::cli {
namespace {

struct TransferArgs {
  std::string tls = "tcp";
  int pool_mb = 256;
  int run_kb = 1024;
  int runs_per_op = 16;
  int block_kb = 384;       // the small preset's block (24 layers x K,V x 4 heads x 64 x 16 tokens x f16)
  int blocks_per_request = 32;
  double seconds = 2.0;
  bool json = false;
};

using transport::RmaOp;
using transport::RmaRun;
using transport::TransportEvent;
using transport::UcxTransport;

std::unique_ptr<UcxTransport> make(const TransferArgs& a, pd::NodeId node, std::vector<uint8_t>& pool) {
  transport::UcxTransportConfig c;
  c.secret = "bench";
  c.self.node = node;
  c.self.epoch = 1;
  c.self.role = node == 1 ? pd::Role::kPrefill : pd::Role::kDecode;
  c.region = pool.data();
  c.region_bytes = pool.size();
  c.block_bytes = uint64_t(a.block_kb) * 1024;
  c.n_blocks = static_cast<int32_t>(pool.size() / c.block_bytes);
  c.tls = a.tls;
  return std::make_unique<UcxTransport>(c);
}

// Bytes per second of back-to-back operations, each `runs` (one flush each),
// for about `seconds`.
double measure(UcxTransport& t, uint64_t connection, RmaOp op, const std::function<std::vector<RmaRun>()>& runs,
               double seconds) {
  std::vector<TransportEvent> events;
  uint64_t tag = 0, bytes = 0;
  Stopwatch clock;
  while (clock.elapsed_s() < seconds) {
    std::vector<RmaRun> r = runs();
    for (const RmaRun& run : r) bytes += run.size_bytes;
    t.post(2, op, r, ++tag, monotonic_ms() + 10'000, connection);
    for (bool done = false; !done;) {
      events.clear();
      t.poll(10, &events);
      for (const TransportEvent& e : events)
        if (e.kind == TransportEvent::Kind::kRmaDone && e.tag == tag) {
          if (!e.ok) throw Error("bench transfer: RMA failed: " + e.detail);
          done = true;
        }
    }
  }
  return static_cast<double>(bytes) / clock.elapsed_s();
}

void run(const TransferArgs& a) {
  std::vector<uint8_t> src(size_t(a.pool_mb) << 20, 0x5a), dst(size_t(a.pool_mb) << 20, 0);
  auto initiator = make(a, 1, src);
  auto target = make(a, 2, dst);
  std::atomic<bool> stop{false};
  std::thread target_thread([&] {
    std::vector<TransportEvent> events;
    while (!stop.load()) {
      events.clear();
      target->poll(10, &events);
    }
  });
  struct Joiner {
    std::atomic<bool>& stop;
    UcxTransport& t;
    std::thread& th;
    ~Joiner() {
      stop = true;
      t.wake();
      th.join();
    }
  } joiner{stop, *target, target_thread};

  initiator->connect("127.0.0.1", target->listen_port());
  std::vector<TransportEvent> events;
  for (int64_t until = monotonic_ms() + 5000; monotonic_ms() < until;) {
    initiator->poll(10, &events);
    if (std::any_of(events.begin(), events.end(), [](auto& e) { return e.kind == TransportEvent::Kind::kConnected; }))
      break;
  }
  auto connected = std::find_if(events.begin(), events.end(),
                                [](auto& e) { return e.kind == TransportEvent::Kind::kConnected; });
  if (connected == events.end()) throw Error("bench transfer: the two transports did not connect");
  uint64_t connection = connected->connection;

  uint64_t run_bytes = uint64_t(a.run_kb) * 1024;
  uint64_t window = run_bytes * a.runs_per_op;
  if (window > src.size()) throw Error("bench transfer: --run-kb x --runs-per-op exceeds the pool");
  auto fixed_runs = [&] {
    std::vector<RmaRun> r;
    for (int i = 0; i < a.runs_per_op; ++i) r.push_back({i * run_bytes, i * run_bytes, run_bytes});
    return r;
  };
  uint64_t block = uint64_t(a.block_kb) * 1024;
  int64_t n_blocks = static_cast<int64_t>(src.size() / block);
  std::mt19937_64 rng(1);
  // A request's blocks scattered over the pool on both sides: one run per block.
  auto request_runs = [&] {
    std::vector<RmaRun> r;
    for (int i = 0; i < a.blocks_per_request; ++i)
      r.push_back({(rng() % n_blocks) * block, (rng() % n_blocks) * block, block});
    return r;
  };
  // Warm-up: registration caches and connections.
  measure(*initiator, connection, RmaOp::kPut, fixed_runs, 0.2);
  double put = measure(*initiator, connection, RmaOp::kPut, fixed_runs, a.seconds);
  double get = measure(*initiator, connection, RmaOp::kGet, fixed_runs, a.seconds);
  double put_req = measure(*initiator, connection, RmaOp::kPut, request_runs, a.seconds);
  double get_req = measure(*initiator, connection, RmaOp::kGet, request_runs, a.seconds);
  const double mb = 1e6;
  if (a.json) {
    std::printf(
        "{\"tls\":\"%s\",\"run_bytes\":%llu,\"runs_per_op\":%d,\"put_MBps\":%.1f,\"get_MBps\":%.1f,"
        "\"block_bytes\":%llu,\"blocks_per_request\":%d,\"request_put_MBps\":%.1f,\"request_get_MBps\":%.1f}\n",
        a.tls.c_str(), static_cast<unsigned long long>(run_bytes), a.runs_per_op, put / mb, get / mb,
        static_cast<unsigned long long>(block), a.blocks_per_request, put_req / mb, get_req / mb);
    return;
  }
  std::printf("UCX_TLS=%s\n", a.tls.c_str());
  std::printf("runs of %d KiB, %d per flush:   put %8.1f MB/s   get %8.1f MB/s\n", a.run_kb, a.runs_per_op, put / mb,
              get / mb);
  std::printf("requests of %d scattered %d KiB blocks: put %8.1f MB/s   get %8.1f MB/s\n", a.blocks_per_request,
              a.block_kb, put_req / mb, get_req / mb);
}

}  // namespace

void add_bench_transfer(CLI::App& bench) {
  auto a = std::make_shared<TransferArgs>();
  CLI::App* cmd = bench.add_subcommand("transfer", "KV transfer bandwidth of the UCX transport (put and get)");
  cmd->add_option("--tls", a->tls, "UCX transports (UCX_TLS), e.g. tcp or tcp,sm,self");
  cmd->add_option("--pool-mb", a->pool_mb, "Registered pool per side (MiB)")->check(CLI::Range(16, 8192));
  cmd->add_option("--run-kb", a->run_kb, "Size of one contiguous run (KiB)")->check(CLI::Range(4, 1 << 20));
  cmd->add_option("--runs-per-op", a->runs_per_op, "Runs posted before each flush")->check(CLI::Range(1, 1024));
  cmd->add_option("--block-kb", a->block_kb, "KV block size for request-shaped transfers (KiB)")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--blocks-per-request", a->blocks_per_request, "Blocks per request-shaped transfer")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--seconds", a->seconds, "Time per measurement")->check(CLI::Range(0.1, 600.0));
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->callback([a] { run(*a); });
}

}  // namespace tandem::cli
