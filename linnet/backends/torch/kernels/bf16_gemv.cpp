// bf16 linears for small batches (decode) on CPUs with AVX512-BF16: one pass over the
// bf16 weights, `vdpbf16ps` (pairs of bf16 products, exact in f32, summed in f32), both
// cores (at::parallel_for over blocks of output rows). y = x @ w^T (+ b), rounded once
// to bf16. Built without AVX512-BF16 the op exists but refuses (`bf16_gemv_native`
// answers false), and the caller keeps torch's own linear.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstdint>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

namespace {

constexpr int kRows = 4;

// Rows r0..r0+R of y for x row b (cols a multiple of 32).
template <int R>
void bf16_rows(const uint16_t* x, const uint16_t* w, float* acc_out, int64_t r0, int64_t cols) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < cols; k += 32) {
    __m512bh xs = (__m512bh)_mm512_loadu_si512((const void*)(x + k));
    for (int r = 0; r < R; ++r) {
      __m512bh ws = (__m512bh)_mm512_loadu_si512((const void*)(w + (r0 + r) * cols + k));
      acc[r] = _mm512_dpbf16_ps(acc[r], ws, xs);
    }
  }
  for (int r = 0; r < R; ++r) acc_out[r] = _mm512_reduce_add_ps(acc[r]);
}

at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "shapes");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bf16");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && w.size(1) % 32 == 0, "layout");
  const int64_t batch = x.size(0), rows = w.size(0), cols = w.size(1);
  const float* bias = nullptr;
  at::Tensor bias_f;
  if (b.has_value()) {
    bias_f = b->to(at::kFloat).contiguous();
    TORCH_CHECK(bias_f.numel() == rows, "bias");
    bias = bias_f.data_ptr<float>();
  }
  at::Tensor y = at::empty({batch, rows}, x.options());
  auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* yp = reinterpret_cast<c10::BFloat16*>(y.data_ptr());
  const int64_t tiles = (rows + kRows - 1) / kRows;
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / (kRows * cols));
  at::parallel_for(0, tiles, grain, [&](int64_t lo, int64_t hi) {
    float sums[kRows];
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t r0 = t * kRows, n = std::min<int64_t>(kRows, rows - r0);
      for (int64_t bi = 0; bi < batch; ++bi) {
        if (n == kRows) {
          bf16_rows<kRows>(xp + bi * cols, wp, sums, r0, cols);
        } else {
          for (int64_t r = 0; r < n; ++r) bf16_rows<1>(xp + bi * cols, wp, sums + r, r0 + r, cols);
        }
        for (int64_t r = 0; r < n; ++r)
          yp[bi * rows + r0 + r] = c10::BFloat16(sums[r] + (bias ? bias[r0 + r] : 0.0f));
      }
    }
  });
  return y;
}

bool native() { return true; }

}  // namespace
#else
namespace {
at::Tensor bf16_linear(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&) {
  TORCH_CHECK(false, "built without AVX512-BF16");
}
bool native() { return false; }
}  // namespace
#endif

TORCH_LIBRARY_FRAGMENT(linnet_kernels, m) {
  m.def("bf16_linear(Tensor x, Tensor w, Tensor? b) -> Tensor");
  m.def("bf16_gemv_native() -> bool", native);
}

TORCH_LIBRARY_IMPL(linnet_kernels, CPU, m) { m.impl("bf16_linear", bf16_linear); }
