// The model stack: decode equals one-shot prefill, results do not depend on
// the thread count, batch rows are independent, the parallel reference stack
// equals ref::block, the thread pool itself, and `g3attn run` end to end.
#include <catch2/catch.hpp>
#include <atomic>
#include <memory>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "generator/errors.h"
#include "runtime/exec/block.h"
#include "runtime/exec/decode_traffic.h"
#include "runtime/exec/model.h"
#include "runtime/exec/run.h"
#include "runtime/exec/run_driver.h"
#include "runtime/exec/thread_pool.h"
#include "runtime/reference/reference.h"
#include "runtime/reference/reference_stack.h"
#include "tests/support/test_support.h"

using namespace g3;

namespace {


const std::vector<LayerKind> kSix = {LayerKind::Local, LayerKind::Local, LayerKind::Local,
                                     LayerKind::Local, LayerKind::Local, LayerKind::Global};



double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double e = std::fabs(double(a[i]) - double(b[i]));
    if (!(e <= m)) m = std::isnan(e) ? INFINITY : e;
  }
  return m;
}

ModelOptions opts(const std::string& backend, int64_t B, int64_t context, int64_t chunk, int threads) {
  ModelOptions o;
  o.backend = backend;
  o.isa = backend == "reference" ? "scalar" : "best";
  o.batch = B;
  o.context = context;
  o.chunk = chunk;
  o.threads = threads;
  return o;
}

// Prefill `prompt` tokens (chunked by the model), then decode one token per
// step; returns [B][prompt + decode][D].
std::vector<float> run(Model& m, const std::vector<float>& x, int64_t prompt, int64_t decode) {
  const int64_t B = m.options().batch, D = m.config().hidden_size, L = prompt + decode;
  std::vector<float> out(size_t(B * L * D));
  std::vector<float> xp(size_t(B * prompt * D)), yp(xp.size());
  std::vector<int32_t> pp(size_t(B * prompt));
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(&x[size_t(b * L * D)], prompt * D, &xp[size_t(b * prompt * D)]);
    for (int64_t t = 0; t < prompt; ++t) pp[size_t(b * prompt + t)] = int32_t(t);
  }
  m.forward(xp.data(), pp.data(), nullptr, prompt, yp.data());
  for (int64_t b = 0; b < B; ++b) std::copy_n(&yp[size_t(b * prompt * D)], prompt * D, &out[size_t(b * L * D)]);
  for (int64_t k = 0; k < decode; ++k) {
    std::vector<float> xd(size_t(B * D)), yd(size_t(B * D));
    std::vector<int32_t> pd(size_t(B), int32_t(prompt + k));
    for (int64_t b = 0; b < B; ++b) std::copy_n(&x[size_t((b * L + prompt + k) * D)], D, &xd[size_t(b * D)]);
    m.forward(xd.data(), pd.data(), nullptr, 1, yd.data());
    for (int64_t b = 0; b < B; ++b) std::copy_n(&yd[size_t(b * D)], D, &out[size_t((b * L + prompt + k) * D)]);
  }
  return out;
}

}  // namespace

TEST_CASE("the thread pool runs every item once, nests inline and rethrows", "[runtime][pool]") {
  for (int n : {1, 2, 3}) {
    ThreadPool pool(n);
    CHECK(pool.size() == n);
    std::vector<std::atomic<int>> hits(1000);
    for (int rep = 0; rep < 20; ++rep)
      pool.parallel_for(1000, [&](int64_t i) {
        hits[size_t(i)]++;
        pool.parallel_for(2, [](int64_t) {});  // nested: inline
      });
    for (auto& h : hits) CHECK(h.load() == 20);
    CHECK_THROWS_AS(pool.parallel_for(10, [](int64_t i) { if (i == 7) throw InputError("seven"); }), InputError);
    int count = 0;
    pool.parallel_for(0, [&](int64_t) { ++count; });
    CHECK(count == 0);
  }
}

