// bf16 linears for small batches (decode): one pass over the bf16 weights on both cores
// (linnet::parallel_rows over blocks of output rows). y = x @ w^T (+ b), rounded once to bf16.
// With AVX512-BF16: `vdpbf16ps` (pairs of bf16 products, exact in f32, summed in f32).
// With AVX2 and FMA only: each bf16 widened to f32 in registers (zeros below it: exact),
// f32 FMAs, so the same exact products and f32 sums; the weights are read as bf16, half
// of the bytes of a widened f32 copy, which is what a decode step waits on. Built without
// either the op exists but refuses (`bf16_gemv_native` answers false), and the caller
// keeps torch's own linear.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstdint>

#include "cpu_tuning.h"
#include "page_ahead.h"
#include "stream_ahead.h"

namespace {

// The op's checks; the bias in f32 (undefined when there is none).
[[maybe_unused]] at::Tensor checked_bias(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "shapes");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "bf16");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && w.size(1) % 32 == 0, "layout");
  if (!b.has_value()) return at::Tensor();
  at::Tensor bias_f = b->to(at::kFloat).contiguous();
  TORCH_CHECK(bias_f.numel() == w.size(0), "bias");
  return bias_f;
}

}  // namespace

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>

namespace {

constexpr int kRows = 4;
// Prefetch distance along each row (bytes; rows lie end to end, so this reaches the next
// tiles' rows): on an AVX512-BF16 Xeon, 180 weights of 1536x576 bf16 (318 MB) read at
// 12.4-13.0 GB/s with 8192, 10.7 with 2048, 9.2-9.7 with none; 32768 11.2.
constexpr int64_t kAhead = 8192;

// Rows r0..r0+R of y for x row b (cols a multiple of 32), the R rows read side by side.
template <int R>
void bf16_rows(const uint16_t* x, const uint16_t* w, float* acc_out, int64_t r0, int64_t cols) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < cols; k += 32) {
    __m512bh xs = (__m512bh)_mm512_loadu_si512((const void*)(x + k));
    for (int r = 0; r < R; ++r) {
      __builtin_prefetch(reinterpret_cast<const char*>(w + (r0 + r) * cols + k) + kAhead);
      __m512bh ws = (__m512bh)_mm512_loadu_si512((const void*)(w + (r0 + r) * cols + k));
      acc[r] = _mm512_dpbf16_ps(acc[r], ws, xs);
    }
  }
  for (int r = 0; r < R; ++r) acc_out[r] = _mm512_reduce_add_ps(acc[r]);
}

// One row . x (cols a multiple of 32), read front to back: the same sums, in the same
// order, as bf16_rows gives that row.
inline float bf16_row(const uint16_t* x, const uint16_t* row, int64_t cols) {
  linnet::touch_pages_ahead(row, cols * 2);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t k = 0; k < cols; k += 32)
    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(row + k), (__m512bh)_mm512_loadu_si512(x + k));
  return _mm512_reduce_add_ps(acc);
}

