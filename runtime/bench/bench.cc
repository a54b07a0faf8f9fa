// The bench harness. Every row times the runtime's own code, the code `g3attn
// run` runs: a layer prepared with the row's backend and ISA
// (runtime/exec/block.h), the runtime's KV caches and thread pool. Prefill
// and decode rows time the attention core stage of a cached block call
// (run_attention_core: query tiles per KV head, long decodes split into
// chunks merged by log-sum-exp), projections rows the two projection stages,
// block rows the whole cached block call.
#include "runtime/bench/bench.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <thread>

#include "generator/backend_api.h"
#include "generator/bf16.h"
#include "generator/catalogue.h"
#include "generator/errors.h"
#include "runtime/dispatch/big_buffer.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/kernel_registry.h"
#include "runtime/dispatch/prefetch_route.h"
#include "runtime/exec/block.h"
#include "runtime/exec/kv_cache.h"
#include "runtime/exec/thread_pool.h"
#include "runtime/io/layer_weights.h"

namespace g3::bench {

const std::vector<int64_t>& default_prefill_contexts() {
  static const std::vector<int64_t> v = {1024, 4096};
  return v;
}
const std::vector<int64_t>& default_decode_contexts() {
  static const std::vector<int64_t> v = {4096, 32768};
  return v;
}
const std::vector<std::string>& phase_names() {
  static const std::vector<std::string> v = {"prefill", "decode", "block", "projections"};
  return v;
}

static std::string ctx_str(const std::optional<int64_t>& c) { return c ? std::to_string(*c) : "-"; }

std::string Row::shape_id() const {
  return model + "|" + kind + "|" + phase + "|" + kv_dtype + "|" + weight_dtype + "|" + compute + "|" +
         std::to_string(batch) + "|" +
         std::to_string(new_tokens) + "|" + ctx_str(context);
}
std::string Row::label() const { return backend == "auto" ? "auto(" + route + ")" : backend; }

std::string Row::match_id() const { return backend + "|" + isa + "|" + proj + "|" + shape_id(); }
std::string Row::proj_label() const {
  if (proj.empty()) return "-";
  return proj == "auto" ? "auto(" + proj_route + ")" : proj;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Decode-sized rows (the decode core's, and the 1-token block and
// projections rows) run with cold caches. Between two calls of one layer a
// decode step runs every other layer, whose weights and K/V pass through the
// caches, so each layer finds its own in DRAM; a row that repeats one layer
// would find its weights (1B's are 6 MB) or its K/V (a local layer's window:
// 1-8 MB) in the last-level cache and time less than a decode step spends on
// it; and tune, which picks decode backends from these rows, would pick the
// core fastest from cache (on an AMD EPYC Zen 5, warm rows put xbyak 1.3x
// ahead on 4B's bf16-KV local decode, cold ones the three cores within 1%).
// Before each of those runs (untimed) the pool's threads read a buffer of
// three times the L3 (CacheEvictor::bytes). The buffer is on 2 MiB pages
// like the runtime's weights and caches, so the read evicts the caches
// without also emptying the TLB, which a decode step (a few hundred huge
// pages) does not.
// Then, still untimed, a neighbour runs: the same call on a second layer of
// the shape (its own weights and K/V, the row's scratch and activations),
// as the layer before it in a decode step does. A step's kernels find their
// code, tables and scratch in cache, having run a moment ago on the other
// layers; after the eviction alone they did not (AMD EPYC Zen 4, 2 threads:
// 1B's decode core over 16 positions took 12 us cold against 1 us warm, and
// `g3attn run` spent 0.13 ms per 1B local layer and step where the 1-token
// block row took 0.18). With the neighbour, runs alternating with and
// without it in one bench (1B and 4B, contexts 2080 and 8224, f32 and bf16
// K/V, 20 runs each) took 0.66-0.79x on 1B's local decode rows, 0.72-0.94x
// on its global ones, 0.76-1.01x on 1B's block rows and 0.90-0.99x on 4B's.
class CacheEvictor {
 public:
  // 3x the L3 where sysfs gives its size (96 MiB on an AMD EPYC Zen 4,
  // where 1B's and 4B's decode and 1-token block rows timed the same as
  // after 512 MiB, within the machine's noise, in 0.55-0.6x the time),
  // else 512 MiB, more than any x86 part this project has met has.
  static size_t bytes() {
    const long long l3 = l3_bytes();
    return l3 > 0 ? std::max<size_t>(size_t{64} << 20, 3 * size_t(l3)) : size_t{512} << 20;
  }
  // The buffer is written (its pages faulted in) once, outside any timing.
  void reserve() {
    if (!buf_) buf_ = alloc_big_zeroed(bytes());
  }
  void run(ThreadPool& pool) {
    reserve();
    const int64_t items = 64, per = int64_t(bytes() / sizeof(uint64_t)) / items;
    pool.parallel_for(items, [&](int64_t i) {
      // One load per 64-byte line brings the line in; the sum, stored, keeps
      // the loads from being dropped.
      const uint64_t* p = reinterpret_cast<const uint64_t*>(buf_.get()) + i * per;
      uint64_t sum = 0;
      for (int64_t j = 0; j < per; j += 8) sum += p[j];
      sink_.fetch_add(sum, std::memory_order_relaxed);
    });
  }

 private:
  std::shared_ptr<uint8_t> buf_;
  std::atomic<uint64_t> sink_{0};
};

// splitmix64: fast, seedable per chunk so parallel fills are deterministic.
uint64_t mix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Uniform on [-a, a]; a = sqrt(3) * sigma gives standard deviation sigma.
float uni(uint64_t& s, float a) { return (float(mix(s) >> 40) * (1.0f / 16777216.0f) * 2.f - 1.f) * a; }

// Fills n elements (f32 or bf16) in parallel chunks.
void fill_random(ThreadPool& pool, void* dst, int64_t n, DType dt, float sigma, uint64_t seed) {
  const int64_t chunk = 1 << 20;
  const float a = sigma * 1.7320508f;
  pool.parallel_for((n + chunk - 1) / chunk, [&](int64_t c) {
    uint64_t s = seed * 0x1234567ull + uint64_t(c);
    int64_t i0 = c * chunk, i1 = std::min(n, i0 + chunk);
    if (dt == DType::F32) {
      float* p = static_cast<float*>(dst);
      for (int64_t i = i0; i < i1; ++i) p[i] = uni(s, a);
    } else {
      uint16_t* p = static_cast<uint16_t*>(dst);
      for (int64_t i = i0; i < i1; ++i) p[i] = f32_to_bf16(uni(s, a));
    }
  });
}

size_t esize(DType d) { return d == DType::F32 ? 4 : 2; }

// One measured shape: everything but the backend and ISA.
struct Shape {
  std::string model;
  LayerSpec spec;
  std::string kind;   // "local" | "global" | "any" (projections)
  std::string phase;  // prefill | decode | block | projections
  DType kv = DType::F32;
  DType compute = DType::F32;
  std::string kv_label;
  int64_t B = 1, T = 1, C = 0;  // C = 0: no keys (projections)
  double core_flops = 0, proj_flops = 0, kv_bytes = 0;
  bool decode_like() const { return phase == "decode"; }
  // The phase the runtime routes a call of T tokens to (block.h); the
  // decode-sized shapes are the ones timed cold, with a neighbour.
  Phase call_phase() const { return T <= BlockSplit{}.decode_max_tokens ? Phase::Decode : Phase::Prefill; }
};

// SPEC 1.4 with contiguous positions: the query at position p sees keys
// p-W+1 .. p on local layers and 0 .. p on global ones. The FLOP rule counts
// only those pairs: 4 x dh x N x visible pairs (QK^T and P.V, 2 flops each).
double visible_pairs(int64_t T, int64_t C, int64_t window) {
  double pairs = 0;
  for (int64_t t = 0; t < T; ++t) {
    int64_t p = C - T + t;
    pairs += double(window > 0 ? std::min<int64_t>(p + 1, window) : p + 1);
  }
  return pairs;
}

double projection_flops(const LayerSpec& s, int64_t tokens) {
  const double D = s.hidden_size, N = s.num_heads, K = s.num_kv_heads, H = s.head_dim;
  return double(tokens) * (2 * D * (N + 2 * K) * H + 2 * N * H * D);
}

// The first key position a query at `qpos` sees.
int64_t window_start(int64_t qpos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, qpos - window + 1) : 0;
}

// A model's layer of one kind with random checkpoint-like weights (as `g3attn
// run` draws them), packed once; every row's layer shares these weights.
PreparedLayer random_layer(const LayerSpec& s, DType wd, DType compute) {
  return prepare_layer(s, random_layer_weights(s, 7, wd), DType::F32, "reference", "scalar", compute);
}

// The runtime's state for one shape: the call's B x T tokens at positions
// C-T .. C-1 after C-T earlier tokens, in a KV cache built as `g3attn run`
// builds it (full length on global layers, a ring sized for calls of T
// tokens on local ones), and the block's scratch with random activations.
// `history` is the cache before the call (block rows append to it each run);
// `cache` after it, as the attention core sees it.
struct Env {
  std::string id;
  int64_t B = 0, C = 0, T = 0;
  std::unique_ptr<LayerKvCache> history, cache;
  // Cold rows: the caches of the neighbour layer (a second layer of the
  // shape, run untimed just before each timed run; see CacheEvictor).
  std::unique_ptr<LayerKvCache> nb_history, nb_cache;
  std::vector<int32_t> qpos;  // [B][T]
  std::vector<float> x, y;    // block rows: input and output [B][T][D]
  BlockScratch scratch;
};

// Appends tokens [p0, p1) to every row of `c` in calls of at most `call` tokens.
void append_positions(LayerKvCache& c, int64_t p0, int64_t p1, int64_t call) {
  std::vector<int32_t> pos;
  std::vector<int64_t> slot;
  for (int64_t t0 = p0; t0 < p1; t0 += call) {
    const int64_t n = std::min(call, p1 - t0);
    pos.resize(size_t(n));
    slot.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(t0 + i);
    for (int64_t b = 0; b < c.batch(); ++b) {
      c.check_append(b, pos.data(), nullptr, n, n);
      c.append(b, pos.data(), nullptr, n, slot.data());
    }
  }
}

// A shape's cache before its call (`history`) and after it (`cache`): C - T
// tokens of random K/V, then the call's T positions.
void make_caches(ThreadPool& pool, const Shape& sh, int64_t chunk, std::unique_ptr<LayerKvCache>& history,
                 std::unique_ptr<LayerKvCache>& cache) {
  const int64_t B = sh.B, C = sh.C, T = sh.T;
  history = std::make_unique<LayerKvCache>(sh.spec, sh.kv, B, C, std::max(chunk, T));
  LayerKvCache& h = *history;
  const int64_t elems = h.capacity() * sh.spec.num_kv_heads * sh.spec.head_dim;
  for (int64_t b = 0; b < B; ++b) {
    fill_random(pool, h.k(b), elems, sh.kv, 1.f, 1 + 2 * uint64_t(b));
    fill_random(pool, h.v(b), elems, sh.kv, 1.f, 2 + 2 * uint64_t(b));
  }
  append_positions(h, 0, C - T, std::max(chunk, T));
  // The copy shares the K/V buffers (kv_cache.h) and owns the positions.
  cache = std::make_unique<LayerKvCache>(h);
  append_positions(*cache, C - T, C, T);
}

// Builds (or keeps) the state of a shape. Queries and cached K/V are random
// with unit variance (the query alpha-scaled), so logits have about unit
// variance as after QK-norm. `chunk`: the most tokens a call of this run
// appends (rings are sized for it, as `g3attn run --chunk` sizes them).
// Decode-sized shapes also get the neighbour's caches.
void prepare_env(ThreadPool& pool, Env& env, const Shape& sh, const PreparedLayer& L, int64_t chunk) {
  const LayerSpec& s = sh.spec;
  const int64_t B = sh.B, C = sh.C, T = sh.T, H = s.head_dim, N = s.num_heads, D = s.hidden_size;
  const std::string id = sh.model + "|" + sh.kind + "|" + to_string(sh.kv) + "|" + std::to_string(C) + "|" +
                         std::to_string(B) + "|" + std::to_string(T) + "|" + std::to_string(chunk);
  if (env.id == id) return;
  env = Env{};
  env.id = id;
  env.B = B;
  env.C = C;
  env.T = T;
  const int64_t R = B * T;
  reserve_scratch(L, R, env.scratch);
  BlockScratch& S = env.scratch;
  fill_random(pool, S.q.data(), R * N * H, DType::F32, s.alpha, 3);
  fill_random(pool, S.enc.data(), R * N * H, DType::F32, 1.f, 4);
  fill_random(pool, S.u.data(), R * D, DType::F32, 1.f, 6);
  env.x.resize(size_t(R * D));
  env.y.resize(size_t(R * D));
  fill_random(pool, env.x.data(), R * D, DType::F32, 1.f, 5);
  if (C == 0) return;  // projections: no keys
  make_caches(pool, sh, chunk, env.history, env.cache);
  if (sh.call_phase() == Phase::Decode) make_caches(pool, sh, chunk, env.nb_history, env.nb_cache);
  env.qpos.resize(size_t(R));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) env.qpos[size_t(b * T + t)] = int32_t(C - T + t);
}

// One run of a shape's row on a prepared layer: the runtime's stage calls;
// block runs report their stages' wall times into `times` when given.
// `neighbour`: on the neighbour's caches, L being the neighbour's layer; the
// scratch, queries and activations are the row's own, as consecutive layers
// of a decode step share them.
void run_once(ThreadPool& pool, const Shape& sh, const PreparedLayer& L, Env& env,
              BlockStageTimes* times = nullptr, bool neighbour = false) {
  const int64_t R = sh.B * sh.T;
  LayerKvCache* cache = neighbour ? env.nb_cache.get() : env.cache.get();
  const LayerKvCache* history = neighbour ? env.nb_history.get() : env.history.get();
  if (sh.phase == "prefill" || sh.phase == "decode") {
    run_attention_core(L, *cache, env.qpos.data(), sh.B, sh.T, pool, env.scratch);
  } else if (sh.phase == "projections") {
    run_qkv_projection(L, R, pool, env.scratch);
    run_out_projection(L, R, pool, env.scratch);
  } else {
    // The cache as it was before the call (positions only: the K/V buffers
    // are shared and their contents do not matter for time), then the call.
    *cache = *history;
    run_block_cached(L, *cache, env.x.data(), env.qpos.data(), nullptr, sh.B, sh.T, env.y.data(), pool,
                     env.scratch, {}, times);
  }
}

// One backend on one ISA for one kernel key, or why not.
struct Combo {
  std::string backend, isa_req;
  KernelChoice choice;
  std::string isa;  // the ISA the code reports (JIT caps may lower it)
  bool ok = false;
};

// The layer of a shape with a combo's kernels (the packed weights shared)
// and, for projections and block rows, the projection provider `proj`
// (highway, onednn or auto, resolved as prepare_layer resolves it). The
// oneDNN copy of the weights is made once, on the shared base.
PreparedLayer layer_for(PreparedLayer& base, const Shape& sh, const Combo& c, const std::string& proj = "") {
  ProjProvider pp[2] = {ProjProvider::Highway, ProjProvider::Highway};
  if (!proj.empty())
    for (Phase ph : {Phase::Prefill, Phase::Decode}) {
      pp[size_t(ph)] = resolve_projection(parse_projection_route(proj), ph, sh.compute, c.choice.stages[Stage::Gemm],
                                          c.isa_req != best_isa());
      if (pp[size_t(ph)] == ProjProvider::Onednn && !base.onednn_qkv) set_layer_projection(base, ph, ProjProvider::Onednn);
    }
  PreparedLayer L = base;
  L.key = kernel_key(sh.spec, sh.kv, base.key.weight_dtype, sh.compute);
  L.kernels = L.decode = c.choice;
  for (Phase ph : {Phase::Prefill, Phase::Decode}) set_layer_projection(L, ph, pp[size_t(ph)]);
  return L;
}

// The projection providers a shape's rows run: each of --proj on
// projections and block rows (by default highway and onednn on projections
// rows, auto on block rows); none ("") on attention-core rows. The
// reference backend's rows always run its own GEMM (auto keeps it).
std::vector<std::string> projs_for(const Options& o, const Shape& sh, const std::string& backend) {
  if (sh.phase != "projections" && sh.phase != "block") return {""};
  if (backend == "reference") return {"auto"};
  if (!o.projs.empty()) return o.projs;
  if (sh.phase == "projections") return {"highway", "onednn"};
  return {"auto"};
}

class Notes {
 public:
  void add(const std::string& n) {
    if (seen_.insert(n).second) list_.push_back(n);
  }
  std::vector<std::string> list_;

