// What only the Xbyak backend has: availability by ISA cap and key, and the
// vdpbf16ps path, a compute mode of its own that a caller must opt into
// (xbyak::Options), tested here against the reference with a tolerance
// derived for bf16 dot products. Its public kernels (f32 and bf16 K/V
// widened, no vdpbf16ps) are checked on avx2 and avx3 by the conformance
// suite (test_conformance: core, block, golden cases).
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "generator/backend_api.h"
#include "generator/errors.h"
#include "generator/xbyak/xbyak_core.h"
#include "runtime/dispatch/isa.h"
#include "runtime/reference/reference.h"
#include "tests/support/kernel_calls.h"
#include "tests/support/test_support.h"

namespace {

g3::KernelKey key_for(const g3test::CoreSpec& s) {
  return {.head_dim = s.head_dim, .group = s.group, .window = s.window, .rope_base = 10000, .alpha = 0.0625f,
          .kv_dtype = s.kv};
}

// One bf16 K/V call with vdpbf16ps allowed, against the reference. With
// vdpbf16ps the tolerance widens by the derived bound (see inside).
void check_dot_case(const g3test::CoreSpec& spec, const std::string& cap) {
  const g3test::CoreCall d = g3test::CoreCall::random(spec);
  const int64_t T = spec.T, S = spec.S, H = spec.head_dim, G = spec.group;
  const g3::KernelKey key = key_for(spec);

  g3::xbyak::Options opt;
  opt.allow_bf16_dot = true;
  g3::xbyak::CoreConfig cfg;
  std::string why;
  REQUIRE(g3::xbyak::plan(key, cap, opt, &cfg, &why));
  const bool used_dot = cfg.bf16_dot;
  if (cap == "avx3") {
    g3::xbyak::CoreConfig again;
    g3::xbyak::plan(key, cap, opt, &again, &why);
    CHECK(used_dot == again.bf16_dot);  // used whenever allowed and the CPU has AVX512_BF16
  }
  // bf16 KV alone is storage: the public entry never rounds q or p.
  g3::xbyak::CoreConfig plain;
  g3::xbyak::plan(key, cap, {}, &plain, &why);
  CHECK_FALSE(plain.bf16_dot);

  const g3::BackendKernels bk = g3::xbyak::kernels(key, cap, opt);
  REQUIRE(bk.table.core != nullptr);
  const g3test::CoreCall::Outputs want = d.run(&g3::ref::core), got = d.run(bk.table.core);

  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g) {
      const float* o = &got.out[size_t(t * d.out_stride + g * H)];
      const float* w = &want.out[size_t(t * d.out_stride + g * H)];
      const float* qh = &d.q[size_t(t * d.q_stride + g * H)];
      // vdpbf16ps rounds q (per element) and p (per weight) to bf16, unit
      // roundoff u = 2^-9. A logit then moves by at most
      //   eps = u * sum_h |q_h k_h|   (k is already bf16: exact),
      // which changes each softmax weight by a factor within e^(+-2 eps), so
      // the output moves by at most (e^(2 eps) - 1) * max|v|; rounding p
      // adds at most u * max|v| (the denominator keeps the f32 p). The test
      // uses 2u (a factor 2 of headroom for f32 accumulation order) and the
      // largest eps over the visible keys of the row; the same eps bounds lse.
      double eps = 0, vmax = 0;
      if (used_dot) {
        const double u = std::ldexp(1.0, -8);
        for (int64_t s = 0; s < S; ++s) {
          const int64_t kp = d.kpos[size_t(s)], qp = d.qpos[size_t(t)];
          if (!d.kvalid[size_t(s)] || kp > qp || (spec.window > 0 && qp - kp >= spec.window)) continue;
          double acc = 0;
          for (int64_t h = 0; h < H; ++h) acc += std::fabs(double(qh[h]) * d.kf[size_t(s * H + h)]);
          eps = std::max(eps, u * acc);
          for (int64_t h = 0; h < H; ++h) vmax = std::max(vmax, std::fabs(double(d.vf[size_t(s * H + h)])));
        }
      }
      const double extra = used_dot ? (std::expm1(2 * eps) + std::ldexp(1.0, -8)) * vmax : 0.0;
      for (int64_t h = 0; h < H; ++h) {
        const double tol = 2e-5 + 2e-5 * std::fabs(w[h]) + extra;
        if (!(std::fabs(double(o[h]) - w[h]) <= tol)) {
          FAIL_CHECK("dh " << H << " G " << G << " W " << spec.window << " T " << T << " S " << S << " dot "
                           << used_dot << " cap " << cap << ": out[" << t << "][" << g << "][" << h << "] = " << o[h]
                           << ", reference " << w[h] << " (tol " << tol << ")");
          return;
        }
      }
      const float wl = want.lse[size_t(t * G + g)], gl = got.lse[size_t(t * G + g)];
      if (std::isinf(wl)) {
        CHECK(std::isinf(gl));
        CHECK(gl < 0);
      } else {
        CHECK(std::fabs(double(gl) - wl) <= 2e-5 + 2e-5 * std::fabs(wl) + eps);
      }
    }
}

}  // namespace

