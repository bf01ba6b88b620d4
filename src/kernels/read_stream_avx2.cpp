#include <immintrin.h>

#include "kernels/read_stream_loops.h"

namespace tandem::kernels {

namespace {

// Two 32-byte loads a line.
struct Avx2 {
  using Acc = __m256i;
  static constexpr const char* kIsa = "avx2";
  static Acc zero() { return _mm256_setzero_si256(); }
  static void add_line(Acc& a, const uint8_t* line) {
    a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(line)));
    a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(line + 32)));
  }
  static uint64_t sum(const Acc (&a)[8]) {
    __m256i s = a[0];
    for (int l = 1; l < 8; ++l) s = _mm256_add_epi64(s, a[l]);
    alignas(32) uint64_t out[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
    return out[0] + out[1] + out[2] + out[3];
  }
};

}  // namespace

std::span<const ReadLoop> read_loops_avx2() { return kReadLoops<Avx2>; }

}  // namespace tandem::kernels