TEST_CASE("decode one token at a time equals one-shot prefill", "[runtime][decode]") {
  for (const auto& backend : {std::string("reference"), std::string("auto")}) {
    ModelConfig cfg = g3test::tiny_model(kSix, 4);
    const int64_t L = 30, D = cfg.hidden_size;
    std::vector<float> x = g3test::randn(size_t(L * D), 3);
    Model one(cfg, g3test::random_weights(7), opts(backend, 1, L, L, 2));
    Model dec(cfg, g3test::random_weights(7), opts(backend, 1, L, 4, 2));
    auto a = run(one, x, L, 0);
    auto b = run(dec, x, 9, L - 9);
    INFO(backend << " max diff " << max_abs(a, b));
    CHECK(max_abs(a, b) <= 2e-5);
  }
}

TEST_CASE("results do not depend on the thread count", "[runtime][threads]") {
  // Work is split by shape, never by thread count, so results are
  // bit-identical; the 600-token prompt makes the decode KV split run too.
  for (const auto& backend : {std::string("reference"), std::string("auto")}) {
    ModelConfig cfg = g3test::tiny_model({LayerKind::Local, LayerKind::Global}, 8);
    const int64_t B = 2, prompt = 600, decode = 3, D = cfg.hidden_size;
    std::vector<float> x = g3test::randn(size_t(B * (prompt + decode) * D), 9);
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2, 3}) {
      Model m(cfg, g3test::random_weights(4), opts(backend, B, prompt + decode, 128, threads));
      outs.push_back(run(m, x, prompt, decode));
    }
    INFO(backend);
    CHECK(max_abs(outs[0], outs[1]) == 0);
    CHECK(max_abs(outs[0], outs[2]) == 0);
  }
}

TEST_CASE("batch rows are independent: changing one row leaves the others bit-identical", "[runtime][batch]") {
  for (const auto& backend : {std::string("reference"), std::string("auto")}) {
    ModelConfig cfg = g3test::tiny_model(kSix, 4);
    const int64_t B = 3, prompt = 21, decode = 5, L = prompt + decode, D = cfg.hidden_size;
    std::vector<float> x = g3test::randn(size_t(B * L * D), 12);
    Model m(cfg, g3test::random_weights(8), opts(backend, B, L, 8, 2));
    auto a = run(m, x, prompt, decode);
    for (int64_t i = L * D; i < 2 * L * D; ++i) x[size_t(i)] = -2.f * x[size_t(i)] + 0.5f;  // row 1 only
    m.reset();
    auto b = run(m, x, prompt, decode);
    for (int64_t row : {0, 2}) {
      const auto first = a.begin() + row * L * D, last = first + L * D;
      CHECK(std::equal(first, last, b.begin() + row * L * D));
    }
    CHECK(!std::equal(a.begin() + L * D, a.begin() + 2 * L * D, b.begin() + L * D));
    // A row run alone gives the same result as inside the batch, up to f32
    // rounding (a GEMM may tile a lone row differently from a batch's rows).
    Model solo(cfg, g3test::random_weights(8), opts(backend, 1, L, 8, 2));
    std::vector<float> x2(x.begin() + 2 * L * D, x.begin() + 3 * L * D);
    auto c = run(solo, x2, prompt, decode);
    CHECK(max_abs(c, std::vector<float>(b.begin() + 2 * L * D, b.begin() + 3 * L * D)) <= 1e-5);
  }
}

