// `g3attn run` in one process, through the public C API (include/g3attn/
// g3attn.h), so every run exercises what an embedding engine calls: one
// g3attn_layer and one library-owned g3attn_cache per layer, the hidden
// state handed from layer to layer by g3attn_block. run_driver.h drives it
// exactly as it drives the tensor-parallel stack (runtime/tp/).
#pragma once
#include <g3attn/g3attn.h>

#include "runtime/api/api_call.h"
#include "runtime/cli/args.h"
#include "runtime/exec/run.h"

namespace g3::cli {

// The run `r` describes (check_run_request has accepted it) on `model`, the
// API's description of r.config.
RunResult run_through_api(const RunRequest& r, const g3attn_model* model);

// The API's model for the run command's arguments, from the source
// cmd_run reads r.config from: the checkpoint's config.json (--weights
// without --model or --config), else --config, else --model (default 1b).
ApiHandle<g3attn_model> api_model(const Args& a);

}  // namespace g3::cli
