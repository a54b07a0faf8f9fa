#include "runtime/exec/run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>

#include <unistd.h>

#include "generator/errors.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/kernel_registry.h"
#include "runtime/exec/model.h"
#include "runtime/io/checkpoint.h"
#include "runtime/reference/reference_stack.h"

namespace g3 {

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

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
  o.compute = r.compute;
  o.proj = r.proj;
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
  // Decode step i (from 0) sees prompt + i + 1 positions: the mean is
  // prompt + (decode + 1) / 2. The weights as the layers hold them (bf16
  // compute packs them as bf16 whatever the checkpoint holds).
  res.decode_traffic = decode_traffic(cfg, m.layers().front().key.weight_dtype, r.kv_dtype, B,
                                      r.prompt + (r.decode + 1) / 2);

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
    ReferenceStack ref(cfg, ws, B, L, m.pool(), r.kv_dtype, r.compute);
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