TEST_CASE("the parallel reference stack equals ref::block with the official cache", "[runtime][reference]") {
  ModelConfig cfg = g3test::tiny_model({LayerKind::Local, LayerKind::Global, LayerKind::Local}, 4);
  const int64_t B = 2, T = 11, decode = 4, S = T + decode, D = cfg.hidden_size;
  WeightSource ws = g3test::random_weights(2);
  ThreadPool pool(2);
  ReferenceStack rs(cfg, ws, B, S, pool);
  std::vector<LayerSpec> specs = layer_specs(cfg);
  std::vector<LayerWeights> w;
  std::vector<ref::Cache> caches;
  for (const auto& s : specs) {
    w.push_back(ws(s));
    caches.push_back(ref::Cache::zeros(B, S, cfg.num_kv_heads, cfg.head_dim));
  }
  std::vector<float> x = g3test::randn(size_t(B * T * D), 5);
  std::vector<int32_t> pos(size_t(B * T));
  std::vector<uint8_t> real(size_t(B * T), 1);
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = pos[size_t(T + t)] = int32_t(t);
  for (int64_t t = 8; t < T; ++t) {  // row 1 right-padded after 8 tokens
    real[size_t(T + t)] = 0;
    pos[size_t(T + t)] = 7;
  }
  std::vector<uint8_t> slot_real(size_t(B * S), 0);
  auto official = [&](const float* xin, const int32_t* p, const uint8_t* rl, int64_t n, int64_t start, float* y) {
    std::vector<uint8_t> mask(size_t(B * n * S), 0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t) slot_real[size_t(b * S + start + t)] = rl ? rl[b * n + t] : 1;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t s = 0; s <= start + t; ++s) mask[size_t((b * n + t) * S + s)] = slot_real[size_t(b * S + s)];
    std::vector<float> cur(xin, xin + B * n * D), nxt(cur.size());
    for (size_t l = 0; l < specs.size(); ++l) {
      ref::block(specs[l], w[l], cur.data(), p, B, n, mask.data(), &caches[l], nxt.data(), nullptr);
      cur.swap(nxt);
    }
    std::copy(cur.begin(), cur.end(), y);
  };
  std::vector<float> got(x.size()), want(x.size());
  rs.forward(x.data(), pos.data(), real.data(), T, got.data());
  official(x.data(), pos.data(), real.data(), T, 0, want.data());
  CHECK(max_abs(got, want) <= 1e-6);
  for (int64_t k = 0; k < decode; ++k) {
    std::vector<float> xd = g3test::randn(size_t(B * D), 100 + k), g1(xd.size()), w1(xd.size());
    std::vector<int32_t> pd = {int32_t(T + k), int32_t(8 + k)};
    rs.forward(xd.data(), pd.data(), nullptr, 1, g1.data());
    official(xd.data(), pd.data(), nullptr, 1, T + k, w1.data());
    CHECK(max_abs(g1, w1) <= 1e-6);
  }
}

// A stack whose every forward call takes about 2 ms, for drive_run alone.
struct SleepStack {
  std::function<void(int, int64_t)> on_layer;
  int64_t num_layers() const { return 1; }
  RunLayer route(int64_t) const { return {}; }
  std::vector<double> layer_ms() const { return {calls * 2.0}; }
  void forward(const float*, const int32_t*, const uint8_t*, int64_t, float*) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ++calls;
  }
  int calls = 0;
};

