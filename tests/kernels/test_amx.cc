// The AMX attention core (generator/xbyak/amx_core.h): against the scalar
// reference in the bf16 compute mode at a bound derived below, which a core
// that drops one visible key exceeds; both Gemma head dims and others, both
// layer kinds, contexts ending mid-block, ring slots in any order, invalid
// slots holding NaN, f32 and bf16 KV, T from 1 to a few hundred; its routing
// through the backend table; and the refusal paths (no AMX, G3ATTN_AMX=off,
// a kernel that refuses the tile data), which must name their reason and
// fall back, never crash. On a CPU without AMX the kernel tests print
// "skipped: amx avx3_dl (why)" and pass; the refusal tests run everywhere.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "generator/bf16.h"
#include "generator/errors.h"
#include "generator/xbyak/amx_core.h"
#include "generator/xbyak/amx_permission.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/kernel_registry.h"
#include "runtime/reference/reference.h"
#include "templates/mask_rule.h"
#include "tests/support/kernel_calls.h"
#include "tests/support/test_support.h"

namespace {

using g3test::CoreCall;
using g3test::CoreSpec;

g3::KernelKey key_for(const CoreSpec& s, g3::DType compute = g3::DType::BF16) {
  return {.head_dim = s.head_dim, .group = s.group, .window = s.window, .rope_base = 10000, .alpha = 0.0625f,
          .kv_dtype = s.kv, .compute = compute};
}

// Whether the AMX core runs here; prints the skip line the suites use when not.
bool amx_runs_here() {
  std::string why;
  if (!g3::isa_compiled("avx3_dl")) why = "avx3_dl is not compiled into this build";
  else if (!g3::amx_available(key_for({.head_dim = 128, .group = 2}), "avx3_dl", &why)) {}
  if (why.empty()) return true;
  std::printf("skipped: amx avx3_dl (%s)\n", why.c_str());
  std::fflush(stdout);
  return false;
}

double bf16r(double x) { return double(g3::bf16_to_f32(g3::f32_to_bf16(float(x)))); }

// The bound, per output element, of a core in the bf16 compute mode against
// the reference (kernel_contract.h: out = sum_s bf16(p_s) bf16(v_s) / sum_s
// p_s, logits from bf16(q) and bf16(k)). The reference computes in double.
//
// Logits. Products of two bf16 values are exact in f32, so a core's logit
// differs from the reference's only by its f32 sums: |dl_s| <= dh 2^-24
// sum_h |q_h k_h| (n u for n = dh additions in any order). The softmax in f32
// adds the rounding of logit - max and of exp (a few ulps) and of the
// online rescale factors (one per block); together every weight p_s is
// computed as c p_s (1 + d_s) with a common c and
//   |d_s| <= eps = 2 max_s |dl_s| + 2^-24 (max_s |l_s - max| + 3 nblocks + 8).
// Weights. The product takes bf16(p): the core rounds its p (relative to its
// running max) and the reference rounds its own p (relative to the final
// max), independently; each rounding moves p by at most 2^-8 of itself (the
// bf16 unit roundoff), so the two rounded weights differ by at most
// (2^-7 + eps) p_s. With A_h = sum_s p_s |v_sh| / sum_s p_s and the
// denominators differing by eps, the outputs differ by at most
//   (2^-7 + 2.1 eps) A_h + eps |out_h| + 4 S 2^-24 A_h
// where the last term is the f32 accumulation of the P.V sums and their
// rescales. lse = max + log(sum p) moves by at most 2 eps. A run that drops
// one visible key changes its row by p_s |v_s - out| / sum p, far above this.
struct BoundCheck {
  double worst = 0;  // max over elements of |got - want| / bound (> 1: exceeded)
  std::string where;
};

BoundCheck check_bound(const CoreCall& d, const CoreCall::Outputs& got, const CoreCall::Outputs& want) {
  const CoreSpec& sp = d.spec;
  const int64_t T = sp.T, S = sp.S, H = sp.head_dim, G = sp.group;
  const g3_core_args a = d.args(nullptr, nullptr);
  BoundCheck r;
  auto note = [&](double ratio, const std::string& what) {
    if (ratio > r.worst || std::isnan(ratio)) {
      r.worst = std::isnan(ratio) ? INFINITY : ratio;
      r.where = what;
    }
  };
  std::vector<double> l(static_cast<size_t>(S)), p(l.size()), mag(l.size());
  for (int64_t t = 0; t < T; ++t) {
    const g3_row_bounds rb = g3_bounds_of(&a, t);
    for (int64_t g = 0; g < G; ++g) {
      const float* q = &d.q[size_t(t * d.q_stride + g * H)];
      const float* o = &got.out[size_t(t * d.out_stride + g * H)];
      const float* w = &want.out[size_t(t * d.out_stride + g * H)];
      const std::string at = "row t " + std::to_string(t) + " g " + std::to_string(g);
      double mx = -INFINITY;
      for (int64_t s = 0; s < S; ++s) {
        l[size_t(s)] = -INFINITY;
        if (!g3_visible(rb, s, d.kpos[size_t(s)], d.kvalid[size_t(s)])) continue;
        double acc = 0, m = 0;
        for (int64_t h = 0; h < H; ++h) {
          const double x = bf16r(q[h]) * bf16r(d.kf[size_t(s * H + h)]);
          acc += x;
          m += std::fabs(x);
        }
        l[size_t(s)] = acc;
        mag[size_t(s)] = m;
        mx = std::max(mx, acc);
      }
      if (mx == -INFINITY) {  // no visible key: zeros and lse = -inf
        for (int64_t h = 0; h < H; ++h)
          if (o[h] != 0.f) note(INFINITY, at + ": sees no key but out[" + std::to_string(h) + "] != 0");
        if (sp.lse && !(std::isinf(got.lse[size_t(t * G + g)]) && got.lse[size_t(t * G + g)] < 0))
          note(INFINITY, at + ": sees no key but lse != -inf");
        continue;
      }
      double L = 0, dl = 0, spread = 0;
      for (int64_t s = 0; s < S; ++s) {
        if (l[size_t(s)] == -INFINITY) {
          p[size_t(s)] = 0;
          continue;
        }
        p[size_t(s)] = std::exp(l[size_t(s)] - mx);
        L += p[size_t(s)];
        dl = std::max(dl, H * std::ldexp(1.0, -24) * mag[size_t(s)]);
        spread = std::max(spread, mx - l[size_t(s)]);
      }
      const double eps = 2 * dl + std::ldexp(1.0, -24) * (spread + 3.0 * (S / 16 + 1) + 8);
      for (int64_t h = 0; h < H; ++h) {
        double A = 0;
        for (int64_t s = 0; s < S; ++s)
          if (p[size_t(s)] != 0) A += p[size_t(s)] * std::fabs(double(d.vf[size_t(s * H + h)]));
        A /= L;
        const double bound = (std::ldexp(1.0, -7) + std::ldexp(1.0, -14) + 2.1 * eps) * A + eps * std::fabs(w[h]) +
                             4.0 * S * std::ldexp(1.0, -24) * A + 1e-7;
        note(std::fabs(double(o[h]) - w[h]) / bound,
             at + " h " + std::to_string(h) + ": " + std::to_string(o[h]) + " vs reference " + std::to_string(w[h]));
      }
      if (sp.lse) {
        const double gl = got.lse[size_t(t * G + g)], wl = want.lse[size_t(t * G + g)];
        note(std::fabs(gl - wl) / (2 * eps + 1e-6 * (1 + std::fabs(wl))),
             at + ": lse " + std::to_string(gl) + " vs reference " + std::to_string(wl));
      }
    }
  }
  return r;
}

// The reference in the bf16 compute mode on the same inputs.
CoreCall::Outputs reference(const CoreCall& d) {
  CoreCall c = d;
  c.spec.compute = g3::DType::BF16;
  return c.run(&g3::ref::core);
}

std::string describe(const CoreSpec& s) {
  return "dh " + std::to_string(s.head_dim) + " G " + std::to_string(s.group) + " W " + std::to_string(s.window) +
         " T " + std::to_string(s.T) + " S " + std::to_string(s.S) + " kv " + g3::to_string(s.kv) +
         (s.causal == G3_CAUSAL_SLOTS ? " slots" : " positions") + " order " + std::to_string(int(s.order));
}

// One call on the AMX tiles (min_rows 0: even T = 1 runs on the tiles)
// against the reference; returns the worst ratio to the bound.
double amx_case(CoreSpec spec, int min_rows = 0) {
  spec.compute = g3::DType::BF16;
  const CoreCall d = CoreCall::random(spec);
  const g3::BackendKernels k = g3::amx::kernels(key_for(spec), "avx3_dl", {.min_rows = min_rows});
  REQUIRE(k.table.core != nullptr);
  const CoreCall::Outputs got = d.run(k.table.core), want = reference(d);
  // The stride padding of out must stay untouched.
  for (int64_t t = 0; t < spec.T; ++t)
    for (int64_t i = spec.group * spec.head_dim; i < d.out_stride; ++i)
      REQUIRE(got.out[size_t(t * d.out_stride + i)] == CoreCall::kGarbage);
  const bool tiles = spec.T * spec.group >= min_rows;
  const BoundCheck b = check_bound(d, got, want);
  INFO(describe(spec) << (tiles ? " on the tiles" : " on the highway delegate") << ": worst " << b.worst << " of the bound at "
                      << b.where);
  CHECK(b.worst <= 1.0);
  return b.worst;
}

}  // namespace

