// KV caches: the local-layer ring and the global full-length buffer must give
// what the official full-length layout gives (SPEC 1.3-1.6) for every query
// row with at least one visible key: chunked prefill with chunks that do not
// divide the prompt, decode across several wrap-arounds, long decode split
// into KV chunks, and padded batches (right padding with position gaps as the
// official sampler lays them out, and left padding). The official side is
// ref::block with a full-length ref::Cache and the official dense masks.
// Also: appends are all or nothing, for a batch, a chunked prompt and a
// single block call (at the end of the file).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "generator/errors.h"
#include "runtime/dispatch/big_buffer.h"
#include "runtime/dispatch/isa.h"
#include "runtime/exec/kv_cache.h"
#include "runtime/exec/model.h"
#include "runtime/reference/reference.h"
#include "tests/support/test_support.h"

using namespace g3;

namespace {




// The official stack: every layer has a full-length ref::Cache of S slots; a
// call's T tokens (padding too) go to slots end_index.. and the caller mask
// is mask[b][t][s] = slot s holds a real token && s <= end_index + t.
struct Official {
  ModelConfig cfg;
  std::vector<LayerSpec> specs;
  std::vector<LayerWeights> w;
  std::vector<ref::Cache> caches;
  std::vector<uint8_t> slot_real;
  int64_t B, S, end = 0;
  Official(const ModelConfig& c, const WeightSource& ws, int64_t B_, int64_t S_) : cfg(c), B(B_), S(S_) {
    specs = layer_specs(c);
    for (const auto& s : specs) {
      w.push_back(ws(s));
      caches.push_back(ref::Cache::zeros(B, S, c.num_kv_heads, c.head_dim));
    }
    slot_real.assign(size_t(B * S), 0);
  }
  // y [B][T][D]; has_key[b*T+t] says whether the row saw a key in every layer.
  void call(const float* x, const int32_t* pos, const uint8_t* real, int64_t T, float* y, std::vector<bool>* has_key) {
    const int64_t start = end, D = cfg.hidden_size;
    REQUIRE(start + T <= S);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) slot_real[size_t(b * S + start + t)] = real ? real[b * T + t] : 1;
    std::vector<uint8_t> mask(size_t(B * T * S), 0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t s = 0; s <= start + t; ++s) mask[size_t((b * T + t) * S + s)] = slot_real[size_t(b * S + s)];
    std::vector<float> cur(x, x + B * T * D), nxt(cur.size());
    for (size_t l = 0; l < specs.size(); ++l) {
      ref::block(specs[l], w[l], cur.data(), pos, B, T, mask.data(), &caches[l], nxt.data(), nullptr);
      cur.swap(nxt);
    }
    std::copy(cur.begin(), cur.end(), y);
    has_key->assign(size_t(B * T), true);
    const ref::Cache& c0 = caches[0];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        bool any_global = false, any_local = false;
        for (int64_t s = 0; s < S; ++s) {
          if (!mask[size_t((b * T + t) * S + s)]) continue;
          any_global = true;
          any_local = any_local || ref::sliding_visible(pos[b * T + t], c0.positions[size_t(b * S + s)],
                                                        cfg.sliding_window);
        }
        bool has_local = false;
        for (auto k : cfg.layer_types) has_local = has_local || k == LayerKind::Local;
        (*has_key)[size_t(b * T + t)] = any_global && (any_local || !has_local);
      }
    end += T;
  }
};

// Max |a - b| over rows flagged in ok (rows of D floats).
double max_diff(const std::vector<float>& a, const std::vector<float>& b, const std::vector<bool>& ok, int64_t D) {
  double m = 0;
  for (size_t r = 0; r < ok.size(); ++r) {
    if (!ok[r]) continue;
    for (int64_t d = 0; d < D; ++d) {
      double e = std::fabs(double(a[r * D + d]) - double(b[r * D + d]));
      if (!(e <= m)) m = std::isnan(e) ? INFINITY : e;
    }
  }
  return m;
}

struct Layout {
  int64_t B = 1;
  std::vector<int64_t> lengths;  // real prompt tokens per row
  int64_t Lpad = 0;              // padded prompt length
  bool left = false;             // left padding instead of right
};

