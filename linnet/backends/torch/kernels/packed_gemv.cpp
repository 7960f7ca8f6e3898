// Weight-only quantized linears for small batches (decode): one pass over the packed
// weights, both cores (linnet::parallel_rows over blocks of output rows).
//
//   y[b, r] = sum_k w[r, k] * x[b, k],   w[r, k] = scale[r, k / 32] * code[r, k] (+ offset)
//
// Each weight is dequantized in registers exactly as the reference does it (scale * code
// is exact in f32; fma(code, scale, offset) rounds once, as scale * code + offset does),
// multiplied by x in f32 and summed in f32: the reference's products, another summation
// order. Layouts (linnet/weights/gguf_packed.py): q8_0 codes int8 (rows, cols); 4-bit
// codes uint8 (rows, cols / 2), element k < cols / 2 in the low nibble of byte k and
// element cols / 2 + k in its high nibble (q5_0: then the row's fifth bits, cols / 8
// bytes); scale and offset f32 (rows, cols / 32).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>

#include "stream_ahead.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
#define LINNET_AVX512 1
#endif

namespace {

constexpr int64_t kGroup = 32;
constexpr int kRows = 4;  // output rows per tile: each x chunk loaded once for them all

#if LINNET_AVX512
using V = __m512;  // 16 lanes; a chunk is 16 weights
inline V zero() { return _mm512_setzero_ps(); }
inline V load(const float* p) { return _mm512_loadu_ps(p); }
inline V bcast(float v) { return _mm512_set1_ps(v); }
inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V mul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V add(V a, V b) { return _mm512_add_ps(a, b); }
inline void store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline float hsum(V a) { return _mm512_reduce_add_ps(a); }
inline V i8_chunk(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
inline void u4_chunk(const uint8_t* p, V& lo, V& hi) {
  __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
  lo = _mm512_cvtepi32_ps(_mm512_and_si512(c, _mm512_set1_epi32(15)));
  hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(c, 4));
}
#elif defined(__AVX2__) && defined(__FMA__)
struct V {  // 16 lanes in two AVX2 registers (GCC does not vectorise the portable struct)
  __m256 a, b;
};
inline V zero() { return V{_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V load(const float* p) { return V{_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline V bcast(float v) { return V{_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
inline V fma(V a, V b, V c) {
  return V{_mm256_fmadd_ps(a.a, b.a, c.a), _mm256_fmadd_ps(a.b, b.b, c.b)};
}
inline V mul(V a, V b) { return V{_mm256_mul_ps(a.a, b.a), _mm256_mul_ps(a.b, b.b)}; }
inline V add(V a, V b) { return V{_mm256_add_ps(a.a, b.a), _mm256_add_ps(a.b, b.b)}; }
inline void store(float* p, V v) {
  _mm256_storeu_ps(p, v.a);
  _mm256_storeu_ps(p + 8, v.b);
}
inline float hsum(V v) {
  const __m256 s = _mm256_add_ps(v.a, v.b);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
inline V i8_chunk(const int8_t* p) {
  const __m128i c = _mm_loadu_si128((const __m128i*)p);
  return V{_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)),
           _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(c, c)))};
}
inline void u4_chunk(const uint8_t* p, V& lo, V& hi) {
  const __m128i c = _mm_loadu_si128((const __m128i*)p), m = _mm_set1_epi8(15);
  const __m128i l = _mm_and_si128(c, m), h = _mm_and_si128(_mm_srli_epi16(c, 4), m);
  lo = V{_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(l)),
         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(l, l)))};
  hi = V{_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h)),
         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(h, h)))};
}
#else
struct V {  // portable 16 lanes: -O3 -march=native vectorises these loops
  float v[16];
};
inline V zero() { return V{}; }
inline V load(const float* p) {
  V r;
  for (int i = 0; i < 16; ++i) r.v[i] = p[i];
  return r;
}
inline V bcast(float x) {
  V r;
  for (int i = 0; i < 16; ++i) r.v[i] = x;
  return r;
}
inline V fma(V a, V b, V c) {
  for (int i = 0; i < 16; ++i) c.v[i] = __builtin_fmaf(a.v[i], b.v[i], c.v[i]);
  return c;
}
inline V mul(V a, V b) {
  for (int i = 0; i < 16; ++i) a.v[i] *= b.v[i];
  return a;
}
inline V add(V a, V b) {
  for (int i = 0; i < 16; ++i) a.v[i] += b.v[i];
  return a;
}
inline void store(float* p, V v) {
  for (int i = 0; i < 16; ++i) p[i] = v.v[i];
}
inline float hsum(V a) {
  float s = 0;
  for (int i = 0; i < 16; ++i) s += a.v[i];
  return s;
}
inline V i8_chunk(const int8_t* p) {
  V r;
  for (int i = 0; i < 16; ++i) r.v[i] = float(p[i]);
  return r;
}
inline void u4_chunk(const uint8_t* p, V& lo, V& hi) {
  for (int i = 0; i < 16; ++i) {
    lo.v[i] = float(p[i] & 15);
    hi.v[i] = float(p[i] >> 4);
  }
}
#endif

