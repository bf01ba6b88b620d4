// Helpers for tests that talk to tandem processes over HTTP: a free port,
// and one value of an instance's or the router's Prometheus /metrics.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace tandem::testing {

// A loopback port free now (the kernel's pick; released for the caller).
inline int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
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

}  // namespace tandem::testing