// Runs prompt + decode through the runtime (ring caches, chunked) and the
// official stack, returns the max difference over rows with a visible key.
double compare(const ModelConfig& cfg, const Layout& lay, int64_t chunk, int64_t decode, const std::string& backend,
               const std::string& isa, DType kv, uint64_t seed, int threads = 2, int64_t* wraps = nullptr) {
  const int64_t B = lay.B, T = lay.Lpad, D = cfg.hidden_size;
  std::vector<float> x = g3test::randn(size_t(B * (T + decode) * D), seed + 1);
  std::vector<int32_t> pos(size_t(B * T));
  std::vector<uint8_t> real(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = lay.lengths[size_t(b)], pad = T - L;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = lay.left ? t - pad : t;  // index among the row's real tokens
      const bool r = i >= 0 && i < L;
      real[size_t(b * T + t)] = r;
      // The official cumsum rule: leading pads 0, trailing pads repeat the last position.
      pos[size_t(b * T + t)] = int32_t(r ? i : (i < 0 ? 0 : L - 1));
    }
  }
  WeightSource ws = g3test::random_weights(seed);
  ModelOptions o;
  o.backend = backend;
  o.isa = isa;
  o.kv_dtype = kv;
  o.batch = B;
  o.context = T + decode;
  o.chunk = chunk;
  o.threads = threads;
  Model m(cfg, ws, o);
  Official off(cfg, ws, B, T + decode);

  std::vector<float> xp(size_t(B * T * D));
  for (int64_t b = 0; b < B; ++b) std::copy_n(&x[size_t(b * (T + decode) * D)], T * D, &xp[size_t(b * T * D)]);
  std::vector<float> got(xp.size()), want(xp.size());
  std::vector<bool> ok;
  m.forward(xp.data(), pos.data(), real.data(), T, got.data());
  off.call(xp.data(), pos.data(), real.data(), T, want.data(), &ok);
  double worst = max_diff(got, want, ok, D);
  INFO("prefill diff " << worst);
  for (int64_t k = 0; k < decode; ++k) {
    std::vector<float> xd(size_t(B * D)), g1(size_t(B * D)), w1(size_t(B * D));
    std::vector<int32_t> pd(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      std::copy_n(&x[size_t((b * (T + decode) + T + k) * D)], D, &xd[size_t(b * D)]);
      pd[size_t(b)] = int32_t(lay.lengths[size_t(b)] + k);  // the row's own next position: gaps in slots
    }
    m.forward(xd.data(), pd.data(), nullptr, 1, g1.data());
    off.call(xd.data(), pd.data(), nullptr, 1, w1.data(), &ok);
    worst = std::max(worst, max_diff(g1, w1, ok, D));
  }
  if (wraps) {
    *wraps = 0;
    for (int l = 0; l < cfg.num_layers; ++l)
      if (m.cache(l).is_ring()) *wraps = std::max(*wraps, m.cache(l).written(0) / m.cache(l).capacity());
  }
  return worst;
}

}  // namespace

TEST_CASE("ring caches equal the official full-length layout through chunked prefill and wrapping decode",
          "[kv][ring]") {
  const std::vector<std::vector<LayerKind>> stacks = {
      {LayerKind::Local}, {LayerKind::Global}, {LayerKind::Local, LayerKind::Global, LayerKind::Local}};
  for (const auto& backend : {std::string("reference"), std::string("auto")}) {
    const std::string isa = backend == "reference" ? "scalar" : "best";
    for (const auto& kinds : stacks)
      for (int64_t chunk : {5, 7, 13}) {
        ModelConfig cfg = g3test::tiny_model(kinds, 4);
        Layout lay;
        lay.B = 2;
        lay.lengths = {37, 37};
        lay.Lpad = 37;
        // Enough decode steps for three wrap-arounds of the ring after prefill.
        const int64_t cap = ring_slots(4, chunk, 1 << 20);
        int64_t wraps = 0;
        double d = compare(cfg, lay, chunk, 3 * cap + 2, backend, isa, DType::F32, 11, 2, &wraps);
        INFO("backend " << backend << " layers " << kinds.size() << " first kind " << to_string(kinds[0])
                        << " chunk " << chunk << " max diff " << d);
        CHECK(d <= 2e-4);
        if (kinds[0] == LayerKind::Local) CHECK(wraps >= 3 + 37 / cap);
      }
  }
}

