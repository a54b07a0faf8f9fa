// One conformance suite for every attention backend x ISA: the same test
// bodies run on each route, the way Highway runs one test body on every
// target. Each body is instantiated once per backend of the backend table
// (runtime/dispatch/backends.h), as a test named "...: <backend>", and runs
// on every ISA that backend serves here; routes this CPU or build cannot
// run are printed as skipped, by name.
//
// Two kinds of route:
//  - kernel routes call a backend's own build entry for a key and ISA (the
//    reference's contract kernels on scalar, Highway on every target compiled
//    and runnable here, a JIT on every ISA cap this CPU runs where it serves
//    the body's keys: LLVM on all, Xbyak on avx2 and avx3, AMX on avx3_dl in
//    the bf16 compute mode), so what runs is that backend by construction;
//    the kernels must target the ISA asked for;
//  - runtime routes go through the kernel registry (prepare_layer,
//    run_apply), which may fall back: every check asserts that the backend
//    asked for is the one that ran, so a fallback to Highway is never a pass
//    for llvm or xbyak.
//
// What is pinned down here (SPEC 1.3-1.6, templates/kernel_contract.h):
//  - the attention core (g3_core_fn), on f32 and bf16 K/V, on awkward shapes
//    (head_dim 6 to 256 and not a vector multiple, G 1 to 8, windows that
//    are no tile multiple, T = 1, T and S ending mid-tile, empty caches,
//    ring-ordered and shuffled slots, invalid slots holding NaN and junk
//    positions, rows that see no key, lse asked for or not), stays within an
//    error bound derived below from f32 arithmetic against the
//    double-precision reference fed the same K/V, and within 2e-5 + 2e-5
//    |ref|; that bound is tight enough to fail when one key is dropped;
//  - the QK stage (g3_qk_fn) on every route that provides one equals the
//    reference on built-in and generic keys;
//  - slots with kvalid == 0 never touch an output, whatever they hold (NaN,
//    Inf): on every core case the outputs are bit for bit those of the same
//    call with zeros there;
//  - without a cache, causality comes from token order, never from
//    positions: packed documents, repeated positions, gaps and decreasing
//    positions equal the official block on both layer kinds;
//  - every golden case passes through run_apply (`g3attn apply`).
//
// What only one backend has is tested in that backend's suite:
// test_hwy_attention (specialised vs generic kernels), test_llvm and
// test_jit_cache (targets, the memo, the on-disk cache), test_xbyak
// (availability, the vdpbf16ps opt-in path), test_amx (tile permission and
// refusals).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "generator/backend_api.h"
#include "generator/catalogue.h"
#include "runtime/dispatch/backends.h"
#include "runtime/dispatch/kernel_registry.h"
#include "runtime/exec/apply.h"
#include "runtime/exec/block.h"
#include "runtime/reference/reference.h"
#include "templates/mask_rule.h"
#include "tests/support/kernel_calls.h"
#include "tests/support/test_support.h"