TEST_CASE("amx core stays within the bf16 bound of the reference", "[amx][core][bf16]") {
  if (!amx_runs_here()) return;
  uint32_t seed = 11;
  double worst = 0;
  // Calls of 1 to 300 tokens; contexts ending mid-block (the block is 128
  // keys) and spanning several blocks; the longest only at the Gemma dims.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 77}, {3, 40}, {13, 13}, {45, 150}, {70, 301}};
  for (int dh : {128, 256})
    for (int G : {1, 2, 4})
      for (int W : {0, 61})
        for (g3::DType kv : {g3::DType::F32, g3::DType::BF16})
          for (auto [T, S] : shapes)
            worst = std::max(worst, amx_case({.head_dim = dh, .group = G, .window = W, .T = T, .S = S, .kv = kv,
                                              .order = g3test::SlotOrder(seed % 3), .seed = seed++}));
  std::printf("amx vs reference, bf16 compute: worst %.3f of the derived bound\n", worst);
}

TEST_CASE("amx core: long calls, ring slots, token-order causality, no lse, other head dims", "[amx][core][bf16]") {
  if (!amx_runs_here()) return;
  uint32_t seed = 101;
  for (g3::DType kv : {g3::DType::F32, g3::DType::BF16}) {
    // A few hundred tokens over several blocks, global and local, each slot order.
    for (auto order : {g3test::SlotOrder::Sorted, g3test::SlotOrder::Ring, g3test::SlotOrder::Shuffled})
      for (int W : {0, 150})
        amx_case({.head_dim = 256, .group = 2, .window = W, .T = 300, .S = 700, .kv = kv, .order = order,
                  .seed = seed++});
    // A local layer's ring as the runtime keeps it (W + 511 slots, wrapped),
    // queried by a prefill tile of 64 tokens.
    amx_case({.head_dim = 128, .group = 2, .window = 1024, .T = 64, .S = 1535, .kv = kv,
              .order = g3test::SlotOrder::Ring, .invalid = 0.02, .seed = seed++});
    // The keys are the call's own tokens (no cache): causality by slot order.
    for (int W : {0, 40})
      amx_case({.head_dim = 128, .group = 2, .window = W, .T = 260, .S = 260, .kv = kv, .causal = G3_CAUSAL_SLOTS,
                .seed = seed++});
    // Queries in no order, no lse asked for, mostly invalid slots.
    amx_case({.head_dim = 128, .group = 8, .T = 33, .S = 200, .kv = kv, .shuffle_queries = true, .invalid = 0.6,
              .lse = false, .seed = seed++});
    // Head dims other than Gemma's: any multiple of 32.
    for (int dh : {32, 96, 512})
      amx_case({.head_dim = dh, .group = 2, .window = dh == 96 ? 50 : 0, .T = 20, .S = 150, .kv = kv,
                .seed = seed++});
  }
}

