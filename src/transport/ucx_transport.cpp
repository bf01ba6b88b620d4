#include "transport/ucx_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>

#include "transport/bytes.h"
#include "util/clock.h"
#include "util/error.h"

namespace tandem::transport {
namespace {

constexpr unsigned kControlAmId = 7;
constexpr size_t kMaxFrameBytes = 1 << 20;

Nonce random_nonce() {
  Nonce n{};
  size_t got = 0;
  while (got < n.size()) {
    ssize_t r = getrandom(n.data() + got, n.size() - got, 0);
    if (r < 0 && errno != EINTR) throw Error(std::string("getrandom: ") + std::strerror(errno));
    if (r > 0) got += static_cast<size_t>(r);
  }
  return n;
}

// Identifies "same machine, same PID and IPC namespaces": only there can UCX's
// shared-memory transports reach a peer, and only there does a pidfd name it.
uint64_t local_host_id() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  struct stat pid_ns{}, ipc_ns{};
  stat("/proc/self/ns/pid", &pid_ns);
  stat("/proc/self/ns/ipc", &ipc_ns);
  Sha256 h;
  h.update(boot_id);
  h.update(std::to_string(pid_ns.st_ino) + "/" + std::to_string(ipc_ns.st_ino));
  Digest d = h.finish();
  uint64_t id = 0;
  std::memcpy(&id, d.data(), sizeof(id));
  return id;
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

std::string ucs_error(const char* what, ucs_status_t status) {
  return std::string(what) + ": " + ucs_status_string(status);
}

void check(ucs_status_t status, const char* what) {
  if (status != UCS_OK) throw Error("UCX " + ucs_error(what, status));
}

}  // namespace

struct UcxTransport::Impl {
  // One hand-shake in progress over the bootstrap TCP connection.
  struct Bootstrap {
    int fd = -1;
    std::unique_ptr<Handshake> handshake;
    std::vector<uint8_t> in;
    std::vector<uint8_t> out;
    pd::TimeMs deadline_ms = 0;
    bool connecting = false;  // client: non-blocking connect not yet complete
    std::string where;
    std::string host;  // client: the peer's address (its UCX listener is there too)
  };
  struct Peer {
    PeerIdentity identity;
    RegionKeys keys;
    ucp_ep_h ep = nullptr;
    ucp_rkey_h rkey = nullptr;
    bool failed = false;       // error callback seen or forced close asked
    void* close_request = nullptr;
    bool closed = false;
    bool fence_wanted = false;
    bool fenced = false;
    uint64_t client_id = 0;    // server side: the connection request we wait for
    uint64_t connection = 0;   // this hand-shake's number (TransportEvent::connection)
    int pidfd = -1;            // shared-memory peers: fenced by their exit
    Impl* impl = nullptr;
  };
  struct Op {
    uint64_t tag = 0;
    pd::NodeId peer = 0;
    uint64_t connection = 0;
    bool timed_out = false;  // its endpoint was force-closed at the deadline
    bool reported = false;   // kRmaDone went out; kept until the flush calls back
    pd::TimeMs deadline_ms = 0;
    uint64_t bytes = 0;
    bool done = false;
    ucs_status_t status = UCS_OK;
    std::string detail;
  };
  struct SendBuffer {
    uint32_t header[2];
    std::vector<uint8_t> data;
  };

  UcxTransportConfig config;
  bool shm_allowed = false;
  uint64_t host_id = 0;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_mem_h memh = nullptr;
  std::vector<uint8_t> packed_rkey;
  ucp_listener_h ucx_listener = nullptr;
  uint16_t ucx_port = 0;
  uint64_t client_id = 0;  // sent with our connection requests; the server matches it
  int worker_fd = -1;
  int wake_fd = -1;
  int listen_fd = -1;
  uint16_t port = 0;
  std::vector<Bootstrap> bootstraps;
  std::map<pd::NodeId, std::unique_ptr<Peer>> peers;
  std::vector<std::unique_ptr<Peer>> retired;  // replaced incarnations still closing
  std::map<uint64_t, std::unique_ptr<Op>> ops;
  uint64_t next_op = 1;
  uint64_t next_connection = 1;
  std::vector<TransportEvent> pending;  // filled by UCX callbacks during progress
  TransportCounters counters;

