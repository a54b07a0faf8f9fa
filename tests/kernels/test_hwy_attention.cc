// The Highway attention kernels (templates/attention-inl.h) against the
// scalar reference (ref::qk, ref::core), on every Highway target compiled in
// and supported by this CPU, specialised (keys of the built-in models) and
// generic (any other key); then every golden case through run_apply with
// backend "highway" on every such ISA.
//
// Tolerances:
//  - f32 KV: |ours - ref| <= 2e-5 + 2e-5 |ref| elementwise (the bound).
//  - bf16 KV, attention core: both sides read the same bf16 cache, so the
//    only difference is f32 vs double arithmetic, as with f32 KV: same bound.
//  - bf16 KV, cache written by the QK stage: ours and the reference compute
//    the f32 value to within a few f32 ulps (|d| <= ~1e-6 |x|), then both
//    round to bf16 (8 significant bits). When the two f32 values straddle a
//    rounding boundary they land on adjacent bf16 values, one bf16 ulp apart,
//    and a bf16 ulp is at most 2^-7 |x| (x in [2^e, 2^(e+1)), ulp 2^(e-7)).
//    Bound: |ours - ref| <= 1e-6 + 2^-7 |ref|. Almost every element is exact.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "generator/backend_api.h"
#include "generator/bf16.h"
#include "generator/catalogue.h"
#include "generator/errors.h"
#include "generator/kernel_key.h"
#include "runtime/dispatch/isa.h"
#include "runtime/exec/apply.h"
#include "runtime/io/npy.h"
#include "runtime/reference/reference.h"
#include "tests/support/test_support.h"

