// One conformance suite for every attention backend x ISA: the same test
// bodies run on each route (the reference's contract kernels, Highway on
// every target compiled and runnable here, LLVM on every ISA cap, Xbyak on
// avx2 and avx3), the way Highway runs one test body on every target. Every
// route asserts that the backend it asked for is the one that ran: a
// fallback to Highway is not a pass for llvm or xbyak. Routes this CPU or
// build cannot run are printed as skipped, by name.
//
// What is pinned down here (SPEC 1.4 and 1.6, templates/kernel_contract.h):
//  - without a cache, causality comes from token order, never from
//    positions: packed documents, repeated positions, gaps and decreasing
//    positions equal the official block on both layer kinds;
//  - slots with kvalid == 0 never touch an output, whatever they hold (NaN,
//    Inf): the outputs are bit for bit those of the same call with zeros
//    there;
//  - every core, on f32 and on bf16 K/V, stays within an error bound
//    derived below from f32 arithmetic against the double-precision
//    reference fed the same (rounded) K/V, and that bound is tight enough
//    to fail when one key is dropped.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "generator/backend_api.h"
#include "generator/bf16.h"
#include "runtime/dispatch/kernel_registry.h"
#include "runtime/exec/apply.h"
#include "runtime/exec/block.h"
#include "runtime/reference/reference.h"
#include "templates/mask_rule.h"
#include "tests/support/test_support.h"