 private:
  std::set<std::string> seen_;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

int phase_rank(const std::string& p) {
  const auto& v = phase_names();
  return int(std::find(v.begin(), v.end(), p) - v.begin());
}

}  // namespace

void validate(const Options& o) {
  if (o.models.empty()) throw InputError("--model: empty list");
  for (const auto& m : o.models) builtin_model(m);  // InputError listing the sizes
  if (o.new_tokens < 1) throw InputError("--new-tokens must be at least 1");
  if (o.batch < 1) throw InputError("--batch must be at least 1");
  for (const auto& p : o.projs) parse_projection_route(p);  // InputError naming --proj
  bool needs_prefill_ctx = false;
  for (const auto& p : o.phases) {
    if (phase_rank(p) >= int(phase_names().size()))
      throw InputError("--phase: unknown phase '" + p + "' (valid: prefill, decode, block, projections, all)");
    if (p == "prefill" || p == "block") needs_prefill_ctx = true;
  }
  for (int64_t c : o.contexts) {
    if (c < 1) throw InputError("--context: " + std::to_string(c) + " is not a positive token count");
    if (needs_prefill_ctx && c < o.new_tokens)
      throw InputError("--context " + std::to_string(c) + " is shorter than --new-tokens " +
                       std::to_string(o.new_tokens) + " (prefill queries are the last new tokens of the context)");
  }
  for (const auto& name : o.models) {
    ModelConfig m = builtin_model(name);
    std::vector<int64_t> ctx = o.contexts;
    if (ctx.empty()) {
      ctx = default_decode_contexts();
      ctx.insert(ctx.end(), default_prefill_contexts().begin(), default_prefill_contexts().end());
    }
    for (int64_t c : ctx) {
      if (c > m.max_position_embeddings)
        throw InputError("--context " + std::to_string(c) + " exceeds model " + name + "'s " +
                         std::to_string(m.max_position_embeddings) + " positions");
      for (DType kv : o.kv_dtypes) {
        double bytes = double(o.batch) * m.num_kv_heads * double(c) * m.head_dim * 2 * double(esize(kv));
        if (bytes > 16e9)
          throw InputError("--context " + std::to_string(c) + " with --batch " + std::to_string(o.batch) +
                           " needs " + fmt("%.1f", bytes / 1e9) + " GB of KV cache for model " + name +
                           " (limit 16 GB)");
      }
    }
  }
}

Result run_bench(Options o) {
  validate(o);
  const Clock::time_point t_start = Clock::now();
  const bool default_contexts = o.contexts.empty();
  const bool run_limits = default_contexts && o.default_run_limits;
  // The cut at kDefaultRunSeconds keeps a plain default run short; a caller
  // with a budget of its own (tune's passes) stops starting rows when that
  // runs out instead, so its late rows keep their runs: cut short, tune's
  // lower ISA caps (a pass of about 78 s on an AMD EPYC Zen 4, 2 cores)
  // would compare one-run rows on a slower machine.
  const bool run_time_cut = run_limits && o.budget_seconds <= 0;
  if (o.threads <= 0) o.threads = int(std::max(1u, std::thread::hardware_concurrency()));
  const bool fixed_repeat = o.repeat > 0;

  Result res;
  res.isas_runnable = runnable_isas();
  for (const auto& n : isa_names())
    if (isa_compiled(n)) res.isas_compiled.push_back(n);
  for (const Backend& b : backends())
    if (b.in_build) res.backends_built.push_back(b.name);
  Notes notes;

  // Which ISAs can run at all; the rest are skipped with their reason.
  std::vector<std::string> isas;
  for (const auto& i : o.isas) {
    std::string why = isa_unavailable_reason(i);
    if (why.empty()) {
      if (std::find(isas.begin(), isas.end(), i) == isas.end()) isas.push_back(i);
    } else {
      notes.add("isa " + i + " skipped: " + why);
    }
  }

  res.peaks = measure_peaks(o.threads);
  ThreadPool pool(o.threads);

  // Shapes, in execution order: per model and KV dtype, contexts ascending,
  // so one cache serves every phase and kind of a context and smaller shapes
  // run first (their times predict the larger ones).
  std::vector<Shape> shapes;
  auto has_phase = [&](const std::string& p) { return std::find(o.phases.begin(), o.phases.end(), p) != o.phases.end(); };
  const std::vector<int64_t> pre_ctx = default_contexts ? default_prefill_contexts() : o.contexts;
  const std::vector<int64_t> dec_ctx = default_contexts ? default_decode_contexts() : o.contexts;
  for (const auto& name : o.models) {
    ModelConfig m = builtin_model(name);
    std::vector<LayerSpec> specs = layer_specs(m);
    std::vector<LayerSpec> kinds;
    for (LayerKind k : {LayerKind::Local, LayerKind::Global})
      for (const auto& s : specs)
        if (s.kind == k) {
          kinds.push_back(s);
          break;
        }
    // Every compute mode x KV dtype.
    for (size_t ci = 0; ci < o.computes.size() * o.kv_dtypes.size(); ++ci) {
      const size_t kvi = ci % o.kv_dtypes.size();
      const DType compute = o.computes[ci / o.kv_dtypes.size()];
      DType kv = o.kv_dtypes[kvi];
      auto base = [&](const LayerSpec& s, const std::string& phase, int64_t T, int64_t C) {
        Shape sh;
        sh.model = name;
        sh.spec = s;
        sh.kind = to_string(s.kind);
        sh.phase = phase;
        sh.kv = kv;
        sh.compute = compute;
        sh.kv_label = to_string(kv);
        sh.B = o.batch;
        sh.T = T;
        sh.C = C;
        return sh;
      };
      // Projections do not touch keys: one row per token count and compute
      // mode, for the first KV dtype only, labelled kind "any" and KV dtype
      // "any".
      if (has_phase("projections") && kvi == 0) {
        const int64_t toks[2] = {o.new_tokens, 1};
        for (int i = 0; i < (o.new_tokens != 1 ? 2 : 1); ++i) {
          const int64_t T = toks[i];
          Shape sh = base(kinds[0], "projections", T, 0);
          sh.kind = "any";
          sh.kv_label = "any";
          sh.proj_flops = projection_flops(sh.spec, sh.B * T);
          shapes.push_back(sh);
        }
      }
      std::set<int64_t> all_ctx;
      if (has_phase("prefill") || has_phase("block")) all_ctx.insert(pre_ctx.begin(), pre_ctx.end());
      if (has_phase("decode") || has_phase("block")) all_ctx.insert(dec_ctx.begin(), dec_ctx.end());
      for (int64_t C : all_ctx) {
        const bool in_pre = std::find(pre_ctx.begin(), pre_ctx.end(), C) != pre_ctx.end();
        const bool in_dec = std::find(dec_ctx.begin(), dec_ctx.end(), C) != dec_ctx.end();
        for (const std::string phase : {"prefill", "decode", "block"}) {
          if (!has_phase(phase)) continue;
          std::vector<int64_t> toks;
          if (phase == "prefill" && in_pre) toks = {o.new_tokens};
          if (phase == "decode" && in_dec) toks = {1};
          if (phase == "block") {
            if (in_pre && C >= o.new_tokens) toks.push_back(o.new_tokens);
            if (in_dec && o.new_tokens != 1) toks.push_back(1);
          }
          for (int64_t T : toks)
            for (const auto& s : kinds) {
              Shape sh = base(s, phase, T, C);
              sh.core_flops = 4.0 * s.head_dim * s.num_heads * double(o.batch) * visible_pairs(T, C, s.window);
              if (phase == "block") sh.proj_flops = projection_flops(s, o.batch * T);
              if (phase == "decode")
                sh.kv_bytes = double(o.batch) * s.num_kv_heads * double(C - window_start(C - 1, s.window)) *
                              s.head_dim * 2 * double(esize(kv));
              shapes.push_back(sh);
            }
        }
      }
    }
  }

  // Kernel tables per (key, backend, ISA), resolved once.
  std::map<std::string, Combo> combos;
  // The phase matters to auto only: it may route prefill and decode apart.
  // Auto's choice may also depend on the context, where the profile's
  // winners differ by context (PreparedLayer::for_call): its rows run the
  // route of theirs.
  auto combo_for = [&](const KernelKey& key, const std::string& backend, const std::string& isa, Phase phase,
                       int64_t context) -> Combo& {
    std::optional<AutoRoute> at;
    if (backend == "auto")
      for (const ContextRoute& r : context_routes(key, phase, isa))
        if (context >= r.from) at = r.route;
    std::string id = key.str() + "|" + backend + "|" + isa + "|" + to_string(phase) + (at ? "|" + at->backend : "");
    auto it = combos.find(id);
    if (it != combos.end()) return it->second;
    Combo c;
    c.backend = backend;
    c.isa_req = isa;
    try {
      c.choice = at ? kernels_for(key, *at, isa) : kernels_for(key, backend, isa, phase);
      c.isa = c.choice.kernels.isa.empty() ? isa : c.choice.kernels.isa;
      c.ok = true;
      // A registry fallback (an unavailable JIT served by Highway) would
      // measure another backend under this one's name: skip it instead.
      // Auto has no name of its own to keep: its rows name their route.
      if (backend != "auto" && c.choice.backend != backend) {
        notes.add("backend " + backend + " on " + isa + " skipped: " +
                  (c.choice.fallback.empty() ? "the registry chose " + c.choice.backend : c.choice.fallback));
        c.ok = false;
      }
    } catch (const InputError& e) {
      notes.add("backend " + backend + " on " + isa + " skipped: " + e.what());
    }
    return combos.emplace(id, std::move(c)).first->second;
  };

  // A model's layer of each kind with random weights, packed once per
  // weight dtype; every row's layer shares them (layer_for). The cold rows'
  // neighbour layers share a second copy (`neighbour`), at other addresses.
  std::map<std::string, PreparedLayer> bases, neighbour_bases;
  auto base_for = [&](const Shape& sh, bool neighbour = false) -> PreparedLayer& {
    auto& m = neighbour ? neighbour_bases : bases;
    const std::string id =
        sh.model + "|" + to_string(sh.spec.kind) + "|" + to_string(o.weight_dtype) + "|" + to_string(sh.compute);
    auto it = m.find(id);
    if (it == m.end()) it = m.emplace(id, random_layer(sh.spec, o.weight_dtype, sh.compute)).first;
    return it->second;
  };

  // Per (backend, ISA, phase, tokens) the last measured GFLOP/s: predicts
  // larger shapes so hopeless ones are skipped before they run. A first row
  // is predicted from one single-threaded run of the same stage on a small
  // shape (16 new tokens over 512 positions).
  std::map<std::string, double> rate;
  std::map<std::string, double> probe_rate;  // per thread, per backend|isa|key|stage
  ThreadPool probe_pool(1);
  auto probe = [&](const Combo& c, const Shape& sh, const std::string& stage) -> double {
    std::string id = c.backend + "|" + c.isa + "|" + c.choice.kernels.isa + "|" + sh.model + "|" + sh.kind + "|" +
                     sh.kv_label + "|" + stage;
    auto it = probe_rate.find(id);
    if (it != probe_rate.end()) return it->second;
    Shape small = sh;
    small.B = 1;
    small.T = 16;
    small.C = stage == "core" ? 512 : 0;
    small.phase = stage == "core" ? "prefill" : "projections";
    const PreparedLayer L = layer_for(base_for(sh), small, c);
    Env e;
    prepare_env(probe_pool, e, small, L, small.T);
    run_once(probe_pool, small, L, e);  // warm-up (JIT first touch, caches)
    Clock::time_point t0 = Clock::now();
    run_once(probe_pool, small, L, e);
    const double secs = seconds_since(t0);
    const double flops = stage == "core" ? 4.0 * sh.spec.head_dim * sh.spec.num_heads * visible_pairs(16, 512, 0)
                                         : projection_flops(sh.spec, 16);
    const double r = flops / std::max(secs, 1e-9);
    probe_rate[id] = r;
    return r;
  };

  Env env;
  CacheEvictor evictor;
  // How many rows will be attempted, for the progress lines.
  const size_t total = shapes.size() * o.backends.size() * isas.size() * std::max<size_t>(1, o.projs.size());
  size_t attempt = 0;

  // A shape's rows are timed side by side: every row is set up (its layer
  // built, one warm-up run) before any is timed, then the rows take one run
  // each in turn, round after round, until each has its runs. A busy minute
  // on this shared machine then lands on every backend and ISA of the shape
  // alike, instead of on whichever row it happened to meet: timed one row
  // after the other, two backends within a few percent of each other swapped
  // places from one run to the next, and auto, which follows tune's
  // measurements, read up to 1.3x behind the row it had beaten there (AMD
  // EPYC Zen 5, `bench --backend all,auto` after `tune`).
  struct Timed {  // a row being measured
    Row row;
    PreparedLayer L;
    PreparedLayer neighbour;  // cold rows: the layer run before each timed run
    bool cold = false;
    int want = 0;  // runs it takes at least (the default ones may stop early)
    std::string rate_id, progress;
    std::vector<double> ms;
    std::vector<BlockStageTimes> stage_ms;  // block rows: each run's stages
    double timed_ms = 0, spent_s = 0;  // its runs; its runs and evictions
  };
  // The shape's rows in the order they were asked for: a timed row, or a
  // copy of one (`copy`: an auto row and its route's; `same_code`: a JIT
  // capped lower) under another backend or ISA cap.
  struct Slot {
    size_t timed = 0;
    bool copy = false, same_code = false;
    std::string backend, isa_cap;
  };

  for (const Shape& sh : shapes) {
    const KernelKey key =
        kernel_key(sh.spec, sh.kv, sh.compute == DType::BF16 ? DType::BF16 : o.weight_dtype, sh.compute);
    std::vector<Timed> timed;
    std::vector<Slot> slots;
    std::map<std::string, size_t> done_rows;  // row key -> its index in `timed`
    for (const auto& backend : o.backends)
      for (const auto& isa : isas)
        for (const std::string& proj : projs_for(o, sh, backend)) {
        ++attempt;
        const Phase phase = sh.call_phase();
        Combo& c = combo_for(key, backend, isa, phase, sh.C);
        if (!c.ok) continue;
        // oneDNN picks its own ISA at run time (it does not honour --isa):
        // its rows are measured once, on the best ISA.
        if (proj == "onednn" && isa != best_isa()) {
          notes.add("proj onednn on " + isa + " skipped: oneDNN picks its own ISA, so its rows run once, on " +
                    best_isa());
          continue;
        }
        // The same code under another requested ISA (the reference ignores
        // the ISA; a JIT may cap lower): measure it once.
        // oneDNN's projections rows run the same code under every backend
        // (the attention core is not part of them): measured once.
        // An auto row runs its route's code: keyed by the route, it is the
        // same row as the route's own (whichever of the two comes first is
        // measured). Timed twice, the same kernel read up to 1.5x apart on
        // the decode rows of one run (AMD EPYC Zen 4 VM), which says nothing
        // about auto's choice.
        const bool any_backend = sh.phase == "projections" && proj == "onednn";
        const std::string code = backend == "auto" ? c.choice.backend : backend;
        const std::string row_key = (any_backend ? "*" : code) + "|" + c.isa + "|" + proj;
        if (done_rows.count(row_key)) {
          const size_t first = done_rows.at(row_key);
          if (!any_backend && (backend == "auto") != (timed[first].row.backend == "auto")) {
            notes.add("auto's rows run the code of the route they name, timed once per shape and ISA with that "
                      "backend's own row (the first of the two measured, the other a copy)");
            slots.push_back({first, true, false, backend, isa});
            continue;
          }
          if (any_backend)
            notes.add("proj onednn projections rows do not depend on the backend: measured once, under the first");
          else if (backend == "reference")
            notes.add("backend reference runs the same scalar code whatever the ISA: measured once, as scalar");
          else if (c.isa != isa) {
            notes.add("backend " + backend + " on " + isa + " runs " + c.isa + " code: measured once, as " + c.isa);
            slots.push_back({first, false, true, backend, isa});
          }
          continue;
        }
        if (o.budget_seconds > 0 && seconds_since(t_start) > o.budget_seconds) {
          notes.add("the time budget of " + fmt("%.0f", o.budget_seconds) + " s ran out: later rows were not measured");
          continue;
        }
        // Predict the time of one run; skip it when over budget.
        const std::string rate_id = backend + "|" + c.isa + "|" + proj + "|" + sh.phase + "|" + std::to_string(sh.T == 1);
        double predicted = 0;
        if (auto it = rate.find(rate_id); it != rate.end()) {
          predicted = (sh.core_flops + sh.proj_flops) / it->second;
        } else {
          if (sh.core_flops > 0) predicted += sh.core_flops / (probe(c, sh, "core") * o.threads);
          if (sh.proj_flops > 0) predicted += sh.proj_flops / (probe(c, sh, "gemm") * o.threads);
        }
        const bool budgeted = backend == "reference" || run_limits;
        if (budgeted && predicted > kRunBudgetSeconds) {
          notes.add(backend + " " + c.isa + " " + sh.model + " " + sh.kind + " " + sh.phase + " context " +
                    ctx_str(sh.C ? std::optional<int64_t>(sh.C) : std::nullopt) + " new_tokens " +
                    std::to_string(sh.T) + " skipped: predicted " + fmt("%.1f", predicted) + " s per run (budget " +
                    fmt("%.1f", kRunBudgetSeconds) + " s)");
          continue;
        }
        Timed t;
        try {
          t.L = layer_for(base_for(sh), sh, c, proj);
        } catch (const InputError& e) {
          notes.add("proj " + proj + " skipped: " + e.what());
          continue;
        }
        t.cold = phase == Phase::Decode;
        // The core rows' neighbour needs no weights of its own: its caches
        // differ, which is all the core reads.
        if (t.cold) t.neighbour = sh.phase == "decode" ? t.L : layer_for(base_for(sh, true), sh, c, proj);
        prepare_env(pool, env, sh, t.L, o.new_tokens);
        run_once(pool, sh, t.L, env);  // warm-up: JIT first calls, page faults, caches
        if (t.cold) run_once(pool, sh, t.neighbour, env, nullptr, true);
        t.want = fixed_repeat ? o.repeat : t.cold ? kDefaultColdRepeat : kDefaultRepeat;
        if (t.cold) {
          evictor.reserve();
          notes.add("decode-sized rows (decode, and 1-token block and projections) ran with cold caches: an "
                    "untimed read of " +
                    fmt("%.0f", double(CacheEvictor::bytes()) / (1 << 20)) +
                    " MiB before each run, then the same call on a second layer of the shape, as a decode step "
                    "finds a layer after the other layers ran");
          notes.add("the decode cores asked for K/V rows ahead as `g3attn plan` shows: " + decode_prefetch().str() +
                    " (" + decode_prefetch_source() + ")");
        }
        t.rate_id = rate_id;
        Row& row = t.row;
        row.backend = backend;
        row.route = c.choice.backend;
        row.proj = proj;
        // The provider that ran, by the name of its code: "highway" is the
        // kernel table's GEMM, the reference's own for the reference.
        if (!proj.empty())
          row.proj_route =
              t.L.proj_for_rows(sh.B * sh.T) == ProjProvider::Onednn ? "onednn" : c.choice.stages[Stage::Gemm];
        row.key = key.str();
        row.isa_cap = isa;
        row.isa = c.isa;
        row.model = sh.model;
        row.kind = sh.kind;
        row.phase = sh.phase;
        row.kv_dtype = sh.kv_label;
        row.compute = to_string(sh.compute);
        row.weight_dtype = (sh.phase == "block" || sh.phase == "projections")
                               ? to_string(sh.compute == DType::BF16 ? DType::BF16 : o.weight_dtype)
                               : "any";
        row.batch = int(sh.B);
        row.new_tokens = sh.T;
        if (sh.C > 0) row.context = sh.C;
        row.flops = sh.core_flops + sh.proj_flops;
        row.kv_bytes = sh.kv_bytes;
        row.specialised = c.choice.kernels.specialised;
        row.stages = c.choice.stages;
        if (!c.choice.fallback.empty()) notes.add("backend " + backend + ": " + c.choice.fallback);
        if (o.progress)
          t.progress = "[" + std::to_string(attempt) + "/" + std::to_string(total) + "] " + row.label() + " " + c.isa +
                       " " + sh.model + " " + sh.kind + " " + sh.phase +
                       (proj.empty() ? "" : " proj " + row.proj_label()) + " ctx " + ctx_str(row.context) +
                       " new " + std::to_string(sh.T);
        done_rows[row_key] = timed.size();
        slots.push_back({timed.size(), false, false, backend, isa});
        timed.push_back(std::move(t));
      }

    // Round after round, one run of each row that still wants one: its
    // `want` runs; by default short warm rows keep going until their runs
    // add up to kMinRowSeconds (at most kMaxRepeat), a row stops once its
    // runs and evictions pass kRowSeconds, and after kDefaultRunSeconds of
    // a default run every row stops at the run it has.
    std::vector<bool> more(timed.size(), true);
    for (bool any = !timed.empty(); any;) {
      any = false;
      for (size_t i = 0; i < timed.size(); ++i) {
        if (!more[i]) continue;
        Timed& t = timed[i];
        const Clock::time_point e0 = Clock::now();
        if (t.cold) {
          evictor.run(pool);
          run_once(pool, sh, t.neighbour, env, nullptr, true);
        }
        const Clock::time_point t0 = Clock::now();
        BlockStageTimes stages;
        run_once(pool, sh, t.L, env, &stages);
        t.ms.push_back(seconds_since(t0) * 1e3);
        if (sh.phase == "block") t.stage_ms.push_back(stages);
        if (t.ms.size() == 1) t.row.timed_from_s = std::chrono::duration<double>(t0 - t_start).count();
        t.row.timed_to_s = seconds_since(t_start);
        t.timed_ms += t.ms.back();
        t.spent_s += seconds_since(e0);
        const int r = int(t.ms.size());
        bool again = r < t.want || (!fixed_repeat && !t.cold && t.timed_ms < kMinRowSeconds * 1e3 && r < kMaxRepeat);
        if (!fixed_repeat && t.spent_s > kRowSeconds) again = false;
        if (again && !fixed_repeat && run_time_cut && seconds_since(t_start) > kDefaultRunSeconds) {
          notes.add("the default run passed " + fmt("%.0f", kDefaultRunSeconds) +
                    " s: rows measured after that took fewer runs (at least one)");
          again = false;
        }
        more[i] = again;
        any |= again;
      }
    }
    for (Timed& t : timed) {
      Row& row = t.row;
      row.ms_median = median(t.ms);
      row.ms_min = *std::min_element(t.ms.begin(), t.ms.end());
      row.runs = int(t.ms.size());
      // Block rows: the stages of the median run (the faster of the two
      // middle ones for an even count), so they add up to at most ms_median;
      // the rest is the bench's restoring of the cache before each call.
      if (!t.stage_ms.empty()) {
        std::vector<size_t> order(t.ms.size());
        std::iota(order.begin(), order.end(), size_t{0});
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return t.ms[a] < t.ms[b]; });
        const BlockStageTimes& mid = t.stage_ms[order[(order.size() - 1) / 2]];
        for (int i = 0; i < BlockStageTimes::kCount; ++i) row.stage_ms.emplace_back(BlockStageTimes::name(i), mid.ms[i]);
      }
      row.gflops = row.flops / (row.ms_median * 1e-3) / 1e9;
      if (sh.decode_like()) {
        row.gbs = sh.kv_bytes / (row.ms_median * 1e-3) / 1e9;
        row.pct_peak = res.peaks.dram_read_gbs > 0 ? *row.gbs / res.peaks.dram_read_gbs * 100 : 0;
      } else {
        row.pct_peak = res.peaks.fp32_gflops > 0 ? row.gflops / res.peaks.fp32_gflops * 100 : 0;
      }
      rate[t.rate_id] = row.flops / (row.ms_median * 1e-3);
      if (o.progress) {
        std::fprintf(stderr, "%s: %.3f ms\n", t.progress.c_str(), row.ms_median);
        std::fflush(stderr);
      }
    }
    for (const Slot& sl : slots) {
      Row r = timed[sl.timed].row;
      if (sl.same_code) {
        r.isa_cap = sl.isa_cap;
        res.same_code.push_back(std::move(r));
        continue;
      }
      if (sl.copy) {
        r.backend = sl.backend;
        r.isa_cap = sl.isa_cap;
      }
      res.rows.push_back(std::move(r));
    }
  }

  // Ratios within a shape: to the reference, and to the fastest row.
  std::map<std::string, double> ref_ms, best_ms;
  for (const Row& r : res.rows) {
    const std::string id = r.shape_id();
    if (r.backend == "reference") ref_ms[id] = r.ms_median;
    auto it = best_ms.find(id);
    if (it == best_ms.end() || r.ms_median < it->second) best_ms[id] = r.ms_median;
  }
  for (Row& r : res.rows) {
    const std::string id = r.shape_id();
    if (auto it = ref_ms.find(id); it != ref_ms.end()) r.vs_reference = it->second / r.ms_median;
    r.vs_best = best_ms[id] / r.ms_median;
  }
  // Display order: model, phase, kind, KV dtype, tokens, context, then
  // backend and ISA in the order asked for.
  auto rank = [](const std::vector<std::string>& v, const std::string& x) {
    return int(std::find(v.begin(), v.end(), x) - v.begin());
  };
  std::stable_sort(res.rows.begin(), res.rows.end(), [&](const Row& a, const Row& b) {
    auto ka = std::make_tuple(rank(o.models, a.model), phase_rank(a.phase), a.kind, a.kv_dtype, -a.new_tokens,
                              a.context.value_or(0), rank(o.backends, a.backend), rank(isa_names(), a.isa));
    auto kb = std::make_tuple(rank(o.models, b.model), phase_rank(b.phase), b.kind, b.kv_dtype, -b.new_tokens,
                              b.context.value_or(0), rank(o.backends, b.backend), rank(isa_names(), b.isa));
    return ka < kb;
  });

  const long long llc = llc_bytes();
  if (llc > 0)
    for (const Row& r : res.rows)
      if (r.phase == "decode" && r.kv_bytes < double(llc) * 1.5) {
        notes.add("decode rows whose K/V (" + fmt("%.1f", r.kv_bytes / 1e6) + " MB for " + r.model + " " + r.kind +
                  " context " + ctx_str(r.context) + ") fit in the " + fmt("%.0f", double(llc) / (1 << 20)) +
                  " MiB last-level cache can exceed 100% of the DRAM read peak");
        break;
      }
  res.options = o;
  res.notes = notes.list_;
  res.seconds = seconds_since(t_start);
  return res;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace g3::bench
