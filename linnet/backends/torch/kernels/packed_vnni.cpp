// Integer dot products for packed linears under numerics="fast" (issue 21), on CPUs with
// AVX512-VNNI (AVX2-only CPUs: packed_int8_avx2.cpp, the same numerics): x is quantized per 32-block to int8 as ggml quantizes its q8_0 activations
// (d = amax / 127, q = round(x / d), ties to even), and each block's dot product is
// vpdpbusd (u8 x s8, four products summed in int32: exact), then scaled in f32:
//
//   y[b, r] = sum_g d_x[b, g] * (scale[r, g] * sum_k code[r, k] q[b, k]
//                                + offset[r, g] * sum_k q[b, k])        (k in block g)
//
// i.e. exactly w . x_hat summed in f32, x_hat = d_x * q the rounded activations: the
// difference from the reference is the activations' rounding (|x - x_hat| <= d_x / 2)
// plus f32 summation error. q8_0 codes are signed: they are flipped to u8 (code + 128)
// and the accumulator starts at -128 * (the four q's sum), so the int32 sums stay exact.
// Layouts as in packed_gemv.cpp. 4-bit weights need rows of whole 64-blocks (each half of
// a row whole 32-blocks); the caller keeps the f32 kernel otherwise. q4_0 and q5_0 come
// without offsets (-8 and -16 times the scale; q5_0's fifth bits expanded with one masked
// move per 64 codes).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_tuning.h"
#include "stream_ahead.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>