// q5_0's fifth bits of elements k..k+15 (k a multiple of 16) of a row's bit plane
// (element i in bit i % 8 of byte i / 8) as 16.0 where set, else 0.0
inline V fifth16(const uint8_t* plane, int64_t k) {
  const unsigned bits = plane[k / 8] | (unsigned(plane[k / 8 + 1]) << 8);
#if LINNET_AVX512
  return _mm512_maskz_mov_ps(__mmask16(bits), _mm512_set1_ps(16.0f));
#elif defined(__AVX2__) && defined(__FMA__)
  // lane i tests bit i: an all-ones lane where set keeps 16.0f
  const __m256i word = _mm256_set1_epi32(int(bits));
  const __m256i low = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i high = _mm256_slli_epi32(low, 8);
  const __m256 sixteen = _mm256_set1_ps(16.0f);
  const auto pick = [&](__m256i sel) {
    const __m256i hit = _mm256_cmpeq_epi32(_mm256_and_si256(word, sel), sel);
    return _mm256_and_ps(_mm256_castsi256_ps(hit), sixteen);
  };
  return V{pick(low), pick(high)};
#else
  V v;
  for (int i = 0; i < 16; ++i) v.v[i] = (bits >> i) & 1u ? 16.0f : 0.0f;
  return v;
#endif
}

struct Problem {
  const float* x;  // (batch, cols)
  const void* codes;
  const float* scale;   // (rows, groups)
  const float* offset;  // (rows, groups) or null
  float* y;             // (batch, rows)
  int64_t batch, rows, cols;
};