namespace {

constexpr double kTol = 2e-5;
constexpr double kBf16Rel = 1.0 / 128.0;  // one bf16 ulp, relative (see top)

// Highway ISAs this build compiled and this CPU runs; the others are
// printed as skipped, by name and reason.
std::vector<std::string> test_isas() {
  std::vector<std::string> v = g3test::highway_test_isas();
  REQUIRE_FALSE(v.empty());  // at least Highway's scalar target always runs
  return v;
}

struct Cmp {
  int64_t bad = 0, n = 0;
  double max_diff = 0;
  void add(double ours, double ref, double atol, double rtol) {
    ++n;
    const double d = std::fabs(ours - ref);
    if (std::isnan(ours) != std::isnan(ref) || d > atol + rtol * std::fabs(ref)) ++bad;
    if (d > max_diff) max_diff = d;
  }
};

float kv_at(const std::vector<uint8_t>& buf, g3::DType dt, size_t i) {
  if (dt == g3::DType::F32) {
    float f;
    std::memcpy(&f, buf.data() + i * 4, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, buf.data() + i * 2, 2);
  return g3::bf16_to_f32(b);
}

// ---------------------------------------------------------------------------
// QK stage

struct QkCase {
  int H, N, Nkv;
  int64_t T;
  double base, scale;
  float alpha;
  g3::DType kv;
};

void check_qk(const QkCase& c, const g3_qk_fn fn, const std::string& what, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t H = c.H, T = c.T, qs = c.N * H + 3, ks = c.Nkv * H + 5;  // odd strides
  std::vector<float> q(static_cast<size_t>(T * qs)), k(static_cast<size_t>(T * ks)), v(static_cast<size_t>(T * ks)),
      qn(static_cast<size_t>(H)), kn(static_cast<size_t>(H));
  for (auto& x : q) x = nd(rng) * 3.f;
  for (auto& x : k) x = nd(rng) * 3.f;
  for (auto& x : v) x = nd(rng);
  for (auto& x : qn) x = nd(rng) * 0.3f;
  for (auto& x : kn) x = nd(rng) * 0.3f;
  const int64_t S = T + 7;  // slots per KV head
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::vector<int64_t> slot(static_cast<size_t>(T));
  std::vector<int64_t> perm(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) perm[size_t(s)] = s;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_int_distribution<int32_t> pd(0, 140000);
  for (int64_t t = 0; t < T; ++t) {
    pos[size_t(t)] = t % 3 == 0 ? pd(rng) : int32_t(t);
    slot[size_t(t)] = t % 5 == 4 ? -1 : perm[size_t(t)];  // ring-like slots, some not written
  }
  const size_t esz = c.kv == g3::DType::F32 ? 4 : 2;
  auto make_args = [&](std::vector<float>& qout, std::vector<uint8_t>& kc, std::vector<uint8_t>& vc) {
    qout.assign(size_t(T * c.N * H), -7.f);
    kc.assign(size_t(c.Nkv * S * H) * esz, 0xAB);
    vc.assign(kc.size(), 0xCD);
    g3_qk_args a{};
    a.T = T;
    a.num_heads = c.N;
    a.num_kv_heads = c.Nkv;
    a.q = q.data();
    a.q_stride = qs;
    a.k = k.data();
    a.v = v.data();
    a.kv_stride = ks;
    a.pos = pos.data();
    a.q_norm = qn.data();
    a.k_norm = kn.data();
    a.q_out = qout.data();
    a.q_out_stride = c.N * H;
    a.k_cache = kc.data();
    a.v_cache = vc.data();
    a.cache_head_stride = S;
    a.slot = slot.data();
    a.head_dim = c.H;
    a.kv_dtype = c.kv == g3::DType::F32 ? G3_DTYPE_F32 : G3_DTYPE_BF16;
    a.alpha = c.alpha;
    a.eps = 1e-6f;
    a.rope_base = c.base;
    a.rope_scale = c.scale;
    return a;
  };
  std::vector<float> q_ref, q_out;
  std::vector<uint8_t> kc_ref, vc_ref, kc, vc;
  g3_qk_args ar = make_args(q_ref, kc_ref, vc_ref);
  g3::ref::qk(&ar);
  g3_qk_args ao = make_args(q_out, kc, vc);
  fn(&ao);
  // Large positions: the reference's double angles and ours are identical;
  // only the f32 rotation differs, so the bound holds at any position.
  Cmp cq, ck, cv;
  for (size_t i = 0; i < q_ref.size(); ++i) cq.add(q_out[i], q_ref[i], kTol, kTol);
  const double krel = c.kv == g3::DType::F32 ? kTol : kBf16Rel, katol = c.kv == g3::DType::F32 ? kTol : 1e-6;
  for (size_t i = 0; i < kc_ref.size() / esz; ++i) {
    // Unwritten slots must be untouched: compare raw bytes there too.
    ck.add(kv_at(kc, c.kv, i), kv_at(kc_ref, c.kv, i), katol, krel);
    cv.add(kv_at(vc, c.kv, i), kv_at(vc_ref, c.kv, i), 0, 0);  // V is copied (or rounded) exactly
  }
  INFO(what << " H" << c.H << " N" << c.N << " Nkv" << c.Nkv << " T" << T << " kv " << g3::to_string(c.kv)
            << ": q max diff " << cq.max_diff << " (" << cq.bad << " bad), k " << ck.max_diff << " (" << ck.bad
            << "), v " << cv.max_diff << " (" << cv.bad << ")");
  CHECK(cq.bad == 0);
  CHECK(ck.bad == 0);
  CHECK(cv.bad == 0);
}

// ---------------------------------------------------------------------------
// Attention core

struct CoreCase {
  int H, G, W;
  int64_t T, S;
  g3::DType kv;
  bool ring;       // slots hold positions in a shuffled order
  double invalid;  // fraction of invalid slots
  bool lse;
};

struct CoreData {
  std::vector<float> q;
  std::vector<uint8_t> k, v;
  std::vector<int32_t> qpos, kpos;
  std::vector<uint8_t> valid;
  int64_t q_stride = 0, out_stride = 0;
};

CoreData make_core_data(const CoreCase& c, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<double> ud(0, 1);
  CoreData d;
  d.q_stride = int64_t(c.G) * c.H + 4;
  d.out_stride = int64_t(c.G) * c.H + 12;
  d.q.resize(size_t(c.T * d.q_stride));
  // alpha-scaled queries of unit-RMS heads: logits of order 1..4.
  const float qs = 1.5f / std::sqrt(float(c.H));
  for (auto& x : d.q) x = nd(rng) * qs * (ud(rng) < 0.05 ? 4.f : 1.f);
  const size_t esz = c.kv == g3::DType::F32 ? 4 : 2;
  d.k.resize(size_t(c.S * c.H) * esz);
  d.v.resize(d.k.size());
  for (int64_t i = 0; i < c.S * c.H; ++i) {
    const float kx = nd(rng), vx = nd(rng);
    if (esz == 4) {
      std::memcpy(&d.k[size_t(i) * 4], &kx, 4);
      std::memcpy(&d.v[size_t(i) * 4], &vx, 4);
    } else {
      const uint16_t kb = g3::f32_to_bf16(kx), vb = g3::f32_to_bf16(vx);
      std::memcpy(&d.k[size_t(i) * 2], &kb, 2);
      std::memcpy(&d.v[size_t(i) * 2], &vb, 2);
    }
  }
  // The cache holds positions 0..S-1 (a context that has filled it), in slot
  // order or shuffled like a ring; some slots are invalid (padding,
  // unwritten) and carry junk positions.
  d.kpos.resize(size_t(c.S));
  d.valid.resize(size_t(c.S));
  for (int64_t s = 0; s < c.S; ++s) d.kpos[size_t(s)] = int32_t(s);
  if (c.ring) {
    // A ring buffer that wrapped: rotated, with a few local swaps.
    std::rotate(d.kpos.begin(), d.kpos.begin() + (c.S / 3), d.kpos.end());
    for (int64_t s = 0; s + 1 < c.S; s += 7) std::swap(d.kpos[size_t(s)], d.kpos[size_t(s + 1)]);
  }
  for (int64_t s = 0; s < c.S; ++s) {
    d.valid[size_t(s)] = ud(rng) >= c.invalid;
    if (!d.valid[size_t(s)] && s % 2) d.kpos[size_t(s)] = s % 4 == 1 ? INT32_MIN + 5 : 1;
  }
  // Queries: the last T positions of the context, plus a few early ones (see
  // little or nothing) and, for T > 2, one row that sees no key at all.
  d.qpos.resize(size_t(c.T));
  for (int64_t t = 0; t < c.T; ++t) d.qpos[size_t(t)] = int32_t(c.S - c.T + t);
  if (c.T > 2) {
    d.qpos[0] = 2;
    d.qpos[1] = -5;  // sees nothing (every valid position is >= 0)
  }
  return d;
}

g3_core_args core_args(const CoreCase& c, CoreData& d, std::vector<float>& out, std::vector<float>& lse) {
  out.assign(size_t(c.T * d.out_stride), 1234.f);
  lse.assign(size_t(c.T * c.G), 99.f);
  g3_core_args a{};
  a.T = c.T;
  a.q = d.q.data();
  a.q_stride = d.q_stride;
  a.qpos = d.qpos.data();
  a.k = d.k.data();
  a.v = d.v.data();
  a.S = c.S;
  a.kpos = d.kpos.data();
  a.kvalid = d.valid.data();
  a.out = out.data();
  a.out_stride = d.out_stride;
  a.lse = c.lse ? lse.data() : nullptr;
  a.head_dim = c.H;
  a.group = c.G;
  a.window = c.W;
  a.kv_dtype = c.kv == g3::DType::F32 ? G3_DTYPE_F32 : G3_DTYPE_BF16;
  return a;
}

// Runs the reference once and every kernel of `fns` against it.
void check_core(const CoreCase& c, const std::vector<std::pair<std::string, g3_core_fn>>& fns, std::mt19937& rng) {
  CoreData d = make_core_data(c, rng);
  std::vector<float> out_ref, lse_ref;
  g3_core_args ar = core_args(c, d, out_ref, lse_ref);
  ar.lse = lse_ref.data();
  g3::ref::core(&ar);
  for (const auto& [name, fn] : fns) {
    std::vector<float> out, lse;
    g3_core_args a = core_args(c, d, out, lse);
    fn(&a);
    Cmp co, cl;
    int64_t pad_touched = 0, no_key_rows = 0;
    for (int64_t t = 0; t < c.T; ++t)
      for (int g = 0; g < c.G; ++g) {
        const size_t o = size_t(t * d.out_stride + int64_t(g) * c.H);
        // Rows with no visible key: the contract's zeros and lse = -inf (the
        // reference kernel does the same), so they are checked too.
        if (std::isinf(lse_ref[size_t(t * c.G + g)])) ++no_key_rows;
        for (int h = 0; h < c.H; ++h) co.add(out[o + size_t(h)], out_ref[o + size_t(h)], kTol, kTol);
        if (c.lse) {
          const double lr = lse_ref[size_t(t * c.G + g)], lo = lse[size_t(t * c.G + g)];
          if (std::isinf(lr)) cl.add(std::isinf(lo) && lo < 0 ? 0 : 1, 0, 0, 0);
          else cl.add(lo, lr, kTol, kTol);
        }
      }
    // Output row padding (out_stride > G*H) must not be written.
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t i = int64_t(c.G) * c.H; i < d.out_stride; ++i)
        pad_touched += out[size_t(t * d.out_stride + i)] != 1234.f;
    INFO(name << " H" << c.H << " G" << c.G << " W" << c.W << " T" << c.T << " S" << c.S << " kv "
              << g3::to_string(c.kv) << (c.ring ? " ring" : "") << " invalid " << c.invalid << ": out max diff "
              << co.max_diff << " (" << co.bad << " bad of " << co.n << "), lse max diff " << cl.max_diff << " ("
              << cl.bad << " bad), rows without keys " << no_key_rows);
    CHECK(co.bad == 0);
    CHECK(cl.bad == 0);
    CHECK(pad_touched == 0);
  }
}

std::vector<g3::KernelKey> builtin_keys() {
  std::vector<g3::KernelKey> keys;
  for (const auto& name : {"1b", "4b", "27b"})  // 270m shares 1b's keys, 12b shares 4b's
    for (g3::DType kv : {g3::DType::F32, g3::DType::BF16})
      for (const auto& k : g3::distinct_keys(g3::builtin_model(name), kv, g3::DType::BF16)) keys.push_back(k);
  return keys;
}

}  // namespace

