// Per-operation time of the forward pass (`tandem bench model --profile`), so a
// regression points at its kernel. Off unless a profile is attached to the
// model: then each op group is timed with the monotonic clock.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "util/clock.h"

namespace tandem {

enum class Op : uint8_t {
  kEmbed,      // token embedding rows
  kNorm,       // RMSNorm before attention and FFN (and per-head q/k norm)
  kQkv,        // Q, K, V projections (one grouped matmul) and, in its epilogue,
               // biases, per-head norms, RoPE and the K/V write into the pool
  kRope,       // the RoPE angles (once per forward)
  kAttention,  // paged attention
  kOutProj,    // attention output projection + residual (epilogue)
  kGateUp,     // gate and up projections (one grouped matmul) + SwiGLU (epilogue)
  kDown,       // down projection + residual (epilogue)
  kRoute,      // routed experts: router, choice, gather, weighted sum + residual
  kRecurrent,  // gated delta-net: convolution, delta rule, gated norm
  kLmHead,     // final norm and vocabulary projection
};
constexpr int kOpCount = 11;
std::string_view name(Op op);

struct OpProfile {
  std::array<int64_t, kOpCount> ns{};
  std::array<double, kOpCount> flops{};         // matmul ops: 2 * rows * cols * tokens
  std::array<double, kOpCount> weight_bytes{};  // matmul ops: weight bytes read
  int64_t forwards = 0;
  void reset() { *this = OpProfile{}; }
  int64_t total_ns() const {
    int64_t t = 0;
    for (int64_t v : ns) t += v;
    return t;
  }
};

// Times one op group into `profile` (no-op when profile is null).
class OpTimer {
 public:
  OpTimer(OpProfile* profile, Op op) : profile_(profile), op_(op), start_ns_(profile ? monotonic_ns() : 0) {}
  ~OpTimer() {
    if (profile_ != nullptr) profile_->ns[static_cast<int>(op_)] += monotonic_ns() - start_ns_;
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  OpProfile* profile_;
  Op op_;
  int64_t start_ns_;
};

}  // namespace tandem