TEST_CASE("long decode splits the KV scan into chunks merged by log-sum-exp", "[kv][decode]") {
  // 600 prompt positions over 2 KV heads: on two cores or more the global
  // layer's decode is cut into two pieces (BlockSplit: 2 items per hardware
  // thread, pieces of at least 256 slots), so the lse merge runs.
  ModelConfig cfg = g3test::tiny_model({LayerKind::Global, LayerKind::Local}, 8);
  Layout lay;
  struct Case {
    const char* what;
    ModelConfig cfg;
    int64_t prompt, decode;
    uint64_t seed;
  };
  const Case cases[] = {
      {"global over 600 positions, two pieces", cfg, 600, 3, 5},
      // 100 positions with chunk 128: the local layer's cache is full length
      // (W + chunk - 1 > the context), so its scan starts at the window.
      {"full-length local", cfg, 100, 3, 6},
      // A local layer of window 600 over a ring of 600 + 128 - 1 slots: 700
      // prompt positions and 40 decode steps wrap it, so the visible 600
      // slots are two spans and the piece that holds the wrap is two calls.
      {"wrapped ring of window 600", g3test::tiny_model({LayerKind::Local}, 600), 700, 40, 7},
  };
  for (const Case& c : cases)
    for (const char* backend : {"reference", "auto"}) {
      lay.lengths = {c.prompt};
      lay.Lpad = c.prompt;
      const double d = compare(c.cfg, lay, 128, c.decode, backend,
                               std::string(backend) == "reference" ? "scalar" : "best", DType::F32, c.seed);
      INFO(backend << " " << c.what << ", max diff " << d);
      CHECK(d <= 2e-4);
    }
}

TEST_CASE("right-padded batch with position gaps matches the official sampler layout", "[kv][batch]") {
  // SPEC 1.6: prompts right-padded to a bucket; decode tokens land after the
  // pad gap in the official cache while positions continue per row, so the
  // window must be measured in positions.
  Layout lay;
  lay.B = 3;
  lay.lengths = {9, 5, 7};
  lay.Lpad = 12;
  for (const auto& backend : {std::string("reference"), std::string("auto")}) {
    const std::string isa = backend == "reference" ? "scalar" : "best";
    double d = compare(g3test::tiny_model({LayerKind::Local, LayerKind::Global, LayerKind::Local}, 4), lay, 5, 10, backend, isa,
                       DType::F32, 21);
    INFO(backend << " max diff " << d);
    CHECK(d <= 2e-4);
  }
}

TEST_CASE("left-padded batch matches the official layout on rows that see a key", "[kv][batch]") {
  Layout lay;
  lay.B = 3;
  lay.lengths = {9, 5, 7};
  lay.Lpad = 9;
  lay.left = true;
  double d = compare(g3test::tiny_model({LayerKind::Local, LayerKind::Global}, 3), lay, 4, 7, "reference", "scalar", DType::F32, 31);
  INFO("max diff " << d);
  CHECK(d <= 2e-4);
}

TEST_CASE("bf16 KV caches stay close to the f32 official layout", "[kv][bf16]") {
  Layout lay;
  lay.lengths = {40};
  lay.Lpad = 40;
  double d = compare(g3test::tiny_model({LayerKind::Local, LayerKind::Global}, 4), lay, 6, 12, "reference", "scalar", DType::BF16, 41);
  INFO("max diff " << d);
  CHECK(d <= 5e-2);
  CHECK(d > 0);  // bf16 rounding is visible: the cache really is bf16
}

