// The small ops of a decode step in one call each (numerics="fast", f32, CPU): RMSNorm in
// one pass, rope from the tables, and attention of one query over the cache (GQA, an
// optional window start and per-head sinks). At batch 1 each replaces 4-10 PyTorch ops
// whose dispatch costs more than their arithmetic (docs/torch.md). References:
// prelude.py's rms_norm_ref, rope_ref, attention_ref. Sums are f32 in another order than
// the references'; rope makes the reference's products and sum exactly (no fma below).
#pragma GCC optimize("fp-contract=off")

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

constexpr int kLanes = 16;  // independent partial sums: the compiler vectorises them

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  const __m256 s8 = _mm256_add_ps(s0, s1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  s = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
#else
  float acc[kLanes] = {};
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; j < kLanes; ++j) s += acc[j];
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// bf16 bits <-> f32: widening is exact; rounding to nearest even, as torch's casts round
inline float widen(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float widen(float x) { return x; }
inline uint16_t to_bf16(float f) { return c10::BFloat16(f).x; }

// 1 / sqrt(mean(x^2) + eps) of one row: both norms' (the bf16 one's bits rest on it)
inline float inverse_rms(const float* x, int64_t n, double eps) {
  const float mean = dot(x, x, n) / static_cast<float>(n);
  return 1.f / std::sqrt(mean + static_cast<float>(eps));
}

// w * (x * rsqrt(mean(x^2) + eps)) for each row of x (..., n), as rms_norm_ref.
at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& w_in, double eps) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && w_in.scalar_type() == at::kFloat, "f32");
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t n = x.size(-1);
  TORCH_CHECK(w.dim() == 1 && w.size(0) == n && w.is_contiguous(), "w: (", n, ")");
  at::Tensor y = at::empty(x.sizes(), x.options());
  const int64_t rows = n ? x.numel() / n : 0;
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)),
                   [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = xp + r * n;
      float* yr = yp + r * n;
      const float inv = inverse_rms(xr, n, eps);
      for (int64_t i = 0; i < n; ++i) yr[i] = wp[i] * (xr[i] * inv);
    }
  });
  return y;
}

// bf16 x and w: x widened and normalised as `rms_norm` does it in f32, rounded to bf16, then
// times w in bf16 (the product of two bf16 is exact in f32, rounded once): rms_norm_ref's
// two roundings, bit for bit what the widened op, a cast and torch's bf16 multiply give,
// in one call instead of four.
at::Tensor rms_norm_bf16(const at::Tensor& x_in, const at::Tensor& w_in, double eps) {
  TORCH_CHECK(x_in.scalar_type() == at::kBFloat16 && w_in.scalar_type() == at::kBFloat16, "bf16");
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t n = x.size(-1);
  TORCH_CHECK(w.dim() == 1 && w.size(0) == n, "w: (", n, ")");
  at::Tensor y = at::empty(x.sizes(), x.options());
  const int64_t rows = n ? x.numel() / n : 0;
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr());
  uint16_t* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)),
                   [&](int64_t lo, int64_t hi) {
    std::vector<float> row(n);
    for (int64_t r = lo; r < hi; ++r) {
      for (int64_t i = 0; i < n; ++i) row[i] = widen(xp[r * n + i]);
      const float inv = inverse_rms(row.data(), n, eps);
      for (int64_t i = 0; i < n; ++i)
        yp[r * n + i] = to_bf16(widen(to_bf16(row[i] * inv)) * widen(wp[i]));
    }
  });
  return y;
}

// One row of D: rope_ref's products, rounded, then summed (no fma: fp-contract is off).
template <class In>
inline void rope_row(const In* xr, const float* c, const float* sn, float* yr, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float p = widen(xr[j]) * c[j], q = widen(xr[j + half]) * sn[j];
    yr[j] = p + q;
  }
  for (int64_t j = half; j < D; ++j) {
    const float p = widen(xr[j]) * c[j], q = widen(xr[j - half]) * sn[j];
    yr[j] = p + q;
  }
}

