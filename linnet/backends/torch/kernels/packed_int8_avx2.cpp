// packed_vnni.cpp's integer kernel (numerics="fast") for x86 CPUs with AVX2 and FMA but
// not AVX512-VNNI: the same rounding of x (per 32-block, d = amax / 127, q = round(x / d)
// ties to even) and the same exact integer block sums, so the same result up to f32
// summation order. Products come from vpmaddubsw (u8 x s8, pairs summed in int16), which
// saturates only past 32767: q8_0 takes ggml's sign trick (|q_x| times code * sign(q_x):
// at most 2 * 127 * 128), 4-bit codes are unsigned already (at most 2 * 15 * 127).
// Then vpmaddwd against ones sums pairs into int32, exactly. Layouts as in packed_gemv.cpp;
// 4-bit rows need whole 64-blocks (each half of a row whole 32-blocks).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "stream_ahead.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace linnet_avx2 {
namespace {

constexpr int64_t kGroup = 32;
constexpr int kRows = 4;  // output rows per tile: each block of x loaded once for them all
// Prefetch distance in bytes along a tile's codes (its rows lie end to end, one stream):
// 2 KB streams q8_0 at ~15 GB/s on the AVX2 EPYC where 512 bytes per row gave ~9.
constexpr int64_t kAhead = 2048;

struct Quantized {          // batch rows of x, each quantized per 32-block
  std::vector<int8_t> q;    // (batch, cols)
  std::vector<float> d;     // (batch, groups): the block's scale
  std::vector<float> sums;  // (batch, groups): d * sum of the block's q (4-bit offsets)
};

inline float hsum(__m256 s) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

inline float hmax(__m256 s) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

// One 32-block of x: q = round(x / d) to nearest even (MXCSR's default, as the VNNI kernel
// rounds), d = amax / 127; returns d and writes the 32 codes in x's order; *sum gets d times
// the codes' sum (the 4-bit offsets' term).
inline float quantize_block(const float* v, int8_t* codes, float* sum_out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 a[4], m = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    a[j] = _mm256_loadu_ps(v + 8 * j);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, a[j]));
  }
  const float d = hmax(m) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  __m256i q[4];
  for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(a[j], _mm256_set1_ps(id)));
  const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  // packs interleave 128-bit lanes: the permute puts the 32 bytes back in order
  const __m256i w = _mm256_packs_epi32(q[0], q[1]), z = _mm256_packs_epi32(q[2], q[3]);
  const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w, z),
                                                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256((__m256i*)codes, b);
  *sum_out = d * hsum(_mm256_cvtepi32_ps(sum));
  return d;
}

Quantized quantize_x(const float* x, int64_t batch, int64_t cols) {
  const int64_t groups = cols / kGroup;
  Quantized out{std::vector<int8_t>(batch * cols), std::vector<float>(batch * groups),
                std::vector<float>(batch * groups)};
  for (int64_t i = 0; i < batch * groups; ++i)
    out.d[i] = quantize_block(x + i * kGroup, out.q.data() + i * kGroup, &out.sums[i]);
  return out;
}

struct Problem {
  const void* codes;
  const float* scale;   // (rows, groups)
  const float* offset;  // (rows, groups); 4-bit codes without it: q4_0, offset = -8 * scale
  float* y;             // (batch, rows)
  int64_t batch, rows, cols;
};

// 32 u8 x s8 products summed to 8 int32 lanes, as f32 (exact: |sum| < 2^24). Where the
// CPU has AVX512-VNNI (an AMD one runs this kernel, cpu_tuning.h), vpdpbusd on 256 bits
// sums the four products of each lane in one instruction: the same exact int32 sums as
// vpmaddubsw's pairs (never saturated, see the top) then vpmaddwd's.
inline __m256 dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s));
#else
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

// sum of a[i] * b[i] in f32, eight lanes then a tail
inline float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 s = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s);
  float t = hsum(s);
  for (; i < n; ++i) t += a[i] * b[i];
  return t;
}

