#include "cli/tensor_link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/clock.h"
#include "util/error.h"

namespace tandem::cli {

namespace {

constexpr uint32_t kMagic = 0x746c6e6b;  // "tlnk"

struct Header {
  uint32_t magic;
  uint32_t kind;
  int64_t step_id;
  uint64_t payload_bytes;
};
static_assert(sizeof(Header) == 24);

sockaddr_in ipv4(const std::string& host, int port, const char* what) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    throw Error(std::string(what) + ": '" + host + "' is not an IPv4 address");
  return addr;
}

// Waits for `events` on fd until deadline_ns; false on the deadline.
bool wait_fd(int fd, short events, int64_t deadline_ns) {
  for (;;) {
    const int64_t left_ms = (deadline_ns - monotonic_ns()) / 1'000'000;
    if (left_ms < 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 100)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

// Both ends: no delay for small messages, and keepalive probes, so a peer
// whose host vanished without a word (no FIN, no reset) ends the link
// within about 25 s even while nothing is sent (a worker waiting for work).
void tune(int fd) {
  int one = 1, idle_s = 10, interval_s = 5, probes = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
}

}  // namespace

std::unique_ptr<TensorLink> TensorLink::connect(const std::string& host, int port, int64_t timeout_ms) {
  const std::string where = host + ":" + std::to_string(port);
  const sockaddr_in addr = ipv4(host, port, "tensor-parallel join address");
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error(std::string("socket: ") + std::strerror(errno));
  tune(fd);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 && errno != EINPROGRESS) {
    const int e = errno;
    ::close(fd);
    throw Error("cannot connect to the engine core at " + where + ": " + std::strerror(e));
  }
  int err = 0;
  socklen_t len = sizeof(err);
  if (!wait_fd(fd, POLLOUT, monotonic_ns() + timeout_ms * 1'000'000) ||
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    ::close(fd);
    throw Error("cannot connect to the engine core at " + where + ": " +
                (err != 0 ? std::strerror(err) : "no answer within " + std::to_string(timeout_ms) + " ms"));
  }
  return std::make_unique<TensorLink>(fd, where);
}

TensorLink::TensorLink(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}

TensorLink::~TensorLink() { ::close(fd_); }

void TensorLink::close_now() { ::shutdown(fd_, SHUT_RDWR); }

void TensorLink::send(uint32_t kind, int64_t step_id, std::span<const uint8_t> payload, int64_t timeout_ms) {
  std::lock_guard<std::mutex> lock(send_mu_);
  const Header h{kMagic, kind, step_id, payload.size()};
  const int64_t deadline = monotonic_ns() + timeout_ms * 1'000'000;
  const auto put = [&](const uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        p += w;
        n -= static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!wait_fd(fd_, POLLOUT, deadline))
          throw Error("the link to " + peer_ + " took no data for " + std::to_string(timeout_ms) + " ms");
        continue;
      }
      throw Error("the link to " + peer_ + " broke: " + std::strerror(errno));
    }
  };
  put(reinterpret_cast<const uint8_t*>(&h), sizeof(h));
  put(payload.data(), payload.size());
}

void TensorLink::read_exact(uint8_t* p, size_t n, int64_t timeout_ms) {
  const int64_t deadline = monotonic_ns() + timeout_ms * 1'000'000;
  while (n > 0) {
    const ssize_t r = ::recv(fd_, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) throw Error("the link to " + peer_ + " was closed by the other side");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) throw Error("the link to " + peer_ + " broke: " + std::strerror(errno));
    if (!wait_fd(fd_, POLLIN, deadline))
      throw Error("the link to " + peer_ + " stopped mid-message for " + std::to_string(timeout_ms) + " ms");
  }
}

bool TensorLink::receive(LinkMessage& out, int64_t timeout_ms, uint64_t max_payload_bytes) {
  if (!wait_fd(fd_, POLLIN, monotonic_ns() + timeout_ms * 1'000'000)) return false;
  Header h{};
  read_exact(reinterpret_cast<uint8_t*>(&h), sizeof(h), std::max<int64_t>(timeout_ms, 1000));
  if (h.magic != kMagic) throw Error("the link to " + peer_ + " sent a message that is not tandem's (bad magic)");
  if (h.payload_bytes > max_payload_bytes)
    throw Error("the link to " + peer_ + " announced " + std::to_string(h.payload_bytes) + " bytes, over the bound of " +
                std::to_string(max_payload_bytes));
  out.kind = h.kind;
  out.step_id = h.step_id;
  out.payload.resize(h.payload_bytes);
  read_exact(out.payload.data(), out.payload.size(), std::max<int64_t>(timeout_ms, 10'000));
  return true;
}

LinkListener::LinkListener(const std::string& host, int port) : host_(host) {
  const sockaddr_in addr = ipv4(host, port, "--tensor-parallel-host");
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw Error(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd_, 16) != 0) {
    const int e = errno;
    ::close(fd_);
    throw Error("the tensor-parallel join listener cannot bind " + host + ":" + std::to_string(port) + ": " +
                std::strerror(e));
  }
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.sin_port);
}

LinkListener::~LinkListener() { ::close(fd_); }

std::unique_ptr<TensorLink> LinkListener::accept(int64_t timeout_ms) {
  if (!wait_fd(fd_, POLLIN, monotonic_ns() + timeout_ms * 1'000'000)) return nullptr;
  sockaddr_in peer{};
  socklen_t len = sizeof(peer);
  const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return nullptr;
  tune(fd);
  char ip[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof(ip));
  return std::make_unique<TensorLink>(fd, std::string(ip) + ":" + std::to_string(ntohs(peer.sin_port)));
}

}  // namespace tandem::cli
