#include "runtime/exec/apply.h"

#include <memory>

#include "generator/errors.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/kernel_registry.h"
#include "runtime/exec/block.h"
#include "runtime/io/npy.h"
#include "runtime/io/safetensors.h"
#include "runtime/reference/reference.h"

namespace g3 {

static std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? "," : "") + std::to_string(s[i]);
  return o + "]";
}

ApplyInputs read_apply_inputs(const ApplyRequest& r) {
  ModelConfig m = load_config_file(r.config);
  int layer = 0;
  if (r.layer) layer = *r.layer;
  else if (m.layer_index) layer = *m.layer_index;
  else throw InputError("--layer is required (" + r.config + " has no layer_index)");
  if (layer < 0 || layer >= m.num_layers)
    throw InputError("--layer " + std::to_string(layer) + " is outside 0.." + std::to_string(m.num_layers - 1));
  std::string backend = parse_backend(r.backend);
  std::string isa = isa_from_flag(r.isa);
  LayerSpec spec = layer_spec(m, layer);
  const int64_t D = spec.hidden_size;

  // Inputs: x [B,T,D] float32, positions [B,T] int32, mask [B,T] int32 of 0/1.
  NpyArray x = read_npy_f32(r.input);
  if (x.shape.size() != 3 || x.shape[2] != D)
    throw InputError(r.input + ": shape " + shape_str(x.shape) + " is not [B, T, hidden_size=" + std::to_string(D) + "]");
  const int64_t B = x.shape[0], T = x.shape[1];
  if (B < 1 || T < 1) throw InputError(r.input + ": empty batch or sequence " + shape_str(x.shape));
  NpyArray pos = read_npy_i32(r.positions);
  if (pos.shape != std::vector<int64_t>{B, T})
    throw InputError(r.positions + ": shape " + shape_str(pos.shape) + " does not match the input's [B, T] = " +
                     shape_str({B, T}));
  std::vector<int32_t> real(size_t(B * T), 1);
  if (!r.attention_mask.empty()) {
    NpyArray mk = read_npy_i32(r.attention_mask);
    if (mk.shape != std::vector<int64_t>{B, T})
      throw InputError(r.attention_mask + ": shape " + shape_str(mk.shape) + " does not match the input's [B, T] = " +
                       shape_str({B, T}));
    for (int64_t i = 0; i < B * T; ++i) {
      if (mk.i32[i] != 0 && mk.i32[i] != 1)
        throw InputError(r.attention_mask + ": value " + std::to_string(mk.i32[i]) + " at index " + std::to_string(i) +
                         " is not 0 or 1");
      real[i] = mk.i32[i];
    }
  }
  // Positions at padded slots mean nothing; real tokens need positions >= 0.
  for (int64_t i = 0; i < B * T; ++i)
    if (real[i] && pos.i32[i] < 0)
      throw InputError(r.positions + ": negative position " + std::to_string(pos.i32[i]) + " for a real token at [" +
                       std::to_string(i / T) + "," + std::to_string(i % T) + "]");

  ApplyInputs in;
  in.config = std::move(m);
  in.spec = spec;
  in.backend = std::move(backend);
  in.isa = std::move(isa);
  in.B = B;
  in.T = T;
  in.x = std::move(x.f32);
  in.positions = std::move(pos.i32);
  in.real = std::move(real);
  return in;
}

ApplyResult run_apply(const ApplyRequest& r) {
  ApplyInputs in = read_apply_inputs(r);
  const LayerSpec& spec = in.spec;
  const int64_t B = in.B, T = in.T, D = spec.hidden_size;
  auto file = SafeTensorsFile::open(r.weights);
  LayerWeights w = load_layer_weights(tensor_source(*file), spec);

  ApplyResult out;
  out.spec = spec;
  out.B = B;
  out.T = T;
  out.block_out.resize(size_t(B * T * D));
  out.attn_out.resize(size_t(B * T * D));
  out.real_row.resize(size_t(B * T));
  for (int64_t i = 0; i < B * T; ++i) out.real_row[i] = in.real[i] != 0;

  if (in.backend == "reference") {
    // The official block: dense caller mask (causal AND real keys), no cache.
    std::vector<uint8_t> mask = ref::causal_mask(in.real.data(), B, T);
    ref::block(spec, w, in.x.data(), in.positions.data(), B, T, mask.data(), nullptr, out.block_out.data(),
               out.attn_out.data(), r.kv_dtype, r.compute);
    out.backend = "reference";
    out.isa = "scalar";
    return out;
  }
  PreparedLayer L = prepare_layer(spec, w, r.kv_dtype, in.backend, in.isa, r.compute);
  run_block_nocache(L, in.x.data(), in.positions.data(), in.real.data(), B, T, out.block_out.data(),
                    out.attn_out.data());
  out.backend = L.kernels.backend;
  out.isa = L.kernels.kernels.isa;
  return out;
}

}  // namespace g3
