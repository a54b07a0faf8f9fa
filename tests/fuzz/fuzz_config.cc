// Fuzz harness for the config.json parser (g3::parse_config_json,
// generator/catalogue.h). On success the config must pass validate() again
// and resolve every layer; the bounds in validate() are what keep a crafted
// config from asking for absurd memory later, so the harness checks they
// hold for whatever the parser accepted.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "generator/catalogue.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  g3fuzz::expect_ok_or_input_error("config", [&] {
    std::string text(reinterpret_cast<const char*>(data), size);
    g3::ModelConfig m = g3::parse_config_json(text, "fuzz/config.json");
    if (m.layer_types.size() != static_cast<size_t>(m.num_layers))
      g3fuzz::bug("config", "layer_types has " + std::to_string(m.layer_types.size()) + " entries for " +
                                std::to_string(m.num_layers) + " layers");
    if (m.layer_index && (*m.layer_index < 0 || *m.layer_index >= m.num_layers))
      g3fuzz::bug("config", "layer_index outside the model accepted");
    g3::validate(m, "fuzz/config.json (again)");
    std::vector<g3::LayerSpec> specs = g3::layer_specs(m);
    for (const g3::LayerSpec& l : specs) {
      if (l.num_heads % l.num_kv_heads != 0 || l.head_dim % 2 != 0)
        g3fuzz::bug("config", "layer spec breaks the GQA or RoPE invariants");
      // alpha is rounded to f32 once (SPEC 2.3); it must stay a finite,
      // non-zero scale or every logit of the layer becomes 0, Inf or NaN.
      if (!(l.alpha > 0) || !std::isfinite(l.alpha) || !(l.rope_base > 0) || !(l.rope_scale >= 1))
        g3fuzz::bug("config", "layer spec has a zero, non-finite or negative alpha or rope parameter");
      if (l.kind == g3::LayerKind::Local && l.window < 1) g3fuzz::bug("config", "local layer without a window");
    }
  });
  return 0;
}