// Rows r0..r0+R of y for x rows b0..b0+B: q8_0, 16 weights per step.
template <int R, int B>
void q8_tile(const Problem& p, int64_t r0, int64_t b0) {
  V acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = zero();
  const int64_t groups = p.cols / kGroup;
  const int8_t* codes = static_cast<const int8_t*>(p.codes);
  for (int64_t g = 0; g < groups; ++g) {
    for (int r = 0; r < R; ++r)  // the streams' next lines: 4 rows of codes run at once
      __builtin_prefetch(codes + (r0 + r) * p.cols + g * kGroup + 2048);
    for (int64_t h = 0; h < kGroup; h += 16) {
      const int64_t k = g * kGroup + h;
      V xs[B];
      for (int b = 0; b < B; ++b) xs[b] = load(p.x + (b0 + b) * p.cols + k);
      for (int r = 0; r < R; ++r) {
        const int64_t row = r0 + r;
        V w = mul(i8_chunk(codes + row * p.cols + k), bcast(p.scale[row * groups + g]));
        for (int b = 0; b < B; ++b) acc[r][b] = fma(w, xs[b], acc[r][b]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) p.y[(b0 + b) * p.rows + r0 + r] = hsum(acc[r][b]);
}

// The same for 4-bit codes: 16 bytes give 16 weights of each half of the row. Five:
// q5_0, each row's nibbles followed by its fifth bits (cols / 8 bytes), codes 0..31.
template <int R, int B, bool Five>
void q4_tile(const Problem& p, int64_t r0, int64_t b0) {
  V acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = zero();
  const int64_t groups = p.cols / kGroup, half = p.cols / 2;
  const int64_t stride = Five ? half + p.cols / 8 : half;  // bytes a row
  const uint8_t* codes = static_cast<const uint8_t*>(p.codes);
  for (int64_t j = 0; j < half; j += 16) {
    const int64_t g_lo = j / kGroup, g_hi = (half + j) / kGroup;
    if (j % 64 == 0)
      for (int r = 0; r < R; ++r) __builtin_prefetch(codes + (r0 + r) * stride + j + 1024);
    V x_lo[B], x_hi[B];
    for (int b = 0; b < B; ++b) {
      x_lo[b] = load(p.x + (b0 + b) * p.cols + j);
      x_hi[b] = load(p.x + (b0 + b) * p.cols + half + j);
    }
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const float* s = p.scale + row * groups;
      const float* o = p.offset + row * groups;
      V lo, hi;
      u4_chunk(codes + row * stride + j, lo, hi);
      if (Five) {  // code + 16 * bit: exact in f32, as the reference's codes are
        lo = add(lo, fifth16(codes + row * stride + half, j));
        hi = add(hi, fifth16(codes + row * stride + half, half + j));
      }
      V w_lo = fma(lo, bcast(s[g_lo]), bcast(o[g_lo]));
      V w_hi = fma(hi, bcast(s[g_hi]), bcast(o[g_hi]));
      for (int b = 0; b < B; ++b) acc[r][b] = fma(w_hi, x_hi[b], fma(w_lo, x_lo[b], acc[r][b]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) p.y[(b0 + b) * p.rows + r0 + r] = hsum(acc[r][b]);
}

template <template <int, int> class Tile, int R>
void batch_tiles(const Problem& p, int64_t r0) {
  int64_t b0 = 0;
  for (; b0 + 4 <= p.batch; b0 += 4) Tile<R, 4>::run(p, r0, b0);
  switch (p.batch - b0) {
    case 3: Tile<R, 3>::run(p, r0, b0); break;
    case 2: Tile<R, 2>::run(p, r0, b0); break;
    case 1: Tile<R, 1>::run(p, r0, b0); break;
    default: break;
  }
}

template <int R, int B>
struct Q8 {
  static void run(const Problem& p, int64_t r0, int64_t b0) { q8_tile<R, B>(p, r0, b0); }
};
template <int R, int B>
struct Q4 {
  static void run(const Problem& p, int64_t r0, int64_t b0) { q4_tile<R, B, false>(p, r0, b0); }
};
template <int R, int B>
struct Q5 {
  static void run(const Problem& p, int64_t r0, int64_t b0) { q4_tile<R, B, true>(p, r0, b0); }
};

template <template <int, int> class Tile>
void run_rows(const Problem& p) {
  const int64_t tiles = p.rows / kRows;
  // A tile reads kRows * cols weights; keep parallel chunks at 64k weights or more.
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / (kRows * p.cols));
  linnet::parallel_rows(0, tiles, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) batch_tiles<Tile, kRows>(p, t * kRows);
  });
  for (int64_t r = tiles * kRows; r < p.rows; ++r) batch_tiles<Tile, 1>(p, r);
}

at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scale,
                         const c10::optional<at::Tensor>& offset) {
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous(), "scale");
  TORCH_CHECK(codes.is_contiguous() && codes.dim() == 2, "codes");
  const int64_t rows = scale.size(0), cols = scale.size(1) * kGroup;
  TORCH_CHECK(x.size(-1) == cols && codes.size(0) == rows, "shapes");
  const int64_t batch = x.numel() / cols;  // x (..., cols) -> y (..., rows)
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = rows;
  at::Tensor y = at::empty(shape, x.options());
  Problem p{x.data_ptr<float>(), codes.data_ptr(), scale.data_ptr<float>(), nullptr,
            y.data_ptr<float>(), batch, rows, cols};
  linnet::reading(codes), linnet::reading(scale);
  if (offset.has_value()) linnet::reading(*offset);
  if (codes.scalar_type() == at::kChar) {
    TORCH_CHECK(codes.size(1) == cols && !offset.has_value(), "q8_0 codes");
    run_rows<Q8>(p);
  } else {
    const bool five = codes.size(1) == cols / 2 + cols / 8 && cols % 16 == 0;  // q5_0
    TORCH_CHECK(codes.scalar_type() == at::kByte && (five || codes.size(1) * 2 == cols),
                "4/5-bit codes");
    TORCH_CHECK(offset.has_value() && offset->sizes() == scale.sizes(), "4-bit offset");
    TORCH_CHECK(offset->scalar_type() == at::kFloat && offset->is_contiguous(), "offset");
    p.offset = offset->data_ptr<float>();
    if (five)
      run_rows<Q5>(p);
    else
      run_rows<Q4>(p);
  }
  return y;
}

