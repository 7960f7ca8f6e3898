// MXFP4 linears for small batches (a decode step's chosen experts): one pass over the packed
// blocks, both cores (at::parallel_for over tiles of output rows); AVX-512, AVX2 + FMA or
// portable loops, whichever the build's -march=native allows.
//
//   y[b, r] = sum_k x[b, k] * w[r, k],   w[r, 32 g + i] = table[scale[r, g]][code i of block g]
//
// Layout as GPT-OSS checkpoints store it (linnet/weights/mxfp4.py): blocks uint8
// (rows, groups, 16), byte j holding code 2j in its low nibble and code 2j + 1 in its high
// one; scales uint8 (rows, groups), e8m0. `table` (256, 16) f32 holds every scale byte's
// 16 values E2M1[c] * 2^(s - 127) exactly as the reference dequantizer gives them (made by
// the caller with numpy's ldexp, so the subnormal scales and the infinities of 255 agree),
// so each weight is the reference's bit for bit; products and sums are f32, in another
// order. x is reordered once per call (split_x), so a block's low nibbles meet the even x
// and its high nibbles the odd, in the order the tiles read them.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#define LINNET_MXFP4_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LINNET_MXFP4_AVX2 1
#endif

namespace linnet_mxfp4 {  // mxfp4_int8.cpp
bool mxfp4_gemm_int8(const float* x, const uint8_t* blocks, const uint8_t* scales, float* y,
                     int64_t batch, int64_t rows, int64_t groups);

inline float dot_f32(const float* a, const float* b, int64_t n) {  // the router's logits
  float acc[16] = {};  // independent partial sums: the compiler vectorises them
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0.0f;
  for (int j = 0; j < 16; ++j) s += acc[j];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}
}  // namespace linnet_mxfp4

namespace {

constexpr int64_t kBlock = 32;
constexpr int kRowsPerTile = 4;

struct Mxfp4Problem {
  const float* xs;  // (batch, groups, 32): each block's x in the order of split_x
  const uint8_t* blocks;
  const uint8_t* scales;
  const float* table;
  float* y;  // (batch, rows)
  int64_t batch, rows, groups;
};

#if LINNET_MXFP4_AVX512
// Rows r0..r0+R of y for x rows b0..b0+B.
template <int R, int B>
void mxfp4_tile(const Mxfp4Problem& p, int64_t r0, int64_t b0) {
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi32(15);
  for (int64_t g = 0; g < p.groups; ++g) {
    __m512 x_even[B], x_odd[B];
    for (int b = 0; b < B; ++b) {
      const float* xb = p.xs + ((b0 + b) * p.groups + g) * kBlock;
      x_even[b] = _mm512_loadu_ps(xb);
      x_odd[b] = _mm512_loadu_ps(xb + 16);
    }
    for (int r = 0; r < R; ++r) {
      const int64_t at = (r0 + r) * p.groups + g;
      const __m512 values = _mm512_loadu_ps(p.table + 16 * int64_t(p.scales[at]));
      __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p.blocks + at * 16)));
      __m512 w_even = _mm512_permutexvar_ps(_mm512_and_si512(c, low), values);
      __m512 w_odd = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), values);
      for (int b = 0; b < B; ++b)
        acc[r][b] = _mm512_fmadd_ps(w_odd, x_odd[b], _mm512_fmadd_ps(w_even, x_even[b], acc[r][b]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) p.y[(b0 + b) * p.rows + r0 + r] = _mm512_reduce_add_ps(acc[r][b]);
}
#elif LINNET_MXFP4_AVX2
// A block whose scale 2^(s - 127) keeps every value normal and finite (most; real
// checkpoints' scales lie near 127): its codes become e2m1 doubled (0, 1, 2, 3, 4, 6, 8, 12
// and their negatives), whose f32 bit patterns have only their top two bytes set; two byte
// shuffles look those bytes up and two rounds of unpacks place them in f32 lanes (no
// int-to-float conversion: 8 shuffles a block, 25% less time than widening int8 codes). The
// block's sum times 2^(s - 128) (exact: a power of two) joins the row's: the weights are the
// table's values, the sums f32 in another order. Other scales (the subnormals near 0, the
// infinities of 255) look each code up in the table row, as the reference dequantizer made it.
// Lane order (split_x): w[f] holds the even codes of bytes 4f..4f+3, then their odd codes.
constexpr int kScaleLo = 64, kScaleHi = 191;
// Top byte and second byte of the f32 e2m1-doubled value of codes 0-15, in both 128-bit lanes.
alignas(32) constexpr uint8_t kTopByte[32] = {
    0x00, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, 0x80, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0, 0xC1, 0xC1,
    0x00, 0x3F, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, 0x80, 0xBF, 0xC0, 0xC0, 0xC0, 0xC0, 0xC1, 0xC1};
