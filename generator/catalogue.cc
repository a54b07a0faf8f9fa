// The Gemma 3 catalogue: built-in sizes (SPEC.md section 3.1) and HF
// config.json parsing (SPEC.md section 3.3), resolved into LayerSpecs.
#include "generator/catalogue.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "generator/errors.h"
#include "generator/text_file.h"

namespace g3 {

using nlohmann::json;

const char* to_string(LayerKind k) { return k == LayerKind::Local ? "local" : "global"; }

namespace {

// SPEC 3.2: layer i is global iff (i + 1) % pattern == 0 (pattern 6 for
// Gemma 3), so the trailing partial pattern is local.
std::vector<LayerKind> pattern_layers(int num_layers, int pattern) {
  std::vector<LayerKind> kinds(num_layers);
  for (int i = 0; i < num_layers; ++i)
    kinds[i] = ((i + 1) % pattern == 0) ? LayerKind::Global : LayerKind::Local;
  return kinds;
}

ModelConfig make_builtin(const char* name, int D, int L, int N, int K, int H, int W, double qpas,
                         double global_scale, int max_pos) {
  ModelConfig m;
  m.name = name;
  m.hidden_size = D;
  m.num_layers = L;
  m.num_heads = N;
  m.num_kv_heads = K;
  m.head_dim = H;
  m.sliding_window = W;
  m.query_pre_attn_scalar = qpas;
  m.rope_global_base = 1e6;
  m.rope_local_base = 1e4;
  m.rope_global_scale = global_scale;
  m.rms_eps = 1e-6;
  m.max_position_embeddings = max_pos;
  m.layer_types = pattern_layers(L, 6);
  return m;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

// A short, safe quote of a value for an error message: primitives as JSON
// text cut to 40 characters, containers by type only (dumping a crafted,
// deeply nested value would recurse once per level).
std::string describe(const json& v) {
  if (v.is_structured()) return std::string("a JSON ") + v.type_name();
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// Field readers: each names the file and the field when the value is wrong.
struct Reader {
  const json& obj;
  std::string source;
  std::string where;  // "" or "text_config."
  std::vector<std::string>* defaulted;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw InputError(source + ": " + where + field + " " + what);
  }
  bool has(const std::string& f) const { return obj.contains(f) && !obj.at(f).is_null(); }

  int64_t integer(const std::string& f) const {
    const json& v = obj.at(f);
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) fail(f, "is out of range");
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    // Python writes 1024.0 for a float; accept integral values, nothing else.
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
    }
    fail(f, "must be an integer, got " + describe(v));
  }
  int required_int(const std::string& f) const {
    if (!has(f)) fail(f, "is missing");
    return bounded_int(f);
  }
  int optional_int(const std::string& f, int def) const {
    if (!has(f)) {
      if (defaulted) defaulted->push_back(where + f + "=" + std::to_string(def));
      return def;
    }
    return bounded_int(f);
  }
  // Values that cannot fit an int are out of range whatever the field means;
  // validate() applies each field's own, tighter bounds.
  int bounded_int(const std::string& f) const {
    int64_t v = integer(f);
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
      fail(f, "is out of range (" + std::to_string(v) + ")");
    return static_cast<int>(v);
  }
  double number(const std::string& f) const {
    const json& v = obj.at(f);
    if (!v.is_number()) fail(f, "must be a number, got " + describe(v));
    double d = v.get<double>();
    if (!std::isfinite(d)) fail(f, "must be finite");
    return d;
  }
  double optional_number(const std::string& f, double def) const {
    if (!has(f)) {
      if (defaulted) {
        std::ostringstream s;
        s << where << f << "=" << def;
        defaulted->push_back(s.str());
      }
      return def;
    }
    return number(f);
  }
};

// A rope_scaling / rope_parameters entry: returns (base or NaN, scale).
struct RopeEntry {
  double base = NAN;
  double scale = 1.0;
};
RopeEntry parse_rope_entry(const json& e, const std::string& source, const std::string& field) {
  RopeEntry r;
  if (e.is_null()) return r;
  if (!e.is_object()) throw InputError(source + ": " + field + " must be an object or null");
  std::string type = "default";
  for (const char* k : {"rope_type", "type"}) {
    if (e.contains(k)) {
      if (!e.at(k).is_string()) throw InputError(source + ": " + field + "." + k + " must be a string");
      type = e.at(k).get<std::string>();
      break;
    }
  }
  if (e.contains("rope_theta") && !e.at("rope_theta").is_null()) {
    if (!e.at("rope_theta").is_number()) throw InputError(source + ": " + field + ".rope_theta must be a number");
    r.base = e.at("rope_theta").get<double>();
  }
  if (type == "linear") {
    if (!e.contains("factor") || !e.at("factor").is_number())
      throw InputError(source + ": " + field + " of type linear needs a numeric factor");
    r.scale = e.at("factor").get<double>();
  } else if (type != "default") {
    throw InputError(source + ": " + field + " type '" + type +
                     "' is not used by Gemma 3 (supported: linear, default)");
  }
  return r;
}

}  // namespace

