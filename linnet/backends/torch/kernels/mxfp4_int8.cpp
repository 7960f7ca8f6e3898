// MXFP4 rows against x rounded to int8 (numerics="fast" only; mxfp4_gemv.cpp's
// mxfp4_moe_routed calls it): llama.cpp's scheme for MXFP4 weights and q8_0 activations.
// x is rounded per 32-block exactly as packed_int8_avx2.cpp rounds it (d = amax / 127,
// ties to even); each code becomes its e2m1 value doubled, an int8 (0, 1, 2, 3, 4, 6, 8, 12
// and their negatives) by one byte shuffle; a block's 32 products are summed exactly in
// int32 (vpmaddubsw with the sign trick: |q| * sign-moved code, at most 2 * 127 * 12 a
// pair) and scaled by d * 2^(s - 128) in f32. Against the f32-exact kernel that is x's
// rounding (at most d / 2 an element) and nothing else; about 3x fewer instructions a block.
// On AVX512-VNNI CPUs two blocks go at a time: 64 codes looked up as doubled value + 12
// (0..24, unsigned) and vpdpbusd against x, whose int32 lanes start at -12 times their four
// q (the sums stay exact, as packed_vnni.cpp does for q8_0's flipped codes).
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
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

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define LINNET_MXFP4_VNNI 1
// Two blocks a step. A pair's 64 x bytes: block g's even elements, g + 1's even, g's odd,
// g + 1's odd (so the codes' low nibbles of both blocks, then their high nibbles, meet them);
// int32 lanes 0-3 and 8-11 are block g's, 4-7 and 12-15 block g + 1's. An odd block count
// pads the last pair with zero x (its codes read as zero bytes: 0 products).
alignas(16) constexpr uint8_t kShifted[16] = {12, 13, 14, 15, 16, 18, 20, 24,
                                              12, 11, 10, 9,  8,  6,  4,  0};
// The VNNI kernel's prefetch distance along a row's blocks, in bytes (as packed_vnni.cpp's)
constexpr int64_t kVnniAhead = 2048;

struct PairX {
  std::vector<int8_t> q;      // (batch, pairs, 64) in the order above
  std::vector<float> d;       // (batch, 2 pairs): each block's scale, 0 for the pad
  std::vector<int32_t> bias;  // (batch, pairs, 16): -12 times each lane's four q
  int64_t pairs;
};

// x's blocks, already split and rounded (q: each block's 16 even then 16 odd), as pairs.
PairX pair_x(const std::vector<int8_t>& q, const std::vector<float>& d, int64_t batch, int64_t groups) {
  const int64_t pairs = (groups + 1) / 2;
  PairX out{std::vector<int8_t>(batch * pairs * 64, 0), std::vector<float>(batch * pairs * 2, 0.0f),
            std::vector<int32_t>(batch * pairs * 16), pairs};
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t g = 0; g < groups; ++g) {
      const int8_t* src = q.data() + (b * groups + g) * kBlock;
      int8_t* dst = out.q.data() + (b * pairs + g / 2) * 64 + (g % 2) * 16;
      std::memcpy(dst, src, 16);            // even elements
      std::memcpy(dst + 32, src + 16, 16);  // odd elements
      out.d[b * pairs * 2 + g] = d[b * groups + g];
    }
  for (int64_t l = 0; l < batch * pairs * 16; ++l) {
    const int8_t* v = out.q.data() + 4 * l;
    out.bias[l] = -12 * (v[0] + v[1] + v[2] + v[3]);
  }
  return out;
}

struct VnniProblem {
  const PairX* x;
  const uint8_t* blocks;
  const uint8_t* scales;
  float* y;
  int64_t batch, rows, groups;
};

// 2^(s - 128) for 16 scale bytes (as half_scales(): 255 is +inf; 0 the subnormal 2^-128)
inline __m512 half_scales16(__mmask16 lanes, const uint8_t* s) {
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(lanes, s));
  const __m512 pow = _mm512_scalef_ps(_mm512_set1_ps(1.0f), _mm512_cvtepi32_ps(_mm512_sub_epi32(bytes, _mm512_set1_epi32(128))));
  const __mmask16 inf = _mm512_cmpeq_epi32_mask(bytes, _mm512_set1_epi32(255));
  return _mm512_mask_mov_ps(pow, inf, _mm512_set1_ps(std::numeric_limits<float>::infinity()));
}

