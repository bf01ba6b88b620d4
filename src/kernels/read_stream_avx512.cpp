#include <immintrin.h>

#include "kernels/read_stream_loops.h"

namespace tandem::kernels {

namespace {

struct Avx512 {
  using Acc = __m512i;
  static constexpr const char* kIsa = "avx512";
  static Acc zero() { return _mm512_setzero_si512(); }
  static void add_line(Acc& a, const uint8_t* line) { a = _mm512_add_epi64(a, _mm512_load_si512(line)); }
  static uint64_t sum(const Acc (&a)[8]) {
    __m512i s = a[0];
    for (int l = 1; l < 8; ++l) s = _mm512_add_epi64(s, a[l]);
    // Summed as unsigned (the reduce intrinsic adds signed, which may overflow).
    alignas(64) uint64_t lanes[8];
    _mm512_store_si512(lanes, s);
    uint64_t sum = 0;
    for (uint64_t v : lanes) sum += v;
    return sum;
  }
};

}  // namespace

std::span<const ReadLoop> read_loops_avx512() { return kReadLoops<Avx512>; }

}  // namespace tandem::kernels