const std::vector<std::string>& builtin_model_names() {
  static const std::vector<std::string> names = {"270m", "1b", "4b", "12b", "27b"};
  return names;
}

ModelConfig builtin_model(const std::string& name) {
  // SPEC 3.1 / 3.3: D, L, N, K, H, W, query_pre_attn_scalar (HF meaning),
  // global linear factor, max positions.
  if (name == "270m") return make_builtin("270m", 640, 18, 4, 1, 256, 512, 256, 1.0, 32768);
  if (name == "1b") return make_builtin("1b", 1152, 26, 4, 1, 256, 512, 256, 1.0, 32768);
  if (name == "4b") return make_builtin("4b", 2560, 34, 8, 4, 256, 1024, 256, 8.0, 131072);
  if (name == "12b") return make_builtin("12b", 3840, 48, 16, 8, 256, 1024, 256, 8.0, 131072);
  if (name == "27b") return make_builtin("27b", 5376, 62, 32, 16, 128, 1024, 168, 8.0, 131072);
  throw InputError("--model: unknown model '" + name + "' (valid: " + join(builtin_model_names()) + ")");
}

ModelConfig parse_config_json(const std::string& text, const std::string& source) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) throw InputError(source + ": not valid JSON");
  if (!root.is_object()) throw InputError(source + ": config must be a JSON object");

  ModelConfig m;
  // Multimodal gemma3 configs nest the text model; HF's hub configs for 4B
  // omit the fields that equal Gemma3TextConfig's defaults, so those
  // defaults apply there (and are listed in m.defaulted).
  const json* cfg = &root;
  std::string where;
  bool nested = false;
  if (root.contains("text_config") && !root.at("text_config").is_null()) {
    if (!root.at("text_config").is_object()) throw InputError(source + ": text_config must be an object");
    cfg = &root.at("text_config");
    where = "text_config.";
    nested = true;
  }
  for (const json* o : std::initializer_list<const json*>{&root, cfg}) {
    if (o->contains("model_type") && o->at("model_type").is_string()) {
      std::string mt = o->at("model_type").get<std::string>();
      if (mt != "gemma3" && mt != "gemma3_text")
        throw InputError(source + ": model_type " + describe(o->at("model_type")) +
                         " is not a Gemma 3 model (need gemma3 or gemma3_text)");
    }
  }
  Reader r{*cfg, source, where, &m.defaulted};

  if (root.contains("model") && root.at("model").is_string()) m.name = root.at("model").get<std::string>();
  else {
    std::string base = source.substr(source.find_last_of('/') + 1);
    m.name = base.empty() ? "config" : base;
  }

  m.hidden_size = r.required_int("hidden_size");
  m.num_layers = r.required_int("num_hidden_layers");
  if (nested) {
    m.num_heads = r.optional_int("num_attention_heads", 8);
    m.num_kv_heads = r.optional_int("num_key_value_heads", 4);
    m.head_dim = r.optional_int("head_dim", 256);
    m.sliding_window = r.optional_int("sliding_window", 4096);
    m.query_pre_attn_scalar = r.optional_number("query_pre_attn_scalar", 256);
  } else {
    m.num_heads = r.required_int("num_attention_heads");
    m.num_kv_heads = r.required_int("num_key_value_heads");
    m.head_dim = r.required_int("head_dim");
    m.sliding_window = r.required_int("sliding_window");
    if (!r.has("query_pre_attn_scalar")) r.fail("query_pre_attn_scalar", "is missing");
    m.query_pre_attn_scalar = r.number("query_pre_attn_scalar");
  }
  m.rms_eps = r.optional_number("rms_norm_eps", 1e-6);
  m.max_position_embeddings = r.optional_int("max_position_embeddings", 131072);

  // Things Gemma 3 never has: refuse rather than compute something else.
  if (r.has("attn_logit_softcapping"))
    r.fail("attn_logit_softcapping", "is set, but Gemma 3 has no attention softcap (SPEC 1.3 step F)");
  if (cfg->contains("use_bidirectional_attention") && cfg->at("use_bidirectional_attention").is_boolean() &&
      cfg->at("use_bidirectional_attention").get<bool>())
    r.fail("use_bidirectional_attention", "is true: bidirectional (embedding) variants are not supported");

  // RoPE (SPEC 2.2, 3.3): legacy fields first, then v5 rope_parameters win.
  m.rope_global_base = r.optional_number("rope_theta", 1e6);
  m.rope_local_base = r.optional_number("rope_local_base_freq", 1e4);
  if (cfg->contains("rope_scaling")) {
    RopeEntry e = parse_rope_entry(cfg->at("rope_scaling"), source, where + "rope_scaling");
    m.rope_global_scale = e.scale;  // HF applies rope_scaling to full-attention layers only
  }
  if (cfg->contains("rope_parameters") && !cfg->at("rope_parameters").is_null()) {
    const json& rp = cfg->at("rope_parameters");
    if (!rp.is_object()) throw InputError(source + ": " + where + "rope_parameters must be an object");
    if (rp.contains("full_attention") || rp.contains("sliding_attention")) {
      if (rp.contains("full_attention")) {
        RopeEntry e = parse_rope_entry(rp.at("full_attention"), source, where + "rope_parameters.full_attention");
        if (!std::isnan(e.base)) m.rope_global_base = e.base;
        m.rope_global_scale = e.scale;
      }
      if (rp.contains("sliding_attention")) {
        RopeEntry e =
            parse_rope_entry(rp.at("sliding_attention"), source, where + "rope_parameters.sliding_attention");
        if (!std::isnan(e.base)) m.rope_local_base = e.base;
        m.rope_local_scale = e.scale;
      }
    } else {
      // A flat entry describes the full-attention rope (local layers keep
      // rope_local_base_freq and no scaling, as HF does).
      RopeEntry e = parse_rope_entry(rp, source, where + "rope_parameters");
      if (!std::isnan(e.base)) m.rope_global_base = e.base;
      m.rope_global_scale = e.scale;
    }
  }

  // Layer kinds: layer_types wins; else sliding_window_pattern; else 6.
  if (r.has("layer_types")) {
    const json& lt = cfg->at("layer_types");
    if (!lt.is_array()) r.fail("layer_types", "must be an array");
    if (m.num_layers < 0 || lt.size() != static_cast<size_t>(m.num_layers))
      r.fail("layer_types", "has " + std::to_string(lt.size()) + " entries but num_hidden_layers is " +
                                std::to_string(m.num_layers));
    for (size_t i = 0; i < lt.size(); ++i) {
      std::string s = lt[i].is_string() ? lt[i].get<std::string>() : describe(lt[i]);
      if (s == "sliding_attention") m.layer_types.push_back(LayerKind::Local);
      else if (s == "full_attention") m.layer_types.push_back(LayerKind::Global);
      else r.fail("layer_types", "[" + std::to_string(i) + "] is '" + describe(lt[i]) +
                                     "' (need sliding_attention or full_attention)");
    }
  } else {
    int pattern = r.has("sliding_window_pattern") ? r.bounded_int("sliding_window_pattern") : 6;
    if (pattern < 1) r.fail("sliding_window_pattern", "must be at least 1");
    validate(m, source);  // bounds num_layers before allocating the list
    m.layer_types = pattern_layers(m.num_layers, pattern);
  }

  if (root.contains("layer_index") && !root.at("layer_index").is_null()) {
    Reader top{root, source, "", nullptr};
    m.layer_index = top.bounded_int("layer_index");
  }
  validate(m, source);
  if (m.layer_index && (*m.layer_index < 0 || *m.layer_index >= m.num_layers))
    throw InputError(source + ": layer_index " + std::to_string(*m.layer_index) + " is outside 0.." +
                     std::to_string(m.num_layers - 1));
  return m;
}

