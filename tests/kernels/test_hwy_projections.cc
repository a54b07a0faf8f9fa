// The Highway projection kernels (templates/projections-inl.h) against the
// scalar reference (runtime/reference.h: ref::gemm, ref::rmsnorm), on every
// ISA that is compiled in and runnable here.
//
// GEMM tolerance. Each output is a sum of K products a[k] * W[n][k]. The
// weights are exact in f32 (bf16 widens exactly) and every kernel adds the
// products with fused multiply-adds in f32, in some order (sequential chains
// per lane and K block, then the K blocks added into c). For any such order
// the rounding error is bounded by gamma_K * sum_k |a[k] * W[n][k]| with
// gamma_K = K u / (1 - K u), u = 2^-24 (Higham, "Accuracy and Stability of
// Numerical Algorithms", eq. 3.4; a fused multiply-add rounds once). The
// reference sums in double, so its own error is negligible. The test allows
//     2e-5 + 2e-5 |ref| + gamma_K * sum_k |a[k] W[n][k]|,
// i.e. the project's usual 2e-5 bound widened by exactly what f32
// accumulation over K terms may cost. With K = 1152 and values in [-1, 1] the
// extra term is about 0.02 against outputs of size ~10, still far below the
// error of a dropped, duplicated or misplaced product.
//
// RMSNorm tolerance: 2e-5 + 2e-5 |ref|. The kernel's sum of squares is f32
// lane partials summed in double (relative error < 1e-6 for these n), the
// scale is rounded once, and y = (x * s) * (1 + w) [+ r] rounds 3-4 times;
// with inputs of size ~1 that is ~1e-6, well inside the bound.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "generator/bf16.h"
#include "generator/errors.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/packed_weights.h"
#include "runtime/io/layer_weights.h"
#include "runtime/reference/reference.h"
#include "tests/support/test_support.h"

#include "generator/highway/projections.h"

namespace {

using g3::DType;

constexpr float kSentinel = -12345.0f;  // marks output cells a kernel must not touch

struct Problem {
  int64_t M, K, N;
  DType dtype;
  std::vector<float> a;       // [M][lda]
  int64_t lda;
  g3::PackedWeights w, w_abs; // W and |W|, packed
};

Problem make_problem(int64_t M, int64_t K, int64_t N, DType dtype, int64_t lda_pad, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Problem p{M, K, N, dtype, {}, K + lda_pad, {}, {}};
  p.a.assign(static_cast<size_t>(M * p.lda), kSentinel);  // stride padding must never be read as data
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) p.a[m * p.lda + k] = u(rng);
  g3::WeightMatrix wm, wa;
  wm.dtype = wa.dtype = dtype;
  wm.rows = wa.rows = N;
  wm.cols = wa.cols = K;
  for (int64_t i = 0; i < N * K; ++i) {
    float v = u(rng);
    if (dtype == DType::F32) {
      wm.f32.push_back(v);
      wa.f32.push_back(std::fabs(v));
    } else {
      uint16_t b = g3::f32_to_bf16(v);
      wm.bf16.push_back(b);
      wa.bf16.push_back(static_cast<uint16_t>(b & 0x7fff));
    }
  }
  p.w = g3::pack_weights(wm);
  p.w_abs = g3::pack_weights(wa);
  return p;
}

// Reference c and the error scale sum_k |a w| over the full column range.
struct Expected {
  std::vector<float> c, abs;
};
Expected expected(const Problem& p) {
  Expected e;
  e.c.assign(static_cast<size_t>(p.M * p.N), 0.0f);
  e.abs.assign(static_cast<size_t>(p.M * p.N), 0.0f);
  std::vector<float> a_abs(p.a.size());
  for (size_t i = 0; i < p.a.size(); ++i) a_abs[i] = std::fabs(p.a[i]);
  g3_gemm_args g = p.w.args(p.a.data(), p.M, p.lda, e.c.data(), p.N, 0, p.N);
  g3::ref::gemm(&g);
  g3_gemm_args ga = p.w_abs.args(a_abs.data(), p.M, p.lda, e.abs.data(), p.N, 0, p.N);
  g3::ref::gemm(&ga);
  return e;
}

double gamma_k(int64_t K) {
  const double u = std::ldexp(1.0, -24);
  return K * u / (1.0 - K * u);
}

