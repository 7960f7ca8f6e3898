// f32 linears for small batches (decode) where torch's own are slow: on the Zen 4 EPYC of
// session 22, torch's f32 linear (MKL's GEMV) read SmolLM2's f32 weights at 11.8 GB/s
// with one thread, a plain read of the same bytes 26-31 GB/s. Here each row is read once,
// front to back (the order AMD's prefetchers reward, cpu_tuning.h), against every x row
// while it sits in L1: four chains of AVX512 FMAs, summed at the end, then the bias. Sums
// run in another order than torch's: the result differs from F.linear by f32 rounding
// (numerics="fast" only). AVX2 with FMA runs the same chains 8 lanes wide; built without
// either the op exists but refuses (`f32_gemv_native` answers false).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "page_ahead.h"
#include "stream_ahead.h"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>

namespace {

#if defined(__AVX512F__)
// One row . x (cols a multiple of 16): four chains of FMAs, so the loads are not held up
// by one chain's latency (one thread, SmolLM2's f32 linears on the Zen 4 EPYC: 27 GB/s
// with four, 22-25 with two, 21-22 with one; a prefetch every line only slowed it, to 19;
// one a 4 KB page, page_ahead.h, helps where the weights lie in 4 KB pages).
inline float f32_row(const float* x, const float* row, int64_t cols) {
  linnet::touch_pages_ahead(row, cols * 4);
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 64 <= cols; k += 64) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(row + k), _mm512_loadu_ps(x + k), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(row + k + 16), _mm512_loadu_ps(x + k + 16), a1);
    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(row + k + 32), _mm512_loadu_ps(x + k + 32), a2);
    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(row + k + 48), _mm512_loadu_ps(x + k + 48), a3);
  }
  for (; k < cols; k += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(row + k), _mm512_loadu_ps(x + k), a0);
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
#else
// AVX2 (an AMD CPU without AVX-512: Zen 2 and 3): the same four chains, 8 lanes each.
inline float f32_row(const float* x, const float* row, int64_t cols) {
  linnet::touch_pages_ahead(row, cols * 4);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= cols; k += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(row + k), _mm256_loadu_ps(x + k), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(row + k + 8), _mm256_loadu_ps(x + k + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(row + k + 16), _mm256_loadu_ps(x + k + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(row + k + 24), _mm256_loadu_ps(x + k + 24), a3);
  }
  for (; k < cols; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(row + k), _mm256_loadu_ps(x + k), a0);
  const __m256 all = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
  half = _mm_add_ps(half, _mm_movehl_ps(half, half));
  half = _mm_add_ss(half, _mm_movehdup_ps(half));
  return _mm_cvtss_f32(half);
}
#endif

at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "shapes");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "f32");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && w.size(1) % 16 == 0, "layout");
  const float* bias = nullptr;
  if (b.has_value()) {
    TORCH_CHECK(b->scalar_type() == at::kFloat && b->is_contiguous() && b->numel() == w.size(0), "bias");
    bias = b->data_ptr<float>();
  }
  linnet::reading(w);
  const int64_t batch = x.size(0), rows = w.size(0), cols = w.size(1);
  at::Tensor y = at::empty({batch, rows}, x.options());
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / cols);
  linnet::parallel_rows(0, rows, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      for (int64_t bi = 0; bi < batch; ++bi)
        yp[bi * rows + r] = f32_row(xp + bi * cols, wp + r * cols, cols) + (bias ? bias[r] : 0.0f);
  });
  return y;
}

bool native() { return true; }
#if defined(__AVX512F__)
int64_t lanes() { return 16; }
#else
int64_t lanes() { return 8; }
#endif

}  // namespace
#else
namespace {
at::Tensor f32_linear(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&) {
  TORCH_CHECK(false, "built without AVX512F or AVX2 and FMA");
}
bool native() { return false; }
int64_t lanes() { return 0; }
}  // namespace
#endif

TORCH_LIBRARY_FRAGMENT(linnet_kernels, m) {
  m.def("f32_linear(Tensor x, Tensor w, Tensor? b) -> Tensor");
  m.def("f32_gemv_native() -> bool", native);
  m.def("f32_gemv_lanes() -> int", lanes);  // 16 (AVX512F), 8 (AVX2), 0 (neither)
}

TORCH_LIBRARY_IMPL(linnet_kernels, CPU, m) { m.impl("f32_linear", f32_linear); }
