#include <immintrin.h>

#include "kernels/read_stream.h"

namespace tandem::kernels {

namespace {

// kStreams parts of `bytes` read side by side, 8 / kStreams lines of each a
// turn into their own accumulators; kAhead > 0: each line also fetched that
// far ahead into L2. What the parts leave over (less than 512 * kStreams
// bytes) is read after them as one stream.
template <int kStreams, size_t kAhead>
uint64_t read_streams(const uint8_t* p, size_t bytes) {
  constexpr int kLines = 8 / kStreams;
  static_assert(kLines * kStreams == 8);
  __m512i a[8];
  for (__m512i& v : a) v = _mm512_setzero_si512();
  const size_t part = bytes / (512 * kStreams) * 512;
  for (size_t off = 0; off < part; off += 64 * kLines)
    for (int s = 0; s < kStreams; ++s) {
      const uint8_t* q = p + static_cast<size_t>(s) * part + off;
      for (int l = 0; l < kLines; ++l) {
        if constexpr (kAhead > 0) _mm_prefetch(probe_prefetch_address(q, 64 * static_cast<size_t>(l), kAhead), _MM_HINT_T1);
        a[static_cast<size_t>(s * kLines + l)] =
            _mm512_add_epi64(a[static_cast<size_t>(s * kLines + l)], _mm512_load_si512(q + 64 * l));
      }
    }
  for (const uint8_t *q = p + kStreams * part, *end = p + bytes; q < end; q += 512)
    for (size_t l = 0; l < 8; ++l) a[l] = _mm512_add_epi64(a[l], _mm512_load_si512(q + 64 * l));
  __m512i s = a[0];
  for (size_t l = 1; l < 8; ++l) s = _mm512_add_epi64(s, a[l]);
  // Summed as unsigned (the reduce intrinsic adds signed, which may overflow).
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, s);
  uint64_t sum = 0;
  for (uint64_t v : lanes) sum += v;
  return sum;
}

constexpr ReadLoop kLoops[] = {
    {read_streams<1, 0>, "avx512"},
    {read_streams<1, kProbePrefetchBytes>, "avx512 + L2 prefetch"},
    {read_streams<2, kProbeStreamPrefetchBytes>, "avx512, 2 streams + L2 prefetch"},
    {read_streams<4, kProbeStreamPrefetchBytes>, "avx512, 4 streams + L2 prefetch"},
};

}  // namespace

std::span<const ReadLoop> read_loops_avx512() { return kLoops; }

}  // namespace tandem::kernels