TEST_CASE("highway compiles the scalar target and the ISAs the build promises", "[hwy]") {
  auto isas = g3::highway_compiled_isas();
  REQUIRE(!isas.empty());
  CHECK(isas.front() == "scalar");
  for (const auto& i : isas) CHECK(g3::isa_compiled(i));
  CHECK_THROWS_AS(g3::highway_kernels(builtin_keys()[0], "bogus"), g3::InputError);
}

TEST_CASE("highway kernels are specialised for built-in keys and generic otherwise", "[hwy]") {
  for (const auto& isa : test_isas()) {
    for (const auto& name : g3::builtin_model_names())
      for (g3::DType kv : {g3::DType::F32, g3::DType::BF16})
        for (g3::DType w : {g3::DType::F32, g3::DType::BF16})
          for (const auto& k : g3::distinct_keys(g3::builtin_model(name), kv, w)) {
            g3::BackendKernels b = g3::highway_kernels(k, isa);
            INFO(name << " " << k.str() << " on " << isa);
            CHECK(b.specialised);
            CHECK(b.isa == isa);
            CHECK(b.table.qk != nullptr);
            CHECK(b.table.core != nullptr);
          }
    g3::KernelKey odd = builtin_keys()[0];
    odd.head_dim = 48;
    g3::BackendKernels b = g3::highway_kernels(odd, isa);
    CHECK_FALSE(b.specialised);
    CHECK(b.table.core != nullptr);
    CHECK(!b.note.empty());
  }
}