  explicit Impl(const UcxTransportConfig& c) : config(c) {
    if (config.secret.empty()) throw Error("the cluster secret is empty: set --cluster-secret or TANDEM_CLUSTER_SECRET");
    shm_allowed = config.tls.find("sm") != std::string::npos || config.tls.find("cma") != std::string::npos ||
                  config.tls.find("all") != std::string::npos || config.tls.find("posix") != std::string::npos ||
                  config.tls.find("sysv") != std::string::npos;
    host_id = local_host_id();
    init_ucx();
    init_listener();
  }

  void init_ucx() {
    ucp_config_t* ucp_config = nullptr;
    check(ucp_config_read(nullptr, nullptr, &ucp_config), "ucp_config_read");
    auto modify = [&](const char* key, const std::string& value) {
      ucs_status_t s = ucp_config_modify(ucp_config, key, value.c_str());
      if (s != UCS_OK) {
        ucp_config_release(ucp_config);
        throw Error("UCX rejected " + std::string(key) + "=" + value + ": " + ucs_status_string(s));
      }
    };
    modify("TLS", config.tls);
    if (!config.net_devices.empty()) modify("NET_DEVICES", config.net_devices);
    modify("KEEPALIVE_INTERVAL", std::to_string(config.keepalive_interval_ms) + "ms");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    ucs_status_t s = ucp_init(&params, ucp_config, &context);
    ucp_config_release(ucp_config);
    check(s, "ucp_init");

    Nonce id_bytes = random_nonce();
    std::memcpy(&client_id, id_bytes.data(), sizeof(client_id));
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_CLIENT_ID;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    wp.client_id = client_id;
    check(ucp_worker_create(context, &wp, &worker), "ucp_worker_create");

    // The handler before the address is published (ucx#9819: otherwise
    // early messages are dropped).
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = kControlAmId;
    am.cb = &Impl::on_am;
    am.arg = this;
    check(ucp_worker_set_am_recv_handler(worker, &am), "ucp_worker_set_am_recv_handler");
    check(ucp_worker_get_efd(worker, &worker_fd), "ucp_worker_get_efd");

    // Endpoints come from UCX's connection manager (client-server): one
    // endpoint pair per peer, whose close the other side sees as a
    // disconnect. (Worker-address endpoints created from both sides pair up
    // implicitly, and a forced close on one side let the other reconnect
    // into a UCX assertion.) Connection requests are accepted only from a
    // peer that has just passed the hand-shake (its client id).
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    if (inet_pton(AF_INET, config.listen_host.c_str(), &addr.sin_addr) != 1)
      throw Error("transfer listener: '" + config.listen_host + "' is not an IPv4 address");
    ucp_listener_params_t lp{};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    lp.sockaddr.addrlen = sizeof(addr);
    lp.conn_handler.cb = &Impl::on_conn_request;
    lp.conn_handler.arg = this;
    check(ucp_listener_create(worker, &lp, &ucx_listener), "ucp_listener_create");
    ucp_listener_attr_t la{};
    la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    check(ucp_listener_query(ucx_listener, &la), "ucp_listener_query");
    ucx_port = ntohs(reinterpret_cast<const sockaddr_in*>(&la.sockaddr)->sin_port);

    if (config.region != nullptr && config.region_bytes > 0) {
      ucp_mem_map_params_t mp{};
      mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_PROT;
      mp.address = config.region;
      mp.length = config.region_bytes;
      mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE | UCP_MEM_MAP_PROT_REMOTE_READ |
                UCP_MEM_MAP_PROT_REMOTE_WRITE;
      check(ucp_mem_map(context, &mp, &memh), "ucp_mem_map (registering the KV pool)");
      void* rkey_buffer = nullptr;
      size_t rkey_len = 0;
      check(ucp_rkey_pack(context, memh, &rkey_buffer, &rkey_len), "ucp_rkey_pack");
      auto* r = static_cast<const uint8_t*>(rkey_buffer);
      packed_rkey.assign(r, r + rkey_len);
      ucp_rkey_buffer_release(rkey_buffer);
    }
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd < 0) throw Error(std::string("eventfd: ") + std::strerror(errno));
  }

