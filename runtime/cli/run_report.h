// What `g3attn run` prints and writes about a run, for both of its paths:
// the single-process stack and the tensor-parallel one (run_tp.cc), which
// adds its per-rank lines and fields to these.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/exec/run.h"

namespace g3::cli {

// "model 1b: hidden_size 1152, 26 layers (22 local, 4 global); ..."
void print_model_line(const RunResult& res);
// The routing table: layers per kernel key with their backend and ISA.
void print_routing(const RunResult& res);
// Prefill tokens/s, decode ms/token, each layer kind's mean decode ms per
// layer and step, and the local/global time split;
// `split_label` names whose split it is ("time split", "time split (rank 0)").
void print_rates(const RunRequest& r, const RunResult& res, const std::string& split_label);
// The --verify line's comparison with the scalar reference, without its end.
std::string verify_text(const RunResult& res);
// The JSON summary's common fields: model, shape, modes, rates (with
// "decode_ms_per_layer" by kind after decode steps), KV bytes,
// verify (when run) and one entry per layer.
nlohmann::json run_json(const RunRequest& r, const RunResult& res);

}  // namespace g3::cli
