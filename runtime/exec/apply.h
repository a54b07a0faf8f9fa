// One layer's block on real weights and .npy inputs: what `g3attn apply`
// does, as a library call so tests take exactly the same path.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "generator/catalogue.h"
#include "generator/kernel_key.h"

namespace g3 {

struct ApplyRequest {
  std::string config, weights, input, positions, attention_mask;  // mask optional ("")
  std::optional<int> layer;       // default: the config's layer_index
  std::string backend = "auto";
  std::string isa;                // the --isa flag ("" = $G3ATTN_ISA or best); resolved inside
  DType kv_dtype = DType::F32;
  DType compute = DType::F32;     // the compute mode (kernel_key.h)
};

struct ApplyResult {
  LayerSpec spec;
  int64_t B = 0, T = 0;
  std::vector<float> block_out, attn_out;  // [B][T][D]
  std::vector<bool> real_row;              // [B*T] rows with mask 1
  std::string backend, isa;
};

// The request's config, layer, names and .npy inputs, read and validated
// (InputError naming the file and the problem); the weights are not read.
struct ApplyInputs {
  ModelConfig config;
  LayerSpec spec;
  std::string backend, isa;  // parsed and resolved
  int64_t B = 0, T = 0;
  std::vector<float> x;         // [B][T][D]
  std::vector<int32_t> positions;  // [B][T]
  std::vector<int32_t> real;       // [B][T], 1 = real token
};
ApplyInputs read_apply_inputs(const ApplyRequest& r);

// Validates every input (InputError naming the file and the problem) before
// computing anything. Rows whose mask is 0 are don't-care. `g3attn apply`
// reads its inputs the same way and runs the block through the C API.
ApplyResult run_apply(const ApplyRequest& r);

}  // namespace g3
