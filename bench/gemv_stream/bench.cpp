// One thread streams SmolLM2-135M's 121 decode matrices (30 x qkv 960x576, o 576x576,
// gate+up 3072x576, down 576x1536, and the 49152x576 head: 151 MB at q8_0, more than the
// L3) through the packed GEMV kernels at batch B, thread CPU time, variants interleaved
// in rounds: the f32 kernel (packed_gemv.cpp), the AVX2 integer kernel at an older commit
// ("int8-old") and as it is now ("int8-new"). Built by run.sh without torch (stub/ stands in
// for at::parallel_for: one thread). GB/s counts packed bytes (codes, scales, offsets).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>
#include <random>
#include <algorithm>
#include <string>
#include "build/f32k.cpp"
#include "build/old_int8.cpp"
#include "build/new_int8.cpp"
struct Mat { int64_t rows, cols; std::vector<int8_t> c; std::vector<float> s, o; };
static double tcpu() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char** argv) {
  const bool q4 = argc > 1 && std::string(argv[1]) == "q4";
  const int batch = argc > 2 ? atoi(argv[2]) : 1;
  const int rounds = argc > 3 ? atoi(argv[3]) : 5;
  std::mt19937 rng(1);
  std::vector<std::pair<int64_t,int64_t>> shapes;
  for (int l = 0; l < 30; ++l) { shapes.push_back({960,576}); shapes.push_back({576,576}); shapes.push_back({3072,576}); shapes.push_back({576,1536}); }
  shapes.push_back({49152,576});
  std::vector<Mat> ms; double bytes = 0;
  for (auto [r, c] : shapes) {
    Mat m{r, c}; int64_t nb = q4 ? r * c / 2 : r * c;
    m.c.resize(nb); for (auto& v : m.c) v = int8_t(rng());
    if (!q4) for (auto& v : m.c) if (v == -128) v = -127;
    m.s.resize(r * c / 32); for (auto& v : m.s) v = (rng() % 1000) * 1e-5f;
    if (q4) { m.o.resize(r * c / 32); for (auto& v : m.o) v = -((rng() % 1000) * 1e-4f); }
    bytes += nb + 4.0 * m.s.size() + 4.0 * m.o.size();
    ms.push_back(std::move(m));
  }
  std::vector<float> x(batch * 1536), y(batch * 49152), yr(batch * 49152);
  for (auto& v : x) v = (int(rng() % 2001) - 1000) * 1e-3f;
  auto run = [&](int which) {
    double t0 = tcpu();
    for (auto& m : ms) {
      const float* o = q4 ? m.o.data() : nullptr;
      if (which == 0) { f32k::Problem p{x.data(), m.c.data(), m.s.data(), o, y.data(), batch, m.rows, m.cols};
        if (q4) f32k::run_rows<f32k::Q4>(p); else f32k::run_rows<f32k::Q8>(p); }
      else if (which == 1) old_avx2::packed_linear_int8x(x.data(), m.c.data(), m.s.data(), o, y.data(), batch, m.rows, m.cols);
      else linnet_avx2::packed_linear_int8x(x.data(), m.c.data(), m.s.data(), o, y.data(), batch, m.rows, m.cols);
    }
    return tcpu() - t0;
  };
  // the two integer kernels on a down matrix: the same up to f32 summation order
  { auto& m = ms[3]; const float* o = q4 ? m.o.data() : nullptr;
    old_avx2::packed_linear_int8x(x.data(), m.c.data(), m.s.data(), o, yr.data(), batch, m.rows, m.cols);
    linnet_avx2::packed_linear_int8x(x.data(), m.c.data(), m.s.data(), o, y.data(), batch, m.rows, m.cols);
    double e = 0, a = 0; for (int64_t i = 0; i < batch * m.rows; ++i) { e = std::max(e, (double)std::abs(y[i]-yr[i])); a = std::max(a, (double)std::abs(yr[i])); }
    printf("new vs old int8 max|d| %.3g of %.3g\n", e, a); }
  const char* names[] = {"f32", "int8-old", "int8-new"};
  std::vector<std::vector<double>> t(3);
  for (int r = 0; r < rounds; ++r) for (int w = 0; w < 3; ++w) t[w].push_back(run(w));
  for (int w = 0; w < 3; ++w) { auto v = t[w]; std::sort(v.begin(), v.end());
    printf("%s %s b%d: median %.2f ms (min %.2f) %.2f GB/s\n", q4 ? "q4" : "q8", names[w], batch, 1e3 * v[v.size()/2], 1e3 * v[0], bytes / v[v.size()/2] / 1e9); }
  printf("packed MB %.1f\n", bytes / 1e6);
}
