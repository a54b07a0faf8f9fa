// What `g3attn run` is asked and what it reports: a model's attention stack
// on random or checkpoint weights, prompt prefill in chunks then decode
// steps, timings, KV memory and, with verify, the comparison with the
// reference stack. run_driver.h drives a stack through it; the command runs
// it through the C API, in one process (cli/api_run.h) or tensor-parallel
// (tp/tp_run.h).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "generator/catalogue.h"
#include "generator/kernel_key.h"
#include "runtime/dispatch/onednn_route.h"
#include "runtime/exec/decode_traffic.h"
#include "runtime/exec/kv_cache.h"

namespace g3 {

// What `g3attn run` does, as a library call.
struct RunRequest {
  ModelConfig config;
  std::string weights;              // "" = random weights from `seed`
  DType weight_dtype = DType::BF16; // random weights only
  uint64_t seed = 0;
  int64_t prompt = 2048, decode = 32, chunk = 512, batch = 1;
  int threads = 0;
  std::string backend = "auto";
  std::string isa;                  // the --isa flag ("" = $G3ATTN_ISA or best)
  DType kv_dtype = DType::F32;
  DType compute = DType::F32;       // the compute mode (kernel_key.h)
  ProjectionRoute proj = ProjectionRoute::Auto;  // --proj (onednn_route.h)
  bool verify = false;
  // Progress: phase ("prefill", "decode", "verify"), done, total.
  std::function<void(const std::string&, int64_t, int64_t)> progress;
  // Called before the first decode step (done = 0) and after each one
  // (done = steps so far), outside the decode's timing: `g3attn run`
  // measures the DRAM read rate there.
  std::function<void(int64_t done)> decode_pause;
};

struct RunLayer {
  int index = 0;
  LayerKind kind = LayerKind::Local;
  std::string key, backend, isa;
  bool specialised = true;
  double prefill_ms = 0, decode_ms = 0;
};

struct RunResult {
  ModelConfig config;
  std::string isa;
  int threads = 0;
  double prefill_s = 0, decode_s = 0;
  double prefill_tokens_per_s = 0, decode_ms_per_token = 0;
  double local_ms = 0, global_ms = 0;
  KvBytes kv;                       // ring (allocated) vs the official full length
  // What one decode step reads (decode_traffic.h), at the decode phase's
  // mean context; the run command sets it against the DRAM read rate.
  DecodeTraffic decode_traffic;
  std::vector<RunLayer> layers;
  bool verified = false;
  double verify_s = 0;
  double max_abs_diff = 0, max_abs_diff_prefill = 0, max_abs_diff_decode = 0;
  std::vector<float> final_hidden;  // [B][prompt + decode][D] of the last layer
};

// Every check a run makes before allocating anything: sizes, positions
// against max_position_embeddings, and memory (KV caches and weights must
// fit this machine's RAM). Throws InputError; cheap, so callers may run it
// before printing anything.
void check_run_request(const RunRequest& r);

}  // namespace g3