template <int R, int B>
void q8_tile(const Problem& p, const Quantized& x, int64_t r0, int64_t b0) {
  __m256 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm256_setzero_ps();
  const int64_t groups = p.cols / kGroup;
  const int8_t* codes = static_cast<const int8_t*>(p.codes);
#pragma GCC unroll 2
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k = g * kGroup;
    __m256i xq[B], xa[B];
    for (int b = 0; b < B; ++b) {
      xq[b] = _mm256_loadu_si256((const __m256i*)(x.q.data() + (b0 + b) * p.cols + k));
      xa[b] = _mm256_sign_epi8(xq[b], xq[b]);  // |q|: at most 127, read as u8
    }
    // the tile's rows lie end to end: prefetch its byte stream kAhead ahead
    const int8_t* ahead = codes + r0 * p.cols + g * R * kGroup + kAhead;
    for (int j = 0; j < R * kGroup; j += 64) __builtin_prefetch(ahead + j);
    for (int r = 0; r < R; ++r) {
      const int8_t* row = codes + (r0 + r) * p.cols;
      const __m256i w = _mm256_loadu_si256((const __m256i*)(row + k));
      const float s = p.scale[(r0 + r) * groups + g];
      for (int b = 0; b < B; ++b) {
        const __m256 dot = dot_u8s8(xa[b], _mm256_sign_epi8(w, xq[b]));
        const float sd = s * x.d[(b0 + b) * groups + g];
        acc[r][b] = _mm256_fmadd_ps(dot, _mm256_set1_ps(sd), acc[r][b]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) p.y[(b0 + b) * p.rows + r0 + r] = hsum(acc[r][b]);
}

// 32 bits (element i in bit i) as 32 bytes: 16 where the bit is set, else 0 (q5_0's
// fifth bits, added to the nibbles). Each byte picks its bit's byte, then tests its bit.
inline __m256i fifth_bits(const uint8_t* at) {
  uint32_t bits;
  std::memcpy(&bits, at, 4);
  const __m256i word = _mm256_set1_epi32(int(bits));  // shuffles stay in 128-bit lanes:
  const __m256i spread = _mm256_shuffle_epi8(            // both lanes hold the word
      word, _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                             2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i select = _mm256_set1_epi64x(0x8040201008040201LL);  // byte k: bit k % 8
  const __m256i hit = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
  return _mm256_and_si256(hit, _mm256_set1_epi8(16));
}

// 4-bit codes: 32 bytes hold a block of the row's first half (low nibbles) and the
// block at the same place in its second half (high nibbles). Five: q5_0, each row's
// nibbles followed by its fifth bits (cols / 8 bytes in element order), codes 0..31.
template <int R, int B, bool Five>
void q4_tile(const Problem& p, const Quantized& x, int64_t r0, int64_t b0) {
  __m256 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm256_setzero_ps();
  const int64_t groups = p.cols / kGroup, half = p.cols / 2, hg = groups / 2;
  const int64_t stride = Five ? half + p.cols / 8 : half;  // bytes a row
  const uint8_t* codes = static_cast<const uint8_t*>(p.codes);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 2
  for (int64_t g = 0; g < hg; ++g) {
    const int64_t k = g * kGroup;
    __m256i xl[B], xh[B];
    for (int b = 0; b < B; ++b) {
      xl[b] = _mm256_loadu_si256((const __m256i*)(x.q.data() + (b0 + b) * p.cols + k));
      xh[b] = _mm256_loadu_si256((const __m256i*)(x.q.data() + (b0 + b) * p.cols + half + k));
    }
    const uint8_t* ahead = codes + r0 * stride + g * R * kGroup + kAhead;
    for (int j = 0; j < R * kGroup; j += 64) __builtin_prefetch(ahead + j);
    for (int r = 0; r < R; ++r) {
      const uint8_t* row = codes + (r0 + r) * stride;
      const __m256i c = _mm256_loadu_si256((const __m256i*)(row + k));
      __m256i lo = _mm256_and_si256(c, nibble);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), nibble);
      if (Five) {  // elements k.. and half + k.. have their bits at bytes k / 8, (half + k) / 8
        lo = _mm256_or_si256(lo, fifth_bits(row + half + k / 8));
        hi = _mm256_or_si256(hi, fifth_bits(row + half + (half + k) / 8));
      }
      const float* s = p.scale + (r0 + r) * groups;
      for (int b = 0; b < B; ++b) {
        const float* d = x.d.data() + (b0 + b) * groups;
        acc[r][b] = _mm256_fmadd_ps(dot_u8s8(lo, xl[b]), _mm256_set1_ps(s[g] * d[g]), acc[r][b]);
        acc[r][b] = _mm256_fmadd_ps(dot_u8s8(hi, xh[b]), _mm256_set1_ps(s[g + hg] * d[g + hg]),
                                    acc[r][b]);
      }
    }
  }
  for (int r = 0; r < R; ++r)  // the offsets meet x's block sums once per row, not per block
    for (int b = 0; b < B; ++b) {
      const float* sums = x.sums.data() + (b0 + b) * groups;
      // q4_0 / q5_0 (no offsets): each offset is -8 / -16 times the scale, so the term is
      // that times the scales' dot product, exactly (a power of two): offsets never read
      const float terms = p.offset != nullptr ? dot_f32(p.offset + (r0 + r) * groups, sums, groups)
                                              : (Five ? -16.0f : -8.0f) *
                                                    dot_f32(p.scale + (r0 + r) * groups, sums, groups);
      p.y[(b0 + b) * p.rows + r0 + r] = hsum(acc[r][b]) + terms;
    }
}

template <int R, int B>
struct Q8 {
  static void run(const Problem& p, const Quantized& x, int64_t r0, int64_t b0) {
    q8_tile<R, B>(p, x, r0, b0);
  }
};
template <int R, int B>
struct Q4 {
  static void run(const Problem& p, const Quantized& x, int64_t r0, int64_t b0) {
    q4_tile<R, B, false>(p, x, r0, b0);
  }
};
template <int R, int B>
struct Q5 {
  static void run(const Problem& p, const Quantized& x, int64_t r0, int64_t b0) {
    q4_tile<R, B, true>(p, x, r0, b0);
  }
};

// x rows two at a time (more would spill the tile's registers).
template <template <int, int> class Tile, int R>
void batch_tiles(const Problem& p, const Quantized& x, int64_t r0) {
  int64_t b0 = 0;
  for (; b0 + 2 <= p.batch; b0 += 2) Tile<R, 2>::run(p, x, r0, b0);
  if (b0 < p.batch) Tile<R, 1>::run(p, x, r0, b0);
}

template <template <int, int> class Tile>
void run_rows(const Problem& p, const Quantized& x) {
  const int64_t tiles = p.rows / kRows;
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / (kRows * p.cols));
  linnet::parallel_rows(0, tiles, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) batch_tiles<Tile, kRows>(p, x, t * kRows);
  });
  for (int64_t r = tiles * kRows; r < p.rows; ++r) batch_tiles<Tile, 1>(p, x, r);
}

}  // namespace

// Called by packed_vnni.cpp's op after its checks: x (batch, cols) f32 contiguous;
// code_bits 8 (q8_0), 4 or 5 (q5_0, no offsets). 4-bit codes with a null offset are q4_0's
// (offsets -8 * scale: 20 bytes read a block, not 24); q5_0 reads 24 (36 as q8_0).
void packed_linear_int8x(const float* x, const void* codes, const float* scale,
                         const float* offset, float* y, int64_t batch, int64_t rows,
                         int64_t cols, int code_bits) {
  const Quantized xq = quantize_x(x, batch, cols);
  const Problem p{codes, scale, offset, y, batch, rows, cols};
  if (code_bits == 5)
    run_rows<Q5>(p, xq);
  else if (code_bits == 4)
    run_rows<Q4>(p, xq);
  else
    run_rows<Q8>(p, xq);
}

// x's `blocks` 32-blocks rounded as above (mxfp4_gemv.cpp's int8 path): q (blocks * 32), d.
void quantize_blocks(const float* x, int64_t blocks, int8_t* q, float* d) {
  float unused;
  for (int64_t i = 0; i < blocks; ++i) d[i] = quantize_block(x + i * kGroup, q + i * kGroup, &unused);
}

}  // namespace linnet_avx2
#endif