// x [B, H, S, D] (any strides, D's 1) rotated at positions offset..offset+S with the
// [N, D] tables (cos repeated, sin signed): x * cos + swap_halves(x) * sin, contiguous.
// f32 x, or bf16 x: widened, the same f32 arithmetic, rounded once to bf16.
at::Tensor rope(const at::Tensor& x_in, const at::Tensor& cos_in, const at::Tensor& sin_in,
                int64_t offset) {
  const bool bf16 = x_in.scalar_type() == at::kBFloat16;
  TORCH_CHECK(x_in.dim() == 4 && (x_in.scalar_type() == at::kFloat || bf16),
              "x: f32 or bf16 (B, H, S, D)");
  const at::Tensor x = x_in.stride(3) == 1 ? x_in : x_in.contiguous();
  const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), D = x.size(3);
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->dim() == 2 &&
                    t->size(1) == D, "tables: f32 (N, ", D, ")");
  TORCH_CHECK(D % 2 == 0 && offset >= 0 && offset + S <= cos.size(0) &&
                  sin.size(0) == cos.size(0), "positions past the tables");
  at::Tensor y = at::empty({B, H, S, D}, x.options());
  const float* cp = cos.data_ptr<float>() + offset * D;
  const float* sp = sin.data_ptr<float>() + offset * D;
  const int64_t sb = x.stride(0), sh = x.stride(1), ss = x.stride(2);
  const float* xf = bf16 ? nullptr : x.data_ptr<float>();
  float* yf = bf16 ? nullptr : y.data_ptr<float>();
  const uint16_t* xb = bf16 ? reinterpret_cast<const uint16_t*>(x.data_ptr()) : nullptr;
  uint16_t* yb = bf16 ? reinterpret_cast<uint16_t*>(y.data_ptr()) : nullptr;
  at::parallel_for(0, B * H * S, std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1)),
                   [&](int64_t lo, int64_t hi) {
    std::vector<float> row(bf16 ? D : 0);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t s = i % S, h = (i / S) % H, b = i / (S * H), at = b * sb + h * sh + s * ss;
      if (!bf16) {
        rope_row(xf + at, cp + s * D, sp + s * D, yf + i * D, D);
        continue;
      }
      rope_row(xb + at, cp + s * D, sp + s * D, row.data(), D);
      for (int64_t j = 0; j < D; ++j) yb[i * D + j] = to_bf16(row[j]);
    }
  });
  return y;
}

struct Attn {
  const float *q, *sinks;
  const void *k, *v;  // f32, or bf16 (kv_bf16): a bf16 cache read as it lies
  bool kv_bf16;
  float* out;
  int64_t H, G, T, D, start;
  int64_t qb, qh, kb, kh, kt, vb, vh, vt;
  float scale;
};

#if defined(__AVX2__) && defined(__FMA__)
// e^x on 8 lanes for x <= 0 (scores less their max), Cephes' expf: x = n ln2 + r with
// ln2 in two parts, e^r = 1 + r + r^2 p(r) (degree 5), 2^n from exponent bits; x is
// clamped at -87 (e^-87 ~ 1.6e-38, still normal), where softmax weights are 0 anyway.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504089f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                        1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

// scores[i] = e^(scores[i] - top) for i in lo..hi-1; their sum.
float exp_sum(float* scores, int64_t lo, int64_t hi, float top) {
  float total = 0.f;
  int64_t i = lo;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= hi; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + i), _mm256_set1_ps(top)));
    _mm256_storeu_ps(scores + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  for (const float l : lanes) total += l;
#endif
  for (; i < hi; ++i) total += scores[i] = std::exp(scores[i] - top);
  return total;
}

inline float dot(const float* a, const uint16_t* b, int64_t n) {  // f32 q against bf16 keys
  float s = 0.f;
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 s0 = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256i bits = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(b + i)));
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16)), s0);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, s0);
  for (const float l : lanes) s += l;
