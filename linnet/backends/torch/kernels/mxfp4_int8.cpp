// MXFP4 rows against x rounded to int8 (numerics="fast" only; mxfp4_gemv.cpp's
// mxfp4_moe_routed calls it): llama.cpp's scheme for MXFP4 weights and q8_0 activations.
// x is rounded per 32-block exactly as packed_int8_avx2.cpp rounds it (d = amax / 127,
// ties to even); each code becomes its e2m1 value doubled, an int8 (0, 1, 2, 3, 4, 6, 8, 12
// and their negatives) by one byte shuffle; a block's 32 products are summed exactly in
// int32 (vpmaddubsw with the sign trick: |q| * sign-moved code, at most 2 * 127 * 12 a
// pair) and scaled by d * 2^(s - 128) in f32. Against the f32-exact kernel that is x's
// rounding (at most d / 2 an element) and nothing else; about 3x fewer instructions a block.
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace linnet_avx2 {
void quantize_blocks(const float* x, int64_t blocks, int8_t* q, float* d);  // packed_int8_avx2.cpp
}

namespace {

constexpr int64_t kBlock = 32;
constexpr int kRowsPerTile = 4;
constexpr int64_t kAhead = 1024;  // prefetch distance along a row's blocks, in bytes

alignas(32) constexpr int8_t kDoubled[32] = {
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(s - 128) for each scale byte: doubled code times this is the reference's value
// (255 gives +inf, as the reference's weights are +-inf there).
const std::array<float, 256>& half_scales() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int s = 0; s < 255; ++s) t[s] = std::ldexp(1.0f, s - 128);
    t[255] = std::numeric_limits<float>::infinity();
    return t;
  }();
  return table;
}

struct Int8Problem {
  const int8_t* xq;  // (batch, groups, 32): each block's even elements, then its odd ones
  const float* xd;   // (batch, groups)
  const uint8_t* blocks;
  const uint8_t* scales;
  const float* half;  // half_scales()
  float* y;           // (batch, rows)
  int64_t batch, rows, groups;
};

// The 8 lanes' sum in three rounds of pairs (once an output row: no need for shuffles).
inline float lane_sum(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

template <int R, int B>
void int8_tile(const Int8Problem& p, int64_t r0, int64_t b0) {
  __m256 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm256_setzero_ps();
  const __m256i doubled = _mm256_load_si256((const __m256i*)kDoubled);
  const __m256i nibble = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < p.groups; ++g) {
    __m256i xq[B], xa[B];
    for (int b = 0; b < B; ++b) {
      xq[b] = _mm256_loadu_si256((const __m256i*)(p.xq + ((b0 + b) * p.groups + g) * kBlock));
      xa[b] = _mm256_sign_epi8(xq[b], xq[b]);  // |q|, read as u8
    }
    for (int r = 0; r < R; ++r) {
      const int64_t at = (r0 + r) * p.groups + g;
      if ((g & 3) == 0) __builtin_prefetch(p.blocks + at * 16 + kAhead);  // once a cache line
      const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(p.blocks + at * 16)));
      // low lane: the even codes (low nibbles), high lane: the odd ones
      const __m256i c = _mm256_and_si256(_mm256_blend_epi32(bytes, _mm256_srli_epi16(bytes, 4), 0xF0), nibble);
      const __m256i w = _mm256_shuffle_epi8(doubled, c);
      const float ws = p.half[p.scales[at]];
      for (int b = 0; b < B; ++b) {
        const __m256i pairs = _mm256_maddubs_epi16(xa[b], _mm256_sign_epi8(w, xq[b]));
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
        const float sd = ws * p.xd[(b0 + b) * p.groups + g];
        acc[r][b] = _mm256_fmadd_ps(dot, _mm256_set1_ps(sd), acc[r][b]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) p.y[(b0 + b) * p.rows + r0 + r] = lane_sum(acc[r][b]);
}

template <int R>
void int8_rows(const Int8Problem& p, int64_t r0) {
  int64_t b0 = 0;
  for (; b0 + 2 <= p.batch; b0 += 2) int8_tile<R, 2>(p, r0, b0);
  if (b0 < p.batch) int8_tile<R, 1>(p, r0, b0);
}

}  // namespace

namespace linnet_mxfp4 {

// y (batch, rows) = round8(x) @ w^T for one expert's packed rows (layout as mxfp4_gemv.cpp);
// true: done; false where this build has no AVX2 (the caller runs the f32-exact kernel).
bool mxfp4_gemm_int8(const float* x, const uint8_t* blocks, const uint8_t* scales, float* y,
                     int64_t batch, int64_t rows, int64_t groups) {
  std::vector<float> split(batch * groups * kBlock);
  for (int64_t bg = 0; bg < batch * groups; ++bg)
    for (int64_t j = 0; j < 16; ++j) {
      split[bg * kBlock + j] = x[bg * kBlock + 2 * j];
      split[bg * kBlock + 16 + j] = x[bg * kBlock + 2 * j + 1];
    }
  std::vector<int8_t> q(split.size());
  std::vector<float> d(batch * groups);
  linnet_avx2::quantize_blocks(split.data(), batch * groups, q.data(), d.data());
  const Int8Problem p{q.data(), d.data(), blocks, scales, half_scales().data(), y, batch, rows, groups};
  const int64_t tiles = rows / kRowsPerTile;
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / (kRowsPerTile * groups * 17));
  at::parallel_for(0, tiles, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) int8_rows<kRowsPerTile>(p, t * kRowsPerTile);
  });
  for (int64_t r = tiles * kRowsPerTile; r < rows; ++r) int8_rows<1>(p, r);
  return true;
}

}  // namespace linnet_mxfp4

#else

namespace linnet_mxfp4 {
bool mxfp4_gemm_int8(const float*, const uint8_t*, const uint8_t*, float*, int64_t, int64_t, int64_t) {
  return false;
}
}  // namespace linnet_mxfp4

#endif