TEST_CASE("amx core: the bound fails when one visible key is dropped", "[amx][core][bf16]") {
  if (!amx_runs_here()) return;
  for (int dh : {128, 256}) {
    CoreSpec spec{.head_dim = dh, .group = 2, .T = 40, .S = 300, .kv = g3::DType::BF16,
                  .compute = g3::DType::BF16, .seed = 7};
    const CoreCall d = CoreCall::random(spec);
    const g3::BackendKernels k = g3::amx::kernels(key_for(spec), "avx3_dl", {.min_rows = 0});
    const CoreCall::Outputs got = d.run(k.table.core), want = reference(d);
    REQUIRE(check_bound(d, got, want).worst <= 1.0);
    // Drop the key with the largest weight of some row (t, g = 0): the
    // reference of that input must differ from the AMX output past the bound.
    const g3_core_args a = d.args(nullptr, nullptr);
    int64_t best_s = -1;
    double best_l = -INFINITY;
    const int64_t t = spec.T - 1;
    const g3_row_bounds rb = g3_bounds_of(&a, t);
    for (int64_t s = 0; s < spec.S; ++s) {
      if (!g3_visible(rb, s, d.kpos[size_t(s)], d.kvalid[size_t(s)])) continue;
      double acc = 0;
      for (int64_t h = 0; h < dh; ++h) acc += double(d.q[size_t(t * d.q_stride + h)]) * d.kf[size_t(s * dh + h)];
      if (acc > best_l) best_l = acc, best_s = s;
    }
    REQUIRE(best_s >= 0);
    CoreCall dropped = d;
    dropped.kvalid[size_t(best_s)] = 0;
    const BoundCheck b = check_bound(d, got, reference(dropped));
    INFO("dh " << dh << ": dropping slot " << best_s << " gives " << b.worst << " of the bound at " << b.where);
    CHECK(b.worst > 1.0);
    std::printf("amx, dh %d: one visible key dropped gives %.1f times the bound\n", dh, b.worst);
  }
}