TEST_CASE("highway QK stage equals the reference on every ISA", "[hwy][qk]") {
  std::mt19937 rng(42);
  for (const auto& isa : test_isas()) {
    SECTION(isa) {
      // Specialised: the built-in keys with their own constants.
      for (const auto& k : builtin_keys()) {
        g3::BackendKernels b = g3::highway_kernels(k, isa);
        REQUIRE(b.specialised);
        QkCase c{k.head_dim, 2 * k.group, 2, 9, k.rope_base, k.rope_scale, k.alpha, k.kv_dtype};
        check_qk(c, b.table.qk, isa + " specialised " + k.str(), rng);
      }
      // Generic: other head_dims (including ones no vector width divides),
      // groups and RoPE constants.
      const QkCase generic[] = {
          {64, 8, 1, 5, 10000.0, 1.0, 0.125f, g3::DType::F32},
          {128, 4, 4, 17, 1e6, 8.0, 0.0883883476f, g3::DType::BF16},
          {16, 4, 2, 12, 1e6, 8.0, 0.25f, g3::DType::F32},
          {6, 3, 1, 4, 500.0, 2.0, 0.4082f, g3::DType::BF16},
          {256, 1, 1, 1, 10000.0, 1.0, 0.0625f, g3::DType::F32},
          {40, 2, 2, 33, 123456.0, 1.5, 0.158113883f, g3::DType::F32},
      };
      for (const auto& c : generic) {
        g3::KernelKey k;
        k.head_dim = c.H;
        k.group = c.N / c.Nkv;
        k.rope_base = c.base;
        k.rope_scale = c.scale;
        k.alpha = c.alpha;
        k.kv_dtype = c.kv;
        g3::BackendKernels b = g3::highway_kernels(k, isa);
        REQUIRE_FALSE(b.specialised);
        check_qk(c, b.table.qk, isa + " generic", rng);
      }
    }
  }
}

TEST_CASE("highway attention core equals the reference on every ISA (specialised keys)", "[hwy][core]") {
  std::mt19937 rng(7);
  const auto isas = test_isas();
  for (const auto& k : builtin_keys()) {
    std::vector<std::pair<std::string, g3_core_fn>> fns;
    for (const auto& isa : isas) {
      g3::BackendKernels b = g3::highway_kernels(k, isa);
      REQUIRE(b.specialised);
      fns.emplace_back(isa + " " + k.str(), b.table.core);
    }
    // Prefill-sized (T*G above the decode threshold, T not a multiple of any
    // tile, context ending mid-tile) and decode-sized calls.
    const int W = k.window;
    check_core({k.head_dim, k.group, W, 45, W > 0 ? W + 77 : 333, k.kv_dtype, false, 0.1, true}, fns, rng);
    check_core({k.head_dim, k.group, W, 1, W > 0 ? 2 * W + 13 : 517, k.kv_dtype, true, 0.05, true}, fns, rng);
    check_core({k.head_dim, k.group, W, 3, 190, k.kv_dtype, true, 0.0, false}, fns, rng);
  }
}