namespace {

// JIT objects go to a scratch directory: the suite compiles, and never
// fills the user's cache.
const g3test::ScratchJitCache g_scratch_cache;

using g3test::CoreCall;
using g3test::CoreSpec;
using g3test::QkCall;
using g3test::QkSpec;
using g3test::SlotOrder;

struct Route {
  std::string backend, isa;
  std::string name() const { return backend + " " + isa; }
};

// The ISA caps a JIT is tested on: every one for LLVM; Xbyak's two code
// levels (it serves avx3_dl with its avx3 code).
std::vector<std::string> jit_isas(const std::string& backend) {
  if (backend == "xbyak") return {"avx2", "avx3"};
  return g3::isa_names();
}

// The ISAs a backend's own kernels are tested on for a body whose cases use
// `keys`: the reference on scalar; Highway on every target compiled and
// runnable here; a JIT on every cap this CPU runs (Xbyak on its two code
// levels) where it serves at least one of the keys. A route that serves
// none (Xbyak below avx2, AMX outside avx3_dl or in the f32 compute mode)
// is printed as skipped with the backend's reason for the first key.
std::vector<Route> kernel_routes(const std::string& backend, const std::vector<g3::KernelKey>& keys) {
  std::vector<Route> v;
  if (backend == "reference") {
    v.push_back({backend, "scalar"});
  } else if (backend == "highway") {
    for (const auto& isa : g3test::highway_test_isas()) v.push_back({backend, isa});
    REQUIRE_FALSE(v.empty());  // Highway's scalar target always runs
  } else {
    const g3::Backend* b = g3::find_backend(backend);
    REQUIRE(b != nullptr);
    for (const auto& isa : jit_isas(backend)) {
      if (!g3test::backend_runs_here(backend, isa, g3test::Through::Kernel)) continue;
      if (std::any_of(keys.begin(), keys.end(), [&](const g3::KernelKey& k) { return b->why_unavailable(k, isa).empty(); }))
        v.push_back({backend, isa});
      else if (!keys.empty())
        std::printf("skipped: %s %s (%s)\n", backend.c_str(), isa.c_str(), b->why_unavailable(keys[0], isa).c_str());
    }
  }
  return v;
}

// The ISAs a backend is tested on through the runtime: those the registry
// serves here (backend_runs_here); the reference ignores the ISA.
std::vector<Route> runtime_routes(const std::string& backend) {
  if (backend == "reference") return {{backend, "scalar"}};
  if (backend == "highway") return kernel_routes(backend, {});
  std::vector<Route> v;
  for (const auto& isa : jit_isas(backend))
    if (g3test::backend_runs_here(backend, isa)) v.push_back({backend, isa});
  return v;
}

// A route's kernels for a key, built once per process by the backend's own
// entry of the backend table; null (and a printed line) when the backend
// does not serve this key, as Xbyak does not for head_dims that are no
// multiple of its vector width.
const g3::BackendKernels* route_kernels(const g3::KernelKey& key, const Route& r) {
  static std::map<std::string, std::optional<g3::BackendKernels>> memo;
  const std::string id = r.name() + " " + key.str();
  if (auto it = memo.find(id); it != memo.end()) return it->second ? &*it->second : nullptr;
  const g3::Backend* b = g3::find_backend(r.backend);
  REQUIRE(b != nullptr);
  if (const std::string why = b->why_unavailable(key, r.isa); !why.empty()) {
    std::printf("skipped: %s for key %s (%s)\n", r.name().c_str(), key.str().c_str(), why.c_str());
    memo.emplace(id, std::nullopt);
    return nullptr;
  }
  g3::BackendKernels k = b->build(key, r.isa);
  INFO(r.name() << " key " << key.str());
  REQUIRE(k.table.core != nullptr);
  CHECK(k.isa == r.isa);  // the code targets the ISA asked for
  return &*memo.emplace(id, std::move(k)).first->second;
}

// The keys of the built-in models (270m shares 1b's, 12b shares 4b's), on
// which Highway must run its specialised kernels.
std::vector<g3::KernelKey> builtin_keys() {
  std::vector<g3::KernelKey> keys;
  for (const auto& name : {"1b", "4b", "27b"})
    for (g3::DType kv : {g3::DType::F32, g3::DType::BF16})
      for (const auto& k : g3::distinct_keys(g3::builtin_model(name), kv, g3::DType::BF16)) keys.push_back(k);
  return keys;
}

bool is_builtin_key(const g3::KernelKey& key) {
  static const std::set<std::string> all = [] {
    std::set<std::string> s;
    for (const auto& name : g3::builtin_model_names())
      for (g3::DType kv : {g3::DType::F32, g3::DType::BF16})
        for (g3::DType w : {g3::DType::F32, g3::DType::BF16})
          for (const auto& k : g3::distinct_keys(g3::builtin_model(name), kv, w)) s.insert(k.str());
    return s;
  }();
  return all.count(key.str()) > 0;
}

// Highway runs its specialised kernel on a built-in key and the generic one
// on any other.
void check_highway_kind(const Route& r, const g3::KernelKey& key, const g3::BackendKernels& k) {
  if (r.backend != "highway") return;
  INFO(r.name() << " key " << key.str());
  CHECK(k.specialised == is_builtin_key(key));
}

std::string describe(const CoreSpec& s) {
  static const char* orders[] = {"sorted", "ring", "shuffled"};
  return "dh " + std::to_string(s.head_dim) + " G " + std::to_string(s.group) + " W " + std::to_string(s.window) +
         " T " + std::to_string(s.T) + " S " + std::to_string(s.S) + " kv " + g3::to_string(s.kv) +
         (s.causal == G3_CAUSAL_SLOTS ? " slot-causal" : std::string(" ") + orders[int(s.order)]) +
         " invalid " + std::to_string(s.invalid).substr(0, 4) + (s.lse ? "" : " no-lse");
}

// ---------------------------------------------------------------------------
// Attention core cases: one list, run on every kernel route.

struct CoreCase {
  std::string name;
  g3::KernelKey key;
  CoreSpec spec;
};

// A key for a shape that no built-in model has: the core ignores the RoPE
// constants and alpha, which only select Highway's specialised kernels.
g3::KernelKey generic_key(const CoreSpec& s) {
  // 77: no built-in key has this RoPE base.
  return {.head_dim = s.head_dim, .group = s.group, .window = s.window, .rope_base = 77, .alpha = 0.0625f,
          .kv_dtype = s.kv, .compute = s.compute};
}

CoreSpec spec_of(const g3::KernelKey& k, int64_t T, int64_t S) {
  return {.head_dim = k.head_dim, .group = k.group, .window = k.window, .T = T, .S = S, .kv = k.kv_dtype};
}

constexpr auto F32 = g3::DType::F32, BF16 = g3::DType::BF16;

void add(std::vector<CoreCase>& v, const std::string& name, const CoreSpec& s) {
  v.push_back({name, generic_key(s), s});
}

// Decode and prefill calls on caches in any slot order, and packed no-cache
// calls, on f32 and bf16 K/V: invalid slots in every tile position.
std::vector<CoreCase> call_cases() {
  std::vector<CoreCase> v;
  struct Named {
    const char* name;
    int dh, G, W;
    int64_t T, S;
    int causal;
  };
  uint32_t seed = 1;
  for (const Named& n : {Named{"decode, ring order, local", 16, 2, 9, 1, 40, G3_CAUSAL_POSITIONS},
                         Named{"decode, long ring, global, G 4", 256, 4, 0, 1, 300, G3_CAUSAL_POSITIONS},
                         Named{"few rows, dh 128", 128, 2, 0, 3, 70, G3_CAUSAL_POSITIONS},
                         Named{"prefill, ring order, local", 256, 2, 33, 40, 130, G3_CAUSAL_POSITIONS},
                         Named{"prefill over many tiles, G 1", 64, 1, 0, 70, 200, G3_CAUSAL_POSITIONS},
                         Named{"packed tokens, local", 16, 2, 9, 60, 60, G3_CAUSAL_SLOTS},
                         Named{"packed tokens, global, dh 256 G 4", 256, 4, 0, 37, 37, G3_CAUSAL_SLOTS},
                         Named{"packed tokens, local, dh 128", 128, 2, 512, 150, 150, G3_CAUSAL_SLOTS}})
    for (g3::DType kv : {F32, BF16}) {
      const CoreSpec s{.head_dim = n.dh, .group = n.G, .window = n.W, .T = n.T, .S = n.S, .kv = kv,
                       .causal = n.causal, .invalid = 1.0 / 7, .values = CoreSpec::Values::Uniform,
                       .q_scale = 0.25, .seed = seed++};
      v.push_back({n.name, generic_key(s), s});
    }
  return v;
}

// The calls above, then the keys and shapes the Highway and LLVM kernels
// are known to special-case.
std::vector<CoreCase> core_cases() {
  std::vector<CoreCase> v = call_cases();
  uint32_t seed = 1000;

  // The built-in keys (specialised Highway kernels): prefill-sized (T*G
  // above the decode threshold, T no tile multiple, the context ending
  // mid-tile) and decode-sized calls.
  for (const g3::KernelKey& k : builtin_keys()) {
    const int W = k.window;
    CoreSpec a = spec_of(k, 45, W > 0 ? W + 77 : 333), b = spec_of(k, 1, W > 0 ? 2 * W + 13 : 517),
             c = spec_of(k, 3, 190);
    a.order = SlotOrder::Sorted, a.invalid = 0.1, a.seed = seed++;
    b.order = SlotOrder::Ring, b.invalid = 0.05, b.seed = seed++;
    c.order = SlotOrder::Ring, c.invalid = 0, c.lse = false, c.seed = seed++;
    for (const CoreSpec& s : {a, b, c}) v.push_back({"built-in key " + k.str(), k, s});
  }

  // Generic kernels: head_dim 64/128/256 and shapes no vector divides;
  // G 1/2/4/8; windows no multiple of the 64-key tile; T = 1, T no multiple
  // of the row tile; contexts that end mid-tile; T*G rows spanning several
  // row blocks of the prefill kernel (128) with whole tiles skipped on both
  // sides of a window.
  struct Shape {
    int dh, G, W;
    int64_t T, S;
    g3::DType kv;
    SlotOrder order;
    double invalid;
    bool lse;
  };
  for (const Shape& s : {
           Shape{64, 1, 0, 1, 1, F32, SlotOrder::Sorted, 0.0, true},
           Shape{64, 1, 0, 70, 70, F32, SlotOrder::Sorted, 0.0, true},
           Shape{64, 8, 37, 29, 300, F32, SlotOrder::Ring, 0.2, true},
           Shape{128, 4, 0, 1, 1000, BF16, SlotOrder::Ring, 0.1, true},
           Shape{128, 2, 100, 67, 455, F32, SlotOrder::Sorted, 0.0, true},
           Shape{128, 8, 0, 1, 129, F32, SlotOrder::Sorted, 0.3, true},
           Shape{256, 1, 5, 7, 64, F32, SlotOrder::Sorted, 0.0, true},
           Shape{256, 2, 65, 130, 260, BF16, SlotOrder::Ring, 0.05, true},
           Shape{256, 4, 0, 2, 333, BF16, SlotOrder::Sorted, 0.0, false},
           Shape{16, 2, 4, 12, 12, F32, SlotOrder::Sorted, 0.2, true},
           Shape{6, 3, 0, 9, 40, F32, SlotOrder::Ring, 0.1, true},
           Shape{40, 2, 0, 33, 97, BF16, SlotOrder::Sorted, 0.0, true},
           Shape{64, 2, 1, 20, 20, F32, SlotOrder::Sorted, 0.0, true},  // window 1: each row sees only itself
           Shape{64, 4, 0, 5, 0, F32, SlotOrder::Sorted, 0.0, true},    // empty cache: every row sees nothing
           Shape{64, 2, 100, 150, 700, F32, SlotOrder::Sorted, 0.02, true},
           Shape{64, 2, 0, 150, 700, BF16, SlotOrder::Ring, 0.02, true},
       })
    add(v, "awkward shape", {.head_dim = s.dh, .group = s.G, .window = s.W, .T = s.T, .S = s.S, .kv = s.kv,
                             .order = s.order, .invalid = s.invalid, .lse = s.lse, .seed = seed++});

  // Windows below and above S, head_dim 72 (no power of two), fewer slots
  // than one tile; queries at positions inside and before a cache starting
  // at 1000, in no particular order.
  struct Key {
    int dh, G, W;
    g3::DType kv;
  };
  for (const Key& k : {Key{64, 1, 0, F32}, Key{64, 8, 37, BF16}, Key{128, 2, 0, BF16}, Key{128, 4, 53, F32},
                       Key{256, 2, 0, F32}, Key{256, 8, 101, F32}, Key{256, 1, 19, BF16}, Key{72, 2, 29, F32}})
    for (auto [T, S] : std::vector<std::pair<int64_t, int64_t>>{{1, 77}, {37, 141}, {19, 5}})
      add(v, "cache at 1000", {.head_dim = k.dh, .group = k.G, .window = k.W, .T = T, .S = S, .kv = k.kv,
                               .base = 1000, .shuffle_queries = true, .invalid = 1.0 / 7, .q_scale = 0.25,
                               .q_spikes = 0, .seed = seed++});
  add(v, "cache at 1000", {.head_dim = 128, .group = 2, .window = 45, .T = 21, .S = 90, .kv = BF16, .base = 1000,
                           .shuffle_queries = true, .invalid = 1.0 / 7, .q_scale = 0.25, .q_spikes = 0,
                           .seed = seed++});
  return v;
}

// The grid of the vector kernels' register tiles (a case list of its own so
// that ctest can run it beside the others, on the AVX2 and AVX-512 routes
// only, see tile_grid_passes): head_dim 64/128/256 x G
// 1/2/4/8 x global or W 37; T = 1 (decode), T no multiple of the query tile
// (48 tokens at G = 2 on global layers, 64 rows on local ones), contexts
// ending mid-block; the longest shape only at head_dim 64. Queries
// U(-1, 1): logits of standard deviation up to 5, a peaked softmax.
std::vector<CoreCase> tile_grid_cases() {
  std::vector<CoreCase> v;
  uint32_t seed = 5000;
  for (int dh : {64, 128, 256})
    for (int G : {1, 2, 4, 8})
      for (int W : {0, 37})
        for (g3::DType kv : {F32, BF16}) {
          std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 77}, {3, 40}, {13, 13}, {45, 150}};
          if (dh == 64) shapes.push_back({150, 301});
          for (auto [T, S] : shapes)
            add(v, "tile grid", {.head_dim = dh, .group = G, .window = W, .T = T, .S = S, .kv = kv,
                                 .invalid = 1.0 / 9, .values = CoreSpec::Values::Uniform, .q_scale = 1,
                                 .seed = seed++});
        }
  return v;
}

