#include "model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include <unistd.h>

#include "bf16.h"
#include "checkpoint.h"
#include "errors.h"
#include "isa.h"
#include "kernel_registry.h"

namespace g3 {

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

// ---------------------------------------------------------------------------
// Model

Model::Model(const ModelConfig& cfg, const WeightSource& weights, const ModelOptions& o) : cfg_(cfg), opt_(o) {
  if (o.batch < 1) throw InputError("--batch must be at least 1");
  if (o.context < 1) throw InputError("the context must be at least 1 position");
  if (o.chunk < 1) throw InputError("--chunk must be at least 1");
  opt_.chunk = std::min(o.chunk, o.context);
  opt_.isa = resolve_isa(o.isa);  // "best" becomes this machine's best; others are checked
  pool_ = std::make_unique<ThreadPool>(o.threads);
  const std::vector<LayerSpec> specs = layer_specs(cfg);
  // Layers are independent until they run, so drawing or reading and packing
  // their weights is spread over the pool; kernels_for memoises by key, so
  // layers with equal keys get the one kernel.
  layers_.resize(specs.size());
  pool_->parallel_for(int64_t(specs.size()), [&](int64_t i) {
    LayerWeights w = weights(specs[size_t(i)]);
    layers_[size_t(i)] = prepare_layer(specs[size_t(i)], w, opt_.kv_dtype, opt_.backend, opt_.isa);
  });
  for (const LayerSpec& s : specs) caches_.emplace_back(s, opt_.kv_dtype, opt_.batch, opt_.context, opt_.chunk);
  layer_ms_.assign(specs.size(), 0.0);
}

uint64_t Model::kv_bytes_allocated() const {
  uint64_t n = 0;
  for (const auto& c : caches_) n += c.bytes();
  return n;
}

void Model::reset() {
  for (auto& c : caches_) c.reset();
}

void Model::clear_timings() { std::fill(layer_ms_.begin(), layer_ms_.end(), 0.0); }

void Model::forward(const float* x, const int32_t* positions, const uint8_t* real, int64_t T, float* y) {
  const int64_t B = opt_.batch, D = cfg_.hidden_size;
  // All or nothing: chunks run one after another through every layer, so a
  // chunk refused halfway would leave the earlier chunks (and, within a
  // chunk, the earlier layers) cached. Every layer's cache therefore checks
  // the whole call, every row split into the chunks below, before the first
  // chunk runs; the per-call checks inside run_block_cached then always pass.
  for (const LayerKvCache& c : caches_)
    for (int64_t b = 0; b < B; ++b)
      c.check_append(b, positions + b * T, real ? real + b * T : nullptr, T, opt_.chunk);
  for (int64_t t0 = 0; t0 < T; t0 += opt_.chunk) {
    const int64_t Tc = std::min(opt_.chunk, T - t0);
    cur_.resize(size_t(B * Tc * D));
    nxt_.resize(size_t(B * Tc * D));
    pos_.resize(size_t(B * Tc));
    real_.resize(size_t(B * Tc));
    for (int64_t b = 0; b < B; ++b) {
      std::copy_n(x + (b * T + t0) * D, Tc * D, cur_.data() + b * Tc * D);
      std::copy_n(positions + b * T + t0, Tc, pos_.data() + b * Tc);
      if (real) std::copy_n(real + b * T + t0, Tc, real_.data() + b * Tc);
    }
    for (size_t l = 0; l < layers_.size(); ++l) {
      const double t = now_ms();
      run_block_cached(layers_[l], caches_[l], cur_.data(), pos_.data(), real ? real_.data() : nullptr, B, Tc,
                       nxt_.data(), *pool_, scratch_);
      cur_.swap(nxt_);
      layer_ms_[l] += now_ms() - t;
      if (on_layer) on_layer(int(l), Tc);
    }
    for (int64_t b = 0; b < B; ++b) std::copy_n(cur_.data() + b * Tc * D, Tc * D, y + (b * T + t0) * D);
  }
}

// ---------------------------------------------------------------------------
// ReferenceStack: the official layout in double.

namespace {

// sum_i a[i] * b[i] in double with eight independent partial sums: the
// reference is O(T^2) and one dependency chain would make --verify several
// times slower. The clones let the compiler use wide double vectors on
// machines that have them (a per-function target, never a global -m flag);
// every clone accumulates in double, so the oracle's precision is the same.
__attribute__((target_clones("avx512f", "avx2", "default"))) double dot(const float* a, const float* b, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += double(a[i + k]) * double(b[i + k]);
  for (; i < n; ++i) s[0] += double(a[i]) * double(b[i]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace

ReferenceStack::ReferenceStack(const ModelConfig& cfg, const WeightSource& weights, int64_t batch, int64_t cache_len,
                               ThreadPool& pool, DType kv_dtype)
    : cfg_(cfg), B_(batch), S_(cache_len), pool_(pool), kv_dtype_(kv_dtype) {
  const std::vector<LayerSpec> specs = layer_specs(cfg);
  layers_.resize(specs.size());
  pool_.parallel_for(int64_t(specs.size()), [&](int64_t i) {
    Layer& L = layers_[size_t(i)];
    L.spec = specs[size_t(i)];
    LayerWeights w = weights(L.spec);
    L.wq = w.q_proj.to_f32();
    L.wk = w.k_proj.to_f32();
    L.wv = w.v_proj.to_f32();
    L.wo = w.o_proj.to_f32();
    L.q_norm = w.q_norm;
    L.k_norm = w.k_norm;
    L.input_norm = w.input_norm;
    L.post_norm = w.post_norm;
    L.cache = ref::Cache::zeros(batch, cache_len, L.spec.num_kv_heads, L.spec.head_dim);
  });
  slot_real_.assign(size_t(B_ * S_), 0);
}

void ReferenceStack::forward(const float* x, const int32_t* pos, const uint8_t* real, int64_t T, float* y) {
  if (T > S_) throw InputError("reference: " + std::to_string(T) + " tokens exceed the cache length");
  // dynamic_update_slice clamps the start so the whole update fits (SPEC 1.5).
  const int64_t start = std::min(end_index_ % S_, S_ - T);
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t t = 0; t < T; ++t) slot_real_[size_t(b * S_ + start + t)] = real ? real[b * T + t] != 0 : 1;
  const int64_t D = cfg_.hidden_size;
  std::vector<float> cur(x, x + B_ * T * D), nxt(size_t(B_ * T * D));
  for (size_t l = 0; l < layers_.size(); ++l) {
    block(layers_[l], cur.data(), pos, T, start, nxt.data());
    cur.swap(nxt);
    if (on_layer) on_layer(int(l));
  }
  std::copy(cur.begin(), cur.end(), y);
  end_index_ += T;
}

void ReferenceStack::block(Layer& L, const float* x, const int32_t* positions, int64_t T, int64_t start, float* y) {
  const LayerSpec& sp = L.spec;
  const int64_t D = sp.hidden_size, H = sp.head_dim, N = sp.num_heads, K = sp.num_kv_heads, G = N / K;
  const int64_t R = B_ * T, S = S_;
  std::vector<float> u(size_t(R * D)), q(size_t(R * N * H)), k(size_t(R * K * H)), v(size_t(R * K * H));
  std::vector<float> enc(size_t(R * N * H)), a(size_t(R * D));

  // SPEC 1.2 step 1 and 1.3 step A.
  pool_.parallel_for(R, [&](int64_t r) { ref::rms_norm(x + r * D, D, L.input_norm.data(), sp.rms_eps, &u[r * D]); });
  const int64_t QKV = (N + 2 * K) * H, cb = 128, ncb = (QKV + cb - 1) / cb;
  pool_.parallel_for(R * ncb, [&](int64_t i) {
    const int64_t r = i / ncb, c0 = (i % ncb) * cb, c1 = std::min(QKV, c0 + cb);
    const float* ur = &u[r * D];
    for (int64_t c = c0; c < c1; ++c) {
      if (c < N * H) q[r * N * H + c] = float(dot(ur, &L.wq[c * D], D));
      else if (c < (N + K) * H) k[r * K * H + c - N * H] = float(dot(ur, &L.wk[(c - N * H) * D], D));
      else v[r * K * H + c - (N + K) * H] = float(dot(ur, &L.wv[(c - (N + K) * H) * D], D));
    }
  });
  // Steps B-C: QK-norm, RoPE, then q *= alpha.
  pool_.parallel_for(R, [&](int64_t r) {
    const int64_t p = positions[r];
    for (int64_t n = 0; n < N; ++n) {
      float* qh = &q[(r * N + n) * H];
      ref::rms_norm(qh, H, L.q_norm.data(), sp.rms_eps, qh);
      ref::rope(qh, H, p, sp.rope_base, sp.rope_scale);
      for (int64_t h = 0; h < H; ++h) qh[h] = static_cast<float>(double(qh[h]) * double(sp.alpha));
    }
    for (int64_t j = 0; j < K; ++j) {
      float* kh = &k[(r * K + j) * H];
      ref::rms_norm(kh, H, L.k_norm.data(), sp.rms_eps, kh);
      ref::rope(kh, H, p, sp.rope_base, sp.rope_scale);
    }
    // K and V as the cache stores them (rounded once when it holds bf16).
    if (kv_dtype_ == DType::BF16)
      for (float* e : {&k[r * K * H], &v[r * K * H]})
        for (int64_t i = 0; i < K * H; ++i) e[i] = bf16_to_f32(f32_to_bf16(e[i]));
  });
  // Step D: the official cache write (every token, padding included).
  ref::Cache& C = L.cache;
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t slot = start + t, r = b * T + t;
      std::copy_n(&k[r * K * H], K * H, &C.k[(b * S + slot) * K * H]);
      std::copy_n(&v[r * K * H], K * H, &C.v[(b * S + slot) * K * H]);
      C.positions[size_t(b * S + slot)] = positions[r];
    }
  C.end_index += T;
  // Steps E-I: logits over all S slots, K_MASK for hidden ones, softmax over
  // all S (a row with no visible key averages every slot, as the official
  // code does), weighted values.
  pool_.parallel_for(R * N, [&](int64_t i) {
    const int64_t r = i / N, n = i % N, b = r / T, t = r % T, j = n / G;
    const int64_t qp = positions[r];
    const float* qh = &q[(r * N + n) * H];
    std::vector<double> p(static_cast<size_t>(S));
    double mx = -INFINITY;
    for (int64_t s = 0; s < S; ++s) {
      bool visible = slot_real_[size_t(b * S + s)] && s <= start + t;
      if (sp.window > 0) visible = visible && ref::sliding_visible(qp, C.positions[size_t(b * S + s)], sp.window);
      p[size_t(s)] = visible ? dot(qh, &C.k[((b * S + s) * K + j) * H], H) : ref::kMask;
      mx = std::max(mx, p[size_t(s)]);
    }
    double sum = 0;
    for (int64_t s = 0; s < S; ++s) sum += (p[size_t(s)] = std::exp(p[size_t(s)] - mx));
    std::vector<double> acc(size_t(H), 0.0);
    for (int64_t s = 0; s < S; ++s) {
      if (p[size_t(s)] == 0) continue;  // exp(K_MASK - max) underflows to exactly 0
      const float* vh = &C.v[((b * S + s) * K + j) * H];
      for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += p[size_t(s)] * vh[h];
    }
    for (int64_t h = 0; h < H; ++h) enc[(r * N + n) * H + h] = static_cast<float>(acc[size_t(h)] / sum);
  });
  // Step J and SPEC 1.2 steps 3-4.
  const int64_t db = 128, ndb = (D + db - 1) / db;
  pool_.parallel_for(R * ndb, [&](int64_t i) {
    const int64_t r = i / ndb, d0 = (i % ndb) * db, d1 = std::min(D, d0 + db);
    for (int64_t d = d0; d < d1; ++d) a[r * D + d] = float(dot(&enc[r * N * H], &L.wo[d * N * H], N * H));
  });
  pool_.parallel_for(R, [&](int64_t r) {
    std::vector<float> pn(static_cast<size_t>(D));
    ref::rms_norm(&a[r * D], D, L.post_norm.data(), sp.rms_eps, pn.data());
    for (int64_t d = 0; d < D; ++d) y[r * D + d] = static_cast<float>(double(x[r * D + d]) + pn[size_t(d)]);
  });
}

// ---------------------------------------------------------------------------
// run_model

void check_run_request(const RunRequest& r) {
  if (r.prompt < 1) throw InputError("--prompt must be at least 1");
  if (r.decode < 0) throw InputError("--decode must not be negative");
  if (r.chunk < 1) throw InputError("--chunk must be at least 1");
  if (r.batch < 1) throw InputError("--batch must be at least 1");
  parse_backend(r.backend);
  isa_from_flag(r.isa);
  const ModelConfig& cfg = r.config;
  const int64_t L = r.prompt + r.decode;
  if (L > cfg.max_position_embeddings)
    throw InputError("--prompt + --decode = " + std::to_string(L) + " exceeds the model's max_position_embeddings " +
                     std::to_string(cfg.max_position_embeddings));
  // Refuse up front what cannot fit: the KV caches (plus the reference's
  // full-length f32 caches with --verify) and the weights, against RAM.
  const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  const KvBytes kv = kv_bytes(cfg, L, r.batch, r.kv_dtype, std::min(r.chunk, r.prompt));
  const double per_layer = double(cfg.hidden_size) * (cfg.num_heads + 2.0 * cfg.num_kv_heads) * cfg.head_dim +
                           double(cfg.num_heads) * cfg.head_dim * cfg.hidden_size;
  double need = double(kv.ring) + per_layer * cfg.num_layers * (r.weight_dtype == DType::F32 ? 4 : 2);
  if (r.verify) need += double(kv_bytes(cfg, L, r.batch, DType::F32, 0).full_length);
  if (ram > 0 && need > ram)
    throw InputError("this run needs about " + std::to_string(int64_t(need / double(1 << 30))) +
                     " GiB for KV caches and weights, more than this machine's " +
                     std::to_string(int64_t(ram / double(1 << 30))) + " GiB of RAM (lower --prompt, --batch)");
}

RunResult run_model(const RunRequest& r) {
  check_run_request(r);
  const std::string backend = parse_backend(r.backend);
  const std::string isa = isa_from_flag(r.isa);

  RunResult res;
  std::shared_ptr<Checkpoint> ck;
  WeightSource ws;
  if (!r.weights.empty()) {
    ck = std::make_shared<Checkpoint>(open_checkpoint(r.weights, &r.config));
    ws = [ck](const LayerSpec& s) { return ck->layer(s); };
  } else {
    const uint64_t seed = r.seed;
    const DType wd = r.weight_dtype;
    ws = [seed, wd](const LayerSpec& s) { return random_layer_weights(s, seed, wd); };
  }
  const ModelConfig& cfg = r.config;
  const int64_t B = r.batch, L = r.prompt + r.decode, D = cfg.hidden_size;

  ModelOptions o;
  o.backend = backend;
  o.isa = isa;
  o.kv_dtype = r.kv_dtype;
  o.batch = B;
  o.context = L;
  o.chunk = std::min(r.chunk, r.prompt);
  o.threads = r.threads;
  Model m(cfg, ws, o);
  res.config = cfg;
  res.isa = isa;
  res.threads = m.pool().size();
  res.kv = kv_bytes(cfg, L, B, r.kv_dtype, o.chunk);
  if (res.kv.ring != m.kv_bytes_allocated()) throw std::logic_error("kv_bytes accounting disagrees with the caches");

  // Inputs N(0, 1) from the seed; positions 0..prompt-1, then decode positions.
  std::vector<float> x(size_t(B * L * D));
  {
    std::seed_seq seq{uint32_t(r.seed), uint32_t(r.seed >> 32), 0x1A7u};
    std::mt19937_64 g(seq);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : x) v = nd(g);
  }
  std::vector<int32_t> pos(size_t(B * L));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < L; ++t) pos[size_t(b * L + t)] = int32_t(t);
  res.final_hidden.assign(size_t(B * L * D), 0.f);

