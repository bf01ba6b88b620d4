// Helpers for tests that start tandem processes and talk to them over HTTP:
// a process group per command (killed and reaped on every exit path), a
// free port, and one value of an instance's or the router's /metrics.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>

#include "util/clock.h"

namespace tandem::testing {

// A loopback port free now, released for the caller. Picked below the
// kernel's ephemeral range (ip_local_port_range), where the kernel never
// hands out ports of its own: between this check and the caller's bind, a
// connection or a listener on port 0 (gloo's pairs, UCX, clients of other
// tests) cannot take it, only another test picking the same way.
inline int free_port() {
  static std::atomic<uint32_t> next{static_cast<uint32_t>(::getpid()) * 7919u};
  for (int attempt = 0; attempt < 4096; ++attempt) {
    const int port = 20000 + static_cast<int>(next.fetch_add(1) % 12000);  // [20000, 32000)
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(fd);
    if (free) return port;
  }
  return 0;
}

// The value of `name` ("name value" or "name{labels} value": the first
// series; or exactly "name{labels}") at host:port's /metrics; -1 when it
// does not answer, -2 when the metric is missing.
inline double metric(const std::string& host, int port, const std::string& name) {
  httplib::Client cli(host, port);
  auto r = cli.Get("/metrics");
  if (!r) return -1;
  if (name.back() == '}') {
    size_t at = r->body.find("\n" + name + " ");
    return at == std::string::npos ? -2 : std::stod(r->body.substr(at + name.size() + 2));
  }
  for (const char* after : {" ", "{"}) {
    size_t at = r->body.find("\n" + name + after);
    if (at == std::string::npos) continue;
    size_t space = r->body.find(' ', at + 1 + name.size());
    return std::stod(r->body.substr(space + 1));
  }
  return -2;
}

// The value of `name` at host:port once `wanted` holds for it, polled
// (bounded: 5 s); the last value read when it never does. For what a server
// counts a moment after the client has its response: the engine loop frees
// a request's blocks, the router counts how a relay ended.
template <class Wanted>
inline double metric_when(const std::string& host, int port, const std::string& name, Wanted wanted) {
  double value = -1;
  for (int i = 0; i < 500; ++i) {
    value = metric(host, port, name);
    if (wanted(value)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return value;
}

// The KV cache usage at host:port once its requests have let go of their
// blocks.
inline double kv_usage_when_drained(const std::string& host, int port) {
  return metric_when(host, port, "tandem_kv_cache_usage_perc", [](double usage) { return usage == 0; });
}

// Sends `sig` to a process held stopped (SIGSTOP, then SIGCONT), so that it
// handles the signal the moment it runs again: a tiny model finishes a few
// hundred tokens in about 100 ms, which a loaded test machine can spend
// between a test's kill() and the server's signal thread, and a request
// meant to be cut off by the signal would run to its end first.
inline bool signal_when_resumed(pid_t pid, int sig) {
  return ::kill(pid, SIGSTOP) == 0 && ::kill(pid, sig) == 0 && ::kill(pid, SIGCONT) == 0;
}

// A process group running one command; killed and reaped when it goes.
class ProcessGroup {
 public:
  explicit ProcessGroup(const std::string& command) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    const pid_t test = getpid();
    pid_ = fork();
    if (pid_ == 0) {
      // Killed with the test process however it ends (a SIGKILL, a timeout's
      // kill of the test binary), not only by this destructor; the command
      // keeps this across its exec, and tandem's own children follow it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != test) _exit(1);
      setpgid(0, 0);
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    setpgid(pid_, pid_);
    close(fds[1]);
    fd_ = fds[0];
  }
  ~ProcessGroup() {
    if (pid_ > 0) {
      kill(-pid_, SIGTERM);
      int64_t until = monotonic_ms() + 15'000;
      while (monotonic_ms() < until && waitpid(pid_, nullptr, WNOHANG) == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      kill(-pid_, SIGKILL);  // anything left in the group
      waitpid(pid_, nullptr, WNOHANG);
    }
    if (fd_ >= 0) close(fd_);
  }
  // Reads stderr until a line contains `needle` (true) or timeout_ms passes.
  bool wait_for(const std::string& needle, int timeout_ms, std::string* line_out = nullptr) {
    int64_t until = monotonic_ms() + timeout_ms;
    while (monotonic_ms() < until) {
      size_t nl;
      while ((nl = buffer_.find('\n')) != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        log_ += line + "\n";
        if (line.find(needle) != std::string::npos) {
          if (line_out) *line_out = line;
          return true;
        }
      }
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) > 0) {
        char buf[4096];
        ssize_t n = read(fd_, buf, sizeof(buf));
        if (n <= 0) return false;
        buffer_.append(buf, static_cast<size_t>(n));
      }
    }
    return false;
  }
  // Reads what the group wrote since the last wait_for, waiting at most
  // timeout_ms for more, into log() (a failure's message shows all of it).
  void drain(int timeout_ms = 200) {
    pollfd p{fd_, POLLIN, 0};
    char buf[4096];
    ssize_t n = 0;
    while (::poll(&p, 1, timeout_ms) > 0 && (n = read(fd_, buf, sizeof(buf))) > 0) buffer_.append(buf, static_cast<size_t>(n));
    log_ += buffer_;
    buffer_.clear();
  }
  const std::string& log() const { return log_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buffer_, log_;
};

inline bool run(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

// Two namespaces and a veth pair between them; all deleted on every exit path.
struct Namespaces {
  std::string a, b, va, vb;
  bool ok = false;
  std::string why;
  Namespaces() {
    std::string tag = std::to_string(getpid() % 100000);
    a = "tdm-p" + tag;
    b = "tdm-d" + tag;
    va = "tdmp" + tag;
    vb = "tdmd" + tag;
    if (geteuid() != 0) {
      why = "not root: network namespaces cannot be created";
      return;
    }
    ok = run("ip netns add " + a) && run("ip netns add " + b) &&
         run("ip link add " + va + " type veth peer name " + vb) && run("ip link set " + va + " netns " + a) &&
         run("ip link set " + vb + " netns " + b) && run("ip -n " + a + " addr add 192.0.2.1/24 dev " + va) &&
         run("ip -n " + b + " addr add 192.0.2.2/24 dev " + vb) && run("ip -n " + a + " link set " + va + " up") &&
         run("ip -n " + b + " link set " + vb + " up") && run("ip -n " + a + " link set lo up") &&
         run("ip -n " + b + " link set lo up");
    if (!ok) why = "ip netns / veth set-up failed (is iproute2 installed, and may this user create namespaces?)";
  }
  ~Namespaces() {
    run("ip netns del " + a);
    run("ip netns del " + b);
  }
};

// Runs `f` on a thread that has entered network namespace `ns`.
template <typename F>
auto in_namespace(const std::string& ns, F f) {
  return std::async(std::launch::async, [ns, f] {
    int fd = open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    bool entered = fd >= 0 && setns(fd, CLONE_NEWNET) == 0;
    if (fd >= 0) close(fd);
    if (!entered) throw std::runtime_error("setns into " + ns + " failed");
    return f();
  }).get();
}

}  // namespace tandem::testing