alignas(32) constexpr uint8_t kSecondByte[32] = {
    0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40, 0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40,
    0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40, 0x00, 0x80, 0x00, 0x40, 0x80, 0xC0, 0x00, 0x40};

inline void doubled_block(const uint8_t* codes, __m256 w[4]) {
  const __m256i top = _mm256_load_si256((const __m256i*)kTopByte);
  const __m256i second = _mm256_load_si256((const __m256i*)kSecondByte);
  const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)codes));
  // low lane: the even codes (low nibbles), high lane: the odd ones
  const __m256i c = _mm256_and_si256(_mm256_blend_epi32(bytes, _mm256_srli_epi16(bytes, 4), 0xF0),
                                     _mm256_set1_epi8(15));
  const __m256i hi = _mm256_shuffle_epi8(top, c), mid = _mm256_shuffle_epi8(second, c);
  const __m256i lo8 = _mm256_unpacklo_epi8(mid, hi), hi8 = _mm256_unpackhi_epi8(mid, hi);
  const __m256i zero = _mm256_setzero_si256();
  w[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, lo8));
  w[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, lo8));
  w[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, hi8));
  w[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, hi8));
}

// The table's values of 8 codes: vpermps looks up 8 entries, so values 0-7 and 8-15 are
// each permuted and bit 3 (moved to the sign bit) picks one.
inline __m256 lookup8(__m256i c, __m256 lo, __m256 hi) {
  const __m256 pick = _mm256_castsi256_ps(_mm256_slli_epi32(c, 28));
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, c), _mm256_permutevar8x32_ps(hi, c), pick);
}

