#include "runtime/exec/run_driver.h"

#include <cmath>
#include <memory>
#include <random>

#include "runtime/io/checkpoint.h"
#include "runtime/reference/reference_stack.h"

namespace g3 {

double run_clock_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

WeightSource run_weight_source(const RunRequest& r) {
  if (!r.weights.empty()) {
    auto ck = std::make_shared<const Checkpoint>(open_checkpoint(r.weights, &r.config));
    return [ck](const LayerSpec& s) { return ck->layer(s); };
  }
  const uint64_t seed = r.seed;
  const DType wd = r.weight_dtype;
  return [seed, wd](const LayerSpec& s) { return random_layer_weights(s, seed, wd); };
}

RunInputs run_inputs(const RunRequest& r) {
  RunInputs in;
  in.B = r.batch;
  in.L = r.prompt + r.decode;
  in.D = r.config.hidden_size;
  in.x.resize(size_t(in.B * in.L * in.D));
  std::seed_seq seq{uint32_t(r.seed), uint32_t(r.seed >> 32), 0x1A7u};
  std::mt19937_64 g(seq);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : in.x) v = nd(g);
  in.pos.resize(size_t(in.B * in.L));
  for (int64_t b = 0; b < in.B; ++b)
    for (int64_t t = 0; t < in.L; ++t) in.pos[size_t(b * in.L + t)] = int32_t(t);
  return in;
}

std::vector<float> RunInputs::x_block(int64_t t0, int64_t n) const {
  std::vector<float> out(size_t(B * n * D));
  for (int64_t b = 0; b < B; ++b) std::copy_n(&x[size_t((b * L + t0) * D)], n * D, &out[size_t(b * n * D)]);
  return out;
}

std::vector<int32_t> RunInputs::pos_block(int64_t t0, int64_t n) const {
  std::vector<int32_t> out(size_t(B * n));
  for (int64_t b = 0; b < B; ++b) std::copy_n(&pos[size_t(b * L + t0)], n, &out[size_t(b * n)]);
  return out;
}

void RunInputs::put_block(std::vector<float>& out, const std::vector<float>& blk, int64_t t0, int64_t n) const {
  for (int64_t b = 0; b < B; ++b) std::copy_n(&blk[size_t(b * n * D)], n * D, &out[size_t((b * L + t0) * D)]);
}

void verify_against_reference(const RunRequest& r, const WeightSource& ws, ThreadPool& pool, const RunInputs& in,
                              RunResult& res) {
  const double t0 = run_clock_ms();
  const int64_t nl = r.config.num_layers;
  ReferenceStack ref(r.config, ws, in.B, in.L, pool, r.kv_dtype, r.compute);
  std::vector<float> want(size_t(in.B * in.L * in.D));
  auto step = [&](int64_t s, int64_t n) {
    const std::vector<float> xs = in.x_block(s, n);
    const std::vector<int32_t> ps = in.pos_block(s, n);
    std::vector<float> ys(xs.size());
    ref.forward(xs.data(), ps.data(), nullptr, n, ys.data());
    in.put_block(want, ys, s, n);
  };
  ref.on_layer = [&](int layer) {
    if (r.progress) r.progress("verify prefill", layer + 1, nl);
  };
  step(0, r.prompt);
  ref.on_layer = nullptr;
  for (int64_t k = 0; k < r.decode; ++k) {
    step(r.prompt + k, 1);
    if (r.progress) r.progress("verify decode", k + 1, r.decode);
  }
  res.max_abs_diff_prefill = res.max_abs_diff_decode = 0;
  for (int64_t b = 0; b < in.B; ++b)
    for (int64_t t = 0; t < in.L; ++t)
      for (int64_t d = 0; d < in.D; ++d) {
        const size_t i = size_t((b * in.L + t) * in.D + d);
        const double diff = std::fabs(double(res.final_hidden[i]) - double(want[i]));
        double& slot = t < r.prompt ? res.max_abs_diff_prefill : res.max_abs_diff_decode;
        // NaN must not hide as a small difference.
        if (!(diff <= slot)) slot = std::isnan(diff) ? INFINITY : diff;
      }
  res.max_abs_diff = std::max(res.max_abs_diff_prefill, res.max_abs_diff_decode);
  res.verified = true;
  res.verify_s = (run_clock_ms() - t0) / 1000;
}

}  // namespace g3