#endif
  for (; i < n; ++i) s += a[i] * widen(b[i]);
  return s;
}

// One (batch, head): softmax(q k^T * scale) over keys start..end-1 (and the head's sink in
// the denominator), times v; f32 throughout (T: the cache's element, f32 or bf16 bits).
template <class T>
void attend_kv(const Attn& a, int64_t b, int64_t h, float* scores, int64_t start, int64_t end) {
  const int64_t g = h / a.G;
  const float* q = a.q + b * a.qb + h * a.qh;
  const T* k = static_cast<const T*>(a.k) + b * a.kb + g * a.kh;
  const T* v = static_cast<const T*>(a.v) + b * a.vb + g * a.vh;
  float top = a.sinks ? a.sinks[h] : -std::numeric_limits<float>::infinity();
  for (int64_t t = start; t < end; ++t) {
    scores[t] = dot(q, k + t * a.kt, a.D) * a.scale;
    top = std::max(top, scores[t]);
  }
  const float total =
      exp_sum(scores, start, end, top) + (a.sinks ? std::exp(a.sinks[h] - top) : 0.f);
  float* o = a.out + (b * a.H + h) * a.D;
  std::fill(o, o + a.D, 0.f);
  for (int64_t t = start; t < end; ++t) {
    const float p = scores[t] / total;
    const T* vr = v + t * a.vt;
    for (int64_t d = 0; d < a.D; ++d) o[d] += p * widen(vr[d]);
  }
}

void attend(const Attn& a, int64_t b, int64_t h, float* scores, int64_t start, int64_t end) {
  if (a.kv_bf16)
    attend_kv<uint16_t>(a, b, h, scores, start, end);
  else
    attend_kv<float>(a, b, h, scores, start, end);
}

// q, k, v checked (f32, [B, heads, T, D], one query, GQA) and read where they lie when
// each row's D elements are contiguous (a slice of the cache); out [B, H, 1, D].
Attn attn_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const c10::optional<at::Tensor>& sinks, const at::Tensor& out, double scale) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), KV = k.size(1);
  TORCH_CHECK(q.size(2) == 1 && KV > 0 && H % KV == 0 && k.size(0) == B && k.size(3) == D &&
                  v.sizes() == k.sizes(), "shapes: one query, GQA");
  if (sinks.has_value())
    TORCH_CHECK(sinks->scalar_type() == at::kFloat && sinks->is_contiguous() &&
                    sinks->numel() == H, "sinks: f32 (H)");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == v.scalar_type() &&
                  (k.scalar_type() == at::kFloat || k.scalar_type() == at::kBFloat16),
              "q f32; k, v both f32 or both bf16");
  return Attn{q.data_ptr<float>(), sinks.has_value() ? sinks->data_ptr<float>() : nullptr,
              k.data_ptr(), v.data_ptr(), k.scalar_type() == at::kBFloat16, out.data_ptr<float>(),
              H, H / KV, k.size(2), D, 0, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
              k.stride(2), v.stride(0), v.stride(1), v.stride(2), static_cast<float>(scale)};
}

at::Tensor rows_d1(const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 4 && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16),
              "q, k, v: f32 or bf16 (B, heads, T, D)");
  return t.stride(3) == 1 ? t : t.contiguous();
}

// q [B, H, 1, D] over k, v [B, KV, T, D] (the cache's rows 0..T-1, D's stride 1): every
// key from `start` on (a decode step's causal mask hides none; a window's starts later).
at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, double scale, int64_t start,
                            const c10::optional<at::Tensor>& sinks) {
  const at::Tensor q = rows_d1(q_in), k = rows_d1(k_in), v = rows_d1(v_in);
  const int64_t B = q.size(0), H = q.size(1), T = k.size(2);
  TORCH_CHECK(start >= 0 && start < T, "start: 0..T-1");
  at::Tensor out = at::empty({B, H, 1, q.size(3)}, q.options());
  Attn a = attn_args(q, k, v, sinks, out, scale);
  a.start = start;
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(T * a.D, 1));
  at::parallel_for(0, B * H, grain, [&](int64_t lo, int64_t hi) {
    std::vector<float> scores(T);
    for (int64_t i = lo; i < hi; ++i) attend(a, i / H, i % H, scores.data(), start, T);
  });
  return out;
}