  // Gathers columns [t0, t0 + n) of every row into a [B][n] block and back.
  auto gather = [&](const auto& src, int64_t t0, int64_t n, int64_t width) {
    std::vector<std::decay_t<decltype(src[0])>> out(size_t(B * n * width));
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(&src[size_t((b * L + t0) * width)], n * width, &out[size_t(b * n * width)]);
    return out;
  };
  auto scatter = [&](const std::vector<float>& blk, int64_t t0, int64_t n) {
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(&blk[size_t(b * n * D)], n * D, &res.final_hidden[size_t((b * L + t0) * D)]);
  };
  const int64_t nl = cfg.num_layers;

  // Prefill, chunk by chunk (progress after each layer of each chunk).
  const int64_t C = o.chunk;
  double t0 = now_ms();
  for (int64_t s = 0; s < r.prompt; s += C) {
    const int64_t n = std::min(C, r.prompt - s);
    m.on_layer = [&, s, n](int layer, int64_t) {
      if (r.progress) r.progress("prefill", s * nl + (layer + 1) * n, r.prompt * nl);
    };
    auto xs = gather(x, s, n, D);
    auto ps = gather(pos, s, n, 1);
    std::vector<float> ys(xs.size());
    m.forward(xs.data(), ps.data(), nullptr, n, ys.data());
    scatter(ys, s, n);
  }
  res.prefill_s = (now_ms() - t0) / 1000;
  std::vector<double> prefill_ms = m.layer_ms();
  m.on_layer = nullptr;
  t0 = now_ms();
  for (int64_t k = 0; k < r.decode; ++k) {
    auto xs = gather(x, r.prompt + k, 1, D);
    auto ps = gather(pos, r.prompt + k, 1, 1);
    std::vector<float> ys(xs.size());
    m.forward(xs.data(), ps.data(), nullptr, 1, ys.data());
    scatter(ys, r.prompt + k, 1);
    if (r.progress) r.progress("decode", k + 1, r.decode);
  }
  res.decode_s = (now_ms() - t0) / 1000;
  res.prefill_tokens_per_s = double(B * r.prompt) / std::max(res.prefill_s, 1e-9);
  res.decode_ms_per_token = r.decode > 0 ? res.decode_s * 1000 / double(r.decode) : 0;

