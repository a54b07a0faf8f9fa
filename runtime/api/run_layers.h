// The run command's layers through the C API, written once for both of its
// stacks (cli/api_run.cc in one process, tp/sharded_stack.h on one rank of
// a tensor-parallel run): the context the request's options ask for, and
// every layer of the model, or one KV-head range of every layer, as a
// g3attn_layer with its own library-owned g3attn_cache. The stacks run the
// layers themselves; what run_driver.h asks of them besides that (the
// routing, the KV bytes) is answered here from the API's descriptions.
#pragma once
#include <g3attn/g3attn.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/api/api_call.h"
#include "runtime/exec/head_range.h"
#include "runtime/exec/run.h"

namespace g3 {

// A context with the request's backend, ISA cap (no --isa: the options'
// default, $G3ATTN_ISA else best), KV dtype, compute mode and projection
// provider, on a pool of `threads` (0: every core).
ApiHandle<g3attn_context> run_context(const RunRequest& r, int threads);

class RunLayers {
 public:
  // Every layer of `model` in `context`, whole, or only its KV heads `range`
  // (g3attn_layer_create_heads: from a checkpoint only the range's rows are
  // read; random weights are drawn for the whole layer and cut, so both see
  // one model). The weights are r's: the checkpoint r.weights, else random
  // from r.seed in r.weight_dtype. Each layer gets a cache of r.batch rows,
  // r.prompt + r.decode positions and calls of at most `chunk` real tokens
  // per row.
  RunLayers(const RunRequest& r, g3attn_context* context, const g3attn_model* model, int64_t chunk,
            std::optional<HeadRange> range = std::nullopt);

  int64_t size() const { return int64_t(layers_.size()); }
  const g3attn_layer* layer(int64_t l) const { return layers_[size_t(l)].get(); }
  g3attn_cache* cache(int64_t l) { return caches_[size_t(l)].get(); }
  // The routing fields of a RunLayer (index, kind, key, backend, ISA) from
  // g3attn_layer_describe.
  RunLayer route(int64_t l) const;
  // K plus V bytes of every cache.
  uint64_t kv_bytes() const;

 private:
  std::vector<ApiHandle<g3attn_layer>> layers_;
  std::vector<ApiHandle<g3attn_cache>> caches_;
};

}  // namespace g3