  void init_listener() {
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd < 0) throw Error(std::string("socket: ") + std::strerror(errno));
    int one = 1;
    setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(config.listen_port);
    if (inet_pton(AF_INET, config.listen_host.c_str(), &addr.sin_addr) != 1)
      throw Error("transfer listener: '" + config.listen_host + "' is not an IPv4 address");
    if (bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(listen_fd, 64) != 0)
      throw Error("transfer listener: cannot bind " + config.listen_host + ":" + std::to_string(config.listen_port) +
                  ": " + std::strerror(errno));
    socklen_t len = sizeof(addr);
    getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    set_nonblocking(listen_fd);
  }

  ~Impl() {
    for (auto& b : bootstraps) close(b.fd);
    for (auto& [node, p] : peers) force_close(*p);
    for (auto& p : retired) force_close(*p);
    // Bounded: forced closes complete locally.
    for (int i = 0; i < 1000 && !all_closed(); ++i) {
      ucp_worker_progress(worker);
      reap_closes();
    }
    for (auto& [node, p] : peers)
      if (p->pidfd >= 0) close(p->pidfd);
    if (ucx_listener != nullptr) ucp_listener_destroy(ucx_listener);
    if (memh != nullptr) ucp_mem_unmap(context, memh);
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (context != nullptr) ucp_cleanup(context);
    if (listen_fd >= 0) close(listen_fd);
    if (wake_fd >= 0) close(wake_fd);
  }

  bool all_closed() const {
    for (auto& [node, p] : peers)
      if (p->ep != nullptr && !p->closed) return false;
    for (auto& p : retired)
      if (p->ep != nullptr && !p->closed) return false;
    return true;
  }

  RegionKeys own_keys() const {
    RegionKeys k;
    ByteWriter w;
    w.put(ucx_port);
    w.put(client_id);
    k.endpoint_address = std::move(w.bytes());
    k.rkey = packed_rkey;
    k.base_address = reinterpret_cast<uint64_t>(config.region);
    k.size_bytes = config.region_bytes;
    k.n_blocks = config.n_blocks;
    k.block_bytes = config.block_bytes;
    k.n_slots = config.n_slots;
    k.pid = static_cast<uint32_t>(getpid());
    k.host_id = host_id;
    return k;
  }

  // ---- bootstrap (hand-shake) connections ----

  void start_bootstrap(int fd, Handshake::Side side, pd::TimeMs now_ms, std::string where, bool connecting) {
    Bootstrap b;
    b.fd = fd;
    b.handshake = std::make_unique<Handshake>(side, config.secret, config.self, own_keys(), random_nonce());
    b.deadline_ms = now_ms + config.handshake_timeout_ms;
    b.connecting = connecting;
    b.where = std::move(where);
    if (side == Handshake::Side::kClient) queue_frame(b, b.handshake->start());
    bootstraps.push_back(std::move(b));
  }

  static void queue_frame(Bootstrap& b, const std::vector<uint8_t>& frame) {
    if (frame.empty()) return;
    ByteWriter w;
    w.put_bytes(frame);
    b.out.insert(b.out.end(), w.bytes().begin(), w.bytes().end());
  }

  void accept_bootstraps(pd::TimeMs now_ms) {
    for (;;) {
      int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      if (static_cast<int>(bootstraps.size()) >= config.max_bootstrap_connections) {
        close(fd);
        ++counters.handshakes_refused;
        continue;
      }
      start_bootstrap(fd, Handshake::Side::kServer, now_ms, "incoming", false);
    }
  }

  // Drives one bootstrap connection; returns false when it is finished (closed).
  bool service_bootstrap(Bootstrap& b, pd::TimeMs now_ms) {
    auto refused = [&](const std::string& why) {
      ++counters.handshakes_refused;
      TransportEvent e;
      e.kind = TransportEvent::Kind::kRefused;
      e.detail = b.where + ": " + why;
      pending.push_back(std::move(e));
      return false;
    };
    if (b.connecting) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(b.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return refused(std::string("connect: ") + std::strerror(err));
      pollfd p{b.fd, POLLOUT, 0};
      if (::poll(&p, 1, 0) <= 0) return now_ms < b.deadline_ms || refused("hand-shake timed out (connect)");
      b.connecting = false;
    }
    while (!b.out.empty()) {
      ssize_t n = ::send(b.fd, b.out.data(), b.out.size(), MSG_NOSIGNAL);
      if (n <= 0) break;
      b.out.erase(b.out.begin(), b.out.begin() + n);
    }
    Handshake::State state = b.handshake->state();
    if (state != Handshake::State::kInProgress && b.out.empty()) {
      if (state == Handshake::State::kRefused) return refused(b.handshake->why());
      connected(*b.handshake, b.host);
      return false;
    }
    uint8_t buf[4096];
    bool peer_closed = false;
    for (;;) {
      ssize_t n = recv(b.fd, buf, sizeof(buf), 0);
      if (n == 0) peer_closed = true;
      if (n <= 0) break;
      b.in.insert(b.in.end(), buf, buf + n);
      if (b.in.size() > kMaxHandshakeFrameBytes + 4) return refused("oversized hand-shake frame");
    }
    while (b.in.size() >= 4 && b.handshake->state() == Handshake::State::kInProgress) {
      ByteReader r(b.in);
      uint32_t len = r.get<uint32_t>();
      if (len > kMaxHandshakeFrameBytes) return refused("oversized hand-shake frame");
      if (b.in.size() < 4 + size_t{len}) break;
      std::vector<uint8_t> reply = b.handshake->on_frame(std::span(b.in).subspan(4, len));
      b.in.erase(b.in.begin(), b.in.begin() + 4 + len);
      queue_frame(b, reply);
    }
    if (b.handshake->state() != Handshake::State::kInProgress) return service_bootstrap(b, now_ms);
    if (peer_closed) return refused("peer closed the hand-shake");
    return now_ms < b.deadline_ms || refused("hand-shake timed out");
  }

  // A hand-shake completed. The client connects its endpoint to the server's
  // UCX listener at once; the server waits for that connection request.
  void connected(const Handshake& h, const std::string& client_host) {
    const PeerIdentity& id = h.peer();
    const RegionKeys& keys = h.peer_keys();
    ByteReader r(keys.endpoint_address);
    uint16_t peer_ucx_port = r.get<uint16_t>();
    uint64_t peer_client_id = r.get<uint64_t>();
    if (!r.ok() || !r.at_end()) return refuse_peer(id.node, "malformed endpoint address");
    int pidfd = -1;
    if (shm_allowed && keys.host_id == host_id) {
      pidfd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(keys.pid), 0));
      if (pidfd < 0)
        return refuse_peer(id.node, "peer node " + std::to_string(id.node) +
                                        " shares this host but its process cannot be watched (pidfd_open: " +
                                        std::strerror(errno) +
                                        "), so shared-memory RMA with it could never be fenced");
    }
    auto it = peers.find(id.node);
    if (it != peers.end()) {
      // A new incarnation replaces the old one, which is cut off first.
      force_close(*it->second);
      retired.push_back(std::move(it->second));
      peers.erase(it);
    }
    auto peer = std::make_unique<Peer>();
    peer->identity = id;
    peer->keys = keys;
    peer->pidfd = pidfd;
    peer->impl = this;
    peer->client_id = peer_client_id;
    peer->connection = next_connection++;
    Peer& p = *peer;
    peers[id.node] = std::move(peer);
    if (h.side() == Handshake::Side::kServer) return;  // on_conn_request creates the endpoint
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(peer_ucx_port);
    inet_pton(AF_INET, client_host.c_str(), &addr.sin_addr);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER | UCP_EP_PARAMS_FLAGS_SEND_CLIENT_ID;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    ep.sockaddr.addrlen = sizeof(addr);
    endpoint_ready(p, ucp_ep_create(worker, &ep_params_with_errors(ep, p), &p.ep));
  }

  ucp_ep_params_t& ep_params_with_errors(ucp_ep_params_t& ep, Peer& p) {
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &Impl::on_ep_error;
    ep.err_handler.arg = &p;
    return ep;
  }

  void refuse_peer(pd::NodeId node, std::string why) {
    ++counters.handshakes_refused;
    TransportEvent e;
    e.kind = TransportEvent::Kind::kRefused;
    e.peer = node;
    e.detail = std::move(why);
    pending.push_back(std::move(e));
  }

  // The endpoint to an authenticated peer exists (or could not be made).
  void endpoint_ready(Peer& p, ucs_status_t s) {
    if (s == UCS_OK && !p.keys.rkey.empty()) s = ucp_ep_rkey_unpack(p.ep, p.keys.rkey.data(), &p.rkey);
    if (s != UCS_OK) {
      if (p.ep != nullptr) force_close(p);
      p.failed = true;
      return refuse_peer(p.identity.node, ucs_error("endpoint to the peer", s));
    }
    ++counters.handshakes_ok;
    TransportEvent e;
    e.kind = TransportEvent::Kind::kConnected;
    e.peer = p.identity.node;
    e.peer_epoch = p.identity.epoch;
    e.connection = p.connection;
    e.identity = p.identity;
    e.keys = p.keys;
    pending.push_back(std::move(e));
  }

  static void on_conn_request(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<Impl*>(arg);
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ID;
    Peer* peer = nullptr;
    if (ucp_conn_request_query(request, &attr) == UCS_OK) {
      for (auto& [node, p] : self->peers)
        if (p->ep == nullptr && !p->failed && p->client_id == attr.client_id) peer = p.get();
    }
    if (peer == nullptr) {
      // Not a peer that passed the hand-shake: no endpoint.
      ++self->counters.connections_rejected;
      ucp_listener_reject(self->ucx_listener, request);
      return;
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.conn_request = request;
    self->endpoint_ready(*peer, ucp_ep_create(self->worker, &self->ep_params_with_errors(ep, *peer), &peer->ep));
  }

  // ---- UCX callbacks (run inside ucp_worker_progress, on the polling thread) ----

  static ucs_status_t on_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                            const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    uint32_t h[2] = {0, 0};
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (header_length == sizeof(h)) std::memcpy(h, header, sizeof(h));
    auto it = self->peers.find(h[0]);
    // Only frames from an authenticated peer incarnation, sent eagerly (we never
    // send rendezvous control frames), within the size bound, are delivered.
    if (rndv || header_length != sizeof(h) || it == self->peers.end() || it->second->identity.epoch != h[1] ||
        it->second->failed || length > kMaxFrameBytes) {
      ++self->counters.frames_dropped_unknown_peer;
      return UCS_OK;
    }
    ++self->counters.frames_received;
    TransportEvent e;
    e.kind = TransportEvent::Kind::kMessage;
    e.peer = h[0];
    e.peer_epoch = h[1];
    e.connection = it->second->connection;
    auto* bytes = static_cast<const uint8_t*>(data);
    e.frame.assign(bytes, bytes + length);
    self->pending.push_back(std::move(e));
    return UCS_OK;
  }

  static void on_ep_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* peer = static_cast<Peer*>(arg);
    if (peer->failed) return;
    peer->failed = true;
    ++peer->impl->counters.peer_failures;
    TransportEvent e;
    e.kind = TransportEvent::Kind::kPeerFailed;
    e.peer = peer->identity.node;
    e.peer_epoch = peer->identity.epoch;
    e.connection = peer->connection;
    e.detail = ucs_error("endpoint error", status);
    peer->impl->pending.push_back(std::move(e));
  }

  static void on_sent(void* request, ucs_status_t, void* user_data) {
    delete static_cast<SendBuffer*>(user_data);
    ucp_request_free(request);
  }

  static void on_flushed(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<Op*>(user_data);
    op->done = true;
    op->status = status;
    ucp_request_free(request);
  }

  // ---- operations ----

  void force_close(Peer& p) {
    p.failed = true;
    if (p.ep == nullptr || p.close_request != nullptr || p.closed) return;
    if (p.rkey != nullptr) {
      ucp_rkey_destroy(p.rkey);
      p.rkey = nullptr;
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* request = ucp_ep_close_nbx(p.ep, &param);
    if (request == nullptr || UCS_PTR_IS_ERR(request)) {
      p.closed = true;
    } else {
      p.close_request = request;
    }
  }

  void reap_closes() {
    auto reap = [](Peer& p) {
      if (p.close_request != nullptr && ucp_request_check_status(p.close_request) != UCS_INPROGRESS) {
        ucp_request_free(p.close_request);
        p.close_request = nullptr;
        p.closed = true;
      }
    };
    for (auto& [node, p] : peers) reap(*p);
    for (auto& p : retired) reap(*p);
    std::erase_if(retired, [](const std::unique_ptr<Peer>& p) { return p->closed && !p->fence_wanted; });
  }

  bool send(pd::NodeId node, std::span<const uint8_t> frame) {
    auto it = peers.find(node);
    if (it == peers.end() || it->second->ep == nullptr || it->second->failed || frame.size() > kMaxFrameBytes)
      return false;
    auto* buffer = new SendBuffer{{config.self.node, config.self.epoch}, {frame.begin(), frame.end()}};
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    param.cb.send = &Impl::on_sent;
    param.user_data = buffer;
    void* request = ucp_am_send_nbx(it->second->ep, kControlAmId, buffer->header, sizeof(buffer->header),
                                    buffer->data.data(), buffer->data.size(), &param);
    if (request == nullptr || UCS_PTR_IS_ERR(request)) {
      delete buffer;
      if (UCS_PTR_IS_ERR(request)) return false;
    }
    ++counters.frames_sent;
    return true;
  }

  void fail_op(uint64_t tag, pd::NodeId node, std::string detail) {
    ++counters.rma_failed;
    TransportEvent e;
    e.kind = TransportEvent::Kind::kRmaDone;
    e.peer = node;
    e.tag = tag;
    e.ok = false;
    e.detail = std::move(detail);
    pending.push_back(std::move(e));
  }

  void post(pd::NodeId node, RmaOp kind, const std::vector<RmaRun>& runs, uint64_t tag, pd::TimeMs deadline_ms,
            uint64_t connection) {
    auto it = peers.find(node);
    if (it == peers.end() || it->second->ep == nullptr || it->second->failed || it->second->rkey == nullptr)
      return fail_op(tag, node, "peer node " + std::to_string(node) + " is not connected");
    Peer& p = *it->second;
    if (p.connection != connection)
      return fail_op(tag, node, "the addresses came from node " + std::to_string(node) + " on connection " +
                                    std::to_string(connection) + ", which is gone (now " +
                                    std::to_string(p.connection) +
                                    "): it may have been fenced and its memory reused since");
    uint64_t bytes = 0;
    for (const RmaRun& run : runs) {
      // Offsets come from block ids the peer sent (validated at the wire);
      // checked again here against both registered regions.
      if (run.size_bytes == 0 || run.local_offset > config.region_bytes ||
          run.size_bytes > config.region_bytes - run.local_offset || run.remote_offset > p.keys.size_bytes ||
          run.size_bytes > p.keys.size_bytes - run.remote_offset)
        return fail_op(tag, node, "RMA run outside a registered pool");
      bytes += run.size_bytes;
    }
    ++counters.rma_posted;
    for (const RmaRun& run : runs) {
      ucp_request_param_t param{};
      uint8_t* local = static_cast<uint8_t*>(config.region) + run.local_offset;
      uint64_t remote = p.keys.base_address + run.remote_offset;
      void* request = kind == RmaOp::kPut ? ucp_put_nbx(p.ep, local, run.size_bytes, remote, p.rkey, &param)
                                          : ucp_get_nbx(p.ep, local, run.size_bytes, remote, p.rkey, &param);
      if (UCS_PTR_IS_ERR(request))
        return fail_op(tag, node, ucs_error(kind == RmaOp::kPut ? "ucp_put_nbx" : "ucp_get_nbx",
                                            UCS_PTR_STATUS(request)));
      // Completion is tracked by the flush below, which covers every
      // operation posted on the endpoint before it, at origin and target.
      if (request != nullptr) ucp_request_free(request);
    }
    auto op = std::make_unique<Op>();
    op->tag = tag;
    op->peer = node;
    op->connection = p.connection;
    op->deadline_ms = deadline_ms;
    op->bytes = bytes;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &Impl::on_flushed;
    param.user_data = op.get();
    void* request = ucp_ep_flush_nbx(p.ep, &param);
    if (UCS_PTR_IS_ERR(request)) return fail_op(tag, node, ucs_error("ucp_ep_flush_nbx", UCS_PTR_STATUS(request)));
    if (request == nullptr) op->done = true;
    ops[next_op++] = std::move(op);
  }

  // The connection an operation ran on, wherever its peer record is now
  // (current, or retired by a newer incarnation); null once destroyed.
  Peer* find_connection(uint64_t connection) {
    for (auto& [node, p] : peers)
      if (p->connection == connection) return p.get();
    for (auto& p : retired)
      if (p->connection == connection) return p.get();
    return nullptr;
  }

  void fence(pd::NodeId node, pd::Epoch epoch) {
    Peer* target = nullptr;
    auto it = peers.find(node);
    if (it != peers.end() && it->second->identity.epoch == epoch) target = it->second.get();
    for (auto& p : retired)
      if (target == nullptr && p->identity.node == node && p->identity.epoch == epoch) target = p.get();
    auto fenced_now = [&](const char* why) {
      TransportEvent e;
      e.kind = TransportEvent::Kind::kPeerFenced;
      e.peer = node;
      e.peer_epoch = epoch;
      e.detail = why;
      pending.push_back(std::move(e));
    };
    // No record of that incarnation: it never connected, or its endpoint was
    // closed and reaped when a newer one replaced it.
    if (target == nullptr) return fenced_now("no connection to that incarnation");
    if (target->fenced) return fenced_now("fenced already");
    target->fence_wanted = true;
    force_close(*target);
  }

  // Turns completed operations, closes and exits into events.
  void collect(pd::TimeMs now_ms) {
    reap_closes();
    for (auto it = ops.begin(); it != ops.end();) {
      Op& op = *it->second;
      Peer* conn = find_connection(op.connection);
      if (!op.done && !op.timed_out && now_ms >= op.deadline_ms) {
        // Force-closing the endpoint cancels the operation: its flush
        // completes with an error, at the latest when the close is over.
        ++counters.rma_deadline_exceeded;
        if (conn != nullptr) force_close(*conn);
        op.timed_out = true;
        op.detail = "deadline exceeded; endpoint to node " + std::to_string(op.peer) + " force-closed";
      }
      // Reported only once nothing of it can still land: its flush called
      // back, or the endpoint it ran on is closed.
      bool over = op.done || (op.timed_out && (conn == nullptr || conn->closed));
      if (op.reported || !over) {
        if (op.reported && op.done) {
          it = ops.erase(it);
        } else {
          ++it;
        }
        continue;
      }
      // A flush can report success on an endpoint whose peer has reset it;
      // nothing is known to have landed then, so it counts as a failure.
      ucs_status_t status = op.timed_out ? UCS_ERR_TIMED_OUT : op.status;
      if (status == UCS_OK && (conn == nullptr || conn->failed)) {
        status = UCS_ERR_ENDPOINT_TIMEOUT;
        op.detail = "endpoint to node " + std::to_string(op.peer) + " failed during the operation";
      }
      TransportEvent e;
      e.kind = TransportEvent::Kind::kRmaDone;
      e.peer = op.peer;
      e.tag = op.tag;
      e.ok = status == UCS_OK;
      if (e.ok) {
        counters.bytes_moved += static_cast<int64_t>(op.bytes);
      } else {
        ++counters.rma_failed;
        e.detail = op.detail.empty() ? ucs_error("RMA", status) : op.detail;
      }
      pending.push_back(std::move(e));
      if (!op.done) {
        // The flush callback may still run against this op: keep it alive.
        op.reported = true;
        ++it;
        continue;
      }
      it = ops.erase(it);
    }
    auto check_fenced = [&](Peer& p) {
      if (!p.fence_wanted || p.fenced || !p.closed) return;
      if (p.pidfd >= 0) {
        pollfd f{p.pidfd, POLLIN, 0};
        if (::poll(&f, 1, 0) <= 0) return;  // still alive: shared memory stays reachable
      }
      p.fenced = true;
      p.fence_wanted = false;
      TransportEvent e;
      e.kind = TransportEvent::Kind::kPeerFenced;
      e.peer = p.identity.node;
      e.peer_epoch = p.identity.epoch;
      e.detail = p.pidfd >= 0 ? "process exited" : "endpoint force-closed";
      pending.push_back(std::move(e));
    };
    for (auto& [node, p] : peers) check_fenced(*p);
    for (auto& p : retired) check_fenced(*p);
    // Failed endpoints are closed (the error callback leaves only a forced close).
    for (auto& [node, p] : peers)
      if (p->failed) force_close(*p);
  }

  void poll(int timeout_ms, std::vector<TransportEvent>* events) {
    pd::TimeMs now_ms = monotonic_ms();
    auto work = [&] {
      now_ms = monotonic_ms();
      accept_bootstraps(now_ms);
      std::erase_if(bootstraps, [&](Bootstrap& b) {
        bool keep = service_bootstrap(b, now_ms);
        if (!keep) close(b.fd);
        return !keep;
      });
      while (ucp_worker_progress(worker) != 0) {
      }
      collect(now_ms);
    };
    work();
    if (pending.empty() && timeout_ms > 0 && ucp_worker_arm(worker) == UCS_OK) {
      std::vector<pollfd> fds;
      fds.push_back({worker_fd, POLLIN, 0});
      fds.push_back({wake_fd, POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      for (const Bootstrap& b : bootstraps)
        fds.push_back({b.fd, static_cast<short>(POLLIN | (b.out.empty() && !b.connecting ? 0 : POLLOUT)), 0});
      for (auto& [node, p] : peers)
        if (p->fence_wanted && p->pidfd >= 0) fds.push_back({p->pidfd, POLLIN, 0});
      int wait_ms = timeout_ms;
      for (const auto& [id, op] : ops)
        if (!op->done) wait_ms = static_cast<int>(std::clamp<pd::TimeMs>(op->deadline_ms - now_ms, 0, wait_ms));
      // Pending closes and unfinished hand-shakes need short naps, not long sleeps.
      if (!bootstraps.empty() || !all_closed()) wait_ms = std::min(wait_ms, 10);
      ::poll(fds.data(), fds.size(), wait_ms);
      uint64_t drained = 0;
      if (read(wake_fd, &drained, sizeof(drained)) < 0) {
        // Nothing to drain: the wake-up came from elsewhere.
      }
      work();
    }
    for (auto& e : pending) events->push_back(std::move(e));
    pending.clear();
  }

  void connect(const std::string& host, uint16_t peer_port, pd::TimeMs now_ms) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(peer_port);
    std::string where = host + ":" + std::to_string(peer_port);
    if (fd < 0 || inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
      if (fd >= 0) close(fd);
      TransportEvent e;
      e.kind = TransportEvent::Kind::kRefused;
      e.detail = where + ": not a reachable IPv4 address";
      pending.push_back(std::move(e));
      return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int r = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    start_bootstrap(fd, Handshake::Side::kClient, now_ms, where, r != 0 && errno == EINPROGRESS);
    bootstraps.back().host = host;
    if (r != 0 && errno != EINPROGRESS) {
      // Reported by the first service_bootstrap (SO_ERROR), like a late failure.
      bootstraps.back().connecting = true;
    }
  }
};

UcxTransport::UcxTransport(const UcxTransportConfig& config) : impl_(std::make_unique<Impl>(config)) {}
UcxTransport::~UcxTransport() = default;

void UcxTransport::connect(const std::string& host, uint16_t port) {
  impl_->connect(host, port, monotonic_ms());
}
bool UcxTransport::send(pd::NodeId peer, std::span<const uint8_t> frame) { return impl_->send(peer, frame); }
void UcxTransport::post(pd::NodeId peer, RmaOp op, std::vector<RmaRun> runs, uint64_t tag,
                        pd::TimeMs deadline_ms, uint64_t connection) {
  impl_->post(peer, op, runs, tag, deadline_ms, connection);
}
void UcxTransport::fence(pd::NodeId peer, pd::Epoch epoch) { impl_->fence(peer, epoch); }
void UcxTransport::poll(int timeout_ms, std::vector<TransportEvent>* events) {
  impl_->poll(timeout_ms, events);
}
void UcxTransport::wake() {
  uint64_t one = 1;
  if (write(impl_->wake_fd, &one, sizeof(one)) < 0) {
    // The counter is full: a wake-up is already pending.
  }
}
uint16_t UcxTransport::listen_port() const { return impl_->port; }
bool UcxTransport::fences_by_close() const { return !impl_->shm_allowed; }
const TransportCounters& UcxTransport::counters() const { return impl_->counters; }

}  // namespace tandem::transport