TEST_CASE("highway attention core equals the reference on every ISA (generic kernel)", "[hwy][core]") {
  std::mt19937 rng(11);
  const auto isas = test_isas();
  // head_dim 64/128/256 plus shapes no vector divides; G 1/2/4/8; windows
  // that are not a multiple of the 64-key tile; T = 1, T not a multiple of
  // the row tile; contexts that end mid-tile; ring-like slot orders; invalid
  // slots; rows with no visible key.
  const CoreCase cases[] = {
      {64, 1, 0, 1, 1, g3::DType::F32, false, 0.0, true},
      {64, 1, 0, 70, 70, g3::DType::F32, false, 0.0, true},
      {64, 8, 37, 29, 300, g3::DType::F32, true, 0.2, true},
      {128, 4, 0, 1, 1000, g3::DType::BF16, true, 0.1, true},
      {128, 2, 100, 67, 455, g3::DType::F32, false, 0.0, true},
      {128, 8, 0, 1, 129, g3::DType::F32, false, 0.3, true},
      {256, 1, 5, 7, 64, g3::DType::F32, false, 0.0, true},
      {256, 2, 65, 130, 260, g3::DType::BF16, true, 0.05, true},
      {256, 4, 0, 2, 333, g3::DType::BF16, false, 0.0, false},
      {16, 2, 4, 12, 12, g3::DType::F32, false, 0.2, true},
      {6, 3, 0, 9, 40, g3::DType::F32, true, 0.1, true},
      {40, 2, 0, 33, 97, g3::DType::BF16, false, 0.0, true},
      {64, 2, 1, 20, 20, g3::DType::F32, false, 0.0, true},  // window 1: each row sees only itself
      {64, 4, 0, 5, 0, g3::DType::F32, false, 0.0, true},    // empty cache: every row sees nothing
  };
  for (const auto& c : cases) {
    g3::KernelKey k;
    k.head_dim = c.H;
    k.group = c.G;
    k.window = c.W;
    k.rope_base = 77;  // no generated key has this base
    k.kv_dtype = c.kv;
    std::vector<std::pair<std::string, g3_core_fn>> fns;
    for (const auto& isa : isas) {
      g3::BackendKernels b = g3::highway_kernels(k, isa);
      REQUIRE_FALSE(b.specialised);
      fns.emplace_back(isa + " generic", b.table.core);
    }
    check_core(c, fns, rng);
  }
}

TEST_CASE("highway attention core: T*G rows spanning several row blocks", "[hwy][core]") {
  // More rows than one block of the prefill kernel (128), a local window
  // and a long cache so whole tiles are skipped on both sides of the window.
  std::mt19937 rng(5);
  g3::KernelKey k;
  k.head_dim = 64;
  k.group = 2;
  k.window = 100;
  k.rope_base = 77;
  std::vector<std::pair<std::string, g3_core_fn>> fns;
  for (const auto& isa : test_isas()) fns.emplace_back(isa, g3::highway_kernels(k, isa).table.core);
  check_core({64, 2, 100, 150, 700, g3::DType::F32, false, 0.02, true}, fns, rng);
  check_core({64, 2, 0, 150, 700, g3::DType::BF16, true, 0.02, true}, fns, rng);
}

// ---------------------------------------------------------------------------
// Golden cases through the `g3attn apply` code path with backend highway.

namespace {

void check_golden(const std::string& name, const std::string& isa) {
  g3test::GoldenCheck g = g3test::check_golden_case(name, "highway", isa);
  INFO(name << " " << g.backend << " " << g.isa << ": attn max diff " << g.attn_max << ", block max diff "
            << g.block_max);
  CHECK(g.backend == "highway");
  CHECK(g.isa == isa);
  CHECK(g.bad_attn == 0);
  CHECK(g.bad_block == 0);
}

}  // namespace

TEST_CASE("every golden case passes through run_apply with backend highway on every ISA", "[hwy][golden]") {
  const auto cases = g3test::golden_cases();
  for (const auto& isa : test_isas()) {
    SECTION(isa) {
      for (const auto& c : cases) check_golden(c, isa);
    }
  }
}
