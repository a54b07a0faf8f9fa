// The Xbyak backend's attention core against the scalar reference
// (ref::core) on random awkward shapes, for every ISA cap this CPU can run,
// with and without vdpbf16ps; and every golden case through run_apply with
// backend "xbyak".
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "generator/backend_api.h"
#include "generator/bf16.h"
#include "generator/errors.h"
#include "generator/xbyak/xbyak_core.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/kernel_registry.h"
#include "runtime/exec/apply.h"
#include "runtime/io/npy.h"
#include "runtime/reference/reference.h"
#include "tests/support/test_support.h"

namespace {

struct Case {
  int dh, G, W;
  int64_t T, S;
  bool bf16;
  uint32_t seed;
};

// Caps to test: each only when this CPU can run code of that level; the
// others are printed as skipped, with the reason. Tests that call the
// backend directly need nothing else; tests through run_apply also need the
// ISA among Highway's compiled targets (backend_runs_here).
std::vector<std::string> caps(bool through_runtime) {
  std::vector<std::string> v;
  for (const std::string cap : {"avx2", "avx3"}) {
    if (through_runtime) {
      if (g3test::backend_runs_here("xbyak", cap)) v.push_back(cap);
    } else if (g3::isa_supported_by_cpu(cap)) {
      v.push_back(cap);
    } else {
      std::printf("skipped: xbyak %s (this CPU cannot run it)\n", cap.c_str());
    }
  }
  return v;
}

g3::KernelKey key_for(const Case& c) {
  g3::KernelKey k;
  k.head_dim = c.dh;
  k.group = c.G;
  k.window = c.W;
  k.rope_base = 10000;
  k.alpha = 0.0625f;
  k.kv_dtype = c.bf16 ? g3::DType::BF16 : g3::DType::F32;
  return k;
}

// Runs one case; returns the number of checked elements. With vdpbf16ps the
// tolerance widens by the derived bound (see the comment inside).
int64_t run_case(const Case& c, const std::string& cap, bool allow_dot, bool* used_dot) {
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<float> U(-1.f, 1.f);
  const int64_t T = c.T, S = c.S, H = c.dh, G = c.G;
  // Queries: q_stride wider than G*H to catch stride mix-ups.
  const int64_t q_stride = G * H + 16, out_stride = G * H + 8;
  std::vector<float> q(size_t(T * q_stride));
  for (auto& x : q) x = U(rng);
  std::vector<float> kf(size_t(S * H)), vf(size_t(S * H));
  for (auto& x : kf) x = U(rng);
  for (auto& x : vf) x = U(rng) * 2.f;
  std::vector<uint16_t> kb(kf.size()), vb(vf.size());
  if (c.bf16) {
    for (size_t i = 0; i < kf.size(); ++i) kb[i] = g3::f32_to_bf16(kf[i]), vb[i] = g3::f32_to_bf16(vf[i]);
    for (size_t i = 0; i < kf.size(); ++i) kf[i] = g3::bf16_to_f32(kb[i]), vf[i] = g3::bf16_to_f32(vb[i]);
  }
  // Slots hold positions 5 .. 5+S-1 in shuffled order (unsorted cache), a
  // few invalid slots; queries at the latest positions, in reverse, plus
  // queries before every key (rows with no visible key).
  std::vector<int32_t> kpos(static_cast<size_t>(S)), qpos(static_cast<size_t>(T));
  for (int64_t s = 0; s < S; ++s) kpos[size_t(s)] = int32_t(5 + s);
  std::shuffle(kpos.begin(), kpos.end(), rng);
  std::vector<uint8_t> kvalid(size_t(S), 1);
  for (int64_t s = 0; s < S; ++s)
    if (rng() % 9 == 0) kvalid[size_t(s)] = 0;
  // Invalid slots hold NaN: nothing of them may reach the output.
  for (int64_t s = 0; s < S; ++s)
    if (!kvalid[size_t(s)])
      for (int64_t h = 0; h < H; ++h) {
        const size_t i = size_t(s * H + h);
        kf[i] = vf[i] = std::numeric_limits<float>::quiet_NaN();
        kb[i] = vb[i] = 0x7fc0;
      }
  for (int64_t t = 0; t < T; ++t) qpos[size_t(t)] = int32_t(5 + S - 1 - t);
  if (T > 3) qpos[1] = 2;  // before every key
  std::vector<float> out(size_t(T * out_stride), 123.f), want(size_t(T * out_stride), 0.f);
  std::vector<float> lse(size_t(T * G)), want_lse(size_t(T * G));

  g3_core_args a{};
  a.T = T;
  a.q = q.data();
  a.q_stride = q_stride;
  a.qpos = qpos.data();
  a.k = c.bf16 ? static_cast<const void*>(kb.data()) : kf.data();
  a.v = c.bf16 ? static_cast<const void*>(vb.data()) : vf.data();
  a.S = S;
  a.kpos = kpos.data();
  a.kvalid = kvalid.data();
  a.out_stride = out_stride;
  a.head_dim = int32_t(H);
  a.group = int32_t(G);
  a.window = c.W;
  a.kv_dtype = c.bf16 ? G3_DTYPE_BF16 : G3_DTYPE_F32;
  a.out = want.data();
  a.lse = want_lse.data();
  g3::ref::core(&a);

  g3::xbyak::Options opt;
  opt.allow_bf16_dot = allow_dot;
  g3::xbyak::CoreConfig cfg;
  std::string why;
  REQUIRE(g3::xbyak::plan(key_for(c), cap, opt, &cfg, &why));
  *used_dot = cfg.bf16_dot;
  g3::BackendKernels bk = g3::xbyak::kernels(key_for(c), cap, opt);
  REQUIRE(bk.table.core != nullptr);
  a.out = out.data();
  a.lse = lse.data();
  bk.table.core(&a);

  int64_t checked = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g) {
      const float* o = &out[size_t(t * out_stride + g * H)];
      const float* w = &want[size_t(t * out_stride + g * H)];
      const float* qh = &q[size_t(t * q_stride + g * H)];
      // vdpbf16ps rounds q (per element) and p (per weight) to bf16, unit
      // roundoff u = 2^-9. A logit then moves by at most
      //   eps = u * sum_h |q_h k_h|   (k is already bf16: exact),
      // which changes each softmax weight by a factor within e^(+-2 eps), so
      // the output moves by at most (e^(2 eps) - 1) * max|v|; rounding p
      // adds at most u * max|v| (the denominator keeps the f32 p). The test
      // uses 2u (a factor 2 of headroom for f32 accumulation order) and the
      // largest eps over the visible keys of the row; the same eps bounds lse.
      double eps = 0, vmax = 0;
      if (*used_dot) {
        const double u = std::ldexp(1.0, -8);
        for (int64_t s = 0; s < S; ++s) {
          const int64_t kp = kpos[size_t(s)], qp = qpos[size_t(t)];
          if (!kvalid[size_t(s)] || kp > qp || (c.W > 0 && qp - kp >= c.W)) continue;
          double acc = 0;
          for (int64_t h = 0; h < H; ++h) acc += std::fabs(double(qh[h]) * kf[size_t(s * H + h)]);
          eps = std::max(eps, u * acc);
          for (int64_t h = 0; h < H; ++h) vmax = std::max(vmax, std::fabs(double(vf[size_t(s * H + h)])));
        }
      }
      const double extra = *used_dot ? (std::expm1(2 * eps) + std::ldexp(1.0, -8)) * vmax : 0.0;
      for (int64_t h = 0; h < H; ++h) {
        const double tol = 2e-5 + 2e-5 * std::fabs(w[h]) + extra;
        if (!(std::fabs(double(o[h]) - w[h]) <= tol)) {
          FAIL_CHECK("dh " << H << " G " << G << " W " << c.W << " T " << T << " S " << S << " bf16 " << c.bf16
                           << " dot " << *used_dot << " cap " << cap << ": out[" << t << "][" << g << "][" << h
                           << "] = " << o[h] << ", reference " << w[h] << " (tol " << tol << ")");
          return checked;
        }
        ++checked;
      }
      const float wl = want_lse[size_t(t * G + g)], gl = lse[size_t(t * G + g)];
      if (std::isinf(wl)) {
        CHECK(std::isinf(gl));
        CHECK(gl < 0);
      } else {
        CHECK(std::fabs(double(gl) - wl) <= 2e-5 + 2e-5 * std::fabs(wl) + eps);
      }
    }
  return checked;
}

}  // namespace