inline void table_block(const float* values, const uint8_t* codes, __m256 w[4]) {
  const __m256 lo = _mm256_loadu_ps(values), hi = _mm256_loadu_ps(values + 8);
  const __m256i shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4), low = _mm256_set1_epi32(15);
  for (int f = 0; f < 4; ++f) {
    int32_t quad;
    std::memcpy(&quad, codes + 4 * f, 4);
    const __m256i c = _mm256_cvtepu8_epi32(_mm_set1_epi32(quad));  // bytes 4f..4f+3, twice
    w[f] = lookup8(_mm256_and_si256(_mm256_srlv_epi32(c, shift), low), lo, hi);
  }
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <int R, int B>
void mxfp4_tile(const Mxfp4Problem& p, int64_t r0, int64_t b0) {
  __m256 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm256_setzero_ps();
  for (int64_t g = 0; g < p.groups; ++g) {
    for (int r = 0; r < R; ++r) {
      const int64_t at = (r0 + r) * p.groups + g;
      const int s = p.scales[at];
      const bool plain = s >= kScaleLo && s <= kScaleHi;
      __m256 w[4];
      if (plain) {
        doubled_block(p.blocks + at * 16, w);
      } else {
        table_block(p.table + 16 * int64_t(s), p.blocks + at * 16, w);
      }
      const __m256 scale = _mm256_castsi256_ps(_mm256_set1_epi32((s - 1) << 23));  // 2^(s - 128)
      for (int b = 0; b < B; ++b) {
        const float* xb = p.xs + ((b0 + b) * p.groups + g) * kBlock;
        // two chains: half the latency of one
        __m256 s0 = _mm256_mul_ps(w[0], _mm256_loadu_ps(xb));
        __m256 s1 = _mm256_mul_ps(w[2], _mm256_loadu_ps(xb + 16));
        s0 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), s0);
        s1 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), s1);
        const __m256 sum = _mm256_add_ps(s0, s1);
        acc[r][b] = plain ? _mm256_fmadd_ps(sum, scale, acc[r][b]) : _mm256_add_ps(sum, acc[r][b]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) p.y[(b0 + b) * p.rows + r0 + r] = hsum8(acc[r][b]);
}
#else
template <int R, int B>
void mxfp4_tile(const Mxfp4Problem& p, int64_t r0, int64_t b0) {
  float acc[R][B][16] = {};
  for (int64_t g = 0; g < p.groups; ++g) {
    for (int r = 0; r < R; ++r) {
      const int64_t at = (r0 + r) * p.groups + g;
      const float* values = p.table + 16 * int64_t(p.scales[at]);
      const uint8_t* codes = p.blocks + at * 16;
      for (int b = 0; b < B; ++b) {
        const float* xb = p.xs + ((b0 + b) * p.groups + g) * kBlock;
        for (int j = 0; j < 16; ++j) {
          acc[r][b][j] = __builtin_fmaf(values[codes[j] & 15], xb[j], acc[r][b][j]);
          acc[r][b][j] = __builtin_fmaf(values[codes[j] >> 4], xb[16 + j], acc[r][b][j]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) {
      float s = 0;
      for (int j = 0; j < 16; ++j) s += acc[r][b][j];
      p.y[(b0 + b) * p.rows + r0 + r] = s;
    }
}
#endif

template <int R>
void mxfp4_rows(const Mxfp4Problem& p, int64_t r0) {
  int64_t b0 = 0;
  for (; b0 + 4 <= p.batch; b0 += 4) mxfp4_tile<R, 4>(p, r0, b0);
  switch (p.batch - b0) {
    case 3: mxfp4_tile<R, 3>(p, r0, b0); break;
    case 2: mxfp4_tile<R, 2>(p, r0, b0); break;
    case 1: mxfp4_tile<R, 1>(p, r0, b0); break;
    default: break;
  }
}

// x (batch, groups * 32) -> (batch, groups, 32) in the order the tiles read a block's codes:
// AVX2, for each quarter f of the block's 16 bytes, the 4 even elements then the 4 odd ones;
// otherwise each block's 16 even elements, then its 16 odd.
std::vector<float> split_x(const float* x, int64_t batch, int64_t groups) {
  std::vector<float> out(batch * groups * kBlock);
  for (int64_t bg = 0; bg < batch * groups; ++bg)
    for (int64_t j = 0; j < 16; ++j)
      for (int64_t odd = 0; odd < 2; ++odd) {
#if LINNET_MXFP4_AVX2
        const int64_t at = (j / 4) * 8 + odd * 4 + j % 4;
#else
        const int64_t at = odd * 16 + j;
#endif
        out[bg * kBlock + at] = x[bg * kBlock + 2 * j + odd];
      }
  return out;
}

// y (batch, rows) = x @ w^T for one expert's packed rows; x (batch, groups * 32) f32.
void mxfp4_gemm(const float* x, const uint8_t* blocks, const uint8_t* scales, const float* table,
                float* y, int64_t batch, int64_t rows, int64_t groups) {
  std::vector<float> xs = split_x(x, batch, groups);
  Mxfp4Problem p{xs.data(), blocks, scales, table, y, batch, rows, groups};
  const int64_t tiles = rows / kRowsPerTile;
  // a tile reads kRowsPerTile rows of 17 bytes a block; keep parallel chunks at 64 KB or more
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / (kRowsPerTile * groups * 17));
  at::parallel_for(0, tiles, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) mxfp4_rows<kRowsPerTile>(p, t * kRowsPerTile);
  });
  for (int64_t r = tiles * kRowsPerTile; r < rows; ++r) mxfp4_rows<1>(p, r);
}

void check_packed(const at::Tensor& blocks, const at::Tensor& scales, int64_t lead) {
  TORCH_CHECK(blocks.dim() == lead + 3 && blocks.size(-1) == 16 && blocks.is_contiguous() &&
                  blocks.scalar_type() == at::kByte, "blocks (..., rows, groups, 16) uint8");
  TORCH_CHECK(scales.dim() == lead + 2 && scales.is_contiguous() && scales.scalar_type() == at::kByte &&
                  scales.size(-2) == blocks.size(-3) && scales.size(-1) == blocks.size(-2), "scales");
}

void check_table(const at::Tensor& table) {
  TORCH_CHECK(table.scalar_type() == at::kFloat && table.is_contiguous() && table.numel() == 256 * 16,
              "table (256, 16) f32");
}

at::Tensor mxfp4_linear(const at::Tensor& x, const at::Tensor& blocks, const at::Tensor& scales,
                        const at::Tensor& table) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x");
  check_packed(blocks, scales, 0);
  check_table(table);
  const int64_t rows = blocks.size(0), groups = blocks.size(1);
  TORCH_CHECK(x.size(1) == groups * kBlock, "x has ", x.size(1), " columns, the blocks ", groups * kBlock);
  at::Tensor y = at::empty({x.size(0), rows}, x.options());
  mxfp4_gemm(x.data_ptr<float>(), blocks.data_ptr<uint8_t>(), scales.data_ptr<uint8_t>(),
             table.data_ptr<float>(), y.data_ptr<float>(), x.size(0), rows, groups);
  return y;
}