// Calls in the bf16 compute mode (kernel_contract.h: q, K, p and V rounded
// to bf16 for their products): decode and prefill on caches in any order,
// packed no-cache calls, both layer kinds, head_dim 64/128/256, f32 K/V
// (rounded as they are loaded) and bf16 K/V.
std::vector<CoreCase> bf16_compute_cases() {
  std::vector<CoreCase> v;
  uint32_t seed = 7000;
  struct Named {
    int dh, G, W;
    int64_t T, S;
    int causal;
  };
  for (const Named& n : {Named{256, 2, 0, 1, 300, G3_CAUSAL_POSITIONS}, Named{128, 4, 37, 2, 150, G3_CAUSAL_POSITIONS},
                         Named{256, 2, 65, 130, 260, G3_CAUSAL_POSITIONS}, Named{128, 2, 0, 70, 200, G3_CAUSAL_POSITIONS},
                         Named{64, 8, 0, 45, 150, G3_CAUSAL_POSITIONS}, Named{128, 2, 9, 60, 60, G3_CAUSAL_SLOTS}})
    for (g3::DType kv : {F32, BF16})
      add(v, "bf16 compute", {.head_dim = n.dh, .group = n.G, .window = n.W, .T = n.T, .S = n.S, .kv = kv,
                              .compute = BF16, .causal = n.causal, .invalid = 0.1, .seed = seed++});
  return v;
}