TEST_CASE("LayerKvCache assigns ring slots in arrival order and rejects bad positions", "[kv][unit]") {
  ModelConfig cfg = g3test::tiny_model({LayerKind::Local, LayerKind::Global}, 4);
  LayerKvCache local(layer_spec(cfg, 0), DType::F32, 2, 100, 3);
  LayerKvCache global(layer_spec(cfg, 1), DType::BF16, 1, 10, 3);
  CHECK(local.capacity() == 6);  // W + C - 1
  CHECK(local.is_ring());
  CHECK(global.capacity() == 10);
  CHECK(!global.is_ring());
  CHECK(global.bytes() == 2u * 2 * 10 * 16 * 2);

  // One block call: check, then take slots.
  std::vector<int64_t> slot(3);
  auto reserve = [&](LayerKvCache& c, int64_t b, const int32_t* p, const uint8_t* r, int64_t T) {
    c.check_append(b, p, r, T, T);
    c.append(b, p, r, T, slot.data());
  };
  const int32_t p1[3] = {0, 1, 2};
  const uint8_t r1[3] = {1, 0, 1};
  reserve(local, 0, p1, r1, 3);
  CHECK(slot == std::vector<int64_t>{0, -1, 1});
  CHECK(local.kvalid(0)[1] == 1);
  CHECK(local.kvalid(0)[2] == 0);
  CHECK(local.kpos(0)[1] == 2);
  CHECK(local.last_position(0) == 2);
  for (int32_t p = 3; p < 10; ++p) {
    reserve(local, 0, &p, nullptr, 1);
    CHECK(slot[0] == (p - 1) % 6);
  }
  CHECK(local.written(0) == 9);
  CHECK(local.used(0) == 6);
  CHECK(local.written(1) == 0);  // rows are independent
  CHECK(local.last_position(1) == -1);

  const int32_t back[1] = {5};
  CHECK_THROWS_AS(local.check_append(0, back, nullptr, 1, 1), InputError);
  const int32_t neg[1] = {-1};
  CHECK_THROWS_AS(local.check_append(1, neg, nullptr, 1, 1), InputError);
  // Six tokens fit the ring as two block calls of three, not as one call.
  const int32_t six[6] = {20, 21, 22, 23, 24, 25};
  CHECK_NOTHROW(local.check_append(1, six, nullptr, 6, 3));
  CHECK_THROWS_AS(local.check_append(1, six, nullptr, 6, 6), InputError);
  // Positions must increase across the calls a check covers, not only within one.
  const int32_t dip[6] = {20, 21, 22, 22, 24, 25};
  CHECK_THROWS_AS(local.check_append(1, dip, nullptr, 6, 3), InputError);
  CHECK(local.written(1) == 0);  // checking changes nothing
  for (int32_t p = 0; p < 10; ++p) reserve(global, 0, &p, nullptr, 1);
  const int32_t more[1] = {10};
  CHECK_THROWS_AS(global.check_append(0, more, nullptr, 1, 1), InputError);  // context exceeded
  global.reset();
  CHECK(global.written(0) == 0);
  CHECK(global.kvalid(0)[0] == 0);
  CHECK(global.last_position(0) == -1);
}

TEST_CASE("LayerKvCache keeps K and V in one buffer, on 2 MiB pages once it holds 512 KiB", "[kv][unit]") {
  // 1B's local ring (1023 slots of one 256-wide KV head) in bf16: just
  // under 512 KiB each of K and V, so alone neither reaches the size that
  // goes on huge pages (runtime/dispatch/big_buffer.h); together they do.
  const ModelConfig m = builtin_model("1b");
  const LayerSpec local = layer_spec(m, 0);
  REQUIRE(local.window == 512);
  for (DType t : {DType::F32, DType::BF16})
    for (int64_t batch : {1, 2}) {
      LayerKvCache c(local, t, batch, 8192, 512);
      CAPTURE(int(t), batch);
      CHECK(c.capacity() == 1023);
      const auto* k = static_cast<const uint8_t*>(c.k(0));
      const auto* v = static_cast<const uint8_t*>(c.v(0));
      CHECK(reinterpret_cast<uintptr_t>(k) % kHugePageBytes == 0);
      // Every row's K, then from the next line every row's V.
      CHECK(v - k == std::ptrdiff_t((size_t(batch) * c.sequence_bytes() + 63) / 64 * 64));
      CHECK(reinterpret_cast<uintptr_t>(v) % 64 == 0);
      if (batch == 2) {
        CHECK(static_cast<const uint8_t*>(c.k(1)) - k == std::ptrdiff_t(c.sequence_bytes()));
        CHECK(static_cast<const uint8_t*>(c.v(1)) - v == std::ptrdiff_t(c.sequence_bytes()));
      }
    }
}