// Runs the kernel over columns [n0, n1) into a c with row stride ldc that is
// prefilled with the sentinel, then checks every cell: in range within the
// bound, everything else untouched. Returns the number of violations.
int64_t run_and_check(g3_gemm_fn fn, const Problem& p, const Expected& e, int64_t n0, int64_t n1, int64_t ldc,
                      std::vector<float>* out = nullptr) {
  std::vector<float> c(static_cast<size_t>(p.M * ldc), kSentinel);
  g3_gemm_args g = p.w.args(p.a.data(), p.M, p.lda, c.data(), ldc, n0, n1);
  fn(&g);
  const double gk = gamma_k(p.K);
  int64_t bad = 0;
  double worst = 0;
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < ldc; ++n) {
      const float got = c[m * ldc + n];
      if (n >= n0 && n < n1) {
        const double ref = e.c[m * p.N + n];
        const double tol = 2e-5 + 2e-5 * std::fabs(ref) + gk * e.abs[m * p.N + n];
        const double err = std::fabs(got - ref);
        worst = std::max(worst, err / tol);
        if (!(err <= tol)) ++bad;
      } else if (got != kSentinel) {
        ++bad;
      }
    }
  if (bad) UNSCOPED_INFO("violations " << bad << ", worst error / bound " << worst);
  if (out) *out = std::move(c);
  return bad;
}

const char* dtype_name(DType d) { return d == DType::F32 ? "f32" : "bf16"; }

}  // namespace

TEST_CASE("highway projections: every runnable ISA is served, bad names are InputError", "[hwy][projections]") {
  const auto isas = g3test::highway_test_isas();  // prints what it skips
  REQUIRE(!isas.empty());
  for (const auto& isa : isas) {
    CHECK(g3::highway_gemm(isa) != nullptr);
    CHECK(g3::highway_rmsnorm(isa) != nullptr);
  }
  CHECK_THROWS_AS(g3::highway_gemm("avx9"), g3::InputError);
  CHECK_THROWS_AS(g3::highway_rmsnorm("best"), g3::InputError);
}

TEST_CASE("highway gemm equals ref::gemm on awkward shapes, f32 and bf16 weights", "[hwy][projections]") {
  const int64_t Ms[] = {1, 3, 7, 33};
  const int64_t Ns[] = {1, 31, 33, 96};
  const int64_t Ks[] = {1, 17, 1152};
  const auto isas = g3test::highway_test_isas();  // prints what it skips
  uint32_t seed = 1;
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t M : Ms)
      for (int64_t N : Ns)
        for (int64_t K : Ks) {
          const Problem p = make_problem(M, K, N, dt, 0, seed++);
          const Expected e = expected(p);
          for (const auto& isa : isas) {
            INFO(isa << " " << dtype_name(dt) << " M=" << M << " N=" << N << " K=" << K);
            CHECK(run_and_check(g3::highway_gemm(isa), p, e, 0, N, N) == 0);
          }
        }
}

TEST_CASE("highway gemm: blocked path across K and M blocks, GEMV/tile boundaries", "[hwy][projections]") {
  // M around the GEMV groups (4 rows) and limit (16), the row tiles (4, 6,
  // 12 rows), M and K past the cache blocks (M block 192 rows, K block 512),
  // K tails.
  struct Shape {
    int64_t M, K, N;
  };
  const Shape shapes[] = {{4, 300, 64},  {5, 513, 40},  {16, 256, 32},  {17, 1025, 65},
                          {25, 100, 96}, {24, 512, 33}, {200, 600, 70}, {197, 1100, 40}};
  const auto isas = g3test::highway_test_isas();  // prints what it skips
  uint32_t seed = 1000;
  for (DType dt : {DType::F32, DType::BF16})
    for (const Shape& s : shapes) {
      const Problem p = make_problem(s.M, s.K, s.N, dt, 0, seed++);
      const Expected e = expected(p);
      for (const auto& isa : isas) {
        INFO(isa << " " << dtype_name(dt) << " M=" << s.M << " N=" << s.N << " K=" << s.K);
        CHECK(run_and_check(g3::highway_gemm(isa), p, e, 0, s.N, s.N) == 0);
      }
    }
}

TEST_CASE("highway gemm: panel sub-ranges and strides; a split equals the whole bit for bit",
          "[hwy][projections]") {
  // N = 100: panels [0,32) [32,64) [64,96) [96,100) with the last one
  // zero-padded. lda and ldc are larger than K and N; the padding columns of
  // a and c hold a sentinel that must neither be read nor written.
  const auto isas = g3test::highway_test_isas();  // prints what it skips
  for (DType dt : {DType::F32, DType::BF16})
    for (int64_t M : {1, 2, 7, 40}) {  // GEMV groups and the blocked path
      const int64_t K = 77, N = 100, ldc = N + 13;
      const Problem p = make_problem(M, K, N, dt, 9, 77 + static_cast<uint32_t>(M));
      const Expected e = expected(p);
      const std::pair<int64_t, int64_t> ranges[] = {{0, 32}, {32, 64}, {64, 100}, {96, 100}, {32, 100}, {0, 100}};
      for (const auto& isa : isas) {
        const g3_gemm_fn fn = g3::highway_gemm(isa);
        for (auto [n0, n1] : ranges) {
          INFO(isa << " " << dtype_name(dt) << " M=" << M << " range [" << n0 << "," << n1 << ")");
          CHECK(run_and_check(fn, p, e, n0, n1, ldc) == 0);
        }
        // Threads split by panels, so a split must not change any value.
        std::vector<float> whole, lo, hi;
        run_and_check(fn, p, e, 0, N, ldc, &whole);
        run_and_check(fn, p, e, 0, 64, ldc, &lo);
        run_and_check(fn, p, e, 64, N, ldc, &hi);
        bool same = true;
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            const float v = n < 64 ? lo[m * ldc + n] : hi[m * ldc + n];
            same = same && std::memcmp(&v, &whole[m * ldc + n], sizeof v) == 0;
          }
        INFO(isa << " " << dtype_name(dt) << " M=" << M);
        CHECK(same);
      }
    }
}