// mxfp4_linear with x rounded to int8 per block (mxfp4_int8.cpp); AVX2 builds only.
at::Tensor mxfp4_linear_int8(const at::Tensor& x, const at::Tensor& blocks, const at::Tensor& scales) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x");
  check_packed(blocks, scales, 0);
  const int64_t rows = blocks.size(0), groups = blocks.size(1);
  TORCH_CHECK(x.size(1) == groups * kBlock, "x has ", x.size(1), " columns, the blocks ", groups * kBlock);
  at::Tensor y = at::empty({x.size(0), rows}, x.options());
  TORCH_CHECK(linnet_mxfp4::mxfp4_gemm_int8(x.data_ptr<float>(), blocks.data_ptr<uint8_t>(),
                                            scales.data_ptr<uint8_t>(), y.data_ptr<float>(), x.size(0),
                                            rows, groups),
              "this build has no AVX2: no int8 MXFP4 kernel");
  return y;
}

// GPT-OSS's clamped SwiGLU on h (2 * ffn: gate and up interleaved) into act (ffn), as
// `_clamped_swiglu` in the PyTorch prelude: (clamp(up, +-limit) + 1) * g * sigmoid(alpha g),
// g = min(gate, limit).
void clamped_swiglu(const float* h, float* act, int64_t ffn, float alpha, float limit) {
  for (int64_t i = 0; i < ffn; ++i) {
    const float gate = std::min(h[2 * i], limit);
    const float up = std::min(std::max(h[2 * i + 1], -limit), limit);
    act[i] = (up + 1.0f) * (gate * (1.0f / (1.0f + std::exp(-gate * alpha))));
  }
}

struct Experts {  // one moe layer's packed experts, checked by `experts_of`
  const uint8_t *in_blocks, *in_scales, *out_blocks, *out_scales;
  const float *in_bias, *out_bias, *table;
  int64_t count, dim, ffn, in_groups, out_groups;
  float alpha, limit;
};

