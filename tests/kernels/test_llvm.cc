// The LLVM ORC backend against the scalar reference (runtime/reference.h):
// g3_qk_fn and g3_core_fn on random awkward shapes, for the host and for the
// avx2 cap (and one shape on every runnable cap), plus every golden case
// through run_apply with --backend llvm.
//
// Bounds: 2e-5 + 2e-5 * |ref| for everything computed in f32. The one
// exception is the bf16 cache write of the qk stage: the kernel rounds its
// f32 result to bf16 while the reference rounds its double result, so near
// a rounding tie they may pick neighbouring bf16 values. One bf16 ulp is at
// most 2^-7 * |x|, hence 2e-5 + 2^-7 * |ref| there. The core reads the same
// bf16 bits as the reference, so its bound stays 2e-5 + 2e-5 * |ref|.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "generator/backend_api.h"
#include "generator/bf16.h"
#include "generator/llvm/llvm_backend.h"
#include "runtime/dispatch/isa.h"
#include "runtime/exec/apply.h"
#include "runtime/io/npy.h"
#include "runtime/reference/reference.h"
#include "tests/support/test_support.h"

namespace {

constexpr double kTol = 2e-5;

// Every run compiles from scratch into its own cache directory: the tests
// must exercise the compiler, and must not fill the user's ~/.cache.
struct ScratchCache {
  g3test::TempDir dir;
  ScratchCache() { setenv("G3ATTN_CACHE_DIR", dir.path.c_str(), 1); }
} g_scratch_cache;

g3::KernelKey make_key(int dh, int G, int W, g3::DType kv, double base = 1e4, double scale = 1.0) {
  g3::KernelKey k;
  k.head_dim = dh;
  k.group = G;
  k.window = W;
  k.rope_base = base;
  k.rope_scale = scale;
  k.alpha = static_cast<float>(1.0 / std::sqrt(double(dh)));
  k.kv_dtype = kv;
  k.weight_dtype = g3::DType::BF16;
  return k;
}

std::vector<float> kv_to_f32(const std::vector<uint8_t>& raw, g3::DType dt) {
  std::vector<float> out;
  if (dt == g3::DType::F32) {
    out.resize(raw.size() / 4);
    std::memcpy(out.data(), raw.data(), raw.size());
  } else {
    out.resize(raw.size() / 2);
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      out[i] = g3::bf16_to_f32(h);
    }
  }
  return out;
}

int64_t count_bad(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                  double* maxd) {
  int64_t bad = 0;
  *maxd = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double d = std::fabs(double(got[i]) - want[i]);
    if (!(d <= atol + rtol * std::fabs(want[i]))) ++bad;
    if (!(d <= *maxd)) *maxd = std::isnan(d) ? INFINITY : d;
  }
  return bad;
}

// Stage B-D: T tokens, some not written (slot -1), slots scattered in a cache
// with spare room, large and small positions.
void check_qk(const g3::KernelKey& key, const std::string& isa, int64_t T, uint32_t seed) {
  g3::BackendKernels k = g3::llvm_kernels(key, isa);
  REQUIRE(k.table.qk != nullptr);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int dh = key.head_dim, Nkv = 2, N = key.group * Nkv;
  const int64_t qstride = N * dh + 3, kvstride = Nkv * dh + 5, chs = T + 7;
  std::vector<float> q(size_t(T * qstride)), kk(size_t(T * kvstride)), v(size_t(T * kvstride));
  for (auto* vec : {&q, &kk, &v})
    for (auto& x : *vec) x = nd(rng) * 2.f;
  std::vector<float> qn(static_cast<size_t>(dh)), kn(static_cast<size_t>(dh));
  for (auto& x : qn) x = nd(rng) * 0.3f;
  for (auto& x : kn) x = nd(rng) * 0.3f;
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::vector<int64_t> slot(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    pos[t] = t % 3 == 0 ? int32_t(rng() % 131072) : int32_t(t);
    slot[t] = t % 5 == 4 ? -1 : (t * 3 + 1) % chs;  // distinct slots, some skipped
  }
  const size_t esz = key.kv_dtype == g3::DType::F32 ? 4 : 2;
  auto run = [&](g3_qk_fn fn, std::vector<float>* qout, std::vector<uint8_t>* kc, std::vector<uint8_t>* vc) {
    qout->assign(size_t(T * N * dh), 0.f);
    kc->assign(size_t(Nkv * chs * dh) * esz, 0);
    vc->assign(size_t(Nkv * chs * dh) * esz, 0);
    g3_qk_args a{};
    a.T = T;
    a.num_heads = N;
    a.num_kv_heads = Nkv;
    a.q = q.data();
    a.q_stride = qstride;
    a.k = kk.data();
    a.v = v.data();
    a.kv_stride = kvstride;
    a.pos = pos.data();
    a.q_norm = qn.data();
    a.k_norm = kn.data();
    a.q_out = qout->data();
    a.q_out_stride = N * dh;
    a.k_cache = kc->data();
    a.v_cache = vc->data();
    a.cache_head_stride = chs;
    a.slot = slot.data();
    a.head_dim = dh;
    a.kv_dtype = key.kv_dtype == g3::DType::F32 ? G3_DTYPE_F32 : G3_DTYPE_BF16;
    a.alpha = key.alpha;
    a.eps = 1e-6f;
    a.rope_base = key.rope_base;
    a.rope_scale = key.rope_scale;
    fn(&a);
  };
  std::vector<float> q1, q2;
  std::vector<uint8_t> k1, k2, v1, v2;
  run(k.table.qk, &q1, &k1, &v1);
  run(&g3::ref::qk, &q2, &k2, &v2);
  double d;
  INFO("qk " << key.str() << " isa " << isa << " T " << T);
  CHECK(count_bad(q1, q2, kTol, kTol, &d) == 0);
  const double krtol = key.kv_dtype == g3::DType::F32 ? kTol : std::ldexp(1.0, -7);
  CHECK(count_bad(kv_to_f32(k1, key.kv_dtype), kv_to_f32(k2, key.kv_dtype), kTol, krtol, &d) == 0);
  // V is copied (and rounded the same way from the same f32): exact.
  CHECK(v1 == v2);
}

