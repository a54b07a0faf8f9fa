#include "runtime/io/layer_weights.h"

#include <cmath>
#include <cstring>
#include <random>

#include "generator/bf16.h"
#include "generator/errors.h"

namespace g3 {

float WeightMatrix::at(int64_t r, int64_t c) const {
  int64_t i = r * cols + c;
  return dtype == DType::F32 ? f32[i] : bf16_to_f32(bf16[i]);
}

std::vector<float> WeightMatrix::to_f32() const {
  if (dtype == DType::F32) return f32;
  std::vector<float> out(bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) out[i] = bf16_to_f32(bf16[i]);
  return out;
}

TensorSource tensor_source(const SafeTensorsFile& f) {
  return TensorSource{[&f](const std::string& n) -> const TensorView* {
                        return f.has(n) ? &f.get(n) : nullptr;
                      },
                      f.path()};
}

std::string find_layer_prefix(const TensorSource& src, int index) {
  for (const std::string& p : hf_layer_prefixes()) {
    std::string pre = p + std::to_string(index) + ".";
    if (src.find(pre + "self_attn.q_proj.weight") || src.find(pre + "input_layernorm.weight")) return pre;
  }
  throw InputError(src.describe + ": no tensors for layer " + std::to_string(index) +
                   " (looked for model.layers." + std::to_string(index) +
                   ".*, model.language_model.layers.*, language_model.model.layers.*)");
}

static std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? "," : "") + std::to_string(s[i]);
  return o + "]";
}

const TensorView& need_tensor(const TensorSource& src, const std::string& name, const std::vector<int64_t>& shape,
                              const std::string& meaning) {
  const TensorView* t = src.find(name);
  if (!t) throw InputError(src.describe + ": missing tensor " + name);
  if (t->shape != shape)
    throw InputError(src.describe + ": tensor " + name + " has shape " + shape_str(t->shape) +
                     " but the config needs " + meaning + " = " + shape_str(shape));
  return *t;
}

// Weights with NaN or Inf are rejected at load: the fast kernels' max and
// clamped exp would not carry them through the softmax the way the
// reference does, and no real checkpoint holds them. (NaN or Inf in the
// inputs do propagate.)
static void require_finite(const TensorSource& src, const std::string& name, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      throw InputError(src.describe + ": tensor " + name + " holds a non-finite value at element " + std::to_string(i));
}

static void require_finite(const TensorSource& src, const std::string& name, const std::vector<uint16_t>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if ((v[i] & 0x7f80u) == 0x7f80u)  // bf16 exponent all ones: Inf or NaN
      throw InputError(src.describe + ": tensor " + name + " holds a non-finite value at element " + std::to_string(i));
}

static WeightMatrix matrix(const TensorView& t) {
  WeightMatrix m;
  m.rows = t.shape[0];
  m.cols = t.shape[1];
  if (t.dtype == TensorDType::BF16) {
    m.dtype = DType::BF16;
    m.bf16.resize(t.numel());
    std::memcpy(m.bf16.data(), t.data, t.nbytes);
  } else {
    m.dtype = DType::F32;
    m.f32 = t.to_f32();
  }
  return m;
}

LayerWeights load_layer_weights(const TensorSource& src, const LayerSpec& s) {
  std::string p = find_layer_prefix(src, s.index);
  const int64_t D = s.hidden_size, H = s.head_dim, N = s.num_heads, K = s.num_kv_heads;
  LayerWeights w;
  w.q_proj = matrix(need_tensor(src, p + "self_attn.q_proj.weight", {N * H, D}, "[num_heads*head_dim, hidden_size]"));
  w.k_proj = matrix(need_tensor(src, p + "self_attn.k_proj.weight", {K * H, D}, "[num_kv_heads*head_dim, hidden_size]"));
  w.v_proj = matrix(need_tensor(src, p + "self_attn.v_proj.weight", {K * H, D}, "[num_kv_heads*head_dim, hidden_size]"));
  w.o_proj = matrix(need_tensor(src, p + "self_attn.o_proj.weight", {D, N * H}, "[hidden_size, num_heads*head_dim]"));
  w.q_norm = need_tensor(src, p + "self_attn.q_norm.weight", {H}, "[head_dim]").to_f32();
  w.k_norm = need_tensor(src, p + "self_attn.k_norm.weight", {H}, "[head_dim]").to_f32();
  w.input_norm = need_tensor(src, p + "input_layernorm.weight", {D}, "[hidden_size]").to_f32();
  w.post_norm = need_tensor(src, p + "post_attention_layernorm.weight", {D}, "[hidden_size]").to_f32();
  const std::pair<const char*, const WeightMatrix*> mats[] = {
      {"q_proj", &w.q_proj}, {"k_proj", &w.k_proj}, {"v_proj", &w.v_proj}, {"o_proj", &w.o_proj}};
  for (const auto& [n, m] : mats) {
    if (m->dtype == DType::BF16) require_finite(src, p + "self_attn." + n + ".weight", m->bf16);
    else require_finite(src, p + "self_attn." + n + ".weight", m->f32);
  }
  require_finite(src, p + "self_attn.q_norm.weight", w.q_norm);
  require_finite(src, p + "self_attn.k_norm.weight", w.k_norm);
  require_finite(src, p + "input_layernorm.weight", w.input_norm);
  require_finite(src, p + "post_attention_layernorm.weight", w.post_norm);
  return w;
}

LayerWeights random_layer_weights(const LayerSpec& s, uint64_t seed, DType dtype) {
  // One generator per tensor, seeded from (seed, layer, tensor), so a layer's
  // weights do not depend on which other layers were drawn.
  auto gen = [&](int tensor) {
    std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(s.index), uint32_t(tensor)};
    return std::mt19937_64(seq);
  };
  auto mat = [&](int tensor, int64_t rows, int64_t cols) {
    std::mt19937_64 g = gen(tensor);
    std::normal_distribution<float> nd(0.f, 0.02f);
    WeightMatrix m;
    m.dtype = dtype;
    m.rows = rows;
    m.cols = cols;
    if (dtype == DType::F32) {
      m.f32.resize(rows * cols);
      for (auto& v : m.f32) v = nd(g);
    } else {
      m.bf16.resize(rows * cols);
      for (auto& v : m.bf16) v = f32_to_bf16(nd(g));
    }
    return m;
  };
  auto vec = [&](int tensor, int64_t n) {
    std::mt19937_64 g = gen(tensor);
    std::normal_distribution<float> nd(0.f, 0.1f);
    std::vector<float> v(n);
    for (auto& x : v) x = dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(nd(g))) : nd(g);
    return v;
  };
  const int64_t D = s.hidden_size, H = s.head_dim, N = s.num_heads, K = s.num_kv_heads;
  LayerWeights w;
  w.q_proj = mat(0, N * H, D);
  w.k_proj = mat(1, K * H, D);
  w.v_proj = mat(2, K * H, D);
  w.o_proj = mat(3, D, N * H);
  w.q_norm = vec(4, H);
  w.k_norm = vec(5, H);
  w.input_norm = vec(6, D);
  w.post_norm = vec(7, D);
  return w;
}

}  // namespace g3