// Rows r0..r0+R against x rows b0..b0+B: 16 blocks' scales at a time (times x's block
// scales), then 8 pairs of blocks, each pair's lanes given their block's product.
template <int R, int B>
void vnni_tile(const VnniProblem& p, int64_t r0, int64_t b0) {
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  const __m512i lut = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i*)kShifted));
  const __m512i nibble = _mm512_set1_epi8(15);
  const __m512i shifts = _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0);  // high half: the high nibbles
  // lanes 0-3 and 8-11: a pair's first block; 4-7 and 12-15: its second
  const __m512i first = _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
  const int64_t pairs = p.x->pairs;
  for (int64_t g0 = 0; g0 < p.groups; g0 += 16) {
    const int64_t n = std::min<int64_t>(16, p.groups - g0);
    const __mmask16 lanes = (__mmask16)((1u << n) - 1);
    __m512 s[R][B];  // scale[r, g] * d_x[b, g] for these 16 blocks
    for (int r = 0; r < R; ++r) {
      const __m512 ws = half_scales16(lanes, p.scales + (r0 + r) * p.groups + g0);
      for (int b = 0; b < B; ++b)
        s[r][b] = _mm512_mul_ps(ws, _mm512_maskz_loadu_ps(lanes, p.x->d.data() + (b0 + b) * pairs * 2 + g0));
    }
    for (int64_t j = 0; j < n; j += 2) {
      const int64_t g = g0 + j, pr = g / 2;
      const bool two = j + 1 < n;
      const __m512i idx = _mm512_add_epi32(first, _mm512_set1_epi32(int(j)));
      __m512i xq[B], xb[B];
      for (int b = 0; b < B; ++b) {
        const int64_t at = (b0 + b) * pairs + pr;
        xq[b] = _mm512_loadu_si512(p.x->q.data() + at * 64);
        xb[b] = _mm512_loadu_si512(p.x->bias.data() + at * 16);
      }
      for (int r = 0; r < R; ++r) {
        const uint8_t* at = p.blocks + ((r0 + r) * p.groups + g) * 16;
        __builtin_prefetch(at + kVnniAhead);
        const __m512i raw = two ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)at))
                                : _mm512_broadcast_i64x4(_mm256_maskz_loadu_epi8(0xFFFFu, at));
        const __m512i w = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srlv_epi64(raw, shifts), nibble));
        for (int b = 0; b < B; ++b) {
          const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(xb[b], w, xq[b]));
          acc[r][b] = _mm512_fmadd_ps(dot, _mm512_permutexvar_ps(idx, s[r][b]), acc[r][b]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) p.y[(b0 + b) * p.rows + r0 + r] = _mm512_reduce_add_ps(acc[r][b]);
}

template <int R>
void vnni_rows(const VnniProblem& p, int64_t r0) {
  int64_t b0 = 0;
  for (; b0 + 2 <= p.batch; b0 += 2) vnni_tile<R, 2>(p, r0, b0);
  if (b0 < p.batch) vnni_tile<R, 1>(p, r0, b0);
}
#endif

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
  const int64_t tiles = rows / kRowsPerTile;
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / (kRowsPerTile * groups * 17));
#if LINNET_MXFP4_VNNI
  const PairX pairs = pair_x(q, d, batch, groups);
  const VnniProblem p{&pairs, blocks, scales, y, batch, rows, groups};
  at::parallel_for(0, tiles, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) vnni_rows<kRowsPerTile>(p, t * kRowsPerTile);
  });
  for (int64_t r = tiles * kRowsPerTile; r < rows; ++r) vnni_rows<1>(p, r);
#else
  const Int8Problem p{q.data(), d.data(), blocks, scales, half_scales().data(), y, batch, rows, groups};
  at::parallel_for(0, tiles, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) int8_rows<kRowsPerTile>(p, t * kRowsPerTile);
  });
  for (int64_t r = tiles * kRowsPerTile; r < rows; ++r) int8_rows<1>(p, r);
#endif
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