TEST_CASE("amx core: decode-sized calls go to the highway core of the key", "[amx][core][bf16]") {
  if (!amx_runs_here()) return;
  // The default kernels send calls of fewer than 16 rows (T x G) to the
  // Highway core of the same key, which computes in the bf16 mode too: the
  // same bound holds.
  uint32_t seed = 301;
  for (int G : {1, 2, 8})
    for (int W : {0, 61})
      for (int64_t T : {1, 2, 7})
        amx_case({.head_dim = 256, .group = G, .window = W, .T = T, .S = 333, .seed = seed++}, /*min_rows=*/16);
}

TEST_CASE("amx core: NaN or Inf in invalid slots never reach an output", "[amx][core][bf16]") {
  if (!amx_runs_here()) return;
  for (g3::DType kv : {g3::DType::F32, g3::DType::BF16}) {
    CoreSpec spec{.head_dim = 128, .group = 2, .window = 0, .T = 50, .S = 260, .kv = kv,
                  .compute = g3::DType::BF16, .invalid = 0.3, .seed = 5};
    CoreCall d = CoreCall::random(spec);
    const g3::BackendKernels k = g3::amx::kernels(key_for(spec), "avx3_dl", {.min_rows = 0});
    d.fill_invalid(0.f);
    const CoreCall::Outputs zero = d.run(k.table.core);
    for (float junk : {NAN, INFINITY, -INFINITY, 3e38f}) {
      d.fill_invalid(junk);
      const CoreCall::Outputs o = d.run(k.table.core);
      INFO(g3::to_string(kv) << " invalid slots holding " << junk);
      CHECK(o.out == zero.out);  // bit for bit: their weights are exactly 0
      CHECK(o.lse == zero.lse);
    }
  }
}

