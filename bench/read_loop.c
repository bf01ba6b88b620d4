/* The plain reference for tandem's bandwidth probe (issue 18): a C read loop
 * over 1 GiB with AVX-512 loads into 8 independent accumulators (AVX2 or
 * plain 64-bit adds where the CPU lacks it), OpenMP threads, best of 8.
 * Independent of tandem's code on purpose: `tandem bench bandwidth` must
 * read at least what this reads, on the same machine, in the same run
 * (bench/bandwidth_probe.sh runs both). Usage: read_loop [GiB] [passes] */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double now_s(void) { return omp_get_wtime(); }

static uint64_t read_slice(const uint8_t* p, size_t bytes) {
#if defined(__AVX512F__)
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (const uint8_t* end = p + bytes; p < end; p += 512) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + 64));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + 128));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + 192));
    a4 = _mm512_add_epi64(a4, _mm512_load_si512(p + 256));
    a5 = _mm512_add_epi64(a5, _mm512_load_si512(p + 320));
    a6 = _mm512_add_epi64(a6, _mm512_load_si512(p + 384));
    a7 = _mm512_add_epi64(a7, _mm512_load_si512(p + 448));
  }
  a0 = _mm512_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)),
                        _mm512_add_epi64(_mm512_add_epi64(a4, a5), _mm512_add_epi64(a6, a7)));
  uint64_t lanes[8] __attribute__((aligned(64)));
  _mm512_store_si512(lanes, a0);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
#else
  uint64_t a[8] = {0};
  for (const uint8_t* end = p + bytes; p < end; p += 512)
    for (int j = 0; j < 8; ++j)
      for (int w = 0; w < 8; ++w) a[j] += ((const uint64_t*)(p + 64 * j))[w];
  return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
#endif
}

int main(int argc, char** argv) {
  const size_t gib = argc > 1 ? (size_t)atoi(argv[1]) : 1;
  const int passes = argc > 2 ? atoi(argv[2]) : 8;
  const size_t bytes = gib << 30;
  uint8_t* buf = aligned_alloc(2 << 20, bytes);
  if (buf == NULL) return 1;
  const int threads = omp_get_max_threads();
  const size_t slice = bytes / (size_t)threads / 512 * 512;
#pragma omp parallel
  memset(buf + (size_t)omp_get_thread_num() * slice, 1, slice);
  double best = 0;
  uint64_t sink = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const double t0 = now_s();
#pragma omp parallel reduction(+ : sink)
    sink += read_slice(buf + (size_t)omp_get_thread_num() * slice, slice);
    const double gbps = (double)(slice * (size_t)threads) / (now_s() - t0) / 1e9;
    if (gbps > best) best = gbps;
  }
  printf("read_loop: %d threads, %zu GiB, best of %d: %.2f GB/s (sink %llu)\n", threads, gib, passes, best,
         (unsigned long long)(sink & 1));
  free(buf);
  return 0;
}
