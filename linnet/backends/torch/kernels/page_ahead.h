// Weights in 4 KB pages (where 2 MB pages come slowly, huge_pages.py leaves them where
// torch put them) cost a TLB walk every 4 KB of a decode step's stream, and the hardware
// prefetchers stop at each 4 KB boundary. The row kernels AMD's choices run (cpu_tuning.h:
// bf16_gemv.cpp's rows, f32_gemv.cpp) touch the pages `page_ahead()` bytes ahead of the row
// they start, one prefetch a page, so those walks and first lines are under way before
// the loads reach them. SmolLM2's decode, one thread, the Zen 4 EPYC of session 24, every
// weight in 4 KB pages (bench/packed_decode.py, "no page-ahead" against the default):
// bf16 20.4 -> 14.1 ms a token, f32 33.5 -> 25.7; their AVX2 code 18.6 -> 15.3 and
// 25.7 -> 22.8; in 2 MB pages within noise. 64 KB gained less than 128, 256 the same.
// The packed kernels' own per-line prefetch (2 KB ahead) left nothing to gain there.
// A prefetch never faults: one past a weight's mapping is harmless (test_page_ahead.py).
#pragma once

#include <cstdint>

namespace linnet {

constexpr int64_t kPage = 4096;

// the distance in bytes; 0 turns the prefetch off (the `page_ahead` op sets it)
inline int64_t& page_ahead() {
  static int64_t bytes = 128 * 1024;
  return bytes;
}

// One prefetch for each 4 KB page under [at, at + bytes), page_ahead() bytes on.
inline void touch_pages_ahead(const void* at, int64_t bytes) {
  const int64_t ahead = page_ahead();
  if (ahead == 0) return;
  const char* p = static_cast<const char*>(at) + ahead;
  for (int64_t j = 0; j < bytes; j += kPage) __builtin_prefetch(p + j);
}

}  // namespace linnet