TEST_CASE("amx core: threads calling one kernel at once agree with one thread", "[amx][core]") {
  if (!amx_runs_here()) return;
  // Tile configuration and buffers are per thread and per call.
  const CoreSpec spec{.head_dim = 256, .group = 2, .window = 0, .T = 64, .S = 500, .kv = g3::DType::BF16,
                      .compute = g3::DType::BF16, .seed = 9};
  const CoreCall d = CoreCall::random(spec);
  const g3::BackendKernels k = g3::amx::kernels(key_for(spec), "avx3_dl", {});
  const CoreCall::Outputs one = d.run(k.table.core);
  std::vector<CoreCall::Outputs> outs(4);
  std::vector<std::thread> th;
  for (auto& o : outs) th.emplace_back([&] { o = d.run(k.table.core); });
  for (auto& x : th) x.join();
  for (const auto& o : outs) CHECK(o.out == one.out);
}

TEST_CASE("amx routing: the backend table serves bf16-compute keys and says why not otherwise", "[amx][routing]") {
  const g3::KernelKey bf = key_for({.head_dim = 256, .group = 2});
  const g3::KernelKey f32 = key_for({.head_dim = 256, .group = 2}, g3::DType::F32);
  REQUIRE(g3::find_backend("amx") != nullptr);
  CHECK(g3::parse_backend("amx") == "amx");
  // auto below follows its static rule: no tune profile in this cache dir.
  g3test::ScratchJitCache no_profile;
  std::string why;
  // Reasons that hold on any CPU come after the CPU's own: check them only
  // where AMX itself is there.
  if (!amx_runs_here()) {
    CHECK_FALSE(g3::amx_available(bf, "avx3_dl", &why));
    CHECK_FALSE(why.empty());
    CHECK_THROWS_AS(g3::amx_kernels(bf, "avx3_dl"), g3::InputError);
    if (g3::isa_compiled("avx3") && g3::isa_supported_by_cpu("avx3")) {
      const g3::KernelChoice c = g3::kernels_for(bf, "amx", "avx3");
      CHECK(c.backend == "highway");
      CHECK(c.fallback.find("amx unavailable") != std::string::npos);
      CHECK(g3::kernels_for(bf, "auto", "avx3", g3::Phase::Prefill).backend == "highway");
    }
    return;
  }
  CHECK_FALSE(g3::amx_available(f32, "avx3_dl", &why));
  CHECK(why.find("f32 compute mode") != std::string::npos);
  CHECK_FALSE(g3::amx_available(bf, "avx3", &why));
  CHECK(why.find("avx3_dl or best") != std::string::npos);
  g3::KernelKey odd = bf;
  odd.head_dim = 100;
  CHECK_FALSE(g3::amx_available(odd, "avx3_dl", &why));
  CHECK(why.find("head_dim 100") != std::string::npos);
  CHECK_THROWS_AS(g3::amx_kernels(odd, "avx3_dl"), g3::InputError);

  // Through the registry: amx serves the core, Highway every other stage.
  const g3::KernelChoice c = g3::kernels_for(bf, "amx", "avx3_dl");
  CHECK(c.backend == "amx");
  CHECK(c.fallback.empty());
  CHECK(c.stages[g3::Stage::Core] == "amx");
  CHECK(c.stages[g3::Stage::Qk] == "highway");
  CHECK(c.stages[g3::Stage::Gemm] == "highway");
  // An f32-compute key or a lower cap falls back to Highway, saying why.
  const g3::KernelChoice cf = g3::kernels_for(f32, "amx", "avx3_dl");
  CHECK(cf.backend == "highway");
  CHECK(cf.fallback.find("amx unavailable (the amx core computes in bf16") != std::string::npos);
  if (g3::isa_compiled("avx3")) CHECK(g3::kernels_for(bf, "amx", "avx3").backend == "highway");
  // auto's static rule: prefill of the bf16 mode on the AMX core, decode and
  // the f32 mode on Highway.
  const g3::KernelChoice ap = g3::kernels_for(bf, "auto", "avx3_dl", g3::Phase::Prefill);
  CHECK(ap.backend == "amx");
  CHECK(ap.source == "static rule");
  CHECK(g3::kernels_for(bf, "auto", "avx3_dl", g3::Phase::Decode).backend == "highway");
  CHECK(g3::kernels_for(f32, "auto", "avx3_dl", g3::Phase::Prefill).backend == "highway");
  // The registry's core is the AMX core: within the bound on a prefill call.
  const CoreSpec spec{.head_dim = 256, .group = 2, .T = 40, .S = 200, .compute = g3::DType::BF16, .seed = 3};
  const CoreCall d = CoreCall::random(spec);
  CHECK(check_bound(d, d.run(c.kernels.table.core), reference(d)).worst <= 1.0);
}