// 4-bit (q4_0, q4_1, q4_K's rows) or q5_0 rows as f32 scale * code (no offset: the PyTorch
// path applies it to x's sums), into out (rows, cols): what the blocked path's GEMM reads.
// One pass; torch's bit ops took 7x the time of q8_0's one multiply for q5_0, and four
// passes (and, multiply, shift, multiply) for 4-bit rows.
template <bool Five>
void scaled_codes(const at::Tensor& codes, const at::Tensor& scale, at::Tensor& out) {
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous(), "scale");
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous(), "out");
  const int64_t rows = scale.size(0), cols = scale.size(1) * kGroup, half = cols / 2;
  const int64_t stride = Five ? half + cols / 8 : half;
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous(), "codes");
  TORCH_CHECK(codes.size(0) == rows && codes.size(1) == stride && cols % 32 == 0,
              Five ? "q5_0 codes" : "4-bit codes");
  TORCH_CHECK(out.numel() == rows * cols, "out");
  const uint8_t* c = codes.data_ptr<uint8_t>();
  const float* s = scale.data_ptr<float>();
  float* y = out.data_ptr<float>();
  const int64_t groups = cols / kGroup;
  at::parallel_for(0, rows, 16, [&](int64_t lo_row, int64_t hi_row) {
    for (int64_t r = lo_row; r < hi_row; ++r) {
      const uint8_t* row = c + r * stride;
      for (int64_t j = 0; j < half; j += 16) {  // a 16-aligned chunk lies in one group
        V lo, hi;
        u4_chunk(row + j, lo, hi);
        if constexpr (Five) {
          lo = add(lo, fifth16(row + half, j));
          hi = add(hi, fifth16(row + half, half + j));
        }
        store(y + r * cols + j, mul(lo, bcast(s[r * groups + j / kGroup])));
        store(y + r * cols + half + j, mul(hi, bcast(s[r * groups + (half + j) / kGroup])));
      }
    }
  });
}

void q5_0_scaled_codes(const at::Tensor& codes, const at::Tensor& scale, at::Tensor& out) {
  scaled_codes<true>(codes, scale, out);
}

void q4_scaled_codes(const at::Tensor& codes, const at::Tensor& scale, at::Tensor& out) {
  scaled_codes<false>(codes, scale, out);
}

}  // namespace

TORCH_LIBRARY(linnet_kernels, m) {
  m.def("packed_linear(Tensor x, Tensor codes, Tensor scale, Tensor? offset) -> Tensor");
  m.def("q5_0_scaled_codes(Tensor codes, Tensor scale, Tensor(a!) out) -> ()");
  m.def("q4_scaled_codes(Tensor codes, Tensor scale, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(linnet_kernels, CPU, m) {
  m.impl("packed_linear", packed_linear);
  m.impl("q5_0_scaled_codes", q5_0_scaled_codes);
  m.impl("q4_scaled_codes", q4_scaled_codes);
}
