// `tandem router`: the OpenAI API of a P/D cluster in front of its prefill
// and decode instances.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cli/commands.h"
#include "router/router_server.h"
#include "server/shutdown_drain.h"
#include "util/error.h"

namespace tandem::cli {

void add_router(CLI::App& app) {
  auto c = std::make_shared<router::RouterConfig>();
  CLI::App* cmd = app.add_subcommand("router", "OpenAI-compatible front of a P/D cluster (prefill and decode instances join it)");
  cmd->add_option("--host", c->host, "Address to bind (default loopback only)");
  cmd->add_option("--port", c->port, "Port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--cluster-secret", c->secret, "Shared secret of the cluster (default: $TANDEM_CLUSTER_SECRET)");
  cmd->add_option("--api-key", c->api_key, "Require 'Authorization: Bearer KEY' from clients");
  cmd->add_option("--max-in-flight", c->max_in_flight, "Requests served at once (beyond: HTTP 503)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--request-timeout-ms", c->request_timeout_ms, "Deadline of one request")->check(CLI::Range(1000, 86'400'000));
  cmd->add_option("--eviction-ms", c->eviction_ms, "An instance silent this long is dropped")->check(CLI::Range(500, 600'000));
  cmd->add_option("--http-threads", c->http_threads, "Concurrent client connections")->check(CLI::Range(4, 4096));
  cmd->add_option("--shutdown-timeout", c->shutdown_timeout_s,
                  "Seconds SIGTERM lets requests in flight go on before they are cut off")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--max-queued-connections", c->max_queued_connections,
                  "Connections that may wait beyond --http-threads (beyond: HTTP 503 at once)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->callback([c] {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    if (c->secret.empty())
      if (const char* env = std::getenv("TANDEM_CLUSTER_SECRET")) c->secret = env;
    // Minutes since 2026, within the transfer id's epoch bits: a restarted
    // router mints ids no instance remembers.
    c->epoch = static_cast<pd::Epoch>(
        1 + (std::chrono::duration_cast<std::chrono::minutes>(std::chrono::system_clock::now().time_since_epoch()).count() -
             29'453'760) %
                ((1 << 21) - 1));
    router::RouterServer server(*c);
    int port = server.bind();
    std::fprintf(stderr, "tandem router: OpenAI API on http://%s:%d (epoch %u)\n", c->host.c_str(), port, c->epoch);
    std::thread signal_thread([&] {
      int sig = 0;
      sigwait(&signals, &sig);
      std::fprintf(stderr, "tandem router: signal %d: draining (up to %d s)\n", sig, c->shutdown_timeout_s);
      server.begin_drain();
      tandem::server::drain_then_cut_off(
          "tandem router", "router", c->shutdown_timeout_s, [&] { return server.in_flight(); },
          [&](const std::string& why) { server.cut_off(why); });
      server.stop();
    });
    server.serve();
    signal_thread.join();
  });
}

}  // namespace tandem::cli