TEST_CASE("amx refusal: each reason is named, and the permission request is made once", "[amx][refusal]") {
  using g3::amx::Probe;
  static int calls = 0;
  calls = 0;
  const auto grant = +[]() { return ++calls, 0; };
  const auto refuse = +[]() { return ++calls, EPERM; };
  const auto unsupported = +[]() { return ++calls, EINVAL; };
  const Probe cpu{.amx_tile = true, .amx_bf16 = true, .avx512_bf16 = true};
  auto with = [](Probe p, const char* env, int (*req)()) {
    p.env = env;
    p.request = req;
    return p;
  };
  CHECK(g3::amx::decide(with(cpu, nullptr, grant)).empty());
  CHECK(g3::amx::decide(with(cpu, "on", grant)).empty());
  CHECK(g3::amx::decide(with(cpu, "off", grant)) == "AMX disabled by G3ATTN_AMX=off");
  CHECK(g3::amx::decide(with(cpu, "0", grant)) == "AMX disabled by G3ATTN_AMX=0");
  // The permission request is made only when everything before it holds.
  calls = 0;
  CHECK(g3::amx::decide(with(Probe{}, nullptr, grant)).find("no AMX-BF16") != std::string::npos);
  CHECK(g3::amx::decide(with(Probe{.amx_tile = true, .amx_bf16 = true}, nullptr, grant)).find("AVX512_BF16") !=
        std::string::npos);
  CHECK(calls == 0);
  const std::string perm = g3::amx::decide(with(cpu, nullptr, refuse));
  CHECK(perm.find("Linux refused this process the AMX tile data") != std::string::npos);
  CHECK(perm.find("ARCH_REQ_XCOMP_PERM") != std::string::npos);
  CHECK(perm.find(std::strerror(EPERM)) != std::string::npos);
  CHECK(g3::amx::decide(with(cpu, nullptr, unsupported)).find(std::strerror(EINVAL)) != std::string::npos);
}

TEST_CASE("amx refusal: G3ATTN_AMX=off falls back to highway in the registry and in plan", "[amx][refusal]") {
  const g3::KernelKey bf = key_for({.head_dim = 256, .group = 2});
  const char* saved = std::getenv("G3ATTN_AMX");
  const std::string keep = saved ? saved : "";
  setenv("G3ATTN_AMX", "off", 1);
  std::string why;
  CHECK_FALSE(g3::amx_available(bf, "avx3_dl", &why));
  CHECK(why == "AMX disabled by G3ATTN_AMX=off");
  if (g3::isa_compiled("avx3_dl") && g3::isa_supported_by_cpu("avx3_dl")) {
    const g3::KernelChoice c = g3::kernels_for(bf, "amx", "avx3_dl");
    CHECK(c.backend == "highway");
    CHECK(c.fallback == "amx unavailable (AMX disabled by G3ATTN_AMX=off), using highway");
    CHECK(c.kernels.table.core != nullptr);
  }
  if (saved) setenv("G3ATTN_AMX", keep.c_str(), 1);
  else unsetenv("G3ATTN_AMX");

  // The command: plan names the reason and routes to highway, exit 0.
  const g3test::CmdResult r =
      g3test::run_g3attn({"plan", "--model", "4b", "--backend", "amx", "--compute", "bf16"}, "G3ATTN_AMX=off");
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("amx unavailable (AMX disabled by G3ATTN_AMX=off), using highway") != std::string::npos);
  // Without the variable, on a machine with AMX, plan routes the core to amx.
  if (amx_runs_here()) {
    const g3test::CmdResult ok = g3test::run_g3attn({"plan", "--model", "4b", "--backend", "amx", "--compute", "bf16"});
    INFO(ok.out << ok.err);
    CHECK(ok.exit_code == 0);
    CHECK(ok.out.find("amx unavailable") == std::string::npos);
    CHECK(ok.out.find(" amx ") != std::string::npos);
  }
}