TEST_CASE("drive_run: decode_pause runs before and after every decode step, outside the decode's time",
          "[runtime]") {
  RunRequest r;
  r.config = builtin_model("270m");
  r.prompt = 4;
  r.chunk = 4;
  r.decode = 3;
  std::vector<int64_t> seen;
  r.decode_pause = [&](int64_t done) {
    seen.push_back(done);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  };
  SleepStack stack;
  RunResult res;
  drive_run(stack, r, run_inputs(r), r.chunk, res);
  CHECK(seen == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(stack.calls == 4);  // one prefill chunk, three steps
  // Four pauses of 200 ms would make it at least 800 ms.
  CHECK(res.decode_s >= 0.005);
  CHECK(res.decode_s < 0.4);
}

TEST_CASE("g3attn run: summary, JSON and --verify on a small model", "[runtime][cli]") {
  g3test::TempDir dir;
  auto r = g3test::run_g3attn({"run", "--model", "270m", "--prompt", "40", "--decode", "3", "--chunk", "16",
                               "--threads", "2", "--verify", "--json", dir.file("run.json")});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("MLPs not included") != std::string::npos);
  CHECK(r.out.find("prefill:") != std::string::npos);
  CHECK(r.out.find("decode:") != std::string::npos);
  CHECK(r.out.find("time split: local") != std::string::npos);
  CHECK(r.out.find("KV memory:") != std::string::npos);
  CHECK(r.err.find("MLPs are not part of it") != std::string::npos);
  auto j = nlohmann::json::parse(g3test::read_text(dir.file("run.json")));
  CHECK(j["model"]["name"] == "270m");
  CHECK(j["model"]["hidden_size"] == 640);
  CHECK(j["model"]["num_layers"] == 18);
  CHECK(j["prefill_tokens_per_s"].get<double>() > 0);
  CHECK(j["decode_ms_per_token"].get<double>() > 0);
  // The decode floor: 270m's traffic at a measured DRAM rate, and the ratio
  // of the step time to it.
  CHECK(r.out.find("decode floor:") != std::string::npos);
  const g3::DecodeTraffic t =
      g3::decode_traffic(g3::builtin_model("270m"), g3::DType::BF16, g3::DType::F32, 1, 40 + (3 + 1) / 2);
  CHECK(j["decode_floor"]["weight_bytes"].get<double>() == t.weight_bytes);
  CHECK(j["decode_floor"]["kv_bytes"].get<double>() == t.kv_bytes);
  CHECK(j["decode_floor"]["dram_read_gbs"].get<double>() > 0);
  // The DRAM rate, read before the first step and after the last (270m's
  // steps are far shorter than the 250 ms between further passes).
  const auto& passes = j["decode_floor"]["dram_passes"];
  REQUIRE(passes.size() >= 2);
  CHECK(passes.front()["after_steps"] == 0);
  CHECK(passes.back()["after_steps"] == 3);
  for (const auto& p : passes) CHECK(p["gbs"].get<double>() > 0);
  CHECK(j["decode_floor"]["dram_read_gbs"].get<double>() ==
        Approx((t.weight_bytes + t.kv_bytes) / (j["decode_floor"]["floor_ms"].get<double>() * 1e-3) / 1e9));
  CHECK(j["decode_floor"]["ratio"].get<double>() ==
        Approx(j["decode_ms_per_token"].get<double>() / j["decode_floor"]["floor_ms"].get<double>()));
  CHECK(j["kv_bytes"]["ring"].get<uint64_t>() <= j["kv_bytes"]["full_length"].get<uint64_t>());
  CHECK(j["verify"]["max_abs_diff"].get<double>() <= 1e-3);
  REQUIRE(j["layers"].size() == 18);
  CHECK(j["layers"][5]["kind"] == "global");
  CHECK(j["layers"][4]["kind"] == "local");
  CHECK(j["layers"][5]["key"] != j["layers"][4]["key"]);
  CHECK(j["layers"][0]["key"] == j["layers"][4]["key"]);
  for (const char* f : {"index", "kind", "key", "backend", "isa", "ms"}) CHECK(j["layers"][0].contains(f));
  // Each kind's decode ms per layer and step: the layers' decode times over
  // the 3 steps, averaged per kind. The layers run inside the step, so their
  // times add up to no more than the step's.
  CHECK(r.out.find("decode per layer and step: local") != std::string::npos);
  double local_sum = 0, global_sum = 0;
  int nlocal = 0, nglobal = 0;
  for (const auto& l : j["layers"]) {
    if (l["kind"] == "local") local_sum += l["decode_ms"].get<double>(), ++nlocal;
    else global_sum += l["decode_ms"].get<double>(), ++nglobal;
  }
  REQUIRE(nlocal == 15);
  REQUIRE(nglobal == 3);
  const double per_local = j["decode_ms_per_layer"]["local"].get<double>();
  const double per_global = j["decode_ms_per_layer"]["global"].get<double>();
  CHECK(per_local == Approx(local_sum / nlocal / 3));
  CHECK(per_global == Approx(global_sum / nglobal / 3));
  CHECK(per_local > 0);
  CHECK(per_global > 0);
  CHECK(nlocal * per_local + nglobal * per_global <= j["decode_ms_per_token"].get<double>() * (1 + 1e-9));

  CHECK(g3test::run_g3attn({"run", "--chunk", "0"}).exit_code == 2);
  CHECK(g3test::run_g3attn({"run", "--model", "nope"}).exit_code == 2);
  CHECK(g3test::run_g3attn({"run", "--kv-dtype", "f16"}).exit_code == 2);
  auto h = g3test::run_g3attn({"run", "--help"});
  CHECK(h.exit_code == 0);
  CHECK(h.out.find("--threads") != std::string::npos);
}

