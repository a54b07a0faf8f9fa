// The bench harness. Every kernel is called through the g3_kernel_table that
// kernels_for() returns for (key, backend, ISA), on buffers laid out as the
// kernel contract says, split across our own std::threads the way a runtime
// would split them (KV heads x query tiles for prefill, KV heads x KV chunks
// merged by log-sum-exp for decode, column panels for the projections).
#include "runtime/bench/bench.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <thread>

#include "generator/backend_api.h"
#include "generator/bf16.h"
#include "generator/catalogue.h"
#include "generator/errors.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/kernel_registry.h"
#include "runtime/dispatch/packed_weights.h"
#include "runtime/reference/reference.h"

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
  return model + "|" + kind + "|" + phase + "|" + kv_dtype + "|" + weight_dtype + "|" + std::to_string(batch) + "|" +
         std::to_string(new_tokens) + "|" + ctx_str(context);
}
std::string Row::label() const { return backend == "auto" ? "auto(" + route + ")" : backend; }

std::string Row::match_id() const { return backend + "|" + isa + "|" + shape_id(); }

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A small persistent pool: the caller plus n-1 workers pull item indices
// from one atomic counter, so uneven items (causal tiles, window edges)
// balance themselves. Workers spin briefly between regions because the
// decode rows are sub-millisecond and a condition-variable wake-up would
// show up in them; after the spin they sleep.
class Pool {
 public:
  explicit Pool(int n) : n_(std::max(1, n)) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_; }
  void run(int64_t items, const std::function<void(int64_t)>& fn) {
    if (items <= 0) return;
    if (n_ == 1 || items == 1) {
      for (int64_t i = 0; i < items; ++i) fn(i);
      return;
    }
    fn_ = &fn;
    items_ = items;
    next_.store(0, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> l(mu_);
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    work();
    while (done_.load(std::memory_order_acquire) != n_ - 1) _mm_pause();
  }

 private:
  void work() {
    for (;;) {
      int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if (i >= items_) break;
      (*fn_)(i);
    }
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      int spins = 0;
      while (gen_.load(std::memory_order_acquire) == seen) {
        if (++spins < 20000) {
          _mm_pause();
        } else {
          std::unique_lock<std::mutex> l(mu_);
          cv_.wait(l, [&] { return gen_.load(std::memory_order_acquire) != seen; });
        }
      }
      seen = gen_.load(std::memory_order_acquire);
      if (stop_) return;
      work();
      done_.fetch_add(1, std::memory_order_release);
    }
  }
  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int64_t> next_{0};
  std::atomic<int> done_{0};
  int64_t items_ = 0;
  const std::function<void(int64_t)>* fn_ = nullptr;
  bool stop_ = false;
};