// Rows at their own positions (a server's step over cache rows): row b's one query sits at
// positions[b] and attends keys positions[b] - window + 1 .. positions[b] (from 0 without
// a window), nothing past its own length: the causal mask per row, with no work spent on
// the keys of longer rows. k, v [B, KV, T, D] with every positions[b] < T.
at::Tensor decode_attention_rows(const at::Tensor& q_in, const at::Tensor& k_in,
                                 const at::Tensor& v_in, double scale,
                                 const at::Tensor& positions_in, int64_t window,
                                 const c10::optional<at::Tensor>& sinks) {
  const at::Tensor q = rows_d1(q_in), k = rows_d1(k_in), v = rows_d1(v_in);
  const at::Tensor positions = positions_in.contiguous();
  const int64_t B = q.size(0), H = q.size(1), T = k.size(2);
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.numel() == B,
              "positions: i64 (B)");
  TORCH_CHECK(window >= 0, "window: 0 (none) or more");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(pos[b] >= 0 && pos[b] < T, "positions: 0..T-1, got ", pos[b]);
  at::Tensor out = at::empty({B, H, 1, q.size(3)}, q.options());
  const Attn a = attn_args(q, k, v, sinks, out, scale);
  at::parallel_for(0, B * H, std::max<int64_t>(1, 32768 / std::max<int64_t>(T * a.D, 1)),
                   [&](int64_t lo, int64_t hi) {
    std::vector<float> scores(T);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t end = pos[i / H] + 1;
      const int64_t start = window && end > window ? end - window : 0;
      attend(a, i / H, i % H, scores.data(), start, end);
    }
  });
  return out;
}

// A decode layer's attention from its fused qkv output in one call (step_fusion.py: ~20
// PyTorch calls a layer). y [B, 1, W] holds q, k and v at columns q_lo, k_lo, v_lo; per
// batch row, k (normalised and rotated where the weights and tables are given) and v are
// written to the caches at row `at`, q is normalised and rotated alike, and each head
// attends keys start..at. The heads come back merged, [B, 1, H * D]. T is y's element:
// f32, or bf16 (each normalised row rounded as `rms_norm_bf16` rounds it, each rotated row
// rounded once as `rope` rounds it, q widened again, the output rounded once). The same
// arithmetic as the separate ops, so the same bits as rms_norm, rope, the cache writes and
// decode_attention in turn.
struct StepRows {
  const float *cos, *sin;  // the rope tables' row `at`, or null: no rope
  const void *q_norm, *k_norm;  // per-head RMSNorm weights (D, y's dtype), or null
  double eps;
};

// One head's row normalised as rms_norm (f32) or rms_norm_bf16 (bf16) normalise it
// (`wide`: D floats of scratch for the widened bf16 row).
inline void norm_row(const float* x, const float* w, float* out, int64_t D, double eps,
                     float*) {
  const float inv = inverse_rms(x, D, eps);
  for (int64_t i = 0; i < D; ++i) out[i] = w[i] * (x[i] * inv);
}
inline void norm_row(const uint16_t* x, const uint16_t* w, uint16_t* out, int64_t D,
                     double eps, float* wide) {
  for (int64_t i = 0; i < D; ++i) wide[i] = widen(x[i]);
  const float inv = inverse_rms(wide, D, eps);
  for (int64_t i = 0; i < D; ++i) out[i] = to_bf16(widen(to_bf16(wide[i] * inv)) * widen(w[i]));
}