namespace {

struct Route {
  std::string backend, isa;
  std::string name() const { return backend + " " + isa; }
};

// Every route this build and CPU can run, computed once (the skipped ones
// are printed then).
const std::vector<Route>& routes() {
  static const std::vector<Route> v = [] {
    std::vector<Route> r{{"reference", "scalar"}};
    for (const auto& isa : g3test::highway_test_isas()) r.push_back({"highway", isa});
    for (const auto& isa : g3::isa_names())
      if (g3test::backend_runs_here("llvm", isa)) r.push_back({"llvm", isa});
    for (const char* isa : {"avx2", "avx3"})
      if (g3test::backend_runs_here("xbyak", isa)) r.push_back({"xbyak", isa});
    return r;
  }();
  return v;
}

// The kernels of a route; fails the test when the registry served another
// backend than the one asked for.
g3::KernelChoice choose(const g3::KernelKey& key, const Route& r) {
  g3::KernelChoice c = g3::kernels_for(key, r.backend, r.isa);
  INFO("asked for " << r.name() << ", got " << c.backend << " (" << c.fallback << ")");
  REQUIRE(c.backend == r.backend);
  REQUIRE(c.stages[1] == r.backend);  // the attention core
  return c;
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

void check_block(const g3::LayerSpec& spec, const g3::LayerWeights& w, const Positions& P, const Route& route,
                 g3::DType kv) {
  const int64_t B = 2, T = int64_t(P.pos.size()), D = spec.hidden_size;
  std::vector<float> x = g3test::randn(size_t(B * T * D), 11);
  std::vector<int32_t> pos(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) std::copy(P.pos.begin(), P.pos.end(), pos.begin() + b * T);
  // Row 1 is right-padded: its last three tokens are padding (never keys).
  std::vector<int32_t> real(size_t(B * T), 1);
  for (int64_t t = T - 3; t < T; ++t) real[size_t(T + t)] = 0;

  std::vector<uint8_t> mask = g3::ref::causal_mask(real.data(), B, T);
  std::vector<float> want_block(size_t(B * T * D)), want_attn(size_t(B * T * D));
  g3::ref::block(spec, w, x.data(), pos.data(), B, T, mask.data(), nullptr, want_block.data(), want_attn.data(), kv);

  g3::PreparedLayer L = g3::prepare_layer(spec, w, kv, route.backend, route.isa);
  REQUIRE(L.kernels.backend == route.backend);
  std::vector<float> got_block(size_t(B * T * D)), got_attn(size_t(B * T * D));
  g3::run_block_nocache(L, x.data(), pos.data(), real.data(), B, T, got_block.data(), got_attn.data());

  // The golden README's tolerances. With bf16 K/V the reference rounds its
  // double-precision k and ours rounds an f32 one: an element on a bf16
  // rounding boundary may land on the other side, so the bound is wider.
  const double f = kv == g3::DType::BF16 ? 10.0 : 1.0;
  std::vector<bool> ok(real.begin(), real.end());
  int64_t bad_a = 0, bad_b = 0;
  const double da = g3test::max_abs_diff(got_attn.data(), want_attn.data(), B * T, D, ok, 1e-4 * f, 1e-4, &bad_a);
  const double db = g3test::max_abs_diff(got_block.data(), want_block.data(), B * T, D, ok, 5e-4 * f, 1e-4, &bad_b);
  INFO(route.name() << " " << (spec.window ? "local" : "global") << " kv " << g3::to_string(kv) << " positions '"
                    << P.name << "': attn max|diff| " << da << ", block max|diff| " << db);
  CHECK(bad_a == 0);
  CHECK(bad_b == 0);
}

// ---------------------------------------------------------------------------
// Core level: g3_core_fn against ref::core on the same buffers.

struct CoreCase {
  const char* name;
  int dh, G, W;
  int64_t T, S;
  int causal;  // G3_CAUSAL_POSITIONS (a cache in any slot order) or G3_CAUSAL_SLOTS (keys = the call's tokens)
  uint32_t seed;
};

// Buffers of one core call. K/V hold f32 values that are exactly
// representable in bf16, so the f32 and bf16 caches hold the same numbers.
struct CoreData {
  CoreCase c;
  bool bf16 = false;
  int64_t q_stride = 0, out_stride = 0;
  std::vector<float> q, kf, vf;
  std::vector<uint16_t> kb, vb;
  std::vector<int32_t> qpos, kpos;
  std::vector<uint8_t> kvalid;

  g3_core_args args(float* out, float* lse) const {
    g3_core_args a{};
    a.T = c.T;
    a.q = q.data();
    a.q_stride = q_stride;
    a.qpos = qpos.data();
    a.k = bf16 ? static_cast<const void*>(kb.data()) : kf.data();
    a.v = bf16 ? static_cast<const void*>(vb.data()) : vf.data();
    a.S = c.S;
    a.kpos = kpos.data();
    a.kvalid = kvalid.data();
    a.out = out;
    a.out_stride = out_stride;
    a.lse = lse;
    a.head_dim = c.dh;
    a.group = c.G;
    a.window = c.W;
    a.kv_dtype = bf16 ? G3_DTYPE_BF16 : G3_DTYPE_F32;
    a.causal = c.causal;
    a.causal_offset = 0;
    return a;
  }
  // Invalid slots filled with `bits` (a NaN, an Inf, or zero) in every form.
  void fill_invalid(float value) {
    const int64_t H = c.dh;
    for (int64_t s = 0; s < c.S; ++s)
      if (!kvalid[size_t(s)])
        for (int64_t h = 0; h < H; ++h) {
          const size_t i = size_t(s * H + h);
          kf[i] = vf[i] = value;
          kb[i] = vb[i] = g3::f32_to_bf16(value);
        }
  }
};

CoreData make_core_data(const CoreCase& c, bool bf16) {
  CoreData d;
  d.c = c;
  d.bf16 = bf16;
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<float> U(-1.f, 1.f);
  const int64_t T = c.T, S = c.S, H = c.dh, G = c.G;
  // Strides wider than G*H catch stride mix-ups.
  d.q_stride = G * H + 16;
  d.out_stride = G * H + 8;
  d.q.resize(size_t(T * d.q_stride));
  // Queries are already alpha-scaled in real use; 0.25 keeps logits O(1).
  for (auto& x : d.q) x = 0.25f * U(rng);
  d.kf.resize(size_t(S * H));
  d.vf.resize(size_t(S * H));
  d.kb.resize(d.kf.size());
  d.vb.resize(d.vf.size());
  for (size_t i = 0; i < d.kf.size(); ++i) {
    d.kb[i] = g3::f32_to_bf16(U(rng));
    d.vb[i] = g3::f32_to_bf16(2.f * U(rng));
    d.kf[i] = g3::bf16_to_f32(d.kb[i]);
    d.vf[i] = g3::bf16_to_f32(d.vb[i]);
  }
  d.kvalid.assign(size_t(S), 1);
  for (int64_t s = 0; s < S; ++s)
    if (rng() % 7 == 0) d.kvalid[size_t(s)] = 0;
  d.qpos.resize(size_t(T));
  d.kpos.resize(size_t(S));
  if (c.causal == G3_CAUSAL_SLOTS) {
    // Keys are the call's tokens (S = T): packed documents with repeats,
    // gaps and a decreasing run, so position order and token order differ.
    REQUIRE(S == T);
    int32_t p = 0;
    for (int64_t t = 0; t < T; ++t) {
      switch (rng() % 6) {
        case 0: p = 0; break;                      // a new packed document
        case 1: break;                             // a repeated position
        case 2: p += int32_t(rng() % 700); break;  // a gap, often past the window
        case 3: p = p > 5 ? p - 5 : 0; break;      // going backwards
        default: p += 1; break;
      }
      d.qpos[size_t(t)] = d.kpos[size_t(t)] = p;
    }
  } else {
    // A cache in arbitrary slot order (a ring): slots hold positions
    // 5 .. 5+S-1 shuffled; queries at the latest positions, newest first,
    // and one query before every key (a row with no visible key).
    for (int64_t s = 0; s < S; ++s) d.kpos[size_t(s)] = int32_t(5 + s);
    std::shuffle(d.kpos.begin(), d.kpos.end(), rng);
    for (int64_t t = 0; t < T; ++t) d.qpos[size_t(t)] = int32_t(5 + S - 1 - t);
    if (T > 3) d.qpos[1] = 2;
  }
  return d;
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
struct RowBound {
  double out = 0, lse = 0;
};

RowBound row_bound(const CoreData& d, int64_t t, int64_t g) {
  const int64_t H = d.c.dh, S = d.c.S;
  const double u = std::ldexp(1.0, -24), gH = H * u / (1 - H * u);
  g3_core_args a = d.args(nullptr, nullptr);
  const g3_row_bounds rb = g3_bounds_of(&a, t);
  const float* q = &d.q[size_t(t * d.q_stride + g * H)];
  double emax = 0, lmax = -INFINITY, lmin = INFINITY, vmax = 0;
  bool any = false;
  for (int64_t s = 0; s < S; ++s) {
    if (!g3_visible(rb, s, d.kpos[size_t(s)], d.kvalid[size_t(s)])) continue;
    any = true;
    double l = 0, e = 0;
    for (int64_t h = 0; h < H; ++h) {
      const double p = double(q[h]) * d.kf[size_t(s * H + h)];
      l += p;
      e += std::fabs(p);
      vmax = std::max(vmax, double(std::fabs(d.vf[size_t(s * H + h)])));
    }
    emax = std::max(emax, gH * e);
    lmax = std::max(lmax, l);
    lmin = std::min(lmin, l);
  }
  RowBound r;
  if (!any) return r;
  const double delta = 2 * emax + 16 * u * (1 + (lmax - lmin));
  r.out = (std::expm1(2 * delta) + (2.0 * S + 2.0 * H + 32) * u) * vmax;
  r.lse = delta + (S + 16) * u * (1 + std::fabs(lmax) + std::log(double(S)));
  return r;
}

struct Outputs {
  std::vector<float> out, lse;
};

Outputs run_core(g3_core_fn fn, const CoreData& d) {
  Outputs o;
  o.out.assign(size_t(d.c.T * d.out_stride), 123.f);  // garbage: every row must be written
  o.lse.assign(size_t(d.c.T * d.c.G), 123.f);
  g3_core_args a = d.args(o.out.data(), o.lse.data());
  fn(&a);
  return o;
}

// Rows that see at least one key.
bool row_sees_a_key(const CoreData& d, int64_t t) {
  g3_core_args a = d.args(nullptr, nullptr);
  const g3_row_bounds rb = g3_bounds_of(&a, t);
  for (int64_t s = 0; s < d.c.S; ++s)
    if (g3_visible(rb, s, d.kpos[size_t(s)], d.kvalid[size_t(s)])) return true;
  return false;
}

// Elements beyond the bound (outputs and lse); rows with no visible key
// must be zeros with lse = -inf (the contract).
int64_t count_violations(const CoreData& d, const Outputs& got, const Outputs& want, double* worst_ratio) {
  int64_t bad = 0;
  *worst_ratio = 0;
  const int64_t H = d.c.dh, G = d.c.G;
  for (int64_t t = 0; t < d.c.T; ++t) {
    const bool sees = row_sees_a_key(d, t);
    for (int64_t g = 0; g < G; ++g) {
      const float* o = &got.out[size_t(t * d.out_stride + g * H)];
      const float* w = &want.out[size_t(t * d.out_stride + g * H)];
      const float gl = got.lse[size_t(t * G + g)], wl = want.lse[size_t(t * G + g)];
      if (!sees) {
        for (int64_t h = 0; h < H; ++h) bad += o[h] != 0.f;
        bad += !(gl == -INFINITY);
        continue;
      }
      const RowBound rb = row_bound(d, t, g);
      for (int64_t h = 0; h < H; ++h) {
        const double e = std::fabs(double(o[h]) - double(w[h]));
        if (!(e <= rb.out)) ++bad;  // NaN counts as bad
        *worst_ratio = std::max(*worst_ratio, std::isnan(e) ? INFINITY : e / rb.out);
      }
      const double el = std::fabs(double(gl) - double(wl));
      if (!(el <= rb.lse)) ++bad;
    }
  }
  return bad;
}

std::vector<CoreCase> core_cases() {
  return {
      {"decode, ring order, local", 16, 2, 9, 1, 40, G3_CAUSAL_POSITIONS, 1},
      {"decode, long ring, global, G 4", 256, 4, 0, 1, 300, G3_CAUSAL_POSITIONS, 2},
      {"few rows, dh 128", 128, 2, 0, 3, 70, G3_CAUSAL_POSITIONS, 3},
      {"prefill, ring order, local", 256, 2, 33, 40, 130, G3_CAUSAL_POSITIONS, 4},
      {"prefill over many tiles, G 1", 64, 1, 0, 70, 200, G3_CAUSAL_POSITIONS, 5},
      {"packed tokens, local", 16, 2, 9, 60, 60, G3_CAUSAL_SLOTS, 6},
      {"packed tokens, global, dh 256 G 4", 256, 4, 0, 37, 37, G3_CAUSAL_SLOTS, 7},
      {"packed tokens, local, dh 128", 128, 2, 512, 150, 150, G3_CAUSAL_SLOTS, 8},
  };
}

g3::KernelKey key_of(const CoreCase& c, bool bf16) {
  g3::KernelKey k;
  k.head_dim = c.dh;
  k.group = c.G;
  k.window = c.W;
  k.rope_base = c.W ? 10000 : 1000000;
  k.rope_scale = 1;
  k.alpha = 0.0625f;
  k.kv_dtype = bf16 ? g3::DType::BF16 : g3::DType::F32;
  return k;
}

}  // namespace

TEST_CASE("every backend equals the official block for any positions (packed, repeated, gaps, decreasing)",
          "[conformance][positions]") {
  for (const Geometry& geo : geometries()) {
    for (const g3::LayerSpec& spec : {g3::layer_spec(geo.model, 0), g3::layer_spec(geo.model, 5 % geo.model.num_layers)}) {
      const g3::LayerWeights w = g3::random_layer_weights(spec, 3, g3::DType::BF16);
      for (const Route& r : routes())
        for (const Positions& p : position_patterns())
          for (g3::DType kv : {g3::DType::F32, g3::DType::BF16}) {
            INFO(geo.name << ", layer " << spec.index);
            check_block(spec, w, p, r, kv);
          }
    }
  }
}

TEST_CASE("every core stays within the derived f32 bound of the reference, f32 and bf16 K/V", "[conformance][core]") {
  for (const CoreCase& c : core_cases())
    for (bool bf16 : {false, true}) {
      CoreData d = make_core_data(c, bf16);
      d.fill_invalid(std::numeric_limits<float>::quiet_NaN());
      Outputs want = run_core(&g3::ref::core, d);
      for (const Route& r : routes()) {
        const g3::KernelChoice k = choose(key_of(c, bf16), r);
        Outputs got = run_core(k.kernels.table.core, d);
        double worst = 0;
        const int64_t bad = count_violations(d, got, want, &worst);
        INFO(r.name() << " case '" << c.name << "' kv " << (bf16 ? "bf16" : "f32") << ": worst error / bound "
                      << worst);
        CHECK(bad == 0);
      }
    }
}

TEST_CASE("the derived bound fails a core that drops one key", "[conformance][core]") {
  // The bound above must be able to fail: the reference with the most
  // influential visible key of the first row that sees two keys dropped
  // (as if masked) breaks it on every case.
  for (const CoreCase& c : core_cases()) {
    CoreData d = make_core_data(c, false);
    Outputs want = run_core(&g3::ref::core, d);
    g3_core_args a = d.args(nullptr, nullptr);
    int64_t drop = -1;
    for (int64_t t = 0; t < c.T && drop < 0; ++t) {
      const g3_row_bounds rb = g3_bounds_of(&a, t);
      int64_t seen = 0, best = -1;
      double best_l = -INFINITY;
      for (int64_t s = 0; s < c.S; ++s) {
        if (!g3_visible(rb, s, d.kpos[size_t(s)], d.kvalid[size_t(s)])) continue;
        ++seen;
        double l = 0;
        for (int64_t h = 0; h < c.dh; ++h) l += double(d.q[size_t(t * d.q_stride + h)]) * d.kf[size_t(s * c.dh + h)];
        if (l > best_l) best_l = l, best = s;
      }
      if (seen >= 2) drop = best;
    }
    REQUIRE(drop >= 0);
    CoreData dropped = d;
    dropped.kvalid[size_t(drop)] = 0;
    Outputs got = run_core(&g3::ref::core, dropped);
    double worst = 0;
    INFO("case '" << c.name << "': dropping slot " << drop);
    CHECK(count_violations(d, got, want, &worst) > 0);
  }
}

TEST_CASE("invalid slots never touch an output: NaN or Inf there changes no bit", "[conformance][core][nan]") {
  for (const CoreCase& c : core_cases())
    for (bool bf16 : {false, true}) {
      CoreData zeros = make_core_data(c, bf16), nans = zeros, infs = zeros;
      zeros.fill_invalid(0.f);
      nans.fill_invalid(std::numeric_limits<float>::quiet_NaN());
      infs.fill_invalid(-std::numeric_limits<float>::infinity());
      for (const Route& r : routes()) {
        const g3::KernelChoice k = choose(key_of(c, bf16), r);
        const Outputs a = run_core(k.kernels.table.core, zeros), b = run_core(k.kernels.table.core, nans),
                      e = run_core(k.kernels.table.core, infs);
        INFO(r.name() << " case '" << c.name << "' kv " << (bf16 ? "bf16" : "f32"));
        CHECK(std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4) == 0);
        CHECK(std::memcmp(a.out.data(), e.out.data(), a.out.size() * 4) == 0);
        CHECK(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0);
        CHECK(std::memcmp(a.lse.data(), e.lse.data(), a.lse.size() * 4) == 0);
      }
    }
}

TEST_CASE("slot causality with an offset: a call split in two equals the whole call", "[conformance][core]") {
  // G3_CAUSAL_SLOTS: query t sees slots s <= t + causal_offset, so callers
  // may cut the queries of a no-cache call into pieces.
  const CoreCase c{"split", 64, 2, 21, 50, 50, G3_CAUSAL_SLOTS, 9};
  const CoreData d = make_core_data(c, false);
  for (const Route& r : routes()) {
    const g3::KernelChoice k = choose(key_of(c, false), r);
    const Outputs whole = run_core(k.kernels.table.core, d);
    Outputs parts;
    parts.out.assign(whole.out.size(), 0.f);
    parts.lse.assign(whole.lse.size(), 0.f);
    for (int64_t t0 : {int64_t(0), int64_t(23)}) {
      const int64_t t1 = t0 == 0 ? 23 : c.T;
      g3_core_args a = d.args(parts.out.data() + t0 * d.out_stride, parts.lse.data() + t0 * c.G);
      a.T = t1 - t0;
      a.q = d.q.data() + t0 * d.q_stride;
      a.qpos = d.qpos.data() + t0;
      a.causal_offset = t0;
      k.kernels.table.core(&a);
    }
    double worst = 0;
    INFO(r.name());
    CHECK(count_violations(d, parts, whole, &worst) == 0);
  }
}

TEST_CASE("the reference honours --kv-dtype: bf16 K/V change its result the way they change ours",
          "[conformance][bf16]") {
  // Through run_apply, the `g3attn apply` path, on a golden case of the
  // in-repository subset. Rounding K and V to bf16 moves the output by about
  // 2^-9 of its size; the fast path with bf16 K/V must agree with the
  // reference with bf16 K/V far more closely than with the f32 reference.
  const std::string dir = g3test::golden_dir() + "/tiny_local_L2_T16_B2_leftpad";
  auto apply = [&](const std::string& backend, g3::DType kv) {
    g3::ApplyRequest r;
    r.config = dir + "/config.json";
    r.weights = dir + "/weights.safetensors";
    r.input = dir + "/x.npy";
    r.positions = dir + "/positions.npy";
    r.attention_mask = dir + "/attention_mask.npy";
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
