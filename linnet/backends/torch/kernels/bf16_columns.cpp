// bf16 linears for small batches over a column-major weight: w (rows, cols) held as w^T
// contiguous, (cols, rows), as the generated runner holds bf16 linears where the CPU has
// no bf16 dot product (`bf16_columns_preferred`). y += x[k] * w^T[k, :], four k a pass
// (each 16 rows of y loaded and stored once for the four), so the weights are read as one
// forward stream: AVX2 code on an AVX-512 Xeon, one core, 8 KB prefetch, SmolLM2's bf16
// shapes each in its own allocation, read 14.3-16.3 GB/s where bf16_gemv.cpp's row-major
// tiles read 12.3-13.5 (docs/torch.md, "Session 19").
// Each bf16 is widened to f32 in registers (exact), so the products are exact in f32 and
// the sums f32, rounded once to bf16, as bf16_gemv.cpp's kernels compute, in another order.
// Both cores: each thread sums its own range of k into its own y, then the ranges are added.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cstdint>

#include "stream_ahead.h"

namespace {

// Whether the op reads this layout: w^T contiguous with whole 16-row blocks.
[[maybe_unused]] bool columns_layout(const at::Tensor& w) {
  return w.dim() == 2 && w.size(1) > 1 && w.stride(0) == 1 && w.stride(1) == w.size(0) && w.size(0) % 16 == 0;
}

}  // namespace

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <algorithm>
#include <memory>

namespace {

// Prefetch distance in bytes along each of a pass's four w^T rows (they lie end to end):
// SmolLM2's bf16 linears in one allocation on one core read 13.1-14.1 GB/s with none,
// 14.6-15.6 with 1 KB, 16.0-17.2 with 4 KB, 17.6-18.8 with 8 KB, 16.9-18.5 with 16 KB.
constexpr int64_t kAhead = 8192;
constexpr int kStep = 4;  // k a pass: y's 16 rows loaded and stored once for four k
constexpr int64_t kMinShare = 1 << 16;  // weights a thread takes at least

// 16 bf16 widened exactly (zeros interleaved below each): lo holds elements 0-3 and 8-11,
// hi 4-7 and 12-15, so y's slots 4-7 and 8-11 of each 16 hold each other's rows.
inline void widen16(const uint16_t* p, __m256& lo, __m256& hi) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i zero = _mm256_setzero_si256();
  lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
  hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
}

// y (batch, rows) += x[:, k:k+K] @ w^T[k:k+K, :] in widen16's slot order (First: y = ...)
template <int K, bool First>
void columns_pass(const float* x, const uint16_t* wt, float* y, int64_t k, int64_t rows, int64_t cols, int64_t batch) {
  const uint16_t* row[K];
  for (int j = 0; j < K; ++j) row[j] = wt + (k + j) * rows;
  for (int64_t r = 0; r < rows; r += 16) {
    __m256 lo[K], hi[K];
    for (int j = 0; j < K; ++j) {
      __builtin_prefetch(reinterpret_cast<const char*>(row[j] + r) + kAhead);
      widen16(row[j] + r, lo[j], hi[j]);
    }
    for (int64_t b = 0; b < batch; ++b) {
      float* yb = y + b * rows + r;
      __m256 a = First ? _mm256_setzero_ps() : _mm256_loadu_ps(yb);
      __m256 c = First ? _mm256_setzero_ps() : _mm256_loadu_ps(yb + 8);
      for (int j = 0; j < K; ++j) {
        const __m256 xs = _mm256_broadcast_ss(x + b * cols + k + j);
        a = _mm256_fmadd_ps(lo[j], xs, a);
        c = _mm256_fmadd_ps(hi[j], xs, c);
      }
      _mm256_storeu_ps(yb, a);
      _mm256_storeu_ps(yb + 8, c);
    }
  }
}

// y = x[:, lo:hi] @ w^T[lo:hi, :] (zeros for an empty range)
void columns_range(const float* x, const uint16_t* wt, float* y, int64_t lo, int64_t hi, int64_t rows, int64_t cols, int64_t batch) {
  if (lo == hi) {
    std::fill(y, y + batch * rows, 0.0f);
    return;
  }
  int64_t k = lo;
  if (k + kStep <= hi) {
    columns_pass<kStep, true>(x, wt, y, k, rows, cols, batch);
    k += kStep;
  } else {
    columns_pass<1, true>(x, wt, y, k++, rows, cols, batch);
  }
  for (; k + kStep <= hi; k += kStep) columns_pass<kStep, false>(x, wt, y, k, rows, cols, batch);
  for (; k < hi; ++k) columns_pass<1, false>(x, wt, y, k, rows, cols, batch);
}

