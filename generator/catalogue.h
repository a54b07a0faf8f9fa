// The Gemma 3 model catalogue: the five built-in sizes (SPEC.md section 3) and
// any Hugging Face config.json, turned into one LayerSpec per layer index.
// This is what the generator specialises for and what the runtime routes by.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace g3 {

enum class LayerKind { Local, Global };
const char* to_string(LayerKind k);  // "local" | "global"

// Everything of a model that the attention block depends on.
struct ModelConfig {
  std::string name;            // "1b", or the config's "model" label / file name
  int hidden_size = 0;         // D
  int num_layers = 0;
  int num_heads = 0;           // N
  int num_kv_heads = 0;        // Nkv
  int head_dim = 0;            // dh
  int sliding_window = 0;      // W, in RoPE positions (SPEC 1.4)
  double query_pre_attn_scalar = 0;  // HF meaning: alpha = this^-1/2 (SPEC 4 row 2)
  double rope_global_base = 1e6;
  double rope_local_base = 1e4;
  double rope_global_scale = 1.0;    // linear factor, global layers only (SPEC 2.2)
  double rope_local_scale = 1.0;     // always 1 for Gemma 3; kept explicit for v5 configs
  double rms_eps = 1e-6;
  int max_position_embeddings = 131072;
  std::vector<LayerKind> layer_types;  // size num_layers
  std::optional<int> layer_index;      // golden configs carry the layer they run
  std::vector<std::string> defaulted;  // HF defaults used for fields the file omits
};

// One layer's attention block, fully resolved.
struct LayerSpec {
  int index = 0;
  LayerKind kind = LayerKind::Local;
  int window = 0;        // W on local layers, 0 on global layers
  double rope_base = 0;
  double rope_scale = 1;
  float alpha = 0;       // query_pre_attn_scalar^-1/2, rounded to f32 once
  int num_heads = 0, num_kv_heads = 0, head_dim = 0, hidden_size = 0;
  float rms_eps = 1e-6f;
  int group() const { return num_heads / num_kv_heads; }
};

// Built-in sizes: "270m", "1b", "4b", "12b", "27b". Throws InputError on an
// unknown name (the message lists the valid ones).
ModelConfig builtin_model(const std::string& name);
const std::vector<std::string>& builtin_model_names();

// Parses an HF config.json (gemma3_text, or gemma3 with a nested text_config;
// legacy rope_theta / rope_local_base_freq / rope_scaling /
// sliding_window_pattern and newer layer_types / rope_parameters). `source`
// names the file in error messages. Validates every value (validate()).
ModelConfig parse_config_json(const std::string& text, const std::string& source);
ModelConfig load_config_file(const std::string& path);

// Range checks shared by both constructors: sizes positive and bounded so
// that nothing absurd is ever allocated, N a multiple of Nkv, head_dim even.
void validate(const ModelConfig& m, const std::string& source);

LayerSpec layer_spec(const ModelConfig& m, int index);  // throws InputError if out of range
std::vector<LayerSpec> layer_specs(const ModelConfig& m);

}  // namespace g3