// The error bound of an f32 core against ref::core (double) on the same
// K/V, for one row with query q. Derivation (u = 2^-24, the f32 unit
// roundoff; gamma_n = n u / (1 - n u)):
//  - a logit is a sum of H products accumulated in f32 in any order:
//    |error| <= e_s = gamma_H * sum_h |q_h k_sh|;
//  - p_s = exp(l_s - m) in f32: the shift rounds by u |l_s - m| and exp
//    adds a few ulp, so log p_s moves by at most
//    delta = 2 max_s e_s + 16 u (1 + max_s |l_s - m|)  (m carries an e_s too;
//    16 u covers the exp error and the rescaling steps of online softmax);
//  - the output o = sum_s p_s v_s / sum_s p_s, a weighted mean: weights
//    perturbed by factors in [e^-delta, e^delta] move it by at most
//    (e^(2 delta) - 1) max|v|; summing S weighted values and S weights in
//    f32 and dividing adds (2 S + 2 H + 32) u max|v|.
// lse = m + log l moves by at most delta + (S + 16) u (1 + |lse|).
// In the bf16 compute mode the products are of the same bf16-rounded q, K
// and V on both sides (rounding is deterministic), so the terms above hold
// with those values; the weights p enter P.V rounded too, the reference's
// from a double and ours from an f32 p, and where the two straddle a bf16
// rounding boundary they land one bf16 ulp apart: each weight moves by at
// most 2^-8 of itself, the weighted mean by at most 2^-8 max|v| more.
struct RowBound {
  double out = 0, lse = 0;
};

RowBound row_bound(const CoreCall& d, int64_t t, int64_t g) {
  const int64_t H = d.spec.head_dim, S = d.spec.S;
  const double u = std::ldexp(1.0, -24), gH = H * u / (1 - H * u);
  const g3_core_args a = d.args(nullptr, nullptr);
  const g3_row_bounds rb = g3_bounds_of(&a, t);
  const float* q = &d.q[size_t(t * d.q_stride + g * H)];
  const int32_t cm = a.compute;
  double emax = 0, lmax = -INFINITY, lmin = INFINITY, vmax = 0;
  bool any = false;
  for (int64_t s = 0; s < S; ++s) {
    if (!g3_visible(rb, s, d.kpos[size_t(s)], d.kvalid[size_t(s)])) continue;
    any = true;
    double l = 0, e = 0;
    for (int64_t h = 0; h < H; ++h) {
      const double p = g3::ref::operand(q[h], cm) * g3::ref::operand(d.kf[size_t(s * H + h)], cm);
      l += p;
      e += std::fabs(p);
      vmax = std::max(vmax, std::fabs(g3::ref::operand(d.vf[size_t(s * H + h)], cm)));
    }
    emax = std::max(emax, gH * e);
    lmax = std::max(lmax, l);
    lmin = std::min(lmin, l);
  }
  RowBound r;
  if (!any) return r;
  const double delta = 2 * emax + 16 * u * (1 + (lmax - lmin));
  r.out = (std::expm1(2 * delta) + (2.0 * S + 2.0 * H + 32) * u) * vmax;
  if (cm == G3_COMPUTE_BF16) r.out += std::ldexp(1.0, -8) * vmax;
  r.lse = delta + (S + 16) * u * (1 + std::fabs(lmax) + std::log(double(S)));
  return r;
}

// A call with its reference outputs and per-row bounds, computed once and
// compared against every route.
struct CoreExpect {
  CoreCall call;
  CoreCall::Outputs want;
  std::vector<RowBound> bounds;  // [T][G]
  std::vector<bool> sees;        // [T]: the row sees at least one key

  explicit CoreExpect(CoreCall c) : call(std::move(c)) {
    want = call.run(&g3::ref::core);
    const int64_t T = call.spec.T, G = call.spec.group;
    for (int64_t t = 0; t < T; ++t) {
      sees.push_back(call.row_sees_a_key(t));
      for (int64_t g = 0; g < G; ++g) bounds.push_back(row_bound(call, t, g));
    }
  }
};

// The empirical bound every core has always met: 2e-5 + 2e-5 |ref| on
// outputs and lse, and no output more than 1e-3 off.
constexpr double kTol = 2e-5;

struct CoreDiff {
  int64_t beyond_bound = 0;  // elements (outputs and lse) beyond the derived f32 bound
  int64_t beyond_tol = 0;    // beyond kTol + kTol |ref|
  int64_t empty_wrong = 0;   // rows with no visible key not all zeros with lse = -inf
  int64_t padding = 0;       // writes into the out_stride padding
  double worst_ratio = 0;    // largest error / derived bound
  double max_diff = 0;
};

CoreDiff compare_core(const CoreExpect& e, const CoreCall::Outputs& got) {
  const CoreCall& d = e.call;
  const int64_t H = d.spec.head_dim, G = d.spec.group;
  CoreDiff r;
  for (int64_t t = 0; t < d.spec.T; ++t) {
    for (int64_t i = G * H; i < d.out_stride; ++i) r.padding += got.out[size_t(t * d.out_stride + i)] != CoreCall::kGarbage;
    for (int64_t g = 0; g < G; ++g) {
      const float* o = &got.out[size_t(t * d.out_stride + g * H)];
      const float* w = &e.want.out[size_t(t * d.out_stride + g * H)];
      const float gl = got.lse[size_t(t * G + g)], wl = e.want.lse[size_t(t * G + g)];
      if (!e.sees[size_t(t)]) {
        for (int64_t h = 0; h < H; ++h) r.empty_wrong += o[h] != 0.f;
        if (d.spec.lse) r.empty_wrong += !(gl == -INFINITY);
        continue;
      }
      const RowBound& rb = e.bounds[size_t(t * G + g)];
      for (int64_t h = 0; h < H; ++h) {
        const double err = std::fabs(double(o[h]) - double(w[h]));
        if (!(err <= rb.out)) ++r.beyond_bound;  // NaN counts as bad
        if (!(err <= kTol + kTol * std::fabs(w[h]))) ++r.beyond_tol;
        r.worst_ratio = std::max(r.worst_ratio, std::isnan(err) ? INFINITY : err / rb.out);
        r.max_diff = std::max(r.max_diff, std::isnan(err) ? INFINITY : err);
      }
      if (!d.spec.lse) continue;
      const double el = std::fabs(double(gl) - double(wl));
      if (!(el <= rb.lse)) ++r.beyond_bound;
      if (!(el <= kTol + kTol * std::fabs(wl))) ++r.beyond_tol;
    }
  }
  return r;
}

