// `tandem bench ring`: the tensor-parallel broadcast ring's round trip, as
// the engine core sees it each step: publish a step message to N reader
// processes, then read one reply from each on its own response ring (as the
// workers answer). Forked readers, no model: the ring's cost alone.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "parallel/broadcast_ring.h"
#include "util/clock.h"
#include "util/percentile.h"
#include "util/error.h"

namespace tandem::cli {
namespace {

struct RingBenchArgs {
  int readers = 2;
  int messages = 20000;
  int bytes = 256;  // a decode step's message (a few sequences' tokens and block tables)
};

void run(const RingBenchArgs& a) {
  using parallel::BroadcastRing;
  const std::string base = "/dev/shm/tandem-bench-ring-" + std::to_string(::getpid());
  parallel::RingWait wait;
  wait.soft_deadline_ms = 0;
  wait.hard_deadline_ms = 10'000;
  auto steps = BroadcastRing::create(base + ".steps", {4, static_cast<uint64_t>(a.bytes), a.readers}, BroadcastRing::kWriter, "steps");
  std::vector<std::unique_ptr<BroadcastRing>> replies;
  for (int r = 0; r < a.readers; ++r)
    replies.push_back(BroadcastRing::create(base + ".reply" + std::to_string(r), {2, 64, 1}, 0, "reply"));
  std::vector<pid_t> kids;
  for (int r = 0; r < a.readers; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw Error("fork failed");
    if (pid == 0) {
      int status = 0;
      try {
        auto in = BroadcastRing::attach(base + ".steps", r, "steps");
        auto out = BroadcastRing::attach(base + ".reply" + std::to_string(r), BroadcastRing::kWriter, "reply");
        for (int i = 0; i < a.messages; ++i) {
          int64_t step;
          {
            auto g = in->read(wait);
            step = g.message().step_id;
          }
          out->publish(step, 0, {}, wait);
        }
      } catch (...) {
        status = 1;
      }
      ::_exit(status);
    }
    kids.push_back(pid);
  }
  std::vector<uint8_t> msg(static_cast<size_t>(a.bytes), 7);
  std::vector<double> us;
  for (int i = 0; i < a.messages; ++i) {
    const int64_t t0 = monotonic_ns();
    steps->publish(i + 1, 0, msg, wait);
    for (auto& r : replies) r->read(wait).release();
    if (i >= a.messages / 10) us.push_back(static_cast<double>(monotonic_ns() - t0) * 1e-3);  // the first tenth warms up
  }
  bool ok = true;
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  steps->unlink();
  for (auto& r : replies) r->unlink();
  if (!ok) throw Error("a reader process failed");
  std::printf("broadcast ring: %d reader processes, %d messages of %d bytes\n", a.readers, a.messages, a.bytes);
  std::printf("  round trip (publish to every reader, a reply from each): median %.1f us   p99 %.1f us   p99.9 %.1f us\n",
              percentile(us, 0.5), percentile(us, 0.99), percentile(us, 0.999));
}

}  // namespace

void add_bench_ring(CLI::App& bench) {
  auto a = std::make_shared<RingBenchArgs>();
  CLI::App* cmd = bench.add_subcommand("ring", "The tensor-parallel broadcast ring's round trip (forked readers)");
  cmd->add_option("--readers", a->readers, "Reader processes (the workers)")->check(CLI::Range(1, parallel::kMaxRingReaders));
  cmd->add_option("--messages", a->messages, "Round trips")->check(CLI::Range(10, 10'000'000));
  cmd->add_option("--bytes", a->bytes, "Bytes per step message")->check(CLI::Range(0, 1 << 26));
  cmd->callback([a] { run(*a); });
}

}  // namespace tandem::cli
