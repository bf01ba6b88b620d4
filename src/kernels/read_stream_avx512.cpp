#include <immintrin.h>

#include "kernels/read_stream.h"

namespace tandem::kernels {

namespace {

template <bool kPrefetch>
uint64_t read_stream(const uint8_t* p, size_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (const uint8_t* end = p + bytes; p < end; p += 512) {
    if constexpr (kPrefetch)
      for (size_t line = 0; line < 512; line += 64) _mm_prefetch(probe_prefetch_address(p, line), _MM_HINT_T1);
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + 64));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + 128));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + 192));
    a4 = _mm512_add_epi64(a4, _mm512_load_si512(p + 256));
    a5 = _mm512_add_epi64(a5, _mm512_load_si512(p + 320));
    a6 = _mm512_add_epi64(a6, _mm512_load_si512(p + 384));
    a7 = _mm512_add_epi64(a7, _mm512_load_si512(p + 448));
  }
  const __m512i s = _mm512_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)),
                                     _mm512_add_epi64(_mm512_add_epi64(a4, a5), _mm512_add_epi64(a6, a7)));
  // Summed as unsigned (the reduce intrinsic adds signed, which may overflow).
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, s);
  uint64_t sum = 0;
  for (uint64_t v : lanes) sum += v;
  return sum;
}

}  // namespace

uint64_t read_stream_avx512(const uint8_t* p, size_t bytes) { return read_stream<false>(p, bytes); }
uint64_t read_stream_avx512_l2_prefetch(const uint8_t* p, size_t bytes) { return read_stream<true>(p, bytes); }

}  // namespace tandem::kernels
