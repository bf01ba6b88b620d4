#include "transport/gloo_transport.h"

#include "transport/shm_frames.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <filesystem>
#include <chrono>
#include <cstring>

namespace tandem {
namespace {

// The one slot control frames travel on, and the one data phases use.
constexpr uint64_t kControlSlot = 0x74616e64;
constexpr uint64_t kDataSlot = 0x74616e65;

template <typename F>
void translating_gloo_errors(const char* what, F&& f) {
  try {
    f();
  } catch (const ::gloo::Exception& e) {
    throw parallel::TransportError(std::string(what) + ": " + e.what());
  } catch (const ::gloo::EnforceNotMet& e) {
    throw parallel::TransportError(std::string(what) + ": " + e.what());
  }
}

// gloo's FileStore, whose waits give up when `interrupted` is raised: it
// waits in slices (FileStore rounds a wait up to whole seconds).
class InterruptibleStore : public ::gloo::rendezvous::Store {
 public:
  InterruptibleStore(::gloo::rendezvous::Store& inner, const std::atomic<bool>* interrupted)
      : inner_(inner), interrupted_(interrupted) {}
  void set(const std::string& key, const std::vector<char>& data) override { inner_.set(key, data); }
  std::vector<char> get(const std::string& key) override { return inner_.get(key); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      try {
        inner_.wait(keys, std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(1000)));
        return;
      } catch (const ::gloo::IoException&) {
        if (interrupted_ != nullptr && interrupted_->load()) throw ::gloo::IoException("rendezvous interrupted");
        if (std::chrono::steady_clock::now() >= deadline) throw;
      }
    }
  }

 private:
  ::gloo::rendezvous::Store& inner_;
  const std::atomic<bool>* interrupted_;
};

// gloo leaves Nagle's algorithm on for its pairs, so a small message sent
// right after another waits for the peer's (delayed) acknowledgement:
// milliseconds per op. Its pairs' sockets are not exposed, so every TCP
// socket of the process gets TCP_NODELAY once the mesh is connected
// (harmless for the others: tandem's HTTP and UCX sockets want it too).
void no_delay_on_every_tcp_socket() {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    int type = 0;
    socklen_t len = sizeof type;
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof addr;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    if (addr.ss_family != AF_INET && addr.ss_family != AF_INET6) continue;
    const int one = 1;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
}

}  // namespace

GlooTransport::GlooTransport(const GlooGroupOptions& options)
    : options_(options), recv_frames_(new parallel::Frame[static_cast<size_t>(options.size)]) {
  // Rank 0 makes the generation's frame ring before the ranks meet, so it
  // is there for every rank once they have.
  const std::string ring = ShmFrames::path_for(options.rendezvous_dir, options.generation);
  if (options.shared_memory_frames && options.rank == 0) ShmFrames::create(ring, options.size);
  translating_gloo_errors("data-parallel rendezvous", [&] {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = options.bind_host;
    auto device = ::gloo::transport::tcp::CreateDevice(attr);
    ::gloo::rendezvous::FileStore file_store(options.rendezvous_dir);
    InterruptibleStore interruptible(file_store, options.interrupted);
    ::gloo::rendezvous::PrefixStore store(options.generation, interruptible);
    auto context = std::make_shared<::gloo::rendezvous::Context>(options.rank, options.size);
    // connectFullMesh copies the timeout into the transport: set it first.
    context->setTimeout(std::chrono::milliseconds(options.timeout_ms));
    context->connectFullMesh(store, device);
    context_ = context;
    no_delay_on_every_tcp_socket();
  });
  if (options.shared_memory_frames)
    shm_ = std::make_unique<ShmFrames>(ring, options.rank, options.size, options.timeout_ms, options.interrupted);
  send_buf_ = context_->createUnboundBuffer(&send_frame_, sizeof(parallel::Frame));
  recv_buf_ = context_->createUnboundBuffer(recv_frames_.get(), sizeof(parallel::Frame) * static_cast<size_t>(options.size));
}

GlooTransport::~GlooTransport() = default;