// Body: on every case, every core of the backend equals the reference (its
// invalid slots hold NaN), and the same call with zeros or -Inf in the
// invalid slots gives the same bits: invalid slots never touch an output.
// `only_isas`, when not empty, keeps the routes on those ISAs.
void core_equals_reference(const std::string& backend, const std::vector<CoreCase>& cases,
                           const std::vector<std::string>& only_isas = {}) {
  std::vector<g3::KernelKey> keys;
  for (const CoreCase& c : cases) keys.push_back(c.key);
  std::vector<Route> routes = kernel_routes(backend, keys);
  if (!only_isas.empty())
    std::erase_if(routes, [&](const Route& r) {
      if (std::find(only_isas.begin(), only_isas.end(), r.isa) != only_isas.end()) return false;
      std::printf("skipped: %s (this case list runs on wide-vector ISAs only)\n", r.name().c_str());
      return true;
    });
  if (routes.empty()) return;  // nothing to run (the skipped routes were printed)
  for (const CoreCase& c : cases) {
    const CoreExpect e(CoreCall::random(c.spec));
    const bool has_invalid = std::count(e.call.kvalid.begin(), e.call.kvalid.end(), 0) > 0;
    CoreCall zeros = e.call, infs = e.call;
    zeros.fill_invalid(0.f);
    infs.fill_invalid(-std::numeric_limits<float>::infinity());
    for (const Route& r : routes) {
      const g3::BackendKernels* k = route_kernels(c.key, r);
      if (!k) continue;
      check_highway_kind(r, c.key, *k);
      const CoreCall::Outputs got = e.call.run(k->table.core);
      const CoreDiff d = compare_core(e, got);
      INFO(r.name() << " case '" << c.name << "' " << describe(c.spec) << ": worst error / derived bound "
                    << d.worst_ratio << ", max |diff| " << d.max_diff);
      CHECK(d.beyond_bound == 0);
      CHECK(d.empty_wrong == 0);
      CHECK(d.padding == 0);
      // The empirical f32 bounds; the bf16 compute mode has only its derived
      // one, which leaves room for the weights' rounding. That it rounds at
      // all shows against the same backend in the f32 mode: a kernel that
      // ignored the mode would give the same bits.
      if (c.spec.compute == g3::DType::F32) {
        CHECK(d.beyond_tol == 0);
        CHECK(d.max_diff <= 1e-3);
      } else {
        CoreCall f32 = e.call;
        f32.spec.compute = g3::DType::F32;
        g3::KernelKey key32 = c.key;
        key32.compute = g3::DType::F32;
        if (const g3::BackendKernels* k32 = route_kernels(key32, r)) {
          const CoreCall::Outputs o32 = f32.run(k32->table.core);
          CHECK(std::memcmp(got.out.data(), o32.out.data(), got.out.size() * 4) != 0);
        }
      }
      if (!has_invalid) continue;
      const CoreCall::Outputs z = zeros.run(k->table.core), f = infs.run(k->table.core);
      CHECK(std::memcmp(got.out.data(), z.out.data(), got.out.size() * 4) == 0);
      CHECK(std::memcmp(got.out.data(), f.out.data(), got.out.size() * 4) == 0);
      CHECK(std::memcmp(got.lse.data(), z.lse.data(), got.lse.size() * 4) == 0);
      CHECK(std::memcmp(got.lse.data(), f.lse.data(), got.lse.size() * 4) == 0);
    }
  }
}

// Body: G3_CAUSAL_SLOTS with an offset: query t sees slots s <= t +
// causal_offset, so callers may cut the queries of a no-cache call into
// pieces; a call split in two equals the whole call.
void split_call_equals_whole(const std::string& backend) {
  const CoreSpec s{.head_dim = 64, .group = 2, .window = 21, .T = 50, .S = 50, .causal = G3_CAUSAL_SLOTS, .seed = 9};
  const g3::KernelKey key = generic_key(s);
  const CoreCall d = CoreCall::random(s);
  for (const Route& r : kernel_routes(backend, {key})) {
    const g3::BackendKernels* k = route_kernels(key, r);
    if (!k) continue;
    CoreCall::Outputs whole = d.run(k->table.core), parts;
    parts.out.assign(whole.out.size(), CoreCall::kGarbage);
    parts.lse.assign(whole.lse.size(), 0.f);
    for (int64_t t0 : {int64_t(0), int64_t(23)}) {
      const int64_t t1 = t0 == 0 ? 23 : s.T;
      g3_core_args a = d.args(parts.out.data() + t0 * d.out_stride, parts.lse.data() + t0 * s.group);
      a.T = t1 - t0;
      a.q = d.q.data() + t0 * d.q_stride;
      a.qpos = d.qpos.data() + t0;
      a.causal_offset = t0;
      k->table.core(&a);
    }
    CoreExpect e(d);
    e.want = whole;
    const CoreDiff diff = compare_core(e, parts);
    INFO(r.name());
    CHECK(diff.beyond_bound == 0);
    CHECK(diff.empty_wrong == 0);
  }
}

