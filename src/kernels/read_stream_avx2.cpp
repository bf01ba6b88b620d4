#include <immintrin.h>

#include "kernels/read_stream.h"

namespace tandem::kernels {

namespace {

// As read_stream_avx512.cpp's read_streams, with two 32-byte loads a line.
template <int kStreams, size_t kAhead>
uint64_t read_streams(const uint8_t* p, size_t bytes) {
  constexpr int kLines = 8 / kStreams;
  static_assert(kLines * kStreams == 8);
  __m256i a[8];
  for (__m256i& v : a) v = _mm256_setzero_si256();
  auto add_line = [&](size_t i, const uint8_t* line) {
    a[i] = _mm256_add_epi64(a[i], _mm256_load_si256(reinterpret_cast<const __m256i*>(line)));
    a[i] = _mm256_add_epi64(a[i], _mm256_load_si256(reinterpret_cast<const __m256i*>(line + 32)));
  };
  const size_t part = bytes / (512 * kStreams) * 512;
  for (size_t off = 0; off < part; off += 64 * kLines)
    for (int s = 0; s < kStreams; ++s) {
      const uint8_t* q = p + static_cast<size_t>(s) * part + off;
      for (int l = 0; l < kLines; ++l) {
        if constexpr (kAhead > 0) _mm_prefetch(probe_prefetch_address(q, 64 * static_cast<size_t>(l), kAhead), _MM_HINT_T1);
        add_line(static_cast<size_t>(s * kLines + l), q + 64 * l);
      }
    }
  for (const uint8_t *q = p + kStreams * part, *end = p + bytes; q < end; q += 512)
    for (size_t l = 0; l < 8; ++l) add_line(l, q + 64 * l);
  __m256i s = a[0];
  for (size_t l = 1; l < 8; ++l) s = _mm256_add_epi64(s, a[l]);
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return out[0] + out[1] + out[2] + out[3];
}

constexpr ReadLoop kLoops[] = {
    {read_streams<1, 0>, "avx2"},
    {read_streams<1, kProbePrefetchBytes>, "avx2 + L2 prefetch"},
    {read_streams<2, kProbeStreamPrefetchBytes>, "avx2, 2 streams + L2 prefetch"},
    {read_streams<4, kProbeStreamPrefetchBytes>, "avx2, 4 streams + L2 prefetch"},
};

}  // namespace

std::span<const ReadLoop> read_loops_avx2() { return kLoops; }

}  // namespace tandem::kernels