Experts experts_of(const at::Tensor& x, const at::Tensor& in_blocks, const at::Tensor& in_scales,
                   const at::Tensor& in_bias, const at::Tensor& out_blocks, const at::Tensor& out_scales,
                   const at::Tensor& out_bias, const at::Tensor& table, double alpha, double limit) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x (tokens, dim) f32");
  check_packed(in_blocks, in_scales, 1);
  check_packed(out_blocks, out_scales, 1);
  check_table(table);
  const int64_t experts = in_blocks.size(0), two_ffn = in_blocks.size(1), dim = x.size(1);
  const int64_t ffn = two_ffn / 2, in_groups = in_blocks.size(2), out_groups = out_blocks.size(2);
  TORCH_CHECK(in_groups * kBlock == dim && out_blocks.size(0) == experts && out_blocks.size(1) == dim &&
                  out_groups * kBlock == ffn && two_ffn % 2 == 0, "expert shapes");
  TORCH_CHECK(in_bias.scalar_type() == at::kFloat && in_bias.is_contiguous() &&
                  in_bias.numel() == experts * two_ffn, "in_bias (experts, 2 * ffn) f32");
  TORCH_CHECK(out_bias.scalar_type() == at::kFloat && out_bias.is_contiguous() &&
                  out_bias.numel() == experts * dim, "out_bias (experts, dim) f32");
  return {in_blocks.data_ptr<uint8_t>(), in_scales.data_ptr<uint8_t>(), out_blocks.data_ptr<uint8_t>(),
          out_scales.data_ptr<uint8_t>(), in_bias.data_ptr<float>(), out_bias.data_ptr<float>(),
          table.data_ptr<float>(), experts, dim, ffn, in_groups, out_groups, float(alpha), float(limit)};
}

// x @ w^T for one expert's packed rows, f32-exact or (int8_x) with x rounded to int8.
void expert_gemm(bool int8_x, const float* x, const uint8_t* blocks, const uint8_t* scales,
                 const float* table, float* y, int64_t rows, int64_t groups) {
  if (!int8_x || !linnet_mxfp4::mxfp4_gemm_int8(x, blocks, scales, y, 1, rows, groups))
    mxfp4_gemm(x, blocks, scales, table, y, 1, rows, groups);
}

// y (tokens, dim) = for each token n, sum over j of gate[n, j] times expert idx[n, j] on x[n]:
// its two packed matmuls plus biases and its activation, summed in f32 in slot order.
at::Tensor experts_sum(const Experts& e, const at::Tensor& x, const int64_t* ids, const float* gates,
                       int64_t k, bool int8_x) {
  const int64_t dim = e.dim, two_ffn = 2 * e.ffn;
  at::Tensor y = at::zeros({x.size(0), dim}, x.options());
  std::vector<float> h(two_ffn), act(e.ffn), e_out(dim);
  const float* xp = x.data_ptr<float>();
  for (int64_t n = 0; n < x.size(0); ++n) {
    float* yn = y.data_ptr<float>() + n * dim;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t ex = ids[n * k + j];
      TORCH_CHECK(ex >= 0 && ex < e.count, "expert index ", ex, " out of range");
      expert_gemm(int8_x, xp + n * dim, e.in_blocks + ex * two_ffn * e.in_groups * 16,
                  e.in_scales + ex * two_ffn * e.in_groups, e.table, h.data(), two_ffn, e.in_groups);
      for (int64_t r = 0; r < two_ffn; ++r) h[r] += e.in_bias[ex * two_ffn + r];
      clamped_swiglu(h.data(), act.data(), e.ffn, e.alpha, e.limit);
      expert_gemm(int8_x, act.data(), e.out_blocks + ex * dim * e.out_groups * 16,
                  e.out_scales + ex * dim * e.out_groups, e.table, e_out.data(), dim, e.out_groups);
      const float g = gates[n * k + j];
      for (int64_t r = 0; r < dim; ++r) yn[r] += (e_out[r] + e.out_bias[ex * dim + r]) * g;
    }
  }
  return y;
}

// The moe op's expert half for a few tokens (a decode step): token n's experts idx[n, j]
// weighted by gate[n, j]. Reads only the chosen experts' blocks; no Python per expert.
at::Tensor mxfp4_moe(const at::Tensor& x, const at::Tensor& idx, const at::Tensor& gate,
                     const at::Tensor& in_blocks, const at::Tensor& in_scales, const at::Tensor& in_bias,
                     const at::Tensor& out_blocks, const at::Tensor& out_scales,
                     const at::Tensor& out_bias, const at::Tensor& table, double alpha, double limit) {
  const Experts e = experts_of(x, in_blocks, in_scales, in_bias, out_blocks, out_scales, out_bias, table,
                               alpha, limit);
  TORCH_CHECK(idx.dim() == 2 && idx.scalar_type() == at::kLong && idx.is_contiguous() &&
                  idx.size(0) == x.size(0), "idx (tokens, k) int64");
  TORCH_CHECK(gate.sizes() == idx.sizes() && gate.scalar_type() == at::kFloat && gate.is_contiguous(),
              "gate (tokens, k) f32");
  return experts_sum(e, x, idx.data_ptr<int64_t>(), gate.data_ptr<float>(), idx.size(1), false);
}

