// How `g3attn run` drives a stack, written once for both of its stacks
// (both on the C API's layers: whole in cli/api_run.cc, one KV-head range
// per rank in tp/'s ShardedStack), which offer
// num_layers(), route(l) (a RunLayer with the routing fields set),
// forward(), layer_ms() and on_layer as Model (exec/model.h) does:
// the inputs drawn from the seed, the prompt in chunks, decode steps of one
// token a row, the timings and per-layer split, and --verify's comparison
// with the scalar reference stack.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/exec/block.h"
#include "runtime/exec/run.h"
#include "runtime/exec/thread_pool.h"
#include "runtime/io/layer_weights.h"

namespace g3 {

double run_clock_ms();  // a steady clock in milliseconds

// The run's inputs: x [B][L][D] drawn N(0, 1) from the seed, positions
// 0..L-1 in every row (L = prompt + decode).
struct RunInputs {
  int64_t B = 0, L = 0, D = 0;
  std::vector<float> x;
  std::vector<int32_t> pos;
  // Columns [t0, t0 + n) of every row, as [B][n][D] and [B][n].
  std::vector<float> x_block(int64_t t0, int64_t n) const;
  std::vector<int32_t> pos_block(int64_t t0, int64_t n) const;
  // Writes a [B][n][D] block back to columns [t0, t0 + n) of out [B][L][D].
  void put_block(std::vector<float>& out, const std::vector<float>& blk, int64_t t0, int64_t n) const;
};
RunInputs run_inputs(const RunRequest& r);

// Where the run's weights come from: the checkpoint r.weights names, or
// random weights drawn from r.seed in r.weight_dtype.
WeightSource run_weight_source(const RunRequest& r);

// Runs the scalar reference stack (the official full-length caches) on the
// run's inputs and fills res.max_abs_diff* and verify_s against
// res.final_hidden (NaN counts as an infinite difference).
void verify_against_reference(const RunRequest& r, const WeightSource& ws, ThreadPool& pool, const RunInputs& in,
                              RunResult& res);

// The prompt in chunks of `chunk`, then r.decode steps, through `stack`:
// fills res.final_hidden, the timings, tokens/s and ms/token, and one
// RunLayer per layer. `after_prefill` runs between the two phases.
template <class Stack>
void drive_run(Stack& stack, const RunRequest& r, const RunInputs& in, int64_t chunk, RunResult& res,
               const std::function<void()>& after_prefill = {}) {
  const int64_t nl = stack.num_layers();
  res.final_hidden.assign(size_t(in.B * in.L * in.D), 0.f);
  auto step = [&](int64_t t0, int64_t n) {
    const std::vector<float> xs = in.x_block(t0, n);
    const std::vector<int32_t> ps = in.pos_block(t0, n);
    std::vector<float> ys(xs.size());
    stack.forward(xs.data(), ps.data(), nullptr, n, ys.data());
    in.put_block(res.final_hidden, ys, t0, n);
  };
  double t0 = run_clock_ms();
  for (int64_t s = 0; s < r.prompt; s += chunk) {
    const int64_t n = std::min(chunk, r.prompt - s);
    stack.on_layer = [&, s, n](int layer, int64_t) {
      if (r.progress) r.progress("prefill", s * nl + (layer + 1) * n, r.prompt * nl);
    };
    step(s, n);
  }
  res.prefill_s = (run_clock_ms() - t0) / 1000;
  const std::vector<double> prefill_ms = stack.layer_ms();
  stack.on_layer = nullptr;
  if (after_prefill) after_prefill();
  // The decode's time leaves out r.decode_pause's.
  double paused_ms = 0;
  auto pause = [&](int64_t done) {
    if (!r.decode_pause || r.decode == 0) return;
    const double p0 = run_clock_ms();
    r.decode_pause(done);
    paused_ms += run_clock_ms() - p0;
  };
  t0 = run_clock_ms();
  pause(0);
  for (int64_t k = 0; k < r.decode; ++k) {
    step(r.prompt + k, 1);
    if (r.progress) r.progress("decode", k + 1, r.decode);
    pause(k + 1);
  }
  res.decode_s = (run_clock_ms() - t0 - paused_ms) / 1000;
  res.prefill_tokens_per_s = double(in.B * r.prompt) / std::max(res.prefill_s, 1e-9);
  res.decode_ms_per_token = r.decode > 0 ? res.decode_s * 1000 / double(r.decode) : 0;
  for (int64_t l = 0; l < nl; ++l) {
    RunLayer rl = stack.route(l);
    rl.prefill_ms = prefill_ms[size_t(l)];
    rl.decode_ms = stack.layer_ms()[size_t(l)] - prefill_ms[size_t(l)];
    (rl.kind == LayerKind::Local ? res.local_ms : res.global_ms) += rl.prefill_ms + rl.decode_ms;
    res.layers.push_back(rl);
  }
}

}  // namespace g3