template <class T>
void write_step(const Attn& a, const T* y, int64_t yb, int64_t q_lo, int64_t k_lo,
                int64_t v_lo, const StepRows& r, T* kc, T* vc, int64_t B, int64_t KV,
                float* q) {
  const int64_t D = a.D, H = a.H;
  std::vector<float> row(D), wide(D);
  std::vector<T> normed(D);
  auto rotate = [&](const T* in, const void* norm, float* out) {
    if (norm != nullptr) {
      norm_row(in, static_cast<const T*>(norm), normed.data(), D, r.eps, wide.data());
      in = normed.data();
    }
    if (r.cos != nullptr) {
      rope_row(in, r.cos, r.sin, out, D);
      if (std::is_same_v<T, uint16_t>)  // `rope` rounds its bf16 result
        for (int64_t j = 0; j < D; ++j) out[j] = widen(to_bf16(out[j]));
    } else {
      for (int64_t j = 0; j < D; ++j) out[j] = widen(in[j]);
    }
  };
  for (int64_t b = 0; b < B; ++b) {
    const T* yr = y + b * yb;
    for (int64_t h = 0; h < H; ++h) rotate(yr + q_lo + h * D, r.q_norm, q + (b * H + h) * D);
    for (int64_t g = 0; g < KV; ++g) {
      T* kr = kc + b * a.kb + g * a.kh + (a.T - 1) * a.kt;
      if (r.cos == nullptr && r.k_norm == nullptr) {
        std::memcpy(kr, yr + k_lo + g * D, D * sizeof(T));
      } else {  // widened rows come back to T exactly where only the norm ran
        rotate(yr + k_lo + g * D, r.k_norm, row.data());
        for (int64_t j = 0; j < D; ++j) {
          if constexpr (std::is_same_v<T, uint16_t>) kr[j] = to_bf16(row[j]);
          else kr[j] = row[j];
        }
      }
      std::memcpy(vc + b * a.vb + g * a.vh + (a.T - 1) * a.vt, yr + v_lo + g * D, D * sizeof(T));
    }
  }
}