// Body: the decode prefetch hint (g3_core_args::prefetch_bytes and
// prefetch_level, which the runtime sets from a tune profile) is a speed
// hint only: decode-sized calls under any level and distance, the shortest
// and a distance past the end of the cache included, give the same bits as
// under the default.
void prefetch_hint_changes_no_bit(const std::string& backend) {
  std::vector<CoreSpec> specs;
  for (const g3::DType kv : {F32, BF16})
    for (const int group : {1, 4})
      specs.push_back({.head_dim = 256, .group = group, .window = group == 4 ? 0 : 100, .T = 1, .S = 333, .kv = kv,
                       .seed = uint32_t(40 + group)});
  specs.push_back({.head_dim = 64, .group = 2, .T = 3, .S = 200, .seed = 47});
  std::vector<g3::KernelKey> keys;
  for (const CoreSpec& s : specs) keys.push_back(generic_key(s));
  for (const Route& r : kernel_routes(backend, keys))
    for (size_t i = 0; i < specs.size(); ++i) {
      const g3::BackendKernels* k = route_kernels(keys[i], r);
      if (!k) continue;
      const CoreCall d = CoreCall::random(specs[i]);
      const CoreCall::Outputs want = d.run(k->table.core);
      for (const auto& [level, bytes] : std::vector<std::pair<int32_t, int32_t>>{
               {G3_PREFETCH_L1, 64}, {G3_PREFETCH_L1, 8192}, {G3_PREFETCH_L2, 16384}, {G3_PREFETCH_L2, 1 << 20}}) {
        CoreCall::Outputs got;
        got.out.assign(want.out.size(), CoreCall::kGarbage);
        got.lse.assign(want.lse.size(), CoreCall::kGarbage);
        g3_core_args a = d.args(got.out.data(), got.lse.data());
        a.prefetch_level = level;
        a.prefetch_bytes = bytes;
        k->table.core(&a);
        INFO(r.name() << " spec " << i << " level " << level << " bytes " << bytes);
        CHECK(std::memcmp(got.out.data(), want.out.data(), want.out.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(got.lse.data(), want.lse.data(), want.lse.size() * sizeof(float)) == 0);
      }
    }
}

// ---------------------------------------------------------------------------
// QK stage.
//
// Tolerances: q and f32 K, 2e-5 + 2e-5 |ref|. bf16 K: ours and the
// reference compute the f32 value to within a few f32 ulps (|d| <= ~1e-6
// |x|), then both round to bf16 (8 significant bits); when the two straddle
// a rounding boundary they land on adjacent bf16 values, one bf16 ulp apart,
// at most 2^-7 |x|: 1e-6 + 2^-7 |ref|. Almost every element is exact. V is
// copied (or rounded once from the same f32): every byte of the V cache
// equals the reference's, and K slots that no token writes keep their bytes.

struct QkCase {
  std::string name;
  g3::KernelKey key;
  QkSpec spec;
};

std::vector<QkCase> qk_cases() {
  std::vector<QkCase> v;
  uint32_t seed = 100;
  auto key_of = [](const QkSpec& s) {
    return g3::KernelKey{.head_dim = s.head_dim, .group = s.num_heads / s.num_kv_heads, .rope_base = s.rope_base,
                         .rope_scale = s.rope_scale, .alpha = s.alpha, .kv_dtype = s.kv};
  };
  auto add = [&](const std::string& name, QkSpec s) {
    s.seed = seed++;
    v.push_back({name, key_of(s), s});
  };
  // Specialised: the built-in keys with their own constants.
  for (const g3::KernelKey& k : builtin_keys())
    v.push_back({"built-in key", k,
                 {.head_dim = k.head_dim, .num_heads = 2 * k.group, .num_kv_heads = 2, .T = 9,
                  .rope_base = k.rope_base, .rope_scale = k.rope_scale, .alpha = k.alpha, .kv = k.kv_dtype,
                  .seed = seed++}});
  // Generic: other head_dims (including ones no vector width divides and
  // not powers of two), groups and RoPE constants; T = 1 and T = 13.
  constexpr auto F32 = g3::DType::F32, BF16 = g3::DType::BF16;
  for (const QkSpec& s : {QkSpec{64, 8, 1, 5, 10000.0, 1.0, 0.125f, F32},
                          QkSpec{128, 4, 4, 17, 1e6, 8.0, 0.0883883476f, BF16},
                          QkSpec{16, 4, 2, 12, 1e6, 8.0, 0.25f, F32},
                          QkSpec{6, 3, 1, 4, 500.0, 2.0, 0.4082f, BF16},
                          QkSpec{256, 1, 1, 1, 10000.0, 1.0, 0.0625f, F32},
                          QkSpec{40, 2, 2, 33, 123456.0, 1.5, 0.158113883f, F32}})
    add("generic key", s);
  add("generic key, local", {128, 4, 2, 9, 1e4, 1.0, float(1 / std::sqrt(128.0)), BF16});
  v.back().key.window = 45;
  struct C {
    int dh, G;
    g3::DType kv;
    double base, scale;
  };
  for (const C& c : {C{64, 1, F32, 1e4, 1.0}, C{128, 2, BF16, 1e6, 8.0}, C{256, 4, F32, 1e6, 8.0},
                     C{256, 8, BF16, 1e4, 1.0}, C{72, 2, F32, 1e4, 1.0}})
    for (int64_t T : {1, 13})
      add("generic key", {.head_dim = c.dh, .num_heads = 2 * c.G, .num_kv_heads = 2, .T = T, .rope_base = c.base,
                          .rope_scale = c.scale, .alpha = float(1 / std::sqrt(double(c.dh))), .kv = c.kv});
  return v;
}

struct QkDiff {
  int64_t bad_q = 0, bad_k = 0, untouched_k = 0;
  double max_q = 0, max_k = 0;
  bool v_equal = false;
};

QkDiff compare_qk(const QkCall& d, const QkCall::Outputs& got, const QkCall::Outputs& want) {
  QkDiff r;
  for (size_t i = 0; i < want.q.size(); ++i) {
    const double e = std::fabs(double(got.q[i]) - want.q[i]);
    r.bad_q += !(e <= kTol + kTol * std::fabs(want.q[i]));
    r.max_q = std::max(r.max_q, std::isnan(e) ? INFINITY : e);
  }
  const bool f32 = d.spec.kv == g3::DType::F32;
  const double katol = f32 ? kTol : 1e-6, krtol = f32 ? kTol : 1.0 / 128;
  for (size_t i = 0; i < want.k_cache.size() / d.kv_elem_size(); ++i) {
    const double w = d.cache_at(want.k_cache, i), e = std::fabs(double(d.cache_at(got.k_cache, i)) - w);
    r.bad_k += !(e <= katol + krtol * std::fabs(w));
    r.max_k = std::max(r.max_k, std::isnan(e) ? INFINITY : e);
  }
  // Slots no token writes keep the bytes they had.
  std::vector<bool> written(size_t(d.S), false);
  for (int64_t s : d.slot)
    if (s >= 0) written[size_t(s)] = true;
  const size_t row = size_t(d.spec.head_dim) * d.kv_elem_size();
  for (int64_t j = 0; j < d.spec.num_kv_heads; ++j)
    for (int64_t s = 0; s < d.S; ++s)
      if (!written[size_t(s)])
        for (size_t b = 0; b < row; ++b) r.untouched_k += got.k_cache[size_t(j * d.S + s) * row + b] != 0xAB;
  r.v_equal = got.v_cache == want.v_cache;
  return r;
}

// Body: every QK stage of the backend equals the reference.
void qk_equals_reference(const std::string& backend) {
  std::vector<g3::KernelKey> keys;
  for (const QkCase& c : qk_cases()) keys.push_back(c.key);
  const std::vector<Route> routes = kernel_routes(backend, keys);
  std::set<std::string> without_qk;
  for (const QkCase& c : qk_cases()) {
    const QkCall d = QkCall::random(c.spec);
    const QkCall::Outputs want = d.run(&g3::ref::qk);
    for (const Route& r : routes) {
      const g3::BackendKernels* k = route_kernels(c.key, r);
      if (!k) continue;
      if (!k->table.qk) {
        // The runtime takes this stage from the backend's fallback.
        if (without_qk.insert(r.name()).second)
          std::printf("skipped: %s QK stage (not provided; the registry takes Highway's)\n", r.name().c_str());
        continue;
      }
      check_highway_kind(r, c.key, *k);
      const QkDiff q = compare_qk(d, d.run(k->table.qk), want);
      INFO(r.name() << " " << c.name << " " << c.key.str() << " N " << c.spec.num_heads << " Nkv "
                    << c.spec.num_kv_heads << " T " << c.spec.T << ": q max diff " << q.max_q << " (" << q.bad_q
                    << " bad), k max diff " << q.max_k << " (" << q.bad_k << " bad)");
      CHECK(q.bad_q == 0);
      CHECK(q.bad_k == 0);
      CHECK(q.untouched_k == 0);
      CHECK(q.v_equal);
    }
  }
}

// ---------------------------------------------------------------------------
// Block level: run_block_nocache (the `g3attn apply` path) against the
// official block, ref::block with the causal caller mask of SPEC 1.4.

struct Geometry {
  const char* name;
  g3::ModelConfig model;
};

std::vector<Geometry> geometries() {
  std::vector<Geometry> g;
  g.push_back({"tiny D64 dh16 G2 W4 (generic kernels)", g3test::tiny_model({g3::LayerKind::Local, g3::LayerKind::Global})});
  // The built-in 1B and 27B keys (specialised Highway kernels) on a small
  // hidden size: the key does not depend on D, and a small W makes the
  // window bite within a few tokens of positions.
  for (const char* size : {"1b", "27b"}) {
    g3::ModelConfig m = g3::builtin_model(size);
    m.hidden_size = 128;
    g.push_back({size, m});
  }
  return g;
}

struct Positions {
  const char* name;
  std::vector<int32_t> pos;
};

// Position patterns of T = 12 tokens; the big gaps put keys in and out of
// the window of every built-in size.
std::vector<Positions> position_patterns() {
  std::vector<Positions> v;
  v.push_back({"contiguous", {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}});
  v.push_back({"two packed documents", {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}});
  v.push_back({"repeated positions", {0, 1, 1, 2, 3, 4, 5, 6, 7, 7, 7, 8}});
  v.push_back({"gaps", {0, 3, 4, 10, 11, 600, 601, 603, 1100, 1101, 2400, 2401}});
  v.push_back({"decreasing", {2000, 1500, 1100, 900, 600, 11, 10, 9, 4, 3, 1, 0}});
  std::mt19937 rng(7);
  std::vector<int32_t> r(12);
  for (auto& p : r) p = int32_t(rng() % 3000);
  v.push_back({"random", r});
  return v;
}

// Body: the block equals the official one for any positions.
void block_equals_official(const std::string& backend) {
  const std::vector<Route> routes = runtime_routes(backend);
  if (routes.empty()) return;  // runtime_routes printed why
  for (const Geometry& geo : geometries())
    for (const g3::LayerSpec& spec :
         {g3::layer_spec(geo.model, 0), g3::layer_spec(geo.model, 5 % geo.model.num_layers)}) {
      const g3::LayerWeights w = g3::random_layer_weights(spec, 3, g3::DType::BF16);
      for (const Positions& P : position_patterns())
        for (g3::DType kv : {g3::DType::F32, g3::DType::BF16}) {
          const int64_t B = 2, T = int64_t(P.pos.size()), D = spec.hidden_size;
          const std::vector<float> x = g3test::randn(size_t(B * T * D), 11);
          std::vector<int32_t> pos(size_t(B * T));
          for (int64_t b = 0; b < B; ++b) std::copy(P.pos.begin(), P.pos.end(), pos.begin() + b * T);
          // Row 1 is right-padded: its last three tokens are padding (never keys).
          std::vector<int32_t> real(size_t(B * T), 1);
          for (int64_t t = T - 3; t < T; ++t) real[size_t(T + t)] = 0;
          const std::vector<uint8_t> mask = g3::ref::causal_mask(real.data(), B, T);
          std::vector<float> want_block(size_t(B * T * D)), want_attn(size_t(B * T * D));
          g3::ref::block(spec, w, x.data(), pos.data(), B, T, mask.data(), nullptr, want_block.data(),
                         want_attn.data(), kv);
          for (const Route& r : routes) {
            const g3::PreparedLayer L = g3::prepare_layer(spec, w, kv, r.backend, r.isa);
            INFO(geo.name << ", layer " << spec.index << ": asked for " << r.name() << ", got "
                          << L.kernels.backend << " (" << L.kernels.fallback << ")");
            REQUIRE(L.kernels.backend == r.backend);
            REQUIRE(L.kernels.stages[g3::Stage::Core] == r.backend);
            std::vector<float> got_block(size_t(B * T * D)), got_attn(size_t(B * T * D));
            g3::run_block_nocache(L, x.data(), pos.data(), real.data(), B, T, got_block.data(), got_attn.data());
            // The golden README's tolerances. With bf16 K/V the reference
            // rounds its double-precision k and ours rounds an f32 one: an
            // element on a bf16 rounding boundary may land on the other side,
            // so the bound is wider.
            const double f = kv == g3::DType::BF16 ? 10.0 : 1.0;
            const std::vector<bool> ok(real.begin(), real.end());
            int64_t bad_a = 0, bad_b = 0;
            const double da =
                g3test::max_abs_diff(got_attn.data(), want_attn.data(), B * T, D, ok, 1e-4 * f, 1e-4, &bad_a);
            const double db =
                g3test::max_abs_diff(got_block.data(), want_block.data(), B * T, D, ok, 5e-4 * f, 1e-4, &bad_b);
            INFO((spec.window ? "local" : "global") << " kv " << g3::to_string(kv) << " positions '" << P.name
                                                    << "': attn max|diff| " << da << ", block max|diff| " << db);
            CHECK(bad_a == 0);
            CHECK(bad_b == 0);
          }
        }
    }
}

// Body: every golden case through run_apply, the `g3attn apply` code path.
void golden_cases_pass(const std::string& backend) {
  const std::vector<Route> routes = runtime_routes(backend);
  if (routes.empty()) return;  // runtime_routes printed why
  // golden_cases() fails when the set holds fewer cases than it should.
  const std::vector<std::string> cases = g3test::golden_cases();
  for (const Route& r : routes)
    for (const std::string& name : cases) {
      const g3test::GoldenCheck g = g3test::check_golden_case(name, r.backend, r.isa);
      INFO(name << ": asked for " << r.name() << ", ran " << g.backend << " " << g.isa << ": attn max diff "
                << g.attn_max << ", block max diff " << g.block_max);
      CHECK(g.backend == r.backend);
      CHECK(g.isa == r.isa);
      CHECK(g.bad_attn == 0);
      CHECK(g.bad_block == 0);
    }
}

}  // namespace

