// The probe's read loops (read_stream.h), written once over an ISA's vector
// operations V and instantiated by each ISA's file (read_stream_avx2.cpp,
// read_stream_avx512.cpp), compiled for that ISA. V provides:
//   using Acc;                               an accumulator
//   static Acc zero();
//   static void add_line(Acc&, const uint8_t* line);   one 64-byte line
//   static uint64_t sum(const Acc (&)[8]);
//   static constexpr const char* kIsa;
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/isa_kernels.h"
#include "kernels/read_stream.h"

namespace tandem::kernels {

// kStreams parts of `bytes` read side by side, 8 / kStreams lines of each a
// turn into their own accumulators; kAhead > 0: each line also fetched that
// far ahead into L2. What the parts leave over (less than 512 * kStreams
// bytes) is read after them as one stream.
template <typename V, int kStreams, size_t kAhead>
uint64_t read_streams(const uint8_t* p, size_t bytes) {
  constexpr int kLines = 8 / kStreams;
  static_assert(kLines * kStreams == 8);
  typename V::Acc a[8];
  for (auto& v : a) v = V::zero();
  const size_t part = bytes / (512 * kStreams) * 512;
  for (size_t off = 0; off < part; off += 64 * kLines)
    for (int s = 0; s < kStreams; ++s) {
      const uint8_t* q = p + static_cast<size_t>(s) * part + off;
      for (int l = 0; l < kLines; ++l) {
        if constexpr (kAhead > 0) __builtin_prefetch(prefetch_address(q, 64 * l + static_cast<int64_t>(kAhead)), 0, 2);
        V::add_line(a[s * kLines + l], q + 64 * l);
      }
    }
  for (const uint8_t *q = p + kStreams * part, *end = p + bytes; q < end; q += 512)
    for (int l = 0; l < 8; ++l) V::add_line(a[l], q + 64 * l);
  return V::sum(a);
}

// Every loop of the ISA of V, plain first.
template <typename V>
constexpr ReadLoop kReadLoops[] = {
    {read_streams<V, 1, 0>, V::kIsa, ""},
    {read_streams<V, 1, kProbePrefetchBytes>, V::kIsa, " + L2 prefetch"},
    {read_streams<V, 2, kProbeStreamPrefetchBytes>, V::kIsa, ", 2 streams + L2 prefetch"},
    {read_streams<V, 4, kProbeStreamPrefetchBytes>, V::kIsa, ", 4 streams + L2 prefetch"},
};

}  // namespace tandem::kernels