namespace {

constexpr int64_t kGroup = 32;
constexpr int kRows = 2;          // output rows per tile
// Prefetch distance in each row's stream (bytes): rows lie end to end, so this reaches the
// next tiles' rows. On an AVX512-VNNI Xeon, 180 weights of 1536x576 (over 100 MB) read
// q4_0 at 14-15 GB/s with 2048, 10 with 256; q5_0 12 against 9, q8_0 11.5-12 against 10.
constexpr int64_t kAhead = 2048;

struct Quantized {  // batch rows of x, each quantized per 32-block
  std::vector<int8_t> q;      // (batch, cols)
  std::vector<float> d;       // (batch, groups): the block's scale
  std::vector<float> sums;    // (batch, groups): d * sum of the block's q (4-bit offsets)
  std::vector<int32_t> bias;  // (batch, cols / 4): -128 * sum of each four q (q8_0's flip)
};

Quantized quantize_x(const float* x, int64_t batch, int64_t cols) {
  const int64_t groups = cols / kGroup;
  Quantized out{std::vector<int8_t>(batch * cols), std::vector<float>(batch * groups),
                std::vector<float>(batch * groups), std::vector<int32_t>(batch * cols / 4)};
  for (int64_t i = 0; i < batch * groups; ++i) {
    const float* v = x + i * kGroup;
    const __m512 a0 = _mm512_loadu_ps(v), a1 = _mm512_loadu_ps(v + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(a0, _mm512_set1_ps(id)));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(a1, _mm512_set1_ps(id)));
    _mm_storeu_si128((__m128i*)(out.q.data() + i * kGroup), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128((__m128i*)(out.q.data() + i * kGroup + 16), _mm512_cvtsepi32_epi8(q1));
    out.d[i] = d;
    out.sums[i] = d * float(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
    const int8_t* q = out.q.data() + i * kGroup;
    for (int l = 0; l < kGroup / 4; ++l)
      out.bias[i * kGroup / 4 + l] = -128 * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
  }
  return out;
}

struct Problem {
  const void* codes;
  const float* scale;   // (rows, groups)
  const float* offset;  // (rows, groups) or null
  float* y;             // (batch, rows)
  int64_t batch, rows, cols;
};

inline __mmask16 lanes(int64_t n) { return (__mmask16)((1u << n) - 1); }
inline float hsum(__m512 a) { return _mm512_reduce_add_ps(a); }
// A dot product's 16 int32 lanes: 0-7 the pair's first block, 8-15 its second.
inline __m512i pair_index(int64_t first) {
  return _mm512_add_epi32(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                          _mm512_set1_epi32(int(first)));
}

// Rows r0..r0+R, x rows b0..b0+B, q8_0: 16 blocks of scales at a time, 2 blocks a step.
template <int R, int B>
void q8_tile(const Problem& p, const Quantized& x, int64_t r0, int64_t b0) {
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  const int64_t groups = p.cols / kGroup;
  const int8_t* codes = static_cast<const int8_t*>(p.codes);
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  for (int64_t g0 = 0; g0 < groups; g0 += 16) {
    const int64_t n = std::min<int64_t>(16, groups - g0);
    __m512 s[R][B];  // scale[r, g] * d_x[b, g] for these 16 blocks
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < B; ++b)
        s[r][b] = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes(n), p.scale + (r0 + r) * groups + g0),
                                _mm512_maskz_loadu_ps(lanes(n), x.d.data() + (b0 + b) * groups + g0));
    for (int64_t j = 0; j < n; j += 2) {
      const int64_t k = (g0 + j) * kGroup;
      const bool two = n - j >= 2;  // else one block: the upper lanes read nothing
      const __mmask64 bytes = two ? ~0ULL : 0xFFFFFFFFULL;
      const __mmask16 words = two ? 0xFFFF : 0x00FF;
      const __m512i idx = pair_index(j);
      __m512i xq[B], xb[B];
      for (int b = 0; b < B; ++b) {
        xq[b] = _mm512_maskz_loadu_epi8(bytes, x.q.data() + (b0 + b) * p.cols + k);
        xb[b] = _mm512_maskz_loadu_epi32(words, x.bias.data() + ((b0 + b) * p.cols + k) / 4);
      }
      for (int r = 0; r < R; ++r) {
        const int8_t* row = codes + (r0 + r) * p.cols;
        __builtin_prefetch(row + k + kAhead);
        const __m512i w = _mm512_xor_si512(_mm512_maskz_loadu_epi8(bytes, row + k), flip);
        for (int b = 0; b < B; ++b) {
          const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(xb[b], w, xq[b]));
          acc[r][b] = _mm512_fmadd_ps(dot, _mm512_permutexvar_ps(idx, s[r][b]), acc[r][b]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) p.y[(b0 + b) * p.rows + r0 + r] = hsum(acc[r][b]);
}

// 64 fifth bits of q5_0 (bit e of the plane: element e) as bytes 0x10 / 0; `two`: else 32.
inline __m512i fifth_bits(const uint8_t* plane, bool two) {
  uint64_t bits = 0;  // never read past the row's plane; constant sizes: plain loads
  if (two)
    std::memcpy(&bits, plane, 8);
  else
    std::memcpy(&bits, plane, 4);
  return _mm512_maskz_mov_epi8(_cvtu64_mask64(bits), _mm512_set1_epi8(0x10));
}

// The same for 4-bit codes: 64 bytes hold two blocks of each half of the row. Offsets
// stored (Derived 0: q4_K's), or -8 (Derived 4: q4_0) / -16 (Derived 5: q5_0, each row's
// nibbles followed by its fifth bits, cols / 8 bytes in element order) times the scale:
// then the scales' dot product with x's block sums, times that power of two, exactly.
template <int R, int B, int Derived>
void q4_tile(const Problem& p, const Quantized& x, int64_t r0, int64_t b0) {
  constexpr bool Five = Derived == 5;
  __m512 acc[R][B], off[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = off[r][b] = _mm512_setzero_ps();
  const int64_t groups = p.cols / kGroup, half = p.cols / 2, hg = groups / 2;
  const int64_t stride = Five ? half + p.cols / 8 : half;  // bytes a row
  const float* offsets = Derived ? p.scale : p.offset;
  const uint8_t* codes = static_cast<const uint8_t*>(p.codes);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int64_t g0 = 0; g0 < hg; g0 += 16) {
    const int64_t n = std::min<int64_t>(16, hg - g0);
    __m512 lo_s[R][B], hi_s[R][B];
    for (int r = 0; r < R; ++r) {
      const int64_t at = (r0 + r) * groups + g0;
      for (int b = 0; b < B; ++b) {
        const int64_t xat = (b0 + b) * groups + g0;
        const float *d = x.d.data() + xat, *sums = x.sums.data() + xat;
        lo_s[r][b] = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes(n), p.scale + at),
                                   _mm512_maskz_loadu_ps(lanes(n), d));
        hi_s[r][b] = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes(n), p.scale + at + hg),
                                   _mm512_maskz_loadu_ps(lanes(n), d + hg));
        off[r][b] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lanes(n), offsets + at),
                                    _mm512_maskz_loadu_ps(lanes(n), sums), off[r][b]);
        off[r][b] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lanes(n), offsets + at + hg),
                                    _mm512_maskz_loadu_ps(lanes(n), sums + hg), off[r][b]);
      }
    }
    for (int64_t j = 0; j < n; j += 2) {
      const int64_t k = (g0 + j) * kGroup;  // byte in the row; element of its first half
      const bool two = n - j >= 2;
      const __mmask64 bytes = two ? ~0ULL : 0xFFFFFFFFULL;
      const __m512i idx = pair_index(j);
      __m512i xl[B], xh[B];
      for (int b = 0; b < B; ++b) {
        xl[b] = _mm512_maskz_loadu_epi8(bytes, x.q.data() + (b0 + b) * p.cols + k);
        xh[b] = _mm512_maskz_loadu_epi8(bytes, x.q.data() + (b0 + b) * p.cols + half + k);
      }
      for (int r = 0; r < R; ++r) {
        const uint8_t* row = codes + (r0 + r) * stride;
        __builtin_prefetch(row + k + kAhead);
        const __m512i c = _mm512_maskz_loadu_epi8(bytes, row + k);
        __m512i lo = _mm512_and_si512(c, nibble);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(c, 4), nibble);
        if (Five) {  // elements k.. and half + k.. have their bits at bytes k / 8, (half + k) / 8
          lo = _mm512_or_si512(lo, fifth_bits(row + half + k / 8, two));
          hi = _mm512_or_si512(hi, fifth_bits(row + half + (half + k) / 8, two));
        }
        for (int b = 0; b < B; ++b) {
          const __m512i z = _mm512_setzero_si512();
          const __m512 dl = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, lo, xl[b]));
          const __m512 dh = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, hi, xh[b]));
          acc[r][b] = _mm512_fmadd_ps(dl, _mm512_permutexvar_ps(idx, lo_s[r][b]), acc[r][b]);
          acc[r][b] = _mm512_fmadd_ps(dh, _mm512_permutexvar_ps(idx, hi_s[r][b]), acc[r][b]);
        }
      }
    }
  }
  constexpr float times = Derived == 5 ? -16.0f : Derived == 4 ? -8.0f : 1.0f;
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b)
      p.y[(b0 + b) * p.rows + r0 + r] = hsum(acc[r][b]) + times * hsum(off[r][b]);
}