TEST_CASE("highway gemm: empty work writes nothing, K = 0 writes zeros", "[hwy][projections]") {
  const Problem p = make_problem(3, 5, 40, DType::F32, 0, 5);
  for (const auto& isa : g3test::highway_test_isas()) {
    INFO(isa);
    const g3_gemm_fn fn = g3::highway_gemm(isa);
    std::vector<float> c(3 * 40, kSentinel);
    g3_gemm_args g = p.w.args(p.a.data(), 3, p.lda, c.data(), 40, 32, 32);
    fn(&g);
    g = p.w.args(p.a.data(), 0, p.lda, c.data(), 40, 0, 40);
    fn(&g);
    bool untouched = true;
    for (float v : c) untouched = untouched && v == kSentinel;
    CHECK(untouched);
    g = p.w.args(p.a.data(), 3, p.lda, c.data(), 40, 0, 40);
    g.K = 0;
    fn(&g);
    bool zeros = true;
    for (float v : c) zeros = zeros && v == 0.0f;
    CHECK(zeros);
  }
}

TEST_CASE("highway rmsnorm equals ref::rmsnorm, with and without residual, in place", "[hwy][projections]") {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f), uw(-0.5f, 0.5f);
  const int64_t ns[] = {1, 7, 16, 33, 256, 1003, 1152};
  const int64_t rows = 3;
  const auto isas = g3test::highway_test_isas();  // prints what it skips
  for (int64_t n : ns) {
    const int64_t xs = n + 3, ys = n + 5;
    std::vector<float> x(rows * xs, kSentinel), w(n), res(rows * ys, kSentinel);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < n; ++i) {
        x[r * xs + i] = u(rng);
        res[r * ys + i] = u(rng);
      }
    for (auto& v : w) v = uw(rng);
    const float eps = 1e-6f;
    for (bool with_res : {false, true}) {
      std::vector<float> ref(rows * ys, kSentinel);
      g3::ref::rmsnorm(x.data(), rows, n, xs, w.data(), eps, with_res ? res.data() : nullptr, ref.data(), ys);
      for (const auto& isa : isas) {
        INFO(isa << " n=" << n << " residual=" << with_res);
        const g3_rmsnorm_fn fn = g3::highway_rmsnorm(isa);
        std::vector<float> y(rows * ys, kSentinel);
        fn(x.data(), rows, n, xs, w.data(), eps, with_res ? res.data() : nullptr, y.data(), ys);
        int64_t bad = 0;
        for (int64_t i = 0; i < rows * ys; ++i) {
          const bool data = i % ys < n;
          if (data ? !(std::fabs(y[i] - ref[i]) <= 2e-5 + 2e-5 * std::fabs(ref[i])) : y[i] != kSentinel) ++bad;
        }
        CHECK(bad == 0);

        // In place: y aliases x (same stride), and the residual may be the
        // very buffer being normalised into, as in h = x + norm(a) written
        // over the residual stream.
        std::vector<float> inplace(rows * ys, kSentinel);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < n; ++i) inplace[r * ys + i] = x[r * xs + i];
        std::vector<float> ref2(rows * ys, kSentinel);
        g3::ref::rmsnorm(inplace.data(), rows, n, ys, w.data(), eps, with_res ? res.data() : nullptr, ref2.data(),
                         ys);
        fn(inplace.data(), rows, n, ys, w.data(), eps, with_res ? res.data() : nullptr, inplace.data(), ys);
        bad = 0;
        for (int64_t i = 0; i < rows * ys; ++i) {
          const bool data = i % ys < n;
          if (data ? !(std::fabs(inplace[i] - ref2[i]) <= 2e-5 + 2e-5 * std::fabs(ref2[i]))
                   : inplace[i] != kSentinel)
            ++bad;
        }
        CHECK(bad == 0);

        if (with_res) {
          std::vector<float> stream = res;  // y and residual are one buffer
          fn(x.data(), rows, n, xs, w.data(), eps, stream.data(), stream.data(), ys);
          bad = 0;
          for (int64_t i = 0; i < rows * ys; ++i)
            if (i % ys < n && !(std::fabs(stream[i] - ref[i]) <= 2e-5 + 2e-5 * std::fabs(ref[i]))) ++bad;
          CHECK(bad == 0);
        }
      }
    }
  }
}