// 64-byte aligned, zeroed buffer.
struct Buf {
  std::shared_ptr<uint8_t> p;
  size_t bytes = 0;
  static Buf make(size_t bytes) {
    Buf b;
    b.bytes = bytes;
    size_t n = (bytes + 63) / 64 * 64 + 64;
    void* m = std::aligned_alloc(64, n);
    if (!m) throw std::bad_alloc();
    std::memset(m, 0, n);
    b.p = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(m), [](uint8_t* q) { std::free(q); });
    return b;
  }
  float* f() const { return reinterpret_cast<float*>(p.get()); }
  uint8_t* u() const { return p.get(); }
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
void fill_random(Pool& pool, void* dst, int64_t n, DType dt, float sigma, uint64_t seed) {
  const int64_t chunk = 1 << 20;
  const float a = sigma * 1.7320508f;
  pool.run((n + chunk - 1) / chunk, [&](int64_t c) {
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
int32_t contract_dtype(DType d) { return d == DType::F32 ? G3_DTYPE_F32 : G3_DTYPE_BF16; }

// One measured shape: everything but the backend and ISA.
struct Shape {
  std::string model;
  LayerSpec spec;
  std::string kind;   // "local" | "global" | "any" (projections)
  std::string phase;  // prefill | decode | block | projections
  DType kv = DType::F32;
  std::string kv_label;
  int64_t B = 1, T = 1, C = 0;  // C = 0: no keys (projections)
  double core_flops = 0, proj_flops = 0, kv_bytes = 0;
  bool decode_like() const { return phase == "decode"; }
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

// The key range [s0, C) a query block can see: causal end, window start.
// Passing only that range is what a runtime with a full-length cache does.
int64_t window_start(int64_t first_qpos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, first_qpos - window + 1) : 0;
}

// Buffers for one (model, KV dtype, context, batch): the cache and the
// activations of every phase.
struct Env {
  std::string id;
  int64_t B = 0, C = 0, T = 0;
  DType kv = DType::F32;
  Buf kc, vc;                // [B][Nkv][C][dh]
  std::vector<int32_t> kpos; // [C] slot s holds position s
  std::vector<uint8_t> kvalid;
  std::vector<int32_t> qpos; // [T] = C - T + t
  std::vector<int64_t> slot; // [T] = C - T + t
  Buf q, enc, part, lse;     // q [B][T][N][dh] (alpha-scaled), enc likewise
  Buf x, u, qkv, attn, y;    // block activations
};

// Packed projection weights of one model and weight dtype.
struct Weights {
  std::string id;
  PackedWeights wqkv, wo;
  std::vector<float> q_norm, k_norm, in_norm, post_norm;
};

Weights make_weights(Pool& pool, const LayerSpec& s, DType wd) {
  const int64_t D = s.hidden_size, H = s.head_dim, N = s.num_heads, K = s.num_kv_heads;
  auto mat = [&](int64_t rows, int64_t cols, uint64_t seed) {
    WeightMatrix m;
    m.dtype = wd;
    m.rows = rows;
    m.cols = cols;
    if (wd == DType::F32) m.f32.resize(size_t(rows * cols));
    else m.bf16.resize(size_t(rows * cols));
    fill_random(pool, wd == DType::F32 ? static_cast<void*>(m.f32.data()) : static_cast<void*>(m.bf16.data()),
                rows * cols, wd, 0.02f, seed);
    return m;
  };
  Weights w;
  w.wqkv = pack_weights(mat((N + 2 * K) * H, D, 11));  // q, k, v rows stacked, as the block fuses them
  w.wo = pack_weights(mat(D, N * H, 12));
  auto vec = [&](int64_t n, uint64_t seed) {
    std::vector<float> v(static_cast<size_t>(n));
    uint64_t st = seed;
    for (auto& x : v) x = uni(st, 0.1f * 1.7320508f);
    return v;
  };
  w.q_norm = vec(H, 13);
  w.k_norm = vec(H, 14);
  w.in_norm = vec(D, 15);
  w.post_norm = vec(D, 16);
  return w;
}

// Runs the stages of one shape on one kernel table.
class Runner {
 public:
  Runner(Pool& pool, const Shape& sh, const g3_kernel_table& k, Env& env, const Weights* w)
      : pool_(pool), sh_(sh), k_(k), env_(env), w_(w) {
    const LayerSpec& s = sh.spec;
    D_ = s.hidden_size;
    H_ = s.head_dim;
    N_ = s.num_heads;
    Nkv_ = s.num_kv_heads;
    G_ = N_ / Nkv_;
    QKV_ = (N_ + 2 * Nkv_) * H_;
    esz_ = esize(sh.kv);
  }

  void run_once() {
    if (sh_.phase == "prefill") core(sh_.T);
    else if (sh_.phase == "decode") core(1);
    else if (sh_.phase == "projections") projections();
    else block();
  }

  // The same core as one unsplit call per (sequence, KV head) over every
  // slot, on `table`: what the tiles, key ranges and chunk merge must equal.
  void core_unsplit(const g3_kernel_table& table, int64_t T) {
    for (int64_t b = 0; b < sh_.B; ++b)
      for (int64_t j = 0; j < Nkv_; ++j) {
        g3_core_args a = core_args(b, j, 0, T, 0, env_.C, T);
        table.core(&a);
      }
  }

 private:
  // Steps E-I (SPEC 1.3) for T query tokens at the end of the context.
  void core(int64_t T) {
    if (T == 1) core_decode();
    else core_prefill(T);
  }

  g3_core_args core_args(int64_t b, int64_t j, int64_t t0, int64_t nt, int64_t s0, int64_t s1, int64_t T) const {
    g3_core_args a{};
    a.T = nt;
    a.q = env_.q.f() + ((b * T + t0) * N_ + j * G_) * H_;
    a.q_stride = N_ * H_;
    a.qpos = env_.qpos.data() + (env_.T - T) + t0;
    const size_t head = size_t((b * Nkv_ + j) * env_.C + s0) * size_t(H_) * esz_;
    a.k = env_.kc.u() + head;
    a.v = env_.vc.u() + head;
    a.S = s1 - s0;
    a.kpos = env_.kpos.data() + s0;
    a.kvalid = env_.kvalid.data() + s0;
    a.out = env_.enc.f() + ((b * T + t0) * N_ + j * G_) * H_;
    a.out_stride = N_ * H_;
    a.lse = nullptr;
    a.head_dim = int32_t(H_);
    a.group = int32_t(G_);
    a.window = sh_.spec.window;
    a.kv_dtype = contract_dtype(sh_.kv);
    return a;
  }

  // Prefill: items are (sequence, KV head, query tile). Tiles of 64 queries
  // keep the G heads' rows of a tile together; they shrink when there would
  // be fewer than four items per thread.
  void core_prefill(int64_t T) {
    const int64_t B = sh_.B, C = env_.C;
    int64_t tile = 64;
    const int64_t want = 4 * pool_.size();
    if (B * Nkv_ * ((T + tile - 1) / tile) < want) tile = std::max<int64_t>(8, (B * Nkv_ * T + want - 1) / want);
    tile = std::min(tile, T);
    const int64_t tiles = (T + tile - 1) / tile;
    pool_.run(B * Nkv_ * tiles, [&](int64_t i) {
      const int64_t tt = i % tiles, j = (i / tiles) % Nkv_, b = i / (tiles * Nkv_);
      const int64_t t0 = tt * tile, nt = std::min(tile, T - t0);
      const int64_t first = C - T + t0, last = first + nt - 1;
      g3_core_args a = core_args(b, j, t0, nt, window_start(first, sh_.spec.window), last + 1, T);
      k_.core(&a);
    });
  }

  // Decode: the new token at position C-1 reads every visible slot once.
  // With few KV heads the range is split into chunks, each giving a partial
  // output and its log-sum-exp, merged as
  //   o = sum_i exp(lse_i - m) o_i / sum_i exp(lse_i - m),  m = max_i lse_i.
  void core_decode() {
    const int64_t B = sh_.B, C = env_.C;
    const int64_t s0 = window_start(C - 1, sh_.spec.window), len = C - s0;
    const int64_t target = pool_.size() == 1 ? 1 : 2 * pool_.size();
    int64_t nch = (target + B * Nkv_ - 1) / (B * Nkv_);
    nch = std::max<int64_t>(1, std::min(nch, len / 256));
    if (nch == 1) {
      pool_.run(B * Nkv_, [&](int64_t i) {
        const int64_t j = i % Nkv_, b = i / Nkv_;
        g3_core_args a = core_args(b, j, 0, 1, s0, C, 1);
        k_.core(&a);
      });
      return;
    }
    float* part = env_.part.f();
    float* lse = env_.lse.f();
    pool_.run(B * Nkv_ * nch, [&](int64_t i) {
      const int64_t c = i % nch, hb = i / nch, j = hb % Nkv_, b = hb / Nkv_;
      const int64_t c0 = s0 + len * c / nch, c1 = s0 + len * (c + 1) / nch;
      g3_core_args a = core_args(b, j, 0, 1, c0, c1, 1);
      a.out = part + i * G_ * H_;
      a.out_stride = G_ * H_;
      a.lse = lse + i * G_;
      k_.core(&a);
    });
    pool_.run(B * Nkv_, [&](int64_t hb) {
      const int64_t j = hb % Nkv_, b = hb / Nkv_;
      for (int64_t g = 0; g < G_; ++g) {
        float m = -INFINITY;
        for (int64_t c = 0; c < nch; ++c) m = std::max(m, lse[(hb * nch + c) * G_ + g]);
        float* o = env_.enc.f() + (b * N_ + j * G_ + g) * H_;
        std::fill(o, o + H_, 0.f);
        if (m == -INFINITY) continue;  // no visible key: the contract's zeros
        float wsum = 0;
        for (int64_t c = 0; c < nch; ++c) {
          const float wc = std::exp(lse[(hb * nch + c) * G_ + g] - m);
          if (wc == 0.f) continue;
          wsum += wc;
          const float* oc = part + (hb * nch + c) * G_ * H_ + g * H_;
          for (int64_t h = 0; h < H_; ++h) o[h] += wc * oc[h];
        }
        const float inv = 1.f / wsum;
        for (int64_t h = 0; h < H_; ++h) o[h] *= inv;
      }
    });
  }

  // c[M][cols] = a . W^T split into column ranges of whole panels.
  void gemm(const PackedWeights& w, const float* a, int64_t M, int64_t lda, float* c, int64_t ldc) {
    const int64_t panels = w.panels();
    const int64_t want = pool_.size() == 1 ? 1 : 4 * pool_.size();
    const int64_t per = std::max<int64_t>(1, (panels + want - 1) / want);
    const int64_t items = (panels + per - 1) / per;
    pool_.run(items, [&](int64_t i) {
      const int64_t n0 = i * per * G3_PANEL, n1 = std::min(w.N, (i + 1) * per * G3_PANEL);
      g3_gemm_args g = w.args(a, M, lda, c, ldc, n0, n1);
      k_.gemm(&g);
    });
  }

  void rmsnorm(const float* x, float* y, const float* w, const float* residual, int64_t rows) {
    const int64_t per = std::max<int64_t>(1, (rows + pool_.size() - 1) / pool_.size());
    pool_.run((rows + per - 1) / per, [&](int64_t i) {
      const int64_t r0 = i * per, n = std::min(per, rows - r0);
      k_.rmsnorm(x + r0 * D_, n, D_, D_, w, sh_.spec.rms_eps, residual ? residual + r0 * D_ : nullptr, y + r0 * D_,
                 D_);
    });
  }

  // Steps A and J alone: the fused q/k/v projection and the output one.
  void projections() {
    const int64_t M = sh_.B * sh_.T;
    gemm(w_->wqkv, env_.u.f(), M, D_, env_.qkv.f(), QKV_);
    gemm(w_->wo, env_.enc.f(), M, N_ * H_, env_.attn.f(), D_);
  }

  // SPEC 1.2 steps 1-4 with 1.3 A-J: pre-norm, fused projection, QK-norm +
  // RoPE + alpha + cache write, core, output projection, post-norm + residual.
  void block() {
    const int64_t B = sh_.B, T = sh_.T, M = B * T;
    rmsnorm(env_.x.f(), env_.u.f(), w_->in_norm.data(), nullptr, M);
    gemm(w_->wqkv, env_.u.f(), M, D_, env_.qkv.f(), QKV_);
    const int64_t per = std::max<int64_t>(1, (T + pool_.size() - 1) / pool_.size());
    const int64_t chunks = (T + per - 1) / per;
    pool_.run(B * chunks, [&](int64_t i) {
      const int64_t b = i / chunks, t0 = (i % chunks) * per, nt = std::min(per, T - t0);
      g3_qk_args a{};
      a.T = nt;
      a.num_heads = int32_t(N_);
      a.num_kv_heads = int32_t(Nkv_);
      a.q = env_.qkv.f() + (b * T + t0) * QKV_;
      a.q_stride = QKV_;
      a.k = a.q + N_ * H_;
      a.v = a.q + (N_ + Nkv_) * H_;
      a.kv_stride = QKV_;
      a.pos = env_.qpos.data() + (env_.T - T) + t0;
      a.q_norm = w_->q_norm.data();
      a.k_norm = w_->k_norm.data();
      a.q_out = env_.q.f() + (b * T + t0) * N_ * H_;
      a.q_out_stride = N_ * H_;
      a.k_cache = env_.kc.u() + size_t(b * Nkv_ * env_.C * H_) * esz_;
      a.v_cache = env_.vc.u() + size_t(b * Nkv_ * env_.C * H_) * esz_;
      a.cache_head_stride = env_.C;
      a.slot = env_.slot.data() + (env_.T - T) + t0;
      a.head_dim = int32_t(H_);
      a.kv_dtype = contract_dtype(sh_.kv);
      a.alpha = sh_.spec.alpha;
      a.eps = sh_.spec.rms_eps;
      a.rope_base = sh_.spec.rope_base;
      a.rope_scale = sh_.spec.rope_scale;
      k_.qk(&a);
    });
    core(T);
    gemm(w_->wo, env_.enc.f(), M, N_ * H_, env_.attn.f(), D_);
    rmsnorm(env_.attn.f(), env_.y.f(), w_->post_norm.data(), env_.x.f(), M);
  }

  Pool& pool_;
  const Shape& sh_;
  const g3_kernel_table& k_;
  Env& env_;
  const Weights* w_;
  int64_t D_ = 0, H_ = 0, N_ = 0, Nkv_ = 0, G_ = 0, QKV_ = 0;
  size_t esz_ = 4;
};

// Builds (or keeps) the buffers for a shape. Queries and the cache are
// random with unit variance (the query alpha-scaled), so logits have about
// unit variance as after QK-norm.
void prepare_env(Pool& pool, Env& env, const Shape& sh, int64_t T_max) {
  const LayerSpec& s = sh.spec;
  const int64_t B = sh.B, C = sh.C, H = s.head_dim, N = s.num_heads, K = s.num_kv_heads, D = s.hidden_size;
  // Query positions exist only with keys; decode-only runs may have a
  // context shorter than --new-tokens, so they are capped by it.
  const int64_t Tq = C > 0 ? std::min(T_max, C) : 0;
  const std::string id = sh.model + "|" + to_string(sh.kv) + "|" + std::to_string(C) + "|" + std::to_string(B) +
                         "|" + std::to_string(T_max);
  if (env.id == id) return;
  env = Env{};
  env.id = id;
  env.B = B;
  env.C = C;
  env.T = Tq;
  env.kv = sh.kv;
  const size_t cache = size_t(B * K * C * H);
  env.kc = Buf::make(cache * esize(sh.kv));
  env.vc = Buf::make(cache * esize(sh.kv));
  fill_random(pool, env.kc.u(), int64_t(cache), sh.kv, 1.f, 1);
  fill_random(pool, env.vc.u(), int64_t(cache), sh.kv, 1.f, 2);
  env.kpos.resize(size_t(C));
  env.kvalid.assign(size_t(C), 1);
  for (int64_t i = 0; i < C; ++i) env.kpos[size_t(i)] = int32_t(i);
  env.qpos.resize(size_t(Tq));
  env.slot.resize(size_t(Tq));
  for (int64_t t = 0; t < Tq; ++t) {
    env.qpos[size_t(t)] = int32_t(C - Tq + t);
    env.slot[size_t(t)] = C - Tq + t;
  }
  const int64_t qn = B * T_max * N * H;
  env.q = Buf::make(size_t(qn) * 4);
  fill_random(pool, env.q.f(), qn, DType::F32, s.alpha, 3);
  env.enc = Buf::make(size_t(qn) * 4);
  fill_random(pool, env.enc.f(), qn, DType::F32, 1.f, 4);
  // Decode partials: up to 2 x threads chunks per (sequence, KV head).
  const int64_t parts = B * K * std::max<int64_t>(1, 2 * pool.size());
  env.part = Buf::make(size_t(parts * (N / K) * H) * 4);
  env.lse = Buf::make(size_t(parts * (N / K)) * 4);
  env.x = Buf::make(size_t(B * T_max * D) * 4);
  fill_random(pool, env.x.f(), B * T_max * D, DType::F32, 1.f, 5);
  env.u = Buf::make(size_t(B * T_max * D) * 4);
  fill_random(pool, env.u.f(), B * T_max * D, DType::F32, 1.f, 6);
  env.qkv = Buf::make(size_t(B * T_max * (N + 2 * K) * H) * 4);
  env.attn = Buf::make(size_t(B * T_max * D) * 4);
  env.y = Buf::make(size_t(B * T_max * D) * 4);
}

// One backend on one ISA for one kernel key, or why not.
struct Combo {
  std::string backend, isa_req;
  KernelChoice choice;
  std::string isa;  // the ISA the code reports (JIT caps may lower it)
  bool ok = false;
};

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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int phase_rank(const std::string& p) {
  const auto& v = phase_names();
  return int(std::find(v.begin(), v.end(), p) - v.begin());
}

}  // namespace

double harness_max_error(const std::string& model, const std::string& kind, const std::string& phase,
                         int64_t context, int64_t new_tokens, int threads, const std::string& backend,
                         const std::string& isa) {
  ModelConfig m = builtin_model(model);
  Shape sh;
  for (const auto& s : layer_specs(m))
    if (to_string(s.kind) == kind) {
      sh.spec = s;
      break;
    }
  if (sh.spec.num_heads == 0) throw InputError("harness_max_error: model " + model + " has no " + kind + " layer");
  sh.model = model;
  sh.kind = kind;
  sh.phase = phase;
  sh.B = 1;
  sh.T = phase == "decode" ? 1 : new_tokens;
  sh.C = context;
  Pool pool(threads);
  Env env;
  prepare_env(pool, env, sh, new_tokens);
  KernelChoice c = kernels_for(kernel_key(sh.spec, sh.kv, DType::BF16), backend, isa);
  Runner fast(pool, sh, c.kernels.table, env, nullptr);
  fast.run_once();
  const int64_t n = sh.T * sh.spec.num_heads * sh.spec.head_dim;
  std::vector<float> got(env.enc.f(), env.enc.f() + n);
  fast.core_unsplit(ref::kernel_table(), sh.T);
  double err = 0;
  for (int64_t i = 0; i < n; ++i) err = std::max(err, double(std::fabs(got[size_t(i)] - env.enc.f()[i])));
  return err;
}

void validate(const Options& o) {
  if (o.models.empty()) throw InputError("--model: empty list");
  for (const auto& m : o.models) builtin_model(m);  // InputError listing the sizes
  if (o.new_tokens < 1) throw InputError("--new-tokens must be at least 1");
  if (o.batch < 1) throw InputError("--batch must be at least 1");
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
  if (o.threads <= 0) o.threads = int(std::max(1u, std::thread::hardware_concurrency()));
  const bool fixed_repeat = o.repeat > 0;
  const int repeat = fixed_repeat ? o.repeat : kDefaultRepeat;

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
  Pool pool(o.threads);

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
    for (size_t kvi = 0; kvi < o.kv_dtypes.size(); ++kvi) {
      DType kv = o.kv_dtypes[kvi];
      auto base = [&](const LayerSpec& s, const std::string& phase, int64_t T, int64_t C) {
        Shape sh;
        sh.model = name;
        sh.spec = s;
        sh.kind = to_string(s.kind);
        sh.phase = phase;
        sh.kv = kv;
        sh.kv_label = to_string(kv);
        sh.B = o.batch;
        sh.T = T;
        sh.C = C;
        return sh;
      };
      // Projections do not touch keys: one row per token count, for the
      // first KV dtype only, labelled kind "any" and KV dtype "any".
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
  auto combo_for = [&](const KernelKey& key, const std::string& backend, const std::string& isa) -> Combo& {
    std::string id = key.str() + "|" + backend + "|" + isa;
    auto it = combos.find(id);
    if (it != combos.end()) return it->second;
    Combo c;
    c.backend = backend;
    c.isa_req = isa;
    try {
      c.choice = kernels_for(key, backend, isa);
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

  // Per (backend, ISA, phase, tokens) the last measured GFLOP/s: predicts
  // larger shapes so hopeless ones are skipped before they run. A first row
  // is predicted from a one-thread probe of the kernels on a tiny shape.
  std::map<std::string, double> rate;
  std::map<std::string, double> probe_rate;  // per thread, per backend|isa|key|stage
  auto probe = [&](const Combo& c, const Shape& sh, const std::string& stage) -> double {
    std::string id = c.backend + "|" + c.isa + "|" + c.choice.kernels.isa + "|" + sh.model + "|" + sh.kind + "|" +
                     sh.kv_label + "|" + stage;
    auto it = probe_rate.find(id);
    if (it != probe_rate.end()) return it->second;
    const LayerSpec& s = sh.spec;
    const int64_t H = s.head_dim, G = s.num_heads / s.num_kv_heads;
    double flops = 0, secs = 0;
    if (stage == "core") {
      const int64_t T = 16, S = 512;
      Buf q = Buf::make(size_t(T * G * H) * 4), o = Buf::make(size_t(T * G * H) * 4);
      Buf kk = Buf::make(size_t(S * H) * 4), vv = Buf::make(size_t(S * H) * 4);
      fill_random(pool, q.f(), T * G * H, DType::F32, s.alpha, 7);
      fill_random(pool, kk.u(), S * H, sh.kv, 1.f, 8);
      fill_random(pool, vv.u(), S * H, sh.kv, 1.f, 9);
      std::vector<int32_t> qp(T), kp(S);
      std::vector<uint8_t> valid(S, 1);
      for (int64_t t = 0; t < T; ++t) qp[size_t(t)] = int32_t(S - T + t);
      for (int64_t i = 0; i < S; ++i) kp[size_t(i)] = int32_t(i);
      g3_core_args a{};
      a.T = T;
      a.q = q.f();
      a.q_stride = G * H;
      a.qpos = qp.data();
      a.k = kk.u();
      a.v = vv.u();
      a.S = S;
      a.kpos = kp.data();
      a.kvalid = valid.data();
      a.out = o.f();
      a.out_stride = G * H;
      a.head_dim = int32_t(H);
      a.group = int32_t(G);
      a.window = 0;
      a.kv_dtype = contract_dtype(sh.kv);
      c.choice.kernels.table.core(&a);  // warm-up (JIT first touch, caches)
      Clock::time_point t0 = Clock::now();
      c.choice.kernels.table.core(&a);
      secs = seconds_since(t0);
      flops = 4.0 * H * G * visible_pairs(T, S, 0);
    } else {
      const int64_t M = 16, K = s.hidden_size, Ncols = 2 * G3_PANEL;
      WeightMatrix wm;
      wm.dtype = o.weight_dtype;
      wm.rows = Ncols;
      wm.cols = K;
      if (wm.dtype == DType::F32) wm.f32.assign(size_t(Ncols * K), 0.01f);
      else wm.bf16.assign(size_t(Ncols * K), f32_to_bf16(0.01f));
      PackedWeights pw = pack_weights(wm);
      Buf a = Buf::make(size_t(M * K) * 4), cc = Buf::make(size_t(M * Ncols) * 4);
      fill_random(pool, a.f(), M * K, DType::F32, 1.f, 10);
      g3_gemm_args g = pw.args(a.f(), M, K, cc.f(), Ncols, 0, Ncols);
      c.choice.kernels.table.gemm(&g);
      Clock::time_point t0 = Clock::now();
      c.choice.kernels.table.gemm(&g);
      secs = seconds_since(t0);
      flops = 2.0 * M * K * Ncols;
    }
    double r = flops / std::max(secs, 1e-9);
    probe_rate[id] = r;
    return r;
  };

  Env env;
  std::map<std::string, Weights> weights;  // per model and weight dtype
  std::set<std::string> done_rows;
  // How many rows will be attempted, for the progress lines.
  const size_t total = shapes.size() * o.backends.size() * isas.size();
  size_t attempt = 0;

  for (const Shape& sh : shapes) {
    const KernelKey key = kernel_key(sh.spec, sh.kv, o.weight_dtype);
    const int64_t T_env = std::max<int64_t>(o.new_tokens, 1);
    const Weights* w = nullptr;
    if (sh.phase == "block" || sh.phase == "projections") {
      std::string wid = sh.model + "|" + to_string(o.weight_dtype);
      auto it = weights.find(wid);
      if (it == weights.end()) it = weights.emplace(wid, make_weights(pool, sh.spec, o.weight_dtype)).first;
      w = &it->second;
    }
    bool env_ready = false;
    for (const auto& backend : o.backends)
      for (const auto& isa : isas) {
        ++attempt;
        Combo& c = combo_for(key, backend, isa);
        if (!c.ok) continue;
        // The same code under another requested ISA (the reference ignores
        // the ISA; a JIT may cap lower): measure it once.
        const std::string row_key = backend + "|" + c.isa + "|" + sh.model + "|" + sh.kind + "|" + sh.phase + "|" +
                                    sh.kv_label + "|" + std::to_string(sh.T) + "|" + std::to_string(sh.C);
        if (done_rows.count(row_key)) {
          if (backend == "reference")
            notes.add("backend reference runs the same scalar code whatever the ISA: measured once, as scalar");
          else if (c.isa != isa)
            notes.add("backend " + backend + " on " + isa + " runs " + c.isa + " code: measured once, as " + c.isa);
          continue;
        }
        // Predict the time of one run; skip it when over budget.
        const std::string rate_id = backend + "|" + c.isa + "|" + sh.phase + "|" + std::to_string(sh.T == 1);
        double predicted = 0;
        if (auto it = rate.find(rate_id); it != rate.end()) {
          predicted = (sh.core_flops + sh.proj_flops) / it->second;
        } else {
          if (sh.core_flops > 0) predicted += sh.core_flops / (probe(c, sh, "core") * o.threads);
          if (sh.proj_flops > 0) predicted += sh.proj_flops / (probe(c, sh, "gemm") * o.threads);
        }
        const bool budgeted = backend == "reference" || default_contexts;
        if (budgeted && predicted > kRunBudgetSeconds) {
          notes.add(backend + " " + c.isa + " " + sh.model + " " + sh.kind + " " + sh.phase + " context " +
                    ctx_str(sh.C ? std::optional<int64_t>(sh.C) : std::nullopt) + " new_tokens " +
                    std::to_string(sh.T) + " skipped: predicted " + fmt("%.1f", predicted) + " s per run (budget " +
                    fmt("%.1f", kRunBudgetSeconds) + " s)");
          continue;
        }
        if (!env_ready) {
          prepare_env(pool, env, sh, T_env);
          env_ready = true;
        }
        Runner runner(pool, sh, c.choice.kernels.table, env, w);
        runner.run_once();  // warm-up: JIT first calls, page faults, caches
        std::vector<double> ms;
        Clock::time_point row_start = Clock::now();
        for (int r = 0; r < repeat; ++r) {
          Clock::time_point t0 = Clock::now();
          runner.run_once();
          ms.push_back(seconds_since(t0) * 1e3);
          if (!fixed_repeat && seconds_since(row_start) > kRowSeconds) break;
          if (!fixed_repeat && default_contexts && seconds_since(t_start) > kDefaultRunSeconds) {
            notes.add("the default run passed " + fmt("%.0f", kDefaultRunSeconds) +
                      " s: later rows took a single timed run");
            break;
          }
        }
        done_rows.insert(row_key);
        Row row;
        row.backend = backend;
        row.route = c.choice.backend;
        row.isa = c.isa;
        row.model = sh.model;
        row.kind = sh.kind;
        row.phase = sh.phase;
        row.kv_dtype = sh.kv_label;
        row.weight_dtype = (sh.phase == "block" || sh.phase == "projections") ? to_string(o.weight_dtype) : "any";
        row.batch = int(sh.B);
        row.new_tokens = sh.T;
        if (sh.C > 0) row.context = sh.C;
        row.ms_median = median(ms);
        row.ms_min = *std::min_element(ms.begin(), ms.end());
        row.runs = int(ms.size());
        row.flops = sh.core_flops + sh.proj_flops;
        row.kv_bytes = sh.kv_bytes;
        row.gflops = row.flops / (row.ms_median * 1e-3) / 1e9;
        if (sh.decode_like()) {
          row.gbs = sh.kv_bytes / (row.ms_median * 1e-3) / 1e9;
          row.pct_peak = res.peaks.dram_read_gbs > 0 ? *row.gbs / res.peaks.dram_read_gbs * 100 : 0;
        } else {
          row.pct_peak = res.peaks.fp32_gflops > 0 ? row.gflops / res.peaks.fp32_gflops * 100 : 0;
        }
        row.specialised = c.choice.kernels.specialised;
        row.stages = c.choice.stages;
        rate[rate_id] = row.flops / (row.ms_median * 1e-3);
        if (!c.choice.fallback.empty()) notes.add("backend " + backend + ": " + c.choice.fallback);
        if (o.progress) {
          std::fprintf(stderr, "[%zu/%zu] %s %s %s %s %s ctx %s new %lld: %.3f ms\n", attempt, total,
                       row.label().c_str(), c.isa.c_str(), sh.model.c_str(), sh.kind.c_str(), sh.phase.c_str(),
                       ctx_str(row.context).c_str(), (long long)sh.T, row.ms_median);
          std::fflush(stderr);
        }
        res.rows.push_back(std::move(row));
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

}  // namespace g3::bench