namespace {

// One test per backend of the table for a body, "<title>: <backend>", the
// way Highway instantiates one test body per target: a backend added to the
// table is tested here with no edit, and each (body, backend) is its own
// CTest test.
class PerBackend : public Catch::ITestInvoker {
 public:
  PerBackend(void (*body)(const std::string&), std::string backend) : body_(body), backend_(std::move(backend)) {}
  void invoke() const override { body_(backend_); }

 private:
  void (*body_)(const std::string&);
  std::string backend_;
};

int register_per_backend(const char* title, const char* tags, void (*body)(const std::string&), const char* file,
                         size_t line) {
  for (const g3::Backend& b : g3::backends())
    Catch::AutoReg(new PerBackend(body, b.name), Catch::SourceLineInfo(file, line), Catch::StringRef(),
                   Catch::NameAndTags{std::string(title) + ": " + b.name, tags});
  return 0;
}

}  // namespace

#define G3_CONFORMANCE(title, tags, body)                          \
  static const int INTERNAL_CATCH_UNIQUE_NAME(g3_conformance_) = \
      register_per_backend(title, tags, body, __FILE__, __LINE__);

void core_cases_pass(const std::string& backend) { core_equals_reference(backend, core_cases()); }
// The grid is about the register tiles of 256- and 512-bit vectors (the
// ones Xbyak emits); on narrower ISAs the other lists cover the same keys'
// code paths, and a JIT would compile 48 more keys per cap for it.
void tile_grid_passes(const std::string& backend) {
  core_equals_reference(backend, tile_grid_cases(), {"avx2", "avx3", "avx3_dl"});
}
void bf16_compute_passes(const std::string& backend) { core_equals_reference(backend, bf16_compute_cases()); }