TEST_CASE("g3attn run --json alone prints only JSON on stdout", "[runtime][cli]") {
  // README: `--json` alone prints JSON to stdout instead of the text, so
  // `g3attn run --json | python3 -m json.tool` works; the banner and
  // progress lines stay on stderr.
  auto r = g3test::run_g3attn({"run", "--model", "270m", "--prompt", "64", "--decode", "2", "--chunk", "32",
                               "--threads", "2", "--json"});
  INFO("stdout: " << r.out.substr(0, 400) << "\nstderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  nlohmann::json j;
  REQUIRE_NOTHROW(j = nlohmann::json::parse(r.out));  // the whole of stdout, nothing before or after
  CHECK(j["model"]["name"] == "270m");
  CHECK(j["prompt"] == 64);
  CHECK(j["decode"] == 2);
  CHECK(j["layers"].size() == 18);
  CHECK(r.out.find("prefill:") == std::string::npos);
  CHECK(r.err.find("MLPs are not part of it") != std::string::npos);
  // The same through a pipe, as users run it (python3 when this machine has it).
  if (g3test::run_shell("command -v python3").exit_code == 0) {
    // In parentheses: run_shell's </dev/null must not replace the pipe as python3's input.
    auto p = g3test::run_shell("('" + g3test::g3attn_bin() +
                               "' run --model 270m --prompt 64 --decode 2 --threads 2 --json | python3 -m json.tool)");
    INFO(p.err);
    CHECK(p.exit_code == 0);
  } else {
    std::printf("skipped: the python3 -m json.tool pipe (no python3 here; the JSON parsed above)\n");
  }
}

TEST_CASE("every backend of this build runs the stack like the reference stack", "[runtime][backends]") {
  // Gemma-like head geometry (dh 256, G 4 and G 2) at a small width, so JITs
  // that specialise only real head sizes are exercised too.
  for (int kv_heads : {1, 2}) {
    ModelConfig cfg = g3test::tiny_model(kSix, 8);
    cfg.head_dim = 256;
    cfg.num_kv_heads = kv_heads;
    cfg.query_pre_attn_scalar = 256;
    const int64_t B = 2, prompt = 23, decode = 4, L = prompt + decode, D = cfg.hidden_size;
    std::vector<float> x = g3test::randn(size_t(B * L * D), 17);
    // The official layout in double (ReferenceStack), one-shot prefill.
    ThreadPool pool(2);
    ReferenceStack rs(cfg, g3test::random_weights(6), B, L, pool);
    std::vector<float> want(size_t(B * L * D));
    {
      std::vector<float> xp(size_t(B * prompt * D)), yp(xp.size());
      std::vector<int32_t> pp(size_t(B * prompt));
      for (int64_t b = 0; b < B; ++b) {
        std::copy_n(&x[size_t(b * L * D)], prompt * D, &xp[size_t(b * prompt * D)]);
        for (int64_t t = 0; t < prompt; ++t) pp[size_t(b * prompt + t)] = int32_t(t);
      }
      rs.forward(xp.data(), pp.data(), nullptr, prompt, yp.data());
      for (int64_t b = 0; b < B; ++b) std::copy_n(&yp[size_t(b * prompt * D)], prompt * D, &want[size_t(b * L * D)]);
      for (int64_t k = 0; k < decode; ++k) {
        std::vector<float> xd(size_t(B * D)), yd(xd.size());
        std::vector<int32_t> pd(size_t(B), int32_t(prompt + k));
        for (int64_t b = 0; b < B; ++b) std::copy_n(&x[size_t((b * L + prompt + k) * D)], D, &xd[size_t(b * D)]);
        rs.forward(xd.data(), pd.data(), nullptr, 1, yd.data());
        for (int64_t b = 0; b < B; ++b) std::copy_n(&yd[size_t(b * D)], D, &want[size_t((b * L + prompt + k) * D)]);
      }
    }
    for (const std::string backend : {"reference", "highway", "llvm", "xbyak", "auto"}) {
      // A backend this build or CPU lacks is skipped by name (the helper
      // decides from build flags and CPUID, not from the registry); every
      // other one must run itself: a fallback to highway is not a pass.
      if (backend != "auto" && !g3test::backend_runs_here(backend, "best")) continue;
      // README: auto takes highway for f32 KV (this model's).
      const std::string expect = backend == "auto" ? "highway" : backend;
      Model m(cfg, g3test::random_weights(6), opts(backend, B, L, 7, 2));
      for (const PreparedLayer& layer : m.layers()) {
        INFO("backend " << backend << " layer " << layer.spec.index << ": ran " << layer.kernels.backend << " "
                        << layer.kernels.kernels.isa << " (" << layer.kernels.fallback << ")");
        CHECK(layer.kernels.backend == expect);
        CHECK(layer.kernels.fallback.empty());
      }
      auto got = run(m, x, prompt, decode);
      INFO("backend " << backend << " Nkv " << kv_heads << " max diff " << max_abs(got, want));
      CHECK(max_abs(got, want) <= 1e-4);
    }
  }
}

TEST_CASE("the attention core stage equals one unsplit reference call per KV head", "[runtime][core]") {
  // run_attention_core is what the cached block and `g3attn bench`'s prefill
  // and decode rows run: query tiles, scans cut at the causal end, and long
  // decodes split into KV chunks merged by their log-sum-exp. On the
  // reference kernels, on 1, 2 and 3 threads, it must equal one call of
  // ref::core over the whole cache per (row, KV head), up to the float
  // rounding of the merge.
  struct Case {
    const char* model;
    g3::LayerKind kind;
    int64_t context, T;
  };
  const Case cases[] = {
      // 1b: one KV head, window 512, so decode splits its range into chunks
      // and a local prefill's tiles start inside the window (the ring wraps).
      {"1b", g3::LayerKind::Local, 1300, 130}, {"1b", g3::LayerKind::Global, 700, 130},
      {"1b", g3::LayerKind::Local, 2000, 1},   {"1b", g3::LayerKind::Global, 2000, 1},
      // 4b: four KV heads, G = 2.
      {"4b", g3::LayerKind::Local, 1500, 1},   {"4b", g3::LayerKind::Global, 1500, 1},
  };
  for (const Case& c : cases) {
    g3::ModelConfig m = g3::builtin_model(c.model);
    m.hidden_size = 64;  // the core does not depend on D
    g3::LayerSpec spec;
    for (const auto& s : g3::layer_specs(m))
      if (s.kind == c.kind) {
        spec = s;
        break;
      }
    const int64_t B = 2, T = c.T, H = spec.head_dim, N = spec.num_heads, K = spec.num_kv_heads, G = N / K;
    const g3::PreparedLayer L =
        g3::prepare_layer(spec, g3::random_layer_weights(spec, 1, g3::DType::BF16), g3::DType::F32, "reference", "");
    // A cache of `context` positions per row, appended in calls of at most
    // 256 tokens (the ring is sized for that), with random K/V.
    g3::LayerKvCache cache(spec, g3::DType::F32, B, c.context, 256);
    for (int64_t b = 0; b < B; ++b) {
      std::vector<float> kv = g3test::randn(size_t(2 * cache.capacity() * K * H), uint64_t(10 + b));
      std::copy_n(kv.begin(), cache.capacity() * K * H, static_cast<float*>(cache.k(b)));
      std::copy_n(kv.begin() + cache.capacity() * K * H, cache.capacity() * K * H, static_cast<float*>(cache.v(b)));
    }
    std::vector<int32_t> pos;
    std::vector<int64_t> slot;
    for (int64_t t0 = 0; t0 < c.context; t0 += 256) {
      const int64_t n = std::min<int64_t>(256, c.context - t0);
      pos.resize(size_t(n));
      slot.resize(size_t(n));
      for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(t0 + i);
      for (int64_t b = 0; b < B; ++b) cache.append(b, pos.data(), nullptr, n, slot.data());
    }
    std::vector<int32_t> qpos(size_t(B * T));
    for (int64_t i = 0; i < B * T; ++i) qpos[size_t(i)] = int32_t(c.context - T + i % T);
    std::vector<float> q = g3test::randn(size_t(B * T * N * H), 3);
    for (float& x : q) x *= spec.alpha;

    // The reference: one unsplit call per (row, KV head) over every slot.
    std::vector<float> want(size_t(B * T * N * H));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < K; ++j) {
        g3_core_args a{};
        a.T = T;
        a.q = q.data() + (b * T * N + j * G) * H;
        a.q_stride = N * H;
        a.qpos = qpos.data() + b * T;
        a.k = static_cast<const float*>(cache.k(b)) + j * cache.capacity() * H;
        a.v = static_cast<const float*>(cache.v(b)) + j * cache.capacity() * H;
        a.S = cache.capacity();
        a.kpos = cache.kpos(b);
        a.kvalid = cache.kvalid(b);
        a.out = want.data() + (b * T * N + j * G) * H;
        a.out_stride = N * H;
        a.head_dim = int32_t(H);
        a.group = int32_t(G);
        a.window = spec.window;
        a.kv_dtype = G3_DTYPE_F32;
        g3::ref::core(&a);
      }
    for (int threads : {1, 2, 3}) {
      g3::ThreadPool pool(threads);
      g3::BlockScratch S;
      g3::reserve_scratch(L, B * T, S);
      std::copy(q.begin(), q.end(), S.q.begin());
      g3::run_attention_core(L, cache, qpos.data(), B, T, pool, S);
      double err = 0;
      for (size_t i = 0; i < want.size(); ++i) err = std::max(err, double(std::fabs(S.enc[i] - want[i])));
      INFO(c.model << " " << g3::to_string(c.kind) << " context " << c.context << " T " << T << ", " << threads
                   << " threads: max |diff| " << err);
      CHECK(err < 1e-5);
    }
  }
}