at::Tensor attend_cached(const at::Tensor& y, int64_t q_lo, int64_t k_lo, int64_t v_lo,
                         int64_t H, const c10::optional<at::Tensor>& cos,
                         const c10::optional<at::Tensor>& sin, int64_t at, at::Tensor k_cache,
                         at::Tensor v_cache, double scale, int64_t start,
                         const c10::optional<at::Tensor>& sinks,
                         const c10::optional<at::Tensor>& q_norm,
                         const c10::optional<at::Tensor>& k_norm, double eps) {
  const bool bf16 = y.scalar_type() == at::kBFloat16;
  TORCH_CHECK((y.scalar_type() == at::kFloat || bf16) && y.dim() == 3 && y.size(1) == 1 &&
                  y.stride(2) == 1, "y: f32 or bf16 (B, 1, W), W contiguous");
  for (const at::Tensor* t : {&k_cache, &v_cache})
    TORCH_CHECK(t->scalar_type() == y.scalar_type() && t->dim() == 4 && t->stride(3) == 1 &&
                    t->sizes() == k_cache.sizes(), "caches: y's dtype, (B, KV, N, D)");
  const int64_t B = y.size(0), W = y.size(2), KV = k_cache.size(1), N = k_cache.size(2),
                D = k_cache.size(3);
  TORCH_CHECK(k_cache.size(0) == B && KV > 0 && H % KV == 0, "caches: y's batch, GQA heads");
  TORCH_CHECK(q_lo >= 0 && k_lo >= 0 && v_lo >= 0 && q_lo + H * D <= W && k_lo + KV * D <= W &&
                  v_lo + KV * D <= W, "q, k, v columns within y");
  TORCH_CHECK(at >= 0 && at < N && start >= 0 && start <= at, "at: 0..N-1, start: 0..at");
  TORCH_CHECK(cos.has_value() == sin.has_value(), "rope: both tables or neither");
  TORCH_CHECK(q_norm.has_value() == k_norm.has_value(), "norms: both weights or neither");
  StepRows r{nullptr, nullptr, nullptr, nullptr, eps};
  if (cos.has_value()) {
    for (const at::Tensor* t : {&*cos, &*sin})
      TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->dim() == 2 &&
                      t->size(1) == D && t->size(0) > at, "tables: f32 (N, D) past at");
    TORCH_CHECK(D % 2 == 0, "rope: an even head dim");
    r.cos = cos->data_ptr<float>() + at * D;
    r.sin = sin->data_ptr<float>() + at * D;
  }
  if (q_norm.has_value()) {
    for (const at::Tensor* t : {&*q_norm, &*k_norm})
      TORCH_CHECK(t->scalar_type() == y.scalar_type() && t->is_contiguous() && t->dim() == 1 &&
                      t->size(0) == D, "norms: y's dtype, (D)");
    r.q_norm = q_norm->data_ptr();
    r.k_norm = k_norm->data_ptr();
  }
  at::Tensor q = at::empty({B, H, 1, D}, y.options().dtype(at::kFloat));
  at::Tensor out = at::empty({B, 1, H * D}, y.options());
  at::Tensor merged = bf16 ? at::empty({B, H, 1, D}, q.options()) : out;
  const at::Tensor k4 = k_cache.narrow(2, 0, at + 1), v4 = v_cache.narrow(2, 0, at + 1);
  Attn a = attn_args(q, k4, v4, sinks, merged, scale);
  a.start = start;
  if (bf16)
    write_step(a, reinterpret_cast<const uint16_t*>(y.data_ptr()), y.stride(0), q_lo, k_lo,
               v_lo, r, reinterpret_cast<uint16_t*>(k_cache.data_ptr()),
               reinterpret_cast<uint16_t*>(v_cache.data_ptr()), B, KV, q.data_ptr<float>());
  else
    write_step(a, y.data_ptr<float>(), y.stride(0), q_lo, k_lo, v_lo, r,
               k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), B, KV, q.data_ptr<float>());
  const int64_t T = at + 1;
  at::parallel_for(0, B * H, std::max<int64_t>(1, 32768 / std::max<int64_t>(T * D, 1)),
                   [&](int64_t lo, int64_t hi) {
    std::vector<float> scores(T);
    for (int64_t i = lo; i < hi; ++i) attend(a, i / H, i % H, scores.data(), start, T);
  });
  if (bf16) out.copy_(merged.view({B, 1, H * D}));  // rounded once, as `.to(bf16)`
  return out;
}

// Shapes for torch.compile's tracing (fake tensors fall back to Meta kernels).
at::Tensor decode_attention_rows_meta(const at::Tensor& q, const at::Tensor&,
                                      const at::Tensor&, double, const at::Tensor&, int64_t,
                                      const c10::optional<at::Tensor>&) {
  return at::empty(q.sizes(), q.options());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(linnet_kernels, m) {
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("rms_norm_bf16(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("rope(Tensor x, Tensor cos, Tensor sin, int offset) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, float scale, int start, Tensor? sinks)"
        " -> Tensor");
  m.def("decode_attention_rows(Tensor q, Tensor k, Tensor v, float scale, Tensor positions,"
        " int window, Tensor? sinks) -> Tensor");
  m.def("attend_cached(Tensor y, int q_lo, int k_lo, int v_lo, int heads, Tensor? cos,"
        " Tensor? sin, int at, Tensor(a!) k_cache, Tensor(b!) v_cache, float scale, int start,"
        " Tensor? sinks, Tensor? q_norm, Tensor? k_norm, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(linnet_kernels, CPU, m) {
  m.impl("rms_norm", rms_norm);
  m.impl("rms_norm_bf16", rms_norm_bf16);
  m.impl("rope", rope);
  m.impl("decode_attention", decode_attention);
  m.impl("decode_attention_rows", decode_attention_rows);
  m.impl("attend_cached", attend_cached);
}

TORCH_LIBRARY_IMPL(linnet_kernels, Meta, m) {
  m.impl("decode_attention_rows", decode_attention_rows_meta);
}