TEST_CASE("xbyak core equals the reference on random awkward shapes", "[xbyak][core]") {
  const auto cs = caps(false);
  if (cs.empty()) {
    WARN("this CPU has no AVX2+FMA: the xbyak backend is unavailable, nothing to test");
    return;
  }
  uint32_t seed = 1;
  for (const auto& cap : cs) {
    for (int dh : {64, 128, 256})
      for (int G : {1, 2, 4, 8})
        for (int W : {0, 37})
          for (int kvmode = 0; kvmode < 3; ++kvmode) {  // f32, bf16 widened, bf16 with vdpbf16ps
            // T = 1 (decode), T not a multiple of the query tile (48 tokens at
            // G = 2 on global layers, 64 rows on local ones), contexts ending
            // mid-block; the longest shape only at head_dim 64 to stay fast.
            std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 77}, {3, 40}, {13, 13}, {45, 150}};
            if (dh == 64) shapes.push_back({150, 301});
            for (auto [T, S] : shapes) {
              Case c{dh, G, W, T, S, kvmode > 0, seed++};
              bool used_dot = false;
              run_case(c, cap, kvmode == 2, &used_dot);
              if (kvmode == 2 && cap == "avx3") {
                std::string why;
                g3::xbyak::CoreConfig cfg;
                g3::xbyak::Options opt;
                opt.allow_bf16_dot = true;
                g3::xbyak::plan(key_for(c), cap, opt, &cfg, &why);
                CHECK(used_dot == cfg.bf16_dot);  // used whenever allowed and the CPU has AVX512_BF16
                // bf16 KV alone is storage: the public entry never rounds q or p.
                g3::xbyak::plan(key_for(c), cap, {}, &cfg, &why);
                CHECK_FALSE(cfg.bf16_dot);
              }
              if (kvmode != 2) CHECK_FALSE(used_dot);
            }
          }
  }
}

TEST_CASE("xbyak availability follows the ISA cap and the key", "[xbyak]") {
  g3::KernelKey k = key_for({256, 2, 0, 1, 1, false, 0});
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

namespace {

void check_golden(const std::string& name, const std::string& isa) {
  g3test::GoldenCheck g = g3test::check_golden_case(name, "xbyak", isa);
  INFO(name << " " << g.backend << " " << g.isa << ": attn max diff " << g.attn_max << ", block max diff "
            << g.block_max);
  CHECK(g.backend == "xbyak");  // a fallback to highway is not a pass
  CHECK(g.isa == isa);
  CHECK(g.bad_attn == 0);
  CHECK(g.bad_block == 0);
}

}  // namespace

TEST_CASE("xbyak reproduces every golden case through run_apply", "[xbyak][golden]") {
  const auto cs = caps(true);
  if (cs.empty()) return;  // caps() printed why
  auto cases = g3test::golden_cases();
  for (const auto& cap : cs)
    for (const auto& c : cases) {
      SECTION(cap + " " + c) { check_golden(c, cap); }
    }
}