// The whole moe op for a few tokens under numerics="fast": the router's logits (f32 dot
// products), the top_k experts (ties to the lower index) with a softmax over their logits,
// and the experts with x rounded to int8 per block where this build has AVX2. One call a
// layer instead of the router's ~6 PyTorch ops and this op.
at::Tensor mxfp4_moe_routed(const at::Tensor& x, const at::Tensor& router_w, const at::Tensor& router_b,
                            int64_t top_k, const at::Tensor& in_blocks, const at::Tensor& in_scales,
                            const at::Tensor& in_bias, const at::Tensor& out_blocks,
                            const at::Tensor& out_scales, const at::Tensor& out_bias, const at::Tensor& table,
                            double alpha, double limit) {
  const Experts e = experts_of(x, in_blocks, in_scales, in_bias, out_blocks, out_scales, out_bias, table,
                               alpha, limit);
  TORCH_CHECK(router_w.scalar_type() == at::kFloat && router_w.is_contiguous() &&
                  router_w.dim() == 2 && router_w.size(0) == e.count && router_w.size(1) == e.dim,
              "router_w (experts, dim) f32");
  TORCH_CHECK(router_b.scalar_type() == at::kFloat && router_b.is_contiguous() && router_b.numel() == e.count,
              "router_b (experts) f32");
  TORCH_CHECK(top_k >= 1 && top_k <= e.count, "top_k ", top_k, " of ", e.count, " experts");
  const int64_t tokens = x.size(0);
  std::vector<int64_t> ids(tokens * top_k), order(e.count);
  std::vector<float> gates(tokens * top_k), logits(e.count);
  for (int64_t n = 0; n < tokens; ++n) {
    const float* xn = x.data_ptr<float>() + n * e.dim;
    for (int64_t i = 0; i < e.count; ++i)
      logits[i] = linnet_mxfp4::dot_f32(xn, router_w.data_ptr<float>() + i * e.dim, e.dim) +
                  router_b.data_ptr<float>()[i];
    for (int64_t i = 0; i < e.count; ++i) order[i] = i;
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    const float top = logits[order[0]];
    float total = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) total += (gates[n * top_k + j] = std::exp(logits[order[j]] - top));
    for (int64_t j = 0; j < top_k; ++j) {
      gates[n * top_k + j] /= total;
      ids[n * top_k + j] = order[j];
    }
  }
  return experts_sum(e, x, ids.data(), gates.data(), top_k, true);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(linnet_kernels, m) {
  m.def("mxfp4_linear(Tensor x, Tensor blocks, Tensor scales, Tensor table) -> Tensor");
  m.def("mxfp4_linear_int8(Tensor x, Tensor blocks, Tensor scales) -> Tensor");
  m.def(
      "mxfp4_moe(Tensor x, Tensor idx, Tensor gate, Tensor in_blocks, Tensor in_scales, Tensor in_bias, "
      "Tensor out_blocks, Tensor out_scales, Tensor out_bias, Tensor table, float alpha, float limit) -> Tensor");
  m.def(
      "mxfp4_moe_routed(Tensor x, Tensor router_w, Tensor router_b, int top_k, Tensor in_blocks, "
      "Tensor in_scales, Tensor in_bias, Tensor out_blocks, Tensor out_scales, Tensor out_bias, "
      "Tensor table, float alpha, float limit) -> Tensor");
}

TORCH_LIBRARY_IMPL(linnet_kernels, CPU, m) {
  m.impl("mxfp4_linear", mxfp4_linear);
  m.impl("mxfp4_linear_int8", mxfp4_linear_int8);
  m.impl("mxfp4_moe", mxfp4_moe);
  m.impl("mxfp4_moe_routed", mxfp4_moe_routed);
}