  for (int64_t l = 0; l < nl; ++l) {
    const PreparedLayer& P = m.layers()[size_t(l)];
    RunLayer rl;
    rl.index = int(l);
    rl.kind = P.spec.kind;
    rl.key = P.key.str();
    rl.backend = P.kernels.backend;
    rl.isa = P.kernels.kernels.isa;
    rl.specialised = P.kernels.kernels.specialised;
    rl.prefill_ms = prefill_ms[size_t(l)];
    rl.decode_ms = m.layer_ms()[size_t(l)] - prefill_ms[size_t(l)];
    (rl.kind == LayerKind::Local ? res.local_ms : res.global_ms) += rl.prefill_ms + rl.decode_ms;
    res.layers.push_back(rl);
  }

  if (r.verify) {
    t0 = now_ms();
    ReferenceStack ref(cfg, ws, B, L, m.pool(), r.kv_dtype);
    std::vector<float> want(size_t(B * L * D));
    ref.on_layer = [&](int layer) {
      if (r.progress) r.progress("verify prefill", layer + 1, nl);
    };
    {
      auto xs = gather(x, 0, r.prompt, D);
      auto ps = gather(pos, 0, r.prompt, 1);
      std::vector<float> ys(xs.size());
      ref.forward(xs.data(), ps.data(), nullptr, r.prompt, ys.data());
      for (int64_t b = 0; b < B; ++b)
        std::copy_n(&ys[size_t(b * r.prompt * D)], r.prompt * D, &want[size_t(b * L * D)]);
    }
    ref.on_layer = nullptr;
    for (int64_t k = 0; k < r.decode; ++k) {
      auto xs = gather(x, r.prompt + k, 1, D);
      auto ps = gather(pos, r.prompt + k, 1, 1);
      std::vector<float> ys(xs.size());
      ref.forward(xs.data(), ps.data(), nullptr, 1, ys.data());
      for (int64_t b = 0; b < B; ++b) std::copy_n(&ys[size_t(b * D)], D, &want[size_t((b * L + r.prompt + k) * D)]);
      if (r.progress) r.progress("verify decode", k + 1, r.decode);
    }
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < L; ++t)
        for (int64_t d = 0; d < D; ++d) {
          const size_t i = size_t((b * L + t) * D + d);
          const double diff = std::fabs(double(res.final_hidden[i]) - double(want[i]));
          double& slot = t < r.prompt ? res.max_abs_diff_prefill : res.max_abs_diff_decode;
          // NaN must not hide as a small difference.
          if (!(diff <= slot)) slot = std::isnan(diff) ? INFINITY : diff;
        }
    res.max_abs_diff = std::max(res.max_abs_diff_prefill, res.max_abs_diff_decode);
    res.verified = true;
    res.verify_s = (now_ms() - t0) / 1000;
  }
  return res;
}

}  // namespace g3