template <int R, int B>
struct Q8 {
  static void run(const Problem& p, const Quantized& x, int64_t r0, int64_t b0) {
    q8_tile<R, B>(p, x, r0, b0);
  }
};
template <int Derived>
struct Q4Of {
  template <int R, int B>
  struct Tile {
    static void run(const Problem& p, const Quantized& x, int64_t r0, int64_t b0) {
      q4_tile<R, B, Derived>(p, x, r0, b0);
    }
  };
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
namespace linnet_avx2 {  // packed_int8_avx2.cpp: the faster on AMD's CPUs (cpu_tuning.h)
void packed_linear_int8x(const float* x, const void* codes, const float* scale,
                         const float* offset, float* y, int64_t batch, int64_t rows,
                         int64_t cols, int code_bits);
}
namespace {
void run(const float* x, const void* codes, const float* scale, const float* offset,
         float* y, int64_t batch, int64_t rows, int64_t cols) {
  if (linnet::amd_tuning()) {
    linnet_avx2::packed_linear_int8x(x, codes, scale, offset, y, batch, rows, cols,
                                     offset != nullptr ? 4 : 8);
    return;
  }
  const Quantized xq = quantize_x(x, batch, cols);
  Problem p{codes, scale, offset, y, batch, rows, cols};
  if (offset == nullptr)
    run_rows<Q8>(p, xq);
  else
    run_rows<Q4Of<0>::Tile>(p, xq);
}

// q4_0 / q5_0 without offsets (derived from the scales): 20 / 24 bytes a block read
void run_derived(const float* x, const void* codes, const float* scale, float* y, int64_t batch,
                 int64_t rows, int64_t cols, int code_bits) {
  if (linnet::amd_tuning()) {
    linnet_avx2::packed_linear_int8x(x, codes, scale, nullptr, y, batch, rows, cols, code_bits);
    return;
  }
  const Quantized xq = quantize_x(x, batch, cols);
  Problem p{codes, scale, nullptr, y, batch, rows, cols};
  if (code_bits == 5)
    run_rows<Q4Of<5>::Tile>(p, xq);
  else
    run_rows<Q4Of<4>::Tile>(p, xq);
}

}  // namespace
#define LINNET_INT8X 1
#define LINNET_DERIVED_OFFSETS 1  // q4_0 and q5_0 codes come without offsets
#elif defined(__AVX2__) && defined(__FMA__)
namespace linnet_avx2 {  // packed_int8_avx2.cpp
void packed_linear_int8x(const float* x, const void* codes, const float* scale,
                         const float* offset, float* y, int64_t batch, int64_t rows,
                         int64_t cols, int code_bits);
}
namespace {
constexpr int64_t kGroup = 32;
void run(const float* x, const void* codes, const float* scale, const float* offset, float* y,
         int64_t batch, int64_t rows, int64_t cols) {
  linnet_avx2::packed_linear_int8x(x, codes, scale, offset, y, batch, rows, cols,
                                   offset != nullptr ? 4 : 8);
}
// q4_0 / q5_0 without offsets (derived from the scales)
void run_derived(const float* x, const void* codes, const float* scale, float* y, int64_t batch,
                 int64_t rows, int64_t cols, int code_bits) {
  linnet_avx2::packed_linear_int8x(x, codes, scale, nullptr, y, batch, rows, cols, code_bits);
}
}  // namespace
#define LINNET_INT8X 1
#define LINNET_DERIVED_OFFSETS 1  // q4_0 and q5_0 codes come without offsets
#endif

namespace {
#if LINNET_INT8X
at::Tensor packed_linear_int8x(const at::Tensor& x, const at::Tensor& codes,
                               const at::Tensor& scale, const c10::optional<at::Tensor>& offset) {
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous(), "scale");
  TORCH_CHECK(codes.is_contiguous() && codes.dim() == 2, "codes");
  const int64_t rows = scale.size(0), cols = scale.size(1) * kGroup;
  TORCH_CHECK(x.size(-1) == cols && codes.size(0) == rows, "shapes");
  const int64_t batch = x.numel() / cols;  // x (..., cols) -> y (..., rows)
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = rows;
  at::Tensor y = at::empty(shape, x.options());
  linnet::reading(codes), linnet::reading(scale);
  if (offset.has_value()) linnet::reading(*offset);
  const float* off = nullptr;
  if (codes.scalar_type() == at::kChar) {
    TORCH_CHECK(codes.size(1) == cols && !offset.has_value(), "q8_0 codes");
  } else {
    TORCH_CHECK(codes.scalar_type() == at::kByte, "4/5-bit codes");
    TORCH_CHECK(cols % 64 == 0, "4-bit rows of whole 64-blocks");
#if LINNET_DERIVED_OFFSETS
    const bool five = codes.size(1) == cols / 2 + cols / 8;  // q5_0: nibbles, fifth bits
    TORCH_CHECK(five || codes.size(1) * 2 == cols, "4/5-bit codes");
    if (!offset.has_value()) {  // q4_0, q5_0: their offsets follow from the scales
      run_derived(x.data_ptr<float>(), codes.data_ptr(), scale.data_ptr<float>(),
                  y.data_ptr<float>(), batch, rows, cols, five ? 5 : 4);
      return y;
    }
    TORCH_CHECK(!five, "q5_0 codes take no offsets");
#endif
    TORCH_CHECK(codes.size(1) * 2 == cols, "4-bit codes");
    TORCH_CHECK(offset.has_value() && offset->sizes() == scale.sizes(), "4-bit offset");
    TORCH_CHECK(offset->scalar_type() == at::kFloat && offset->is_contiguous(), "offset");
    off = offset->data_ptr<float>();
  }
  run(x.data_ptr<float>(), codes.data_ptr(), scale.data_ptr<float>(), off, y.data_ptr<float>(),
      batch, rows, cols);
  return y;
}

bool native() { return true; }
#else
at::Tensor packed_linear_int8x(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const c10::optional<at::Tensor>&) {
  TORCH_CHECK(false, "built without AVX512-VNNI or AVX2");
}
bool native() { return false; }
#endif
// Whether the op takes q4_0 and q5_0 codes without offsets (both integer kernels, since
// 2026-12-03 the VNNI one too): the caller then passes none (4 bytes a block unread).
bool derived_offsets() {
#if LINNET_DERIVED_OFFSETS
  return true;
#else
  return false;
#endif
}
}  // namespace

namespace {
// Whether a q5_0 weight should stay 5-bit for this op: where it takes q5_0 at all, except
// on a VNNI build under AMD's choices (cpu_tuning.h), whose 256-bit kernel decoded
// SmolLM2's q4_K_M in 9.0 ms a token on the Zen 4 EPYC with the q5_0 matrices in q8_0's
// layout, 10.5 with them 5-bit (medians of 5 alternating rounds, one thread).
bool reads_q5_0() {
#if LINNET_DERIVED_OFFSETS && defined(__AVX512VNNI__)
  return !linnet::amd_tuning();
#elif LINNET_DERIVED_OFFSETS
  return true;
#else
  return false;
#endif
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(linnet_kernels, m) {
  m.def("int8x_reads_q5_0() -> bool", reads_q5_0);
  m.def("packed_linear_int8x(Tensor x, Tensor codes, Tensor scale, Tensor? offset) -> Tensor");
  m.def("int8x_native() -> bool", native);
  m.def("int8x_derived_offsets() -> bool", derived_offsets);
}

TORCH_LIBRARY_IMPL(linnet_kernels, CPU, m) { m.impl("packed_linear_int8x", packed_linear_int8x); }
