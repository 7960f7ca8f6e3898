// MXFP4 rows against x rounded to int8 (numerics="fast" only; mxfp4_gemv.cpp's
// mxfp4_moe_routed calls it): llama.cpp's scheme for MXFP4 weights and q8_0 activations.
// x is rounded per 32-block exactly as packed_int8_avx2.cpp rounds it (d = amax / 127,
// ties to even); each code becomes its e2m1 value doubled, an int8 (0, 1, 2, 3, 4, 6, 8, 12
// and their negatives) by one byte shuffle; a block's 32 products are summed exactly in
// int32 (vpmaddubsw with the sign trick: |q| * sign-moved code, at most 2 * 127 * 12 a
// pair) and scaled by d * 2^(s - 128) in f32. Against the f32-exact kernel that is x's
// rounding (at most d / 2 an element) and nothing else; about 3x fewer instructions a block.
// On AVX512-VNNI CPUs four blocks go at a time (one 64-byte load of codes): each nibble
// half looked up as doubled value + 12 (0..24, unsigned) and vpdpbusd against x, whose int32
// lanes start at -12 times their eight q (the sums stay exact, as packed_vnni.cpp does for
// q8_0's flipped codes); four rows' sums leave in one pass.
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
// Four blocks a step: one 64-byte load of a row's codes (blocks g..g+3, 16 bytes each). Its
// low nibbles are the four blocks' even elements, its high nibbles their odd ones; each half
// is looked up as doubled value + 12 (0..24, unsigned) by one byte shuffle, and both go
// through vpdpbusd into the same int32 lanes against x's even and odd codes: lanes 4j..4j+3
// are block g + j's. A last quad of 1-3 blocks reads only its own codes; x is zero past it.
alignas(16) constexpr uint8_t kShifted[16] = {12, 13, 14, 15, 16, 18, 20, 24,
                                              12, 11, 10, 9,  8,  6,  4,  0};
// The VNNI kernel's prefetch distance along a row's blocks, in bytes (as packed_vnni.cpp's)
constexpr int64_t kVnniAhead = 2048;

struct QuadX {
  std::vector<int8_t> q;      // (batch, quads, 128): the quad's 64 even codes, then its 64 odd
  std::vector<float> d;       // (batch, 4 quads): each block's scale, 0 past the last block
  std::vector<int32_t> bias;  // (batch, quads, 16): -12 times each lane's 4 even and 4 odd q
  int64_t quads;
};

// x's blocks, already split and rounded (q: each block's 16 even then 16 odd), as quads.
QuadX quad_x(const std::vector<int8_t>& q, const std::vector<float>& d, int64_t batch, int64_t groups) {
  const int64_t quads = (groups + 3) / 4;
  QuadX out{std::vector<int8_t>(batch * quads * 128, 0), std::vector<float>(batch * quads * 4, 0.0f),
            std::vector<int32_t>(batch * quads * 16), quads};
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t g = 0; g < groups; ++g) {
      const int8_t* src = q.data() + (b * groups + g) * kBlock;
      int8_t* dst = out.q.data() + (b * quads + g / 4) * 128 + (g % 4) * 16;
      std::memcpy(dst, src, 16);            // even elements
      std::memcpy(dst + 64, src + 16, 16);  // odd elements
      out.d[b * quads * 4 + g] = d[b * groups + g];
    }
  for (int64_t l = 0; l < batch * quads * 16; ++l) {
    const int8_t* even = out.q.data() + (l / 16) * 128 + (l % 16) * 4;
    out.bias[l] = -12 * (even[0] + even[1] + even[2] + even[3] + even[64] + even[65] + even[66] + even[67]);
  }
  return out;
}

struct VnniProblem {
  const QuadX* x;
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

// The four rows' sums of their 16 lanes at y[0], y[stride], y[2 stride], y[3 stride]: the
// lanes folded in halves across rows (two vectors' 256-bit halves, then 128-bit quarters),
// then within each 128-bit quarter; one pass instead of four horizontal reductions.
inline void store_sums4(const __m512 a[4], float* y, int64_t stride) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a[0], a[1], 0x44), _mm512_shuffle_f32x4(a[0], a[1], 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(a[2], a[3], 0x44), _mm512_shuffle_f32x4(a[2], a[3], 0xEE));
  // quarters: a, b, c, d (each the sum of its row's four quarters)
  const __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  const __m512 u = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));  // lanes + lanes two over
  const __m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, 0xB1));  // + the neighbour lane
  alignas(64) float l[16];
  _mm512_store_ps(l, v);
  for (int r = 0; r < 4; ++r) y[r * stride] = l[4 * r];
}

// Rows r0..r0+R against x rows b0..b0+B: 16 blocks' scales at a time (times x's block
// scales), then 4 quads of blocks, each quad's lanes given their block's product.
template <int R, int B>
void vnni_tile(const VnniProblem& p, int64_t r0, int64_t b0) {
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  const __m512i lut = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i*)kShifted));
  const __m512i nibble = _mm512_set1_epi8(15);
  const __m512i first = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const int64_t quads = p.x->quads;
  for (int64_t g0 = 0; g0 < p.groups; g0 += 16) {
    const int64_t n = std::min<int64_t>(16, p.groups - g0);
    const __mmask16 lanes = (__mmask16)((1u << n) - 1);
    __m512 s[R][B];  // scale[r, g] * d_x[b, g] for these 16 blocks
    for (int r = 0; r < R; ++r) {
      const __m512 ws = half_scales16(lanes, p.scales + (r0 + r) * p.groups + g0);
      for (int b = 0; b < B; ++b)
        s[r][b] = _mm512_mul_ps(ws, _mm512_maskz_loadu_ps(lanes, p.x->d.data() + (b0 + b) * quads * 4 + g0));
    }
    for (int64_t j = 0; j < n; j += 4) {
      const int64_t g = g0 + j, qd = g / 4;
      const __mmask64 codes = n - j >= 4 ? ~0ull : (1ull << (16 * (n - j))) - 1;
      const __m512i idx = _mm512_add_epi32(first, _mm512_set1_epi32(int(j)));
      __m512i xe[B], xo[B], xb[B];
      for (int b = 0; b < B; ++b) {
        const int64_t at = (b0 + b) * quads + qd;
        xe[b] = _mm512_loadu_si512(p.x->q.data() + at * 128);
        xo[b] = _mm512_loadu_si512(p.x->q.data() + at * 128 + 64);
        xb[b] = _mm512_loadu_si512(p.x->bias.data() + at * 16);
      }
      for (int r = 0; r < R; ++r) {
        const uint8_t* at = p.blocks + ((r0 + r) * p.groups + g) * 16;
        __builtin_prefetch(at + kVnniAhead);
        const __m512i raw = _mm512_maskz_loadu_epi8(codes, at);
        const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(raw, nibble));
        const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble));
        for (int b = 0; b < B; ++b) {
          const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(xb[b], lo, xe[b]), hi, xo[b]);
          acc[r][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(idx, s[r][b]), acc[r][b]);
        }
      }
    }
  }
  for (int b = 0; b < B; ++b) {
    float* y = p.y + (b0 + b) * p.rows + r0;
    if constexpr (R == 4) {
      const __m512 rows[4] = {acc[0][b], acc[1][b], acc[2][b], acc[3][b]};
      store_sums4(rows, y, 1);
    } else {
      for (int r = 0; r < R; ++r) y[r] = _mm512_reduce_add_ps(acc[r][b]);
    }
  }
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
  const QuadX quads = quad_x(q, d, batch, groups);
  const VnniProblem p{&quads, blocks, scales, y, batch, rows, groups};
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