at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  const at::Tensor bias_f = checked_bias(x, w, b);
  linnet::reading(w);
  const int64_t batch = x.size(0), rows = w.size(0), cols = w.size(1);
  const float* bias = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  at::Tensor y = at::empty({batch, rows}, x.options());
  auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* yp = reinterpret_cast<c10::BFloat16*>(y.data_ptr());
  const int64_t tiles = (rows + kRows - 1) / kRows;
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / (kRows * cols));
  const bool in_sequence = linnet::amd_tuning();  // cpu_tuning.h
  linnet::parallel_rows(0, tiles, grain, [&](int64_t lo, int64_t hi) {
    float sums[kRows];
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t r0 = t * kRows, n = std::min<int64_t>(kRows, rows - r0);
      for (int64_t bi = 0; bi < batch; ++bi) {
        if (in_sequence) {
          for (int64_t r = 0; r < n; ++r) sums[r] = bf16_row(xp + bi * cols, wp + (r0 + r) * cols, cols);
        } else if (n == kRows) {
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
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <vector>

namespace {

constexpr int kRows = 4;
// Prefetch distance in bytes along a tile's weights (its rows lie end to end, one
// stream): 4 KB read a 49152 x 576 weight at ~14 GB/s on the AVX2 EPYC, 768 bytes ~8.
constexpr int64_t kAhead = 4096;

// bf16 is the top half of an f32: interleaving zeros below 16 bf16 widens them exactly,
// in the order unpacklo/unpackhi leave (elements 0-3, 8-11, then 4-7, 12-15). x is
// widened the same way once per call, so each product pairs the same two elements.
inline void widen16(const uint16_t* p, __m256& lo, __m256& hi) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i zero = _mm256_setzero_si256();
  lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
  hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
}

inline float hsum(__m256 s) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// x (batch, cols) in bf16 -> f32 in widen16's order, 16 elements at a time
std::vector<float> widen_x(const uint16_t* x, int64_t n) {
  std::vector<float> out(n);
  for (int64_t k = 0; k < n; k += 16) {
    __m256 lo, hi;
    widen16(x + k, lo, hi);
    _mm256_storeu_ps(out.data() + k, lo);
    _mm256_storeu_ps(out.data() + k + 8, hi);
  }
  return out;
}

// sums[r * B + b] = w row r0 + r . x row b0 + b (x widened by widen_x; cols a multiple of 16)
template <int R, int B>
void bf16_tile(const float* x, const uint16_t* w, float* sums, int64_t r0, int64_t b0, int64_t cols) {
  __m256 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) acc[r][b] = _mm256_setzero_ps();
  const char* stream = reinterpret_cast<const char*>(w + r0 * cols);
  for (int64_t k = 0; k < cols; k += 16) {
    // the tile reads R * 32 bytes a step: its lines kAhead ahead, in the order they lie
    for (int j = 0; j < R * 32; j += 64) __builtin_prefetch(stream + k * 2 * R + j + kAhead);
    __m256 xl[B], xh[B];
    for (int b = 0; b < B; ++b) {
      xl[b] = _mm256_loadu_ps(x + (b0 + b) * cols + k);
      xh[b] = _mm256_loadu_ps(x + (b0 + b) * cols + k + 8);
    }
    for (int r = 0; r < R; ++r) {
      __m256 lo, hi;
      widen16(w + (r0 + r) * cols + k, lo, hi);
      for (int b = 0; b < B; ++b)
        acc[r][b] = _mm256_fmadd_ps(hi, xh[b], _mm256_fmadd_ps(lo, xl[b], acc[r][b]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) sums[r * B + b] = hsum(acc[r][b]);
}

// One row . x (x widened by widen_x; cols a multiple of 32), read front to back with four
// chains of FMAs, no prefetch per line (one per 4 KB page, page_ahead.h): AMD's choice
// (cpu_tuning.h), as f32_gemv.cpp reads f32 rows. SmolLM2's bf16 linears on the Zen 4
// EPYC's AVX2 code, one thread: 17.5-18.3 GB/s, the tiles 13.1-14.7 (docs/torch.md,
// "Session 23"). Another order of sums than the tiles: not the same bits.
inline float bf16_row_seq(const float* x, const uint16_t* row, int64_t cols) {
  linnet::touch_pages_ahead(row, cols * 2);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (int64_t k = 0; k < cols; k += 32) {
    __m256 lo0, hi0, lo1, hi1;
    widen16(row + k, lo0, hi0);
    widen16(row + k + 16, lo1, hi1);
    a0 = _mm256_fmadd_ps(lo0, _mm256_loadu_ps(x + k), a0);
    a1 = _mm256_fmadd_ps(hi0, _mm256_loadu_ps(x + k + 8), a1);
    a2 = _mm256_fmadd_ps(lo1, _mm256_loadu_ps(x + k + 16), a2);
    a3 = _mm256_fmadd_ps(hi1, _mm256_loadu_ps(x + k + 24), a3);
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

// rows r0..r0+R of y for every x row: x rows two at a time (the weights widened once for both)
template <int R>
void bf16_rows(const float* x, const uint16_t* w, float* sums, int64_t r0, int64_t batch, int64_t cols) {
  float part[R * 2];
  int64_t b0 = 0;
  for (; b0 + 2 <= batch; b0 += 2) {
    bf16_tile<R, 2>(x, w, part, r0, b0, cols);
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < 2; ++b) sums[(b0 + b) * R + r] = part[r * 2 + b];
  }
  if (b0 < batch) {
    bf16_tile<R, 1>(x, w, part, r0, b0, cols);
    for (int r = 0; r < R; ++r) sums[b0 * R + r] = part[r];
  }
}

at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  const at::Tensor bias_f = checked_bias(x, w, b);
  linnet::reading(w);
  const int64_t batch = x.size(0), rows = w.size(0), cols = w.size(1);
  const float* bias = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  const std::vector<float> xf = widen_x(reinterpret_cast<const uint16_t*>(x.data_ptr()), batch * cols);
  at::Tensor y = at::empty({batch, rows}, x.options());
  const float* xp = xf.data();
  auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* yp = reinterpret_cast<c10::BFloat16*>(y.data_ptr());
  const int64_t tiles = (rows + kRows - 1) / kRows;
  const int64_t grain = std::max<int64_t>(1, (1 << 16) / (kRows * cols));
  const bool in_sequence = linnet::amd_tuning();  // cpu_tuning.h
  linnet::parallel_rows(0, tiles, grain, [&](int64_t lo, int64_t hi) {
    std::vector<float> sums(batch * kRows);
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t r0 = t * kRows, n = std::min<int64_t>(kRows, rows - r0);
      if (in_sequence) {
        for (int64_t r = 0; r < n; ++r)
          for (int64_t bi = 0; bi < batch; ++bi)
            sums[bi * kRows + r] = bf16_row_seq(xp + bi * cols, wp + (r0 + r) * cols, cols);
      } else if (n == kRows) {
        bf16_rows<kRows>(xp, wp, sums.data(), r0, batch, cols);
      } else {  // a ragged end: one row at a time, into the full tile's layout
        std::vector<float> one(batch);
        for (int64_t r = 0; r < n; ++r) {
          bf16_rows<1>(xp, wp, one.data(), r0 + r, batch, cols);
          for (int64_t bi = 0; bi < batch; ++bi) sums[bi * kRows + r] = one[bi];
        }
      }
      for (int64_t bi = 0; bi < batch; ++bi)
        for (int64_t r = 0; r < n; ++r)
          yp[bi * rows + r0 + r] = c10::BFloat16(sums[bi * kRows + r] + (bias ? bias[r0 + r] : 0.0f));
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

namespace {
// Force cpu_tuning.h's choices for the whole process: -1 by the CPU, 0 off, 1 on; answers
// the mode before.
int64_t amd_tuning(int64_t mode) {
  TORCH_CHECK(mode >= -1 && mode <= 1, "amd_tuning: -1, 0 or 1");
  const int before = linnet::amd_tuning_forced();
  linnet::amd_tuning_forced() = static_cast<int>(mode);
  return before;
}
bool amd_tuned() { return linnet::amd_tuning(); }
// Set page_ahead.h's distance for the whole process (bytes, 0: off); answers the one before.
int64_t page_ahead(int64_t bytes) {
  TORCH_CHECK(bytes >= 0 && bytes % linnet::kPage == 0, "page_ahead: a whole number of 4 KB pages");
  const int64_t before = linnet::page_ahead();
  linnet::page_ahead() = bytes;
  return before;
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(linnet_kernels, m) {
  m.def("bf16_linear(Tensor x, Tensor w, Tensor? b) -> Tensor");
  m.def("amd_tuning(int mode) -> int", amd_tuning);
  m.def("amd_tuned() -> bool", amd_tuned);
  m.def("page_ahead(int bytes) -> int", page_ahead);
  m.def("bf16_gemv_native() -> bool", native);
}

TORCH_LIBRARY_IMPL(linnet_kernels, CPU, m) { m.impl("bf16_linear", bf16_linear); }
