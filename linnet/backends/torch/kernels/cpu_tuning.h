// Where the fastest kernel differs by CPU (issue 21), measured with one thread on
// SmolLM2-135M's decode linears (docs/torch.md, "Session 22"):
//
// - bf16 rows: the Xeon of sessions 16-21 read them fastest side by side, four rows in step
//   each with a software prefetch 8 KB ahead; the Zen 4 EPYC of session 22 reads that at
//   11-12 GB/s and one row after another, without software prefetch, at 21-29 (a plain read
//   of the same bytes: 26-31). Both orders give each row the same sums in the same order.
// - Integer dot products (numerics="fast"): Zen 4 runs 512-bit instructions in two 256-bit
//   halves, and the 256-bit kernel (packed_int8_avx2.cpp) read q8_0 at 18-20 GB/s there
//   against 10-12.5 for the AVX512-VNNI one (q4_0 14 vs 12, q4_K 15.6 vs 13.1); with
//   vpdpbusd on 256 bits in place of vpmaddubsw + vpmaddwd, 20.7 (q4_0 16.8, q4_K 19.2).
//
// `amd_tuning()` picks the second of each pair on AMD CPUs; the `amd_tuning` op forces
// either choice for the process (tests, benchmarks). The Python side asks it too
// (`kernels.f32_gemv_preferred`: f32 decode linears through f32_gemv.cpp, held row-major).
#pragma once

namespace linnet {

// -1: by the CPU's vendor; 0: off; 1: on
inline int& amd_tuning_forced() {
  static int mode = -1;
  return mode;
}

inline bool amd_tuning() {
  static const bool amd = __builtin_cpu_is("amd");
  const int forced = amd_tuning_forced();
  return forced < 0 ? amd : forced == 1;
}

}  // namespace linnet
