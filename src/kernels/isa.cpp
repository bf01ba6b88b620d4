#include "kernels/isa.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "kernels/isa_kernels.h"
#include "util/error.h"

namespace tandem::kernels {

std::string isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown";
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::kAvx512:
      return isa_supported(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("avx512bf16");
  }
  return false;
}

Isa best_supported_isa() {
  if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
  if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

namespace {

Isa initial_isa() {
  const char* env = std::getenv("TANDEM_ISA");
  if (env == nullptr || *env == '\0') return best_supported_isa();
  std::string_view want(env);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (want == isa_name(isa)) {
      if (!isa_supported(isa)) throw Error("TANDEM_ISA=" + std::string(want) + ": this CPU cannot run it");
      return isa;
    }
  }
  throw Error("TANDEM_ISA=" + std::string(want) + " is not one of scalar, avx2, avx512");
}

std::atomic<int>& active_slot() {
  static std::atomic<int> slot{static_cast<int>(initial_isa())};
  return slot;
}

}  // namespace

Isa active_isa() { return static_cast<Isa>(active_slot().load(std::memory_order_relaxed)); }

void set_active_isa(Isa isa) {
  if (!isa_supported(isa)) throw Error("instruction set " + isa_name(isa) + " is not supported by this CPU");
  active_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
}

GemmFn gemm_for(const IsaKernels& k, DType t) {
  switch (t) {
    case DType::kF32: return k.gemm_f32;
    case DType::kF16: return k.gemm_f16;
    case DType::kBF16: return k.gemm_bf16;
    case DType::kQ8_0: return k.gemm_q8_0;
    case DType::kQ4_K: return k.gemm_q4_k;
    case DType::kQ6_K: return k.gemm_q6_k;
    case DType::kQ4_0: return k.gemm_q4_0;
    case DType::kQ4_1: return k.gemm_q4_1;
    case DType::kQ5_0: return k.gemm_q5_0;
    case DType::kQ5_1: return k.gemm_q5_1;
    case DType::kIQ4_NL: return k.gemm_iq4_nl;
    case DType::kQ5_K: return k.gemm_q5_k;
    case DType::kQ2_K: return k.gemm_q2_k;
    case DType::kQ3_K: return k.gemm_q3_k;
    case DType::kIQ4_XS: return k.gemm_iq4_xs;
  }
  return nullptr;
}

const IsaKernels& active_kernels() {
  switch (active_isa()) {
    case Isa::kAvx512: return kAvx512Kernels;
    case Isa::kAvx2: return kAvx2Kernels;
    case Isa::kScalar: break;
  }
  return kScalarKernels;
}

}  // namespace tandem::kernels
