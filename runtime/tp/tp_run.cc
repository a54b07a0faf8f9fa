#include "runtime/tp/tp_run.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>

#include "runtime/api/run_layers.h"
#include "runtime/exec/run_driver.h"
#include "runtime/tp/shard_plan.h"
#include "runtime/tp/sharded_stack.h"

namespace g3 {

namespace {

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

TpRunResult run_tensor_parallel(const RunRequest& r, const g3attn_model* model, int tp, Comm& comm,
                                const SingleRun& single_run) {
  check_run_request(r);
  check_tp_request(r, tp, comm);
  const ModelConfig& cfg = r.config;
  const int64_t B = r.batch, L = r.prompt + r.decode, D = cfg.hidden_size, nl = cfg.num_layers;
  const bool root = comm.rank() == 0;
  const int64_t chunk = std::min(r.chunk, r.prompt);

  // Ranks on one machine share its cores: each takes its share by default.
  // The context depends only on the request (and the machine), so a failure
  // here is every rank's alike and needs no agreement.
  const int threads = r.threads > 0 ? r.threads : std::max(1, ThreadPool::default_threads() / comm.local_size());
  ApiHandle<g3attn_context> context = run_context(r, threads);
  g3attn_context_info info{};
  api_check(g3attn_context_get_info(context.get(), &info));

  // Every rank reads only its range's rows of a checkpoint; random weights
  // are drawn for the whole layer from the seed (the draw is what a single
  // process makes, so both runs see one model) and cut to the range
  // (run_layers.h).
  std::unique_ptr<ShardedStack> stack;
  std::string failure;
  try {
    stack = std::make_unique<ShardedStack>(r, context.get(), model, chunk, comm);
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
  run.isa = info.isa;
  run.threads = info.threads;
  run.kv = kv_bytes(shard_config(cfg, tp), L, B, r.kv_dtype, chunk);
  if (run.kv.ring != stack->kv_bytes_allocated())
    throw std::logic_error("shard_config's KV accounting disagrees with the rank's caches");
  res.kv_single_process = kv_bytes(cfg, L, B, r.kv_dtype, chunk).ring;
  res.allreduce_bytes_per_token = uint64_t(nl) * uint64_t(D) * sizeof(float);

  // The inputs and the drive are the single-process run's (run_driver.h),
  // so the verify step's comparison with it sees the same draw.
  const RunInputs in = run_inputs(r);
  double prefill_comm_ms = 0;
  drive_run(*stack, r, in, chunk, run, [&] { prefill_comm_ms = stack->comm_ms(); });
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
    const double p0 = run_clock_ms();
    for (int i = 0; i < kCalls; ++i) comm.allreduce_sum(probe.data(), B * D);
    res.allreduce_call_us = (run_clock_ms() - p0) * 1000 / kCalls;
  }
  if (!r.verify) return res;

  // Rank 0 checks; the others wait without spinning. The sharded stack's
  // memory and its context's pool are released first: the checks build
  // whole models, on threads of their own.
  stack.reset();
  context.reset();
  std::exception_ptr err;
  if (root) {
    try {
      const double t0 = run_clock_ms();
      auto stage = [&](const std::string& what) {
        return [&r, what](const std::string& phase, int64_t done, int64_t total) {
          if (r.progress) r.progress(what + " " + phase, done, total);
        };
      };
      // The single-process run on every core (the other ranks are idle).
      RunRequest single = r;
      single.verify = false;
      single.progress = stage("single");
      const RunResult one = single_run(single);
      res.max_abs_diff_single = max_diff(run.final_hidden, one.final_hidden, 0, run.final_hidden.size());

      // The scalar reference, exactly as the single-process verify runs it.
      ThreadPool pool(single.threads);
      verify_against_reference(r, run_weight_source(r), pool, in, run);
      run.verify_s = (run_clock_ms() - t0) / 1000;
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
