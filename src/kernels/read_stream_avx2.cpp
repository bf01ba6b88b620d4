#include <immintrin.h>

#include "kernels/read_stream.h"

namespace tandem::kernels {

namespace {

template <bool kPrefetch>
uint64_t read_stream(const uint8_t* p, size_t bytes) {
  // Eight 32-byte accumulators, two loads per 64-byte line: 512 bytes a turn.
  __m256i a[8];
  for (auto& v : a) v = _mm256_setzero_si256();
  for (const uint8_t* end = p + bytes; p < end; p += 512)
    for (int j = 0; j < 8; ++j) {
      if constexpr (kPrefetch) _mm_prefetch(probe_prefetch_address(p, 64 * j), _MM_HINT_T1);
      a[j] = _mm256_add_epi64(a[j], _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 64 * j)));
      a[j] = _mm256_add_epi64(a[j], _mm256_load_si256(reinterpret_cast<const __m256i*>(p + 64 * j + 32)));
    }
  __m256i s = a[0];
  for (int j = 1; j < 8; ++j) s = _mm256_add_epi64(s, a[j]);
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return out[0] + out[1] + out[2] + out[3];
}

}  // namespace

uint64_t read_stream_avx2(const uint8_t* p, size_t bytes) { return read_stream<false>(p, bytes); }
uint64_t read_stream_avx2_l2_prefetch(const uint8_t* p, size_t bytes) { return read_stream<true>(p, bytes); }

}  // namespace tandem::kernels