TEST_CASE("decode traffic: weights once per step, K/V per sequence up to the window", "[runtime][traffic]") {
  const g3::ModelConfig m = g3::builtin_model("1b");
  // 1B: 26 layers of D = 1152, N = 4, Nkv = 1, dh = 256; q/k/v are
  // (4 + 2) x 256 rows of 1152 and o_proj 1152 x 1024: 2,949,120 weights a
  // layer, 2 bytes each in bf16.
  const g3::DecodeTraffic t = g3::decode_traffic(m, g3::DType::BF16, g3::DType::F32, 1, 2048);
  CHECK(t.weight_bytes == 26.0 * 2949120 * 2);
  // Every layer reads K and V of its one KV head: global layers all 2048
  // positions, local layers their 512-position window.
  int global = 0;
  for (int i = 0; i < m.num_layers; ++i) global += g3::layer_spec(m, i).kind == g3::LayerKind::Global;
  CHECK(global == 4);
  const double row = 2.0 * 256 * 4;  // K and V rows of one position, f32
  CHECK(t.kv_bytes == row * (global * 2048.0 + (26 - global) * 512.0));
  // bf16 weights and KV halve what they read; a batch multiplies only K/V.
  const g3::DecodeTraffic b = g3::decode_traffic(m, g3::DType::F32, g3::DType::BF16, 3, 2048);
  CHECK(b.weight_bytes == 2 * t.weight_bytes);
  CHECK(b.kv_bytes == 1.5 * t.kv_bytes);
  // Below the window, local layers see the whole (short) context.
  CHECK(g3::decode_traffic(m, g3::DType::BF16, g3::DType::F32, 1, 100).kv_bytes == row * 26 * 100);
}