// Stage E-I on one KV head: S slots with unsorted positions, invalid slots,
// queries with no visible key.
void check_core(const g3::KernelKey& key, const std::string& isa, int64_t T, int64_t S, uint32_t seed) {
  g3::BackendKernels k = g3::llvm_kernels(key, isa);
  REQUIRE(k.table.core != nullptr);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int dh = key.head_dim, G = key.group;
  const int64_t qstride = G * dh + 4, ostride = G * dh + 2;
  const size_t esz = key.kv_dtype == g3::DType::F32 ? 4 : 2;
  std::vector<float> q(size_t(T * qstride));
  for (auto& x : q) x = nd(rng) * 0.25f;
  std::vector<uint8_t> kc(size_t(S * dh) * esz), vc(size_t(S * dh) * esz);
  for (int64_t i = 0; i < S * dh; ++i) {
    float a = nd(rng), b = nd(rng);
    if (esz == 4) {
      std::memcpy(&kc[i * 4], &a, 4);
      std::memcpy(&vc[i * 4], &b, 4);
    } else {
      uint16_t ha = g3::f32_to_bf16(a), hb = g3::f32_to_bf16(b);
      std::memcpy(&kc[i * 2], &ha, 2);
      std::memcpy(&vc[i * 2], &hb, 2);
    }
  }
  // Slot positions: a shuffled range starting at 1000 (unsorted, like a ring
  // buffer), every 7th slot invalid and holding NaN garbage.
  std::vector<int32_t> kpos(static_cast<size_t>(S));
  std::vector<uint8_t> kvalid(size_t(S), 1);
  for (int64_t s = 0; s < S; ++s) kpos[s] = int32_t(1000 + s);
  std::shuffle(kpos.begin(), kpos.end(), rng);
  for (int64_t s = 0; s < S; s += 7) {
    kvalid[s] = 0;
    float nan = NAN;
    for (int h = 0; h < dh; ++h) {
      if (esz == 4) {
        std::memcpy(&vc[(s * dh + h) * 4], &nan, 4);
        std::memcpy(&kc[(s * dh + h) * 4], &nan, 4);
      } else {
        uint16_t hn = 0x7fc0;
        std::memcpy(&vc[(s * dh + h) * 2], &hn, 2);
        std::memcpy(&kc[(s * dh + h) * 2], &hn, 2);
      }
    }
  }
  // Query positions: mostly inside the cached range, some before it (no
  // visible key), in no particular order.
  std::vector<int32_t> qpos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) qpos[t] = t % 4 == 1 ? int32_t(rng() % 1000) : int32_t(1000 + rng() % (S + 5));
  auto run = [&](g3_core_fn fn, std::vector<float>* out, std::vector<float>* lse) {
    out->assign(size_t(T * ostride), 7.f);  // 7: detects rows never written
    lse->assign(size_t(T * G), 7.f);
    g3_core_args a{};
    a.T = T;
    a.q = q.data();
    a.q_stride = qstride;
    a.qpos = qpos.data();
    a.k = kc.data();
    a.v = vc.data();
    a.S = S;
    a.kpos = kpos.data();
    a.kvalid = kvalid.data();
    a.out = out->data();
    a.out_stride = ostride;
    a.lse = lse->data();
    a.head_dim = dh;
    a.group = G;
    a.window = key.window;
    a.kv_dtype = key.kv_dtype == g3::DType::F32 ? G3_DTYPE_F32 : G3_DTYPE_BF16;
    fn(&a);
  };
  std::vector<float> o1, o2, l1, l2;
  run(k.table.core, &o1, &l1);
  run(&g3::ref::core, &o2, &l2);
  // Compare only the written columns (out_stride leaves a gap).
  std::vector<float> a1, a2;
  int64_t empty_rows = 0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < G * dh; ++i) {
      a1.push_back(o1[t * ostride + i]);
      a2.push_back(o2[t * ostride + i]);
    }
    empty_rows += std::isinf(l2[t * G]) ? 1 : 0;
  }
  double d, dl;
  INFO("core " << key.str() << " isa " << isa << " T " << T << " S " << S << " (rows with no visible key: "
               << empty_rows << ")");
  CHECK(count_bad(a1, a2, kTol, kTol, &d) == 0);
  // lse: equal where finite, -inf where the reference has no visible key.
  int64_t lbad = 0;
  dl = 0;
  for (size_t i = 0; i < l1.size(); ++i) {
    if (std::isinf(l2[i])) {
      lbad += !(std::isinf(l1[i]) && l1[i] < 0);
      continue;
    }
    double e = std::fabs(double(l1[i]) - l2[i]);
    dl = std::max(dl, e);
    lbad += !(e <= kTol + kTol * std::fabs(l2[i]));
  }
  CHECK(lbad == 0);
  CHECK(d <= 1e-3);
}