ModelConfig load_config_file(const std::string& path) {
  // A config.json is a few kilobytes; 64 MiB leaves room for any padding.
  return parse_config_json(read_text_file(path, size_t{64} << 20), path);
}

void validate(const ModelConfig& m, const std::string& source) {
  auto range = [&](const char* what, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      throw InputError(source + ": " + what + " = " + std::to_string(v) + " is out of range [" +
                       std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  // Bounds are generous for real models (27B: D 5376, 62 layers) and keep
  // every later allocation sane: a crafted config cannot ask for terabytes.
  range("hidden_size", m.hidden_size, 1, 65536);
  range("num_hidden_layers", m.num_layers, 1, 1024);
  range("num_attention_heads", m.num_heads, 1, 1024);
  range("num_key_value_heads", m.num_kv_heads, 1, 1024);
  range("head_dim", m.head_dim, 2, 1024);
  range("sliding_window", m.sliding_window, 1, int64_t{1} << 30);
  range("max_position_embeddings", m.max_position_embeddings, 1, std::numeric_limits<int32_t>::max());
  if (m.head_dim % 2 != 0)
    throw InputError(source + ": head_dim = " + std::to_string(m.head_dim) + " must be even (RoPE rotates pairs)");
  if (m.num_heads % m.num_kv_heads != 0)
    throw InputError(source + ": num_attention_heads = " + std::to_string(m.num_heads) +
                     " is not a multiple of num_key_value_heads = " + std::to_string(m.num_kv_heads));
  if (int64_t{m.num_heads} * m.head_dim > 65536)
    throw InputError(source + ": num_attention_heads x head_dim = " +
                     std::to_string(int64_t{m.num_heads} * m.head_dim) + " is out of range (max 65536)");
  auto positive = [&](const char* what, double v) {
    if (!(std::isfinite(v) && v > 0)) throw InputError(source + ": " + what + " must be a positive finite number");
  };
  positive("query_pre_attn_scalar", m.query_pre_attn_scalar);
  // alpha = query_pre_attn_scalar^-1/2 must be a normal, finite f32.
  if (m.query_pre_attn_scalar < 1e-6 || m.query_pre_attn_scalar > 1e12)
    throw InputError(source + ": query_pre_attn_scalar must be in [1e-6, 1e12] (alpha = its ^-1/2 must fit f32)");
  positive("rope_theta", m.rope_global_base);
  positive("rope_local_base_freq", m.rope_local_base);
  if (!(m.rms_eps > 0 && m.rms_eps < 1)) throw InputError(source + ": rms_norm_eps must be in (0, 1)");
  for (double s : {m.rope_global_scale, m.rope_local_scale})
    if (!(std::isfinite(s) && s >= 1.0 && s <= 1e6))
      throw InputError(source + ": rope scaling factor must be in [1, 1e6] (SPEC 2.2: linear interpolation)");
  if (!m.layer_types.empty() && m.layer_types.size() != static_cast<size_t>(m.num_layers))
    throw InputError(source + ": layer_types does not match num_hidden_layers");
}

LayerSpec layer_spec(const ModelConfig& m, int index) {
  if (index < 0 || index >= m.num_layers)
    throw InputError("layer " + std::to_string(index) + " is outside 0.." + std::to_string(m.num_layers - 1) +
                     " of model " + m.name);
  LayerSpec l;
  l.index = index;
  l.kind = m.layer_types.at(index);
  bool local = l.kind == LayerKind::Local;
  l.window = local ? m.sliding_window : 0;
  l.rope_base = local ? m.rope_local_base : m.rope_global_base;
  l.rope_scale = local ? m.rope_local_scale : m.rope_global_scale;
  // alpha from the config, never from D/N or head_dim (SPEC 2.3, watch-out 1).
  l.alpha = static_cast<float>(1.0 / std::sqrt(m.query_pre_attn_scalar));
  l.num_heads = m.num_heads;
  l.num_kv_heads = m.num_kv_heads;
  l.head_dim = m.head_dim;
  l.hidden_size = m.hidden_size;
  l.rms_eps = static_cast<float>(m.rms_eps);
  return l;
}

std::vector<LayerSpec> layer_specs(const ModelConfig& m) {
  std::vector<LayerSpec> v;
  v.reserve(m.num_layers);
  for (int i = 0; i < m.num_layers; ++i) v.push_back(layer_spec(m, i));
  return v;
}

}  // namespace g3