// 8 f32 to bf16, rounded to nearest even, NaN kept quiet: c10::BFloat16's rounding
inline __m128i to_bf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc00000), _mm256_castps_si256(nan));
  const __m256i top = _mm256_srli_epi32(rounded, 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(top), _mm256_extracti128_si256(top, 1));
}

// out (batch, rows) in bf16: the shares' sums in row order, plus the bias
void finish(const float* partial, int64_t shares, const float* bias, int64_t batch, int64_t rows, uint16_t* out) {
  const int64_t size = batch * rows;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t r = 0; r < rows; r += 16) {
      __m256 a = _mm256_setzero_ps(), c = _mm256_setzero_ps();
      for (int64_t s = 0; s < shares; ++s) {
        a = _mm256_add_ps(a, _mm256_loadu_ps(partial + s * size + b * rows + r));
        c = _mm256_add_ps(c, _mm256_loadu_ps(partial + s * size + b * rows + r + 8));
      }
      // slots 0-3 and 8-11 hold rows 0-7, slots 4-7 and 12-15 rows 8-15 (widen16)
      __m256 first = _mm256_permute2f128_ps(a, c, 0x20), second = _mm256_permute2f128_ps(a, c, 0x31);
      if (bias) {
        first = _mm256_add_ps(first, _mm256_loadu_ps(bias + r));
        second = _mm256_add_ps(second, _mm256_loadu_ps(bias + r + 8));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + b * rows + r), to_bf16(first));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + b * rows + r + 8), to_bf16(second));
    }
  }
}

at::Tensor bf16_linear_columns(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "shapes");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bf16");
  TORCH_CHECK(x.is_contiguous() && columns_layout(w), "layout: w^T contiguous, rows a multiple of 16");
  linnet::reading(w);
  const int64_t batch = x.size(0), rows = w.size(0), cols = w.size(1);
  at::Tensor bias_f;
  if (b.has_value()) {
    bias_f = b->to(at::kFloat).contiguous();
    TORCH_CHECK(bias_f.numel() == rows, "bias");
  }
  const at::Tensor xf = x.to(at::kFloat);  // exact
  // k split into one contiguous range a thread (span * shares >= cols): each reads its own
  // stretch of w^T
  const int64_t shares = std::clamp<int64_t>(rows * cols / kMinShare, 1, linnet::threads());
  const int64_t span = ((cols + shares - 1) / shares + kStep - 1) / kStep * kStep;
  std::unique_ptr<float[]> partial(new float[shares * batch * rows]);  // each share writes all of its own
  auto* wt = reinterpret_cast<const uint16_t*>(w.data_ptr());
  const float* xp = xf.data_ptr<float>();
  linnet::parallel_rows(0, shares, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t lo = std::min(cols, s * span), hi = std::min(cols, lo + span);
      columns_range(xp, wt, partial.get() + s * batch * rows, lo, hi, rows, cols, batch);
    }
  });
  at::Tensor y = at::empty({batch, rows}, x.options());
  finish(partial.get(), shares, bias_f.defined() ? bias_f.data_ptr<float>() : nullptr, batch, rows,
         reinterpret_cast<uint16_t*>(y.data_ptr()));
  return y;
}

bool native() { return true; }
#if defined(__AVX512BF16__) && defined(__AVX512F__)
bool preferred() { return false; }  // bf16_gemv.cpp's dot products read row-major w
#else
bool preferred() { return true; }
#endif

}  // namespace
#else
namespace {
at::Tensor bf16_linear_columns(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&) {
  TORCH_CHECK(false, "built without AVX2 and FMA");
}
bool native() { return false; }
bool preferred() { return false; }
}  // namespace
#endif

TORCH_LIBRARY_FRAGMENT(linnet_kernels, m) {
  m.def("bf16_linear_columns(Tensor x, Tensor w, Tensor? b) -> Tensor");
  m.def("bf16_columns_native() -> bool", native);
  m.def("bf16_columns_preferred() -> bool", preferred);
}

TORCH_LIBRARY_IMPL(linnet_kernels, CPU, m) { m.impl("bf16_linear_columns", bf16_linear_columns); }
