#include "runtime/tp/tp_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <memory>
#include <random>

#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/kernel_registry.h"
#include "runtime/exec/head_range.h"
#include "runtime/io/checkpoint.h"
#include "runtime/reference/reference_stack.h"
#include "runtime/tp/shard_plan.h"
#include "runtime/tp/sharded_stack.h"

namespace g3 {

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Largest |a - b| over elements, NaN counting as infinite so it cannot hide.
double max_diff(const std::vector<float>& a, const std::vector<float>& b, size_t from, size_t to) {
  double m = 0;
  for (size_t i = from; i < to; ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
  }
  return m;
}

}  // namespace

void check_tp_request(const RunRequest& r, int tp, const Comm& comm) {
  check_tp_degree(r.config, tp);
  if (tp != comm.size())
    throw InputError("--tp " + std::to_string(tp) + " needs " + std::to_string(tp) + " MPI ranks but this job has " +
                     std::to_string(comm.size()) + " (start it as: mpirun -np " + std::to_string(tp) +
                     " g3attn run --tp " + std::to_string(tp) + " ...)");
}

TpRunResult run_tensor_parallel(const RunRequest& r, int tp, Comm& comm) {
  check_run_request(r);
  check_tp_request(r, tp, comm);
  const ModelConfig& cfg = r.config;
  const int64_t B = r.batch, L = r.prompt + r.decode, D = cfg.hidden_size, nl = cfg.num_layers;
  const bool root = comm.rank() == 0;

  // Where the weights come from: every rank reads only its range's rows of a
  // checkpoint; random weights are drawn for the whole layer from the seed
  // (the draw is what a single process makes, so both runs see one model)
  // and cut to the range.
  std::shared_ptr<Checkpoint> ck;
  WeightSource full_ws;
  RangeWeightSource range_ws;
  ModelOptions o;
  o.backend = parse_backend(r.backend);
  o.isa = isa_from_flag(r.isa);
  o.kv_dtype = r.kv_dtype;
  o.compute = r.compute;
  o.proj = r.proj;
  o.batch = B;
  o.context = L;
  o.chunk = std::min(r.chunk, r.prompt);
  // Ranks on one machine share its cores: each takes its share by default.
  o.threads = r.threads > 0 ? r.threads : std::max(1, ThreadPool::default_threads() / comm.local_size());

  std::unique_ptr<ShardedStack> stack;
  std::string failure;
  try {
    if (!r.weights.empty()) {
      ck = std::make_shared<Checkpoint>(open_checkpoint(r.weights, &r.config));
      full_ws = [ck](const LayerSpec& s) { return ck->layer(s); };
      range_ws = [ck](const LayerSpec& s, HeadRange h) { return load_head_range_weights(ck->source, s, h); };
    } else {
      const uint64_t seed = r.seed;
      const DType wd = r.weight_dtype;
      full_ws = [seed, wd](const LayerSpec& s) { return random_layer_weights(s, seed, wd); };
      range_ws = [seed, wd](const LayerSpec& s, HeadRange h) {
        return slice_head_range(random_layer_weights(s, seed, wd), s, h);
      };
    }
    stack = std::make_unique<ShardedStack>(cfg, range_ws, o, comm);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // A rank that cannot load its slice must not leave the others waiting in
  // the first all-reduce: every rank learns of it here and stops.
  if (!comm.all_ok(failure.empty())) {
    if (!failure.empty()) throw RankError("rank " + std::to_string(comm.rank()) + ": " + failure);
    throw PeerFailed("another rank failed while loading its weights (its message is above)");
  }

  TpRunResult res;
  res.ranks = tp;
  RunResult& run = res.run;
  run.config = cfg;
  run.isa = resolve_isa(o.isa);
  run.threads = stack->pool().size();
  const int64_t chunk = std::min(r.chunk, r.prompt);
  run.kv = kv_bytes(shard_config(cfg, tp), L, B, r.kv_dtype, chunk);
  if (run.kv.ring != stack->kv_bytes_allocated())
    throw std::logic_error("shard_config's KV accounting disagrees with the rank's caches");
  res.kv_single_process = kv_bytes(cfg, L, B, r.kv_dtype, chunk).ring;
  res.allreduce_bytes_per_token = uint64_t(nl) * uint64_t(D) * sizeof(float);

  // The inputs run_model draws (run.cc): N(0, 1) from the seed, positions
  // 0..L-1; the verify step's comparison with the single-process run would
  // show any difference in the draw.
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
  run.final_hidden.assign(size_t(B * L * D), 0.f);
  auto gather = [&](const auto& src, int64_t t0, int64_t n, int64_t width) {
    std::vector<std::decay_t<decltype(src[0])>> out(size_t(B * n * width));
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(&src[size_t((b * L + t0) * width)], n * width, &out[size_t(b * n * width)]);
    return out;
  };
  auto scatter = [&](const std::vector<float>& blk, int64_t t0, int64_t n) {
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(&blk[size_t(b * n * D)], n * D, &run.final_hidden[size_t((b * L + t0) * D)]);
  };

  double t0 = now_ms();
  for (int64_t s = 0; s < r.prompt; s += chunk) {
    const int64_t n = std::min(chunk, r.prompt - s);
    stack->on_layer = [&, s, n](int layer, int64_t) {
      if (r.progress) r.progress("prefill", s * nl + (layer + 1) * n, r.prompt * nl);
    };
    auto xs = gather(x, s, n, D);
    auto ps = gather(pos, s, n, 1);
    std::vector<float> ys(xs.size());
    stack->forward(xs.data(), ps.data(), nullptr, n, ys.data());
    scatter(ys, s, n);
  }
  run.prefill_s = (now_ms() - t0) / 1000;
  const std::vector<double> prefill_ms = stack->layer_ms();
  const double prefill_comm_ms = stack->comm_ms();
  stack->on_layer = nullptr;
  t0 = now_ms();
  for (int64_t k = 0; k < r.decode; ++k) {
    auto xs = gather(x, r.prompt + k, 1, D);
    auto ps = gather(pos, r.prompt + k, 1, 1);
    std::vector<float> ys(xs.size());
    stack->forward(xs.data(), ps.data(), nullptr, 1, ys.data());
    scatter(ys, r.prompt + k, 1);
    if (r.progress) r.progress("decode", k + 1, r.decode);
  }
  run.decode_s = (now_ms() - t0) / 1000;
  run.prefill_tokens_per_s = double(B * r.prompt) / std::max(run.prefill_s, 1e-9);
  run.decode_ms_per_token = r.decode > 0 ? run.decode_s * 1000 / double(r.decode) : 0;
  for (int64_t l = 0; l < nl; ++l) {
    const PreparedLayer& P = stack->layers()[size_t(l)];
    RunLayer rl;
    rl.index = int(l);
    rl.kind = P.spec.kind;
    rl.key = P.key.str();
    rl.backend = P.kernels.backend;
    rl.isa = P.kernels.kernels.isa;
    rl.specialised = P.kernels.kernels.specialised;
    rl.prefill_ms = prefill_ms[size_t(l)];
    rl.decode_ms = stack->layer_ms()[size_t(l)] - prefill_ms[size_t(l)];
    (rl.kind == LayerKind::Local ? run.local_ms : run.global_ms) += rl.prefill_ms + rl.decode_ms;
    run.layers.push_back(rl);
  }
  res.kv_bytes_per_rank = comm.gather(double(stack->kv_bytes_allocated()));
  res.comm_s_per_rank = comm.gather(stack->comm_ms() / 1000);
  res.run_s_per_rank = comm.gather(run.prefill_s + run.decode_s);
  res.comm_decode_s_per_rank = comm.gather((stack->comm_ms() - prefill_comm_ms) / 1000);
  {
    // Calls back to back keep the ranks in step, so the mean is the call's
    // own cost; a few first calls are left out of it as warm-up.
    std::vector<float> probe(size_t(B * D), 0.f);
    constexpr int kWarm = 5, kCalls = 50;
    for (int i = 0; i < kWarm; ++i) comm.allreduce_sum(probe.data(), B * D);
    const double p0 = now_ms();
    for (int i = 0; i < kCalls; ++i) comm.allreduce_sum(probe.data(), B * D);
    res.allreduce_call_us = (now_ms() - p0) * 1000 / kCalls;
  }
  if (!r.verify) return res;

  // Rank 0 checks; the others wait without spinning. The sharded stack's
  // memory is released first: the checks build whole models.
  stack.reset();
  std::exception_ptr err;
  if (root) {
    try {
      t0 = now_ms();
      auto stage = [&](const std::string& what) {
        return [&r, what](const std::string& phase, int64_t done, int64_t total) {
          if (r.progress) r.progress(what + " " + phase, done, total);
        };
      };
      // The single-process run on every core (the other ranks are idle).
      RunRequest single = r;
      single.verify = false;
      single.progress = stage("single");
      const RunResult one = run_model(single);
      res.max_abs_diff_single = max_diff(run.final_hidden, one.final_hidden, 0, run.final_hidden.size());

      // The scalar reference, exactly as run_model's verify runs it.
      ThreadPool pool(single.threads);
      ReferenceStack ref(cfg, full_ws, B, L, pool, r.kv_dtype, r.compute);
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
      for (int64_t b = 0; b < B; ++b) {
        const size_t row = size_t(b * L * D), split = row + size_t(r.prompt * D), end = row + size_t(L * D);
        run.max_abs_diff_prefill = std::max(run.max_abs_diff_prefill, max_diff(run.final_hidden, want, row, split));
        run.max_abs_diff_decode = std::max(run.max_abs_diff_decode, max_diff(run.final_hidden, want, split, end));
      }
      run.max_abs_diff = std::max(run.max_abs_diff_prefill, run.max_abs_diff_decode);
      run.verified = true;
      run.verify_s = (now_ms() - t0) / 1000;
    } catch (...) {
      err = std::current_exception();
    }
  }
  // Rank 0's failure reaches its caller only after the barrier, so the
  // others are not left waiting for it.
  comm.idle_barrier();
  if (err) std::rethrow_exception(err);
  return res;
}

}  // namespace g3