std::vector<std::string> caps_to_test() {
  std::vector<std::string> v = {g3::best_isa()};
  if (g3::best_isa() != "avx2" && g3test::backend_runs_here("llvm", "avx2")) v.push_back("avx2");
  return v;
}

}  // namespace

TEST_CASE("llvm backend is available", "[llvm]") {
  std::string why;
  REQUIRE(g3::llvm_available(&why));
  g3::LlvmTarget t = g3::llvm_target_for("avx2");
  CHECK(t.vector_bits == 256);
  CHECK(g3::llvm_target_for("scalar").vector_bits == 128);
}

TEST_CASE("llvm qk stage equals ref::qk", "[llvm][qk]") {
  struct C {
    int dh, G;
    g3::DType kv;
    double base, scale;
  } cases[] = {{64, 1, g3::DType::F32, 1e4, 1.0},
               {128, 2, g3::DType::BF16, 1e6, 8.0},
               {256, 4, g3::DType::F32, 1e6, 8.0},
               {256, 8, g3::DType::BF16, 1e4, 1.0},
               {72, 2, g3::DType::F32, 1e4, 1.0}};  // head_dim not a power of two
  for (const auto& isa : caps_to_test())
    for (const auto& c : cases) {
      g3::KernelKey key = make_key(c.dh, c.G, 0, c.kv, c.base, c.scale);
      check_qk(key, isa, 1, 1);
      check_qk(key, isa, 13, 2);
    }
}

TEST_CASE("llvm core stage equals ref::core", "[llvm][core]") {
  // W values below and above S, none a multiple of any tile; T = 1 (decode),
  // T odd, and S not a multiple of the key tile.
  struct C {
    int dh, G, W;
    g3::DType kv;
  } cases[] = {{64, 1, 0, g3::DType::F32},   {64, 8, 37, g3::DType::BF16}, {128, 2, 0, g3::DType::BF16},
               {128, 4, 53, g3::DType::F32}, {256, 2, 0, g3::DType::F32},  {256, 8, 101, g3::DType::F32},
               {256, 1, 19, g3::DType::BF16}, {72, 2, 29, g3::DType::F32}};
  for (const auto& isa : caps_to_test())
    for (const auto& c : cases) {
      g3::KernelKey key = make_key(c.dh, c.G, c.W, c.kv);
      check_core(key, isa, 1, 77, 3);
      check_core(key, isa, 37, 141, 4);
      check_core(key, isa, 19, 5, 5);  // fewer slots than one tile
    }
}

TEST_CASE("llvm kernels on every runnable ISA cap", "[llvm][isa]") {
  g3::KernelKey key = make_key(128, 2, 45, g3::DType::BF16);
  for (const auto& isa : g3::isa_names()) {
    if (!g3test::backend_runs_here("llvm", isa)) continue;  // prints the skipped cap
    check_qk(key, isa, 9, 6);
    check_core(key, isa, 21, 90, 7);
  }
}

TEST_CASE("llvm kernels for one key are built once per process", "[llvm]") {
  g3::KernelKey key = make_key(64, 4, 0, g3::DType::F32, 1e6, 1.0);
  g3::BackendKernels a = g3::llvm_kernels(key, "avx2");
  int before = g3::llvm_compiles() + g3::llvm_cache_hits();
  g3::BackendKernels b = g3::llvm_kernels(key, "avx2");
  CHECK(g3::llvm_compiles() + g3::llvm_cache_hits() == before);
  CHECK(a.table.core == b.table.core);
}

namespace {

void check_golden(const std::string& name, const std::string& isa) {
  g3test::GoldenCheck g = g3test::check_golden_case(name, "llvm", isa);
  INFO(name << " " << g.backend << " " << g.isa << ": attn max diff " << g.attn_max << ", block max diff "
            << g.block_max);
  CHECK(g.backend == "llvm");  // a fallback to highway is not a pass
  CHECK(g.bad_attn == 0);
  CHECK(g.bad_block == 0);
}

}  // namespace

TEST_CASE("llvm backend reproduces every golden case", "[llvm][golden]") {
  auto cases = g3test::golden_cases();
  for (const auto& c : cases) {
    SECTION(c) {
      check_golden(c, "");
      if (g3test::backend_runs_here("llvm", "avx2")) check_golden(c, "avx2");
    }
  }
}