TEST_CASE("kv_bytes: 27B at 128K positions, bf16, ring vs full length", "[kv][plan]") {
  ModelConfig m = builtin_model("27b");
  const uint64_t per_slot = 2ull * 16 * 128 * 2;  // K and V, 16 KV heads, dh 128, bf16
  KvBytes k = kv_bytes(m, 131072, 1, DType::BF16, 1);
  CHECK(k.ring == 10 * 131072 * per_slot + 52 * 1024 * per_slot);
  CHECK(k.full_length == 62 * 131072 * per_slot);
  const double gib = double(1ull << 30);
  CHECK(std::fabs(double(k.ring) / gib - 10.40625) < 1e-9);
  CHECK(double(k.full_length) / gib == 62.0);
  KvBytes c = kv_bytes(m, 131072, 2, DType::BF16, 512);
  CHECK(c.ring == 2 * (10 * 131072 * per_slot + 52 * (1024 + 511) * per_slot));

  g3test::TempDir dir;
  auto r = g3test::run_g3attn({"plan", "--model", "27b", "--context", "131072", "--batch", "1", "--kv-dtype", "bf16",
                               "--json", dir.file("plan.json")});
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(g3test::read_text(dir.file("plan.json")));
  CHECK(j["kv_bytes"]["ring"].get<uint64_t>() == k.ring);
  CHECK(j["kv_bytes"]["full_length"].get<uint64_t>() == k.full_length);
  CHECK(j["kv_bytes"]["context"] == 131072);
  CHECK(j["kv_bytes"]["batch"] == 1);
  CHECK(j["kv_bytes"]["dtype"] == "bf16");
  CHECK(j["layers"].size() == 62);
  auto t = g3test::run_g3attn({"plan", "--model", "27b", "--context", "131072", "--kv-dtype", "bf16", "--chunk", "512"});
  REQUIRE(t.exit_code == 0);
  CHECK(t.out.find("ring 10.") != std::string::npos);
  CHECK(t.out.find("full length 62 GiB") != std::string::npos);
  CHECK(g3test::run_g3attn({"plan", "--model", "1b", "--context", "0"}).exit_code == 2);
}

// ---------------------------------------------------------------------------
// All-or-nothing appends. A refused call must leave every cache exactly as it
// was, so that the same caches go on with good input and give, bit for bit,
// what caches that never saw the refused call give (README: "a refused call
// changes nothing").