void GlooTransport::exchange(const parallel::Frame& mine, std::span<parallel::Frame> all,
                             const std::function<void(int)>& arrived) {
  if (shm_) return shm_->exchange(mine, all, arrived);
  const int n = options_.size;
  const auto timeout = std::chrono::milliseconds(options_.timeout_ms);
  send_frame_ = mine;
  translating_gloo_errors("data-parallel exchange", [&] {
    for (int peer = 0; peer < n; ++peer) {
      if (peer == options_.rank) continue;
      recv_buf_->recv(peer, kControlSlot, sizeof(parallel::Frame) * static_cast<size_t>(peer), sizeof(parallel::Frame));
      send_buf_->send(peer, kControlSlot, 0, sizeof(parallel::Frame));
    }
    for (int i = 0; i < n - 1; ++i) {
      int src = -1;
      if (!recv_buf_->waitRecv(&src, timeout))
        throw parallel::TransportError("data-parallel exchange: receive aborted");
      arrived(src);
    }
    for (int i = 0; i < n - 1; ++i) {
      if (!send_buf_->waitSend(timeout)) throw parallel::TransportError("data-parallel exchange: send aborted");
    }
  });
  recv_frames_[static_cast<size_t>(options_.rank)] = mine;
  std::memcpy(all.data(), recv_frames_.get(), sizeof(parallel::Frame) * static_cast<size_t>(n));
}

}  // namespace tandem

namespace tandem {

void GlooTransport::all_to_all(const void* send, std::span<const int64_t> send_bytes, void* recv,
                               std::span<const int64_t> recv_bytes, int64_t largest_send_bytes) {
  if (shm_ && largest_send_bytes <= ShmFrames::kDataBytes) return shm_->all_to_all(send, send_bytes, recv, recv_bytes);
  const int n = options_.size;
  const int me = options_.rank;
  const auto timeout = std::chrono::milliseconds(options_.timeout_ms);
  std::vector<size_t> send_at(static_cast<size_t>(n) + 1, 0), recv_at(static_cast<size_t>(n) + 1, 0);
  for (int r = 0; r < n; ++r) {
    send_at[static_cast<size_t>(r) + 1] = send_at[static_cast<size_t>(r)] + static_cast<size_t>(send_bytes[static_cast<size_t>(r)]);
    recv_at[static_cast<size_t>(r) + 1] = recv_at[static_cast<size_t>(r)] + static_cast<size_t>(recv_bytes[static_cast<size_t>(r)]);
  }
  if (send_bytes[static_cast<size_t>(me)] > 0)  // an empty phase may have no buffers at all
    std::memcpy(static_cast<char*>(recv) + recv_at[static_cast<size_t>(me)],
                static_cast<const char*>(send) + send_at[static_cast<size_t>(me)],
                static_cast<size_t>(send_bytes[static_cast<size_t>(me)]));
  translating_gloo_errors("data-parallel data exchange", [&] {
    // gloo refuses zero-length buffers: a rank that moves nothing posts nothing.
    std::unique_ptr<::gloo::transport::UnboundBuffer> out, in;
    if (send_at.back() > 0) out = context_->createUnboundBuffer(const_cast<void*>(send), send_at.back());
    if (recv_at.back() > 0) in = context_->createUnboundBuffer(recv, recv_at.back());
    int sends = 0, recvs = 0;
    for (int peer = 0; peer < n; ++peer) {
      if (peer == me) continue;
      const auto p = static_cast<size_t>(peer);
      if (recv_bytes[p] > 0) in->recv(peer, kDataSlot, recv_at[p], static_cast<size_t>(recv_bytes[p])), ++recvs;
      if (send_bytes[p] > 0) out->send(peer, kDataSlot, send_at[p], static_cast<size_t>(send_bytes[p])), ++sends;
    }
    for (int i = 0; i < recvs; ++i)
      if (!in->waitRecv(timeout)) throw parallel::TransportError("data-parallel data exchange: receive aborted");
    for (int i = 0; i < sends; ++i)
      if (!out->waitSend(timeout)) throw parallel::TransportError("data-parallel data exchange: send aborted");
  });
}

}  // namespace tandem