G3_CONFORMANCE("the core equals the reference and invalid slots change no bit", "[conformance][core][nan]",
               core_cases_pass)
G3_CONFORMANCE("the core equals the reference on the register-tile grid", "[conformance][core][nan]",
               tile_grid_passes)
G3_CONFORMANCE("the core equals the reference in the bf16 compute mode", "[conformance][core][bf16]",
               bf16_compute_passes)
G3_CONFORMANCE("the QK stage equals the reference", "[conformance][qk]", qk_equals_reference)
G3_CONFORMANCE("slot causality with an offset: a call split in two equals the whole call", "[conformance][core]",
               split_call_equals_whole)
G3_CONFORMANCE("the decode prefetch hint changes no output bit", "[conformance][core]", prefetch_hint_changes_no_bit)
G3_CONFORMANCE("the block equals the official block for any positions", "[conformance][positions]",
               block_equals_official)
G3_CONFORMANCE("every golden case passes through run_apply", "[conformance][golden]", golden_cases_pass)

TEST_CASE("the derived bound fails a core that drops one key", "[conformance][core]") {
  // The bound above must be able to fail: the reference with the most
  // influential visible key of the first row that sees two keys dropped
  // (as if masked) breaks it on every case, in both compute modes.
  std::vector<CoreCase> cases = call_cases();
  for (const CoreCase& c : bf16_compute_cases()) cases.push_back(c);
  for (const CoreCase& c : cases) {
    const CoreExpect e(CoreCall::random(c.spec));
    const CoreCall& d = e.call;
    const g3_core_args a = d.args(nullptr, nullptr);
    int64_t drop = -1;
    for (int64_t t = 0; t < c.spec.T && drop < 0; ++t) {
      const g3_row_bounds rb = g3_bounds_of(&a, t);
      int64_t seen = 0, best = -1;
      double best_l = -INFINITY;
      for (int64_t s = 0; s < c.spec.S; ++s) {
        if (!g3_visible(rb, s, d.kpos[size_t(s)], d.kvalid[size_t(s)])) continue;
        ++seen;
        double l = 0;
        for (int64_t h = 0; h < c.spec.head_dim; ++h)
          l += double(d.q[size_t(t * d.q_stride + h)]) * d.kf[size_t(s * c.spec.head_dim + h)];
        if (l > best_l) best_l = l, best = s;
      }
      if (seen >= 2) drop = best;
    }
    REQUIRE(drop >= 0);
    CoreCall dropped = d;
    dropped.kvalid[size_t(drop)] = 0;
    INFO("case '" << c.name << "' " << describe(c.spec) << ": dropping slot " << drop);
    CHECK(compare_core(e, dropped.run(&g3::ref::core)).beyond_bound > 0);
  }
}

TEST_CASE("auto on the scalar ISA runs highway and reproduces every golden case", "[conformance][golden][auto]") {
  // README: auto takes highway for f32 KV (the golden cases' KV type): the
  // contract path through run_block_nocache on Highway's scalar target.
  for (const std::string& name : g3test::golden_cases()) {
    const g3test::GoldenCheck g = g3test::check_golden_case(name, "auto", "scalar");
    INFO(name << " ran " << g.backend << " " << g.isa << ": attn max diff " << g.attn_max << ", block max diff "
              << g.block_max);
    CHECK(g.backend == "highway");
    CHECK(g.isa == "scalar");
    CHECK(g.bad_attn == 0);
    CHECK(g.bad_block == 0);
  }
}

TEST_CASE("the reference honours --kv-dtype: bf16 K/V change its result the way they change ours",
          "[conformance][bf16]") {
  // Through run_apply, the `g3attn apply` path, on a golden case of the
  // in-repository subset. Rounding K and V to bf16 moves the output by about
  // 2^-9 of its size; the fast path with bf16 K/V must agree with the
  // reference with bf16 K/V far more closely than with the f32 reference.
  const std::string name = "tiny_local_L2_T16_B2_leftpad";
  auto apply = [&](const std::string& backend, g3::DType kv) {
    g3::ApplyRequest r = g3test::golden_apply_request(name);
    r.backend = backend;
    r.isa = backend == "reference" ? "" : "scalar";
    r.kv_dtype = kv;
    return g3::run_apply(r);
  };
  const g3::ApplyResult ref32 = apply("reference", g3::DType::F32), ref16 = apply("reference", g3::DType::BF16),
                        fast16 = apply("highway", g3::DType::BF16);
  REQUIRE(fast16.backend == "highway");
  const int64_t rows = ref32.B * ref32.T, D = ref32.spec.hidden_size;
  const double storage = g3test::max_abs_diff(ref16.attn_out.data(), ref32.attn_out.data(), rows, D, ref32.real_row,
                                              0, 0, nullptr);
  const double ours = g3test::max_abs_diff(fast16.attn_out.data(), ref16.attn_out.data(), rows, D, ref32.real_row,
                                           0, 0, nullptr);
  INFO("bf16 storage moves the reference by " << storage << "; highway bf16 vs reference bf16: " << ours);
  CHECK(storage > 1e-4);
  CHECK(ours < storage / 20);
}