TEST_CASE("xbyak with vdpbf16ps allowed stays within its derived bound of the reference", "[xbyak][core][bf16]") {
  // The caps this CPU runs; the kernels are called directly, so Highway
  // need not be compiled for the cap.
  std::vector<std::string> caps;
  for (const std::string cap : {"avx2", "avx3"})
    if (g3test::backend_runs_here("xbyak", cap, g3test::Through::Kernel)) caps.push_back(cap);
  if (caps.empty()) {
    WARN("this CPU has no AVX2+FMA: the xbyak backend is unavailable, nothing to test");
    return;
  }
  uint32_t seed = 1;
  for (const auto& cap : caps)
    for (int dh : {64, 128, 256})
      for (int G : {1, 2, 4, 8})
        for (int W : {0, 37}) {
          // The tile grid of the conformance suite: T = 1 (decode), T no
          // multiple of the query tile, contexts ending mid-block; the
          // longest shape only at head_dim 64 to stay fast.
          std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 77}, {3, 40}, {13, 13}, {45, 150}};
          if (dh == 64) shapes.push_back({150, 301});
          for (auto [T, S] : shapes)
            check_dot_case({.head_dim = dh, .group = G, .window = W, .T = T, .S = S, .kv = g3::DType::BF16,
                            .invalid = 1.0 / 9, .values = g3test::CoreSpec::Values::Uniform, .q_scale = 1,
                            .seed = seed++},
                           cap);
        }
}

TEST_CASE("xbyak never rounds q or p without the opt-in, on f32 or bf16 K/V", "[xbyak][bf16]") {
  for (const std::string cap : {"avx2", "avx3"}) {
    if (!g3test::backend_runs_here("xbyak", cap, g3test::Through::Kernel)) continue;
    for (int dh : {64, 128, 256})
      for (int G : {1, 2, 4, 8})
        for (int W : {0, 37})
          for (g3::DType kv : {g3::DType::F32, g3::DType::BF16}) {
            g3::xbyak::CoreConfig cfg;
            std::string why;
            REQUIRE(g3::xbyak::plan(key_for({.head_dim = dh, .group = G, .window = W, .kv = kv}), cap, {}, &cfg, &why));
            INFO(cap << " dh " << dh << " G " << G << " W " << W << " kv " << g3::to_string(kv));
            CHECK_FALSE(cfg.bf16_dot);
          }
  }
}

TEST_CASE("xbyak availability follows the ISA cap and the key", "[xbyak]") {
  g3::KernelKey k = key_for({.head_dim = 256, .group = 2});
  std::string why;
  CHECK_FALSE(g3::xbyak_available(k, "sse4", &why));
  CHECK(why.find("below avx2") != std::string::npos);
  CHECK_FALSE(g3::xbyak_available(k, "scalar", &why));
  if (g3::isa_supported_by_cpu("avx2")) {
    CHECK(g3::xbyak_available(k, "avx2", &why));
    g3::BackendKernels b = g3::xbyak_kernels(k, "avx2");
    CHECK(b.isa == "avx2");
    CHECK(b.table.core != nullptr);
    CHECK(b.table.qk == nullptr);  // taken from Highway by the registry
    // How long generation took is reported (compile_ms) but not asserted:
    // times belong in `g3attn bench`, not in a test on a shared machine.
    CHECK(b.compile_ms >= 0);
    k.head_dim = 100;  // not a multiple of the vector width
    CHECK_FALSE(g3::xbyak_available(k, "avx2", &why));
    CHECK(why.find("head_dim 100") != std::string::npos);
    CHECK_THROWS_AS(g3::xbyak_kernels(k, "avx2"), g3::InputError);
  }
  if (g3::isa_supported_by_cpu("avx3")) {
    k.head_dim = 128;
    g3::BackendKernels b = g3::xbyak_kernels(k, "avx3_dl");
    CHECK(b.isa == "avx3");
  }
}
