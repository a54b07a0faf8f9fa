// g3attn apply: one layer's block on real weights and .npy inputs. The
// inputs are read and checked as exec/apply.h reads them; the layer is made
// and run through the C API (libg3attn.so), so every apply exercises it.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "generator/errors.h"
#include "runtime/api/api_call.h"
#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "runtime/exec/apply.h"
#include "runtime/io/npy.h"

namespace g3::cli {

static std::vector<Option> apply_options() {
  std::vector<Option> o = {
      {"config", Arity::Value, "FILE", "HF config.json (required)"},
      {"weights", Arity::Value, "FILE", "model.safetensors holding the layer (required)"},
      {"input", Arity::Value, "FILE", "x.npy, float32 [B, T, hidden_size] (required)"},
      {"positions", Arity::Value, "FILE", "positions.npy, int32 [B, T] (required)"},
      {"attention-mask", Arity::Value, "FILE", "int32 [B, T], 1 = real token, 0 = padding (default: all real)"},
      {"layer", Arity::Value, "L", "layer index (default: the config's layer_index)"},
      {"out", Arity::Value, "FILE", "block output .npy, float32 [B, T, hidden_size] (required)"},
      {"attn-out", Arity::Value, "FILE", "also write the attention output after o_proj"},
      {"json", Arity::OptionalValue, "FILE", "a JSON summary: to stdout, or to FILE"},
  };
  for (auto& c : common_kernel_options()) o.push_back(c);
  return o;
}

int cmd_apply(int argc, char** argv, int first) {
  Args a("apply", apply_options(), argc, argv, first);
  if (a.help()) {
    std::cout << "Usage: g3attn apply --config C --weights W --input x.npy --positions p.npy\n"
                 "                    [--attention-mask m.npy] [--layer L] --out block.npy [--attn-out attn.npy]\n"
                 "Runs one layer's attention block (pre-norm, attention, post-norm, residual) with\n"
                 "keys = this call's tokens: query t sees key s iff s <= t, s is real, and on local\n"
                 "layers |qpos - kpos| < window. Positions feed only RoPE and the window, so packed\n"
                 "documents, repeated or decreasing positions and gaps all run. Rows of padding\n"
                 "(mask 0) are don't-care.\n"
                 "Output files are written atomically (a device or FIFO in place); on bad input nothing is written.\n"
                 "NaN or Inf in the inputs propagate to the outputs; weights with NaN or Inf are refused.\n\n"
              << a.usage();
    return 0;
  }
  for (const char* req : {"config", "weights", "input", "positions", "out"})
    if (!a.has(req)) throw InputError(std::string("--") + req + " is required (see g3attn apply --help)");
  ApplyRequest r;
  r.config = a.str("config");
  r.weights = a.str("weights");
  r.input = a.str("input");
  r.positions = a.str("positions");
  r.attention_mask = a.str("attention-mask");
  if (a.has("layer")) r.layer = static_cast<int>(a.integer("layer", 0, 0, 1 << 20));
  r.backend = a.str("backend", "auto");
  r.isa = a.str("isa");
  r.kv_dtype = parse_dtype(a.str("kv-dtype", "f32"), "--kv-dtype");
  r.compute = parse_dtype(a.str("compute", "f32"), "--compute");
  if (a.has("attn-out") && a.str("attn-out") == a.str("out")) throw InputError("--out and --attn-out name the same file");

  const ApplyInputs in = read_apply_inputs(r);
  const int64_t B = in.B, T = in.T, D = in.spec.hidden_size;

  // The layer through the C API: the context runs on this thread alone
  // (calls without a cache never use a pool), with the flags' kernels.
  g3attn_model* m = nullptr;
  api_check(g3attn_model_load(r.config.c_str(), &m));
  ApiHandle<g3attn_model> model(m);
  g3attn_options* o = nullptr;
  api_check(g3attn_options_create(&o));
  ApiHandle<g3attn_options> options(o);
  api_check(g3attn_options_set_backend(o, in.backend.c_str()));
  api_check(g3attn_options_set_isa(o, in.isa.c_str()));
  api_check(g3attn_options_set_kv_dtype(o, api_dtype(r.kv_dtype)));
  api_check(g3attn_options_set_compute(o, api_dtype(r.compute)));
  api_check(g3attn_options_set_threads(o, 1));
  g3attn_context* c = nullptr;
  api_check(g3attn_context_create(o, &c));
  ApiHandle<g3attn_context> context(c);
  g3attn_weights* w = nullptr;
  api_check(g3attn_weights_open(r.weights.c_str(), m, &w));
  ApiHandle<g3attn_weights> weights(w);
  g3attn_layer* l = nullptr;
  api_check(g3attn_layer_create(c, m, in.spec.index, w, &l));
  ApiHandle<g3attn_layer> layer(l);

  std::vector<uint8_t> real(in.real.begin(), in.real.end());
  std::vector<float> block_out(size_t(B * T * D)), attn_out(size_t(B * T * D));
  api_check(g3attn_block(l, nullptr, in.x.data(), in.positions.data(), real.data(), B, T, block_out.data(),
                         attn_out.data(), 1));
  g3attn_layer_route route;
  api_check(g3attn_layer_describe(l, &route));
  // The reference backend's calls without a cache run the official block in
  // double precision, whatever kernels the layer holds for cached calls.
  const bool reference = in.backend == "reference";
  const std::string backend = reference ? "reference" : route.backend, isa = reference ? "scalar" : route.isa;

  std::vector<int64_t> shape = {B, T, D};
  // Every output is complete before the first is written; if a later write
  // fails, the earlier files are removed, so a failure leaves nothing behind.
  std::vector<std::string> written;
  try {
    write_npy_f32(a.str("out"), block_out.data(), shape);
    written.push_back(a.str("out"));
    if (a.has("attn-out")) {
      write_npy_f32(a.str("attn-out"), attn_out.data(), shape);
      written.push_back(a.str("attn-out"));
    }
    if (a.has("json")) {
      nlohmann::json j = {{"layer", in.spec.index}, {"kind", to_string(in.spec.kind)},
                          {"backend", backend},      {"isa", isa},
                          {"batch", B},              {"tokens", T},
                          {"out", a.str("out")}};
      emit_json(a, j.dump(1));
    }
  } catch (...) {
    for (const auto& f : written) std::remove(f.c_str());
    throw;
  }
  return 0;
}

}  // namespace g3::cli
