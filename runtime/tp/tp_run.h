// `g3attn run --tp R` as a library call: the run of exec/run.h on R ranks,
// each holding one KV head range of every layer through the C API
// (sharded_stack.h), with the same inputs, chunks and decode steps, and rank
// 0's view of the result plus what sharding costs and saves: KV bytes per
// rank, all-reduce bytes per token, time in the all-reduce. With verify,
// rank 0 alone compares the sharded result with the single-process run and
// with the scalar reference (the comparison `run --verify` makes) while the
// other ranks wait idle.
#pragma once
#include <g3attn/g3attn.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "generator/errors.h"
#include "runtime/exec/run.h"
#include "runtime/tp/comm.h"

namespace g3 {

// A failure on this rank only (its weights could not be loaded): the
// message names the rank, and only this rank has it to print.
struct RankError : InputError {
  using InputError::InputError;
};
// Thrown on the ranks that did not fail when another one did (RankError
// there): they stop together instead of waiting in a collective call.
struct PeerFailed : InputError {
  using InputError::InputError;
};

struct TpRunResult {
  RunResult run;  // rank 0's timings and layers; verify fields against the reference
  int ranks = 1;
  std::vector<double> kv_bytes_per_rank;  // rank 0 only, in rank order
  uint64_t kv_single_process = 0;          // the same run's KV ring bytes in one process
  // Floats each rank contributes to all-reduces per token (every layer),
  // times four: the payload, not what the algorithm moves on the wire.
  uint64_t allreduce_bytes_per_token = 0;
  // Per rank (rank 0 only): seconds in the all-reduce, and seconds of
  // prefill plus decode; the all-reduce time includes waiting for the
  // slowest rank to arrive.
  std::vector<double> comm_s_per_rank, run_s_per_rank;
  // Per rank (rank 0 only): seconds in the all-reduce during decode, where
  // each step reduces one token per row per layer: its latency, not its
  // bandwidth, is what a decode step pays.
  std::vector<double> comm_decode_s_per_rank;
  // One decode-sized all-reduce (B x D floats) timed alone after the run,
  // in microseconds: its latency without the waiting for a slower rank that
  // the in-run figures include.
  double allreduce_call_us = 0;
  double max_abs_diff_single = 0;  // verify: vs the single-process run's final hidden state
};

// Checks the degree against the model (check_tp_degree) and against the
// number of ranks the job has; InputError naming both.
void check_tp_request(const RunRequest& r, int tp, const Comm& comm);

// Every rank calls it with the same request; `model` is the API's
// description of r.config. Errors that every rank meets alike (the request,
// the options, the cache checks) are InputErrors thrown on every rank; a
// failure on some ranks only while loading weights is agreed on
// (Comm::all_ok) and thrown everywhere, the failing rank's message on that
// rank, a note on the others. `single_run` is the single-process run that
// verify compares with (the command's: cli/api_run.h).
using SingleRun = std::function<RunResult(const RunRequest&)>;
TpRunResult run_tensor_parallel(const RunRequest& r, const g3attn_model* model, int tp, Comm& comm,
                                const SingleRun& single_run);

}  // namespace g3