namespace {

// Everything a cache holds, per row: the counters, and every slot's position,
// validity byte and K/V bytes.
struct CacheState {
  std::vector<int64_t> counters;
  std::vector<int32_t> kpos;
  std::vector<uint8_t> kvalid, kv;
  bool operator==(const CacheState&) const = default;
};

void add_state(const LayerKvCache& c, CacheState& s) {
  const size_t seq = size_t(c.bytes() / 2 / uint64_t(c.batch()));
  for (int64_t b = 0; b < c.batch(); ++b) {
    s.counters.insert(s.counters.end(), {c.written(b), c.used(b), c.last_position(b)});
    s.kpos.insert(s.kpos.end(), c.kpos(b), c.kpos(b) + c.capacity());
    s.kvalid.insert(s.kvalid.end(), c.kvalid(b), c.kvalid(b) + c.capacity());
    for (const void* p : {c.k(b), c.v(b)}) {
      const uint8_t* q = static_cast<const uint8_t*>(p);
      s.kv.insert(s.kv.end(), q, q + seq);
    }
  }
}

CacheState state_of(const Model& m) {
  CacheState s;
  for (int l = 0; l < m.config().num_layers; ++l) add_state(m.cache(l), s);
  return s;
}

// One call of `pos.size() / B` tokens per row on N(0, 1) inputs from `seed`;
// `real` empty means every token is real.
std::vector<float> call(Model& m, const std::vector<int32_t>& pos, const std::vector<uint8_t>& real, uint64_t seed) {
  const int64_t B = m.options().batch, T = int64_t(pos.size()) / B, D = m.config().hidden_size;
  std::vector<float> x = g3test::randn(size_t(B * T * D), seed), y(x.size());
  m.forward(x.data(), pos.data(), real.empty() ? nullptr : real.data(), T, y.data());
  return y;
}

// Bit for bit (NaN included), without printing whole vectors on failure.
bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<int32_t> iota_rows(int64_t B, int32_t first, int64_t T) {
  std::vector<int32_t> p(size_t(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) p[size_t(b * T + t)] = first + int32_t(t);
  return p;
}

// A local layer (ring of W + C - 1 = 6 slots) and a global one, chunk 3, so
// that prompts run as several chunks and the ring wraps.
ModelOptions small_options(const std::string& backend, int64_t B, int64_t context) {
  ModelOptions o;
  o.backend = backend;
  o.isa = backend == "reference" ? "scalar" : "best";
  o.batch = B;
  o.context = context;
  o.chunk = 3;
  o.threads = 2;
  return o;
}

// `bad` must be refused without changing any cache; then `m` (which saw it)
// and `fresh` (which did not) run the same good calls and must agree bit for
// bit.
void refused_then_continue(Model& m, Model& fresh, const std::function<void(Model&)>& bad,
                           const std::vector<std::vector<int32_t>>& good) {
  const CacheState before = state_of(m);
  CHECK_THROWS_AS(bad(m), InputError);
  CHECK(state_of(m) == before);
  for (size_t i = 0; i < good.size(); ++i) {
    INFO("good call " << i);
    CHECK(bitwise_equal(call(m, good[i], {}, 300 + i), call(fresh, good[i], {}, 300 + i)));
  }
  CHECK(state_of(m) == state_of(fresh));
}

}  // namespace

TEST_CASE("a batch call with one bad row changes no cache, and the model goes on as if it never happened",
          "[kv][atomic]") {
  const ModelConfig cfg = g3test::tiny_model({LayerKind::Local, LayerKind::Global}, 4);
  const int64_t B = 2, context = 40;
  // Row 0 is good in every bad call; row 1 breaks one rule.
  struct Bad {
    const char* what;
    std::vector<int32_t> pos;
    std::vector<uint8_t> real;
  };
  std::vector<Bad> bads = {
      {"row 1 repeats a position within the call", {7, 8, 7, 7}, {}},
      {"row 1 goes back to its cached last position", {7, 6}, {}},
      {"row 1 has a negative position", {7, -1}, {}},
  };
  {
    // Row 1 runs past the context in its twelfth chunk, row 0 holds three
    // real tokens and padding.
    Bad over{"row 1 exceeds the context", {}, {}};
    const int64_t T = 34;
    for (int64_t t = 0; t < T; ++t) {
      over.pos.push_back(int32_t(7 + std::min<int64_t>(t, 2)));
      over.real.push_back(t < 3);
    }
    for (int64_t t = 0; t < T; ++t) {
      over.pos.push_back(int32_t(7 + t));
      over.real.push_back(1);
    }
    bads.push_back(over);
  }
  for (const auto& backend : {std::string("reference"), std::string("auto")})
    for (const Bad& bad : bads) {
      INFO(backend << ": " << bad.what);
      Model m(cfg, g3test::random_weights(51), small_options(backend, B, context));
      Model fresh(cfg, g3test::random_weights(51), small_options(backend, B, context));
      // Seven prompt tokens (chunks of 3, 3, 1): the ring has wrapped once.
      call(m, iota_rows(B, 0, 7), {}, 1);
      call(fresh, iota_rows(B, 0, 7), {}, 1);
      refused_then_continue(
          m, fresh, [&](Model& mm) { call(mm, bad.pos, bad.real, 2); },
          {iota_rows(B, 7, 5), iota_rows(B, 12, 1), iota_rows(B, 13, 1), iota_rows(B, 14, 1)});
    }
}

TEST_CASE("a prompt whose later chunk is bad changes no layer's cache", "[kv][atomic]") {
  const ModelConfig cfg = g3test::tiny_model({LayerKind::Local, LayerKind::Global, LayerKind::Local}, 4);
  const int64_t B = 1, context = 15;
  struct Bad {
    const char* what;
    int64_t cached;  // prompt tokens before the bad call
    std::vector<int32_t> pos;
  };
  const std::vector<Bad> bads = {
      {"second chunk repeats a position", 0, {0, 1, 2, 3, 3, 5, 6}},
      {"third chunk goes backwards", 4, {4, 5, 6, 7, 8, 9, 2}},
      {"fourth chunk exceeds the context", 4, {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}},
  };
  for (const auto& backend : {std::string("reference"), std::string("auto")})
    for (const Bad& bad : bads) {
      INFO(backend << ": " << bad.what);
      Model m(cfg, g3test::random_weights(61), small_options(backend, B, context));
      Model fresh(cfg, g3test::random_weights(61), small_options(backend, B, context));
      if (bad.cached > 0) {
        call(m, iota_rows(B, 0, bad.cached), {}, 1);
        call(fresh, iota_rows(B, 0, bad.cached), {}, 1);
      }
      const int32_t next = int32_t(bad.cached);
      refused_then_continue(
          m, fresh, [&](Model& mm) { call(mm, bad.pos, {}, 2); },
          {iota_rows(B, next, 7), iota_rows(B, next + 7, 1), iota_rows(B, next + 8, 1)});
    }
}

TEST_CASE("run_block_cached checks every row before any row takes a slot", "[kv][atomic]") {
  const ModelConfig cfg = g3test::tiny_model({LayerKind::Local, LayerKind::Global}, 4);
  const WeightSource ws = g3test::random_weights(71);
  const int64_t B = 2, context = 30, chunk = 3, D = cfg.hidden_size;
  ThreadPool pool(2);
  BlockScratch scratch;
  // Row 0 is good in every bad call; row 1 breaks one rule.
  struct Bad {
    const char* what;
    std::vector<int32_t> pos;
    std::vector<uint8_t> real;
  };
  std::vector<Bad> bads = {
      {"row 1 repeats a position", {6, 7, 6, 6}, {}},
      {"row 1 goes back", {6, 5}, {}},
      {"row 1 is negative", {6, -4}, {}},
  };
  {
    // Row 0 has one real token; row 1 has more than the ring's chunk and,
    // on the global layer, more than the context holds.
    Bad big{"row 1 writes too many tokens", {}, {}};
    const int64_t T = 25;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        big.pos.push_back(int32_t(6 + (b == 0 ? 0 : t)));
        big.real.push_back(b == 1 || t == 0);
      }
    bads.push_back(big);
  }
  for (const auto& backend : {std::string("reference"), std::string("auto")})
    for (int layer : {0, 1}) {
      const LayerSpec spec = layer_spec(cfg, layer);
      const PreparedLayer L =
          prepare_layer(spec, ws(spec), DType::F32, backend, resolve_isa(backend == "reference" ? "scalar" : "best"));
      auto run = [&](LayerKvCache& c, const std::vector<int32_t>& pos, const std::vector<uint8_t>& real,
                     uint64_t seed) {
        const int64_t T = int64_t(pos.size()) / B;
        std::vector<float> x = g3test::randn(size_t(B * T * D), seed), y(x.size());
        run_block_cached(L, c, x.data(), pos.data(), real.empty() ? nullptr : real.data(), B, T, y.data(), pool,
                         scratch);
        return y;
      };
      auto state = [](const LayerKvCache& c) {
        CacheState s;
        add_state(c, s);
        return s;
      };
      for (const Bad& bad : bads) {
        INFO(backend << " layer " << layer << ": " << bad.what);
        LayerKvCache cache(spec, DType::F32, B, context, chunk), fresh(spec, DType::F32, B, context, chunk);
        REQUIRE(cache.is_ring() == (layer == 0));
        // Two calls of three tokens: the ring (6 slots) is full.
        for (int32_t p0 : {0, 3}) {
          const std::vector<int32_t> pos = iota_rows(B, p0, 3);
          CHECK(bitwise_equal(run(cache, pos, {}, 10 + p0), run(fresh, pos, {}, 10 + p0)));
        }
        const CacheState before = state(cache);
        CHECK_THROWS_AS(run(cache, bad.pos, bad.real, 20), InputError);
        CHECK(state(cache) == before);
        // The ring wraps in these.
        for (int32_t p0 : {6, 9, 12}) {
          const std::vector<int32_t> pos = iota_rows(B, p0, 3);
          CHECK(bitwise_equal(run(cache, pos, {}, 30 + p0), run(fresh, pos, {}, 30 + p0)));
        }
        CHECK(state(cache) == state(fresh));
      }
    }
}
