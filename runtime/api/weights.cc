// The C API's weight sources: a safetensors checkpoint (runtime/io), random
// weights from a seed, or the caller's arrays in HF layout; each gives one
// layer's weights, or only a head range's rows of them (exec/head_range.h).
#include <cmath>
#include <cstring>

#include "generator/bf16.h"
#include "runtime/api/api.h"

namespace g3::api {

namespace {

bool finite_bits(uint16_t b) { return (b & 0x7f80u) != 0x7f80u; }

// Rows [r0, r1) and columns [c0, c1) of a caller matrix with `cols`
// columns, dtype kept. Non-finite values are refused, as a checkpoint's are
// (layer_weights.h says why).
WeightMatrix caller_block(const void* p, DType dt, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                          const char* name) {
  WeightMatrix m;
  m.dtype = dt;
  m.rows = r1 - r0;
  m.cols = c1 - c0;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) {
      const size_t i = size_t(r * cols + c);
      bool ok;
      if (dt == DType::BF16) {
        uint16_t b;
        std::memcpy(&b, static_cast<const uint8_t*>(p) + 2 * i, 2);
        ok = finite_bits(b);
        m.bf16.push_back(b);
      } else {
        float f;
        std::memcpy(&f, static_cast<const uint8_t*>(p) + 4 * i, 4);
        ok = std::isfinite(f);
        m.f32.push_back(f);
      }
      if (!ok)
        fail(G3ATTN_ERROR_INPUT, std::string("tensors.") + name + " holds a non-finite value at row " +
                                     std::to_string(r) + ", column " + std::to_string(c));
    }
  }
  return m;
}

std::vector<float> caller_vector(const void* p, DType dt, int64_t n, const char* name) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (dt == DType::BF16) {
      uint16_t b;
      std::memcpy(&b, static_cast<const uint8_t*>(p) + 2 * i, 2);
      v[size_t(i)] = bf16_to_f32(b);
    } else {
      std::memcpy(&v[size_t(i)], static_cast<const uint8_t*>(p) + 4 * i, 4);
    }
    if (!std::isfinite(v[size_t(i)]))
      fail(G3ATTN_ERROR_INPUT,
           std::string("tensors.") + name + " holds a non-finite value at element " + std::to_string(i));
  }
  return v;
}

// HF names and shapes of the tensors of g3attn_tensor, in its order.
struct TensorName {
  const char* hf;     // after the layer prefix
  const char* field;  // g3attn_tensors' member
};
const TensorName kTensors[] = {
    {"self_attn.q_proj.weight", "q_proj"},       {"self_attn.k_proj.weight", "k_proj"},
    {"self_attn.v_proj.weight", "v_proj"},       {"self_attn.o_proj.weight", "o_proj"},
    {"self_attn.q_norm.weight", "q_norm"},       {"self_attn.k_norm.weight", "k_norm"},
    {"input_layernorm.weight", "input_norm"},    {"post_attention_layernorm.weight", "post_norm"}};

std::vector<int64_t> tensor_shape(const LayerSpec& s, int t) {
  const int64_t D = s.hidden_size, H = s.head_dim, N = s.num_heads, K = s.num_kv_heads;
  switch (t) {
    case G3ATTN_Q_PROJ: return {N * H, D};
    case G3ATTN_K_PROJ:
    case G3ATTN_V_PROJ: return {K * H, D};
    case G3ATTN_O_PROJ: return {D, N * H};
    case G3ATTN_Q_NORM:
    case G3ATTN_K_NORM: return {H};
    default: return {D};
  }
}

}  // namespace

LayerWeights Weights::load(const LayerSpec& full, HeadRange r) const {
  switch (kind) {
    case Kind::Checkpoint:
      return load_head_range_weights(checkpoint->source, full, r);
    case Kind::Random: {
      LayerWeights w = random_layer_weights(full, seed, dtype);
      if (r.begin == 0 && r.end == full.num_kv_heads) return w;
      return slice_head_range(w, full, r);
    }
    case Kind::Tensors:
      break;
  }
  check_head_range(full, r);
  const int64_t D = full.hidden_size, H = full.head_dim, N = full.num_heads, G = full.group();
  const int64_t q0 = r.begin * G * H, q1 = r.end * G * H, k0 = r.begin * H, k1 = r.end * H;
  const DType dt = to_dtype(enum_value(tensors.dtype), "tensors.dtype");
  const DType nt = to_dtype(enum_value(tensors.norm_dtype), "tensors.norm_dtype");
  LayerWeights w;
  w.q_proj = caller_block(tensors.q_proj, dt, D, q0, q1, 0, D, "q_proj");
  w.k_proj = caller_block(tensors.k_proj, dt, D, k0, k1, 0, D, "k_proj");
  w.v_proj = caller_block(tensors.v_proj, dt, D, k0, k1, 0, D, "v_proj");
  w.o_proj = caller_block(tensors.o_proj, dt, N * H, 0, D, q0, q1, "o_proj");
  w.q_norm = caller_vector(tensors.q_norm, nt, H, "q_norm");
  w.k_norm = caller_vector(tensors.k_norm, nt, H, "k_norm");
  w.input_norm = caller_vector(tensors.input_norm, nt, D, "input_norm");
  w.post_norm = caller_vector(tensors.post_norm, nt, D, "post_norm");
  return w;
}

}  // namespace g3::api

using namespace g3;
using namespace g3::api;

extern "C" {

g3attn_status g3attn_weights_open(const char* path, const g3attn_model* model, g3attn_weights** out) {
  return guard("g3attn_weights_open", G3ATTN_ERROR_INPUT, [&] {
    need(out, "out");
    *out = nullptr;
    need(path, "path");
    auto w = std::make_shared<Weights>();
    w->kind = Weights::Kind::Checkpoint;
    w->checkpoint = std::make_shared<const Checkpoint>(open_checkpoint(path, model ? &model->config : nullptr));
    auto h = std::make_unique<g3attn_weights>();
    h->s = std::move(w);
    *out = h.release();
  });
}

g3attn_status g3attn_model_from_weights(const g3attn_weights* weights, g3attn_model** out) {
  return guard("g3attn_model_from_weights", G3ATTN_ERROR_ARGUMENT, [&] {
    need(out, "out");
    *out = nullptr;
    const Weights& w = *need(weights, "weights")->s;
    if (w.kind != Weights::Kind::Checkpoint)
      fail(G3ATTN_ERROR_ARGUMENT, "only weights from g3attn_weights_open carry a model");
    auto m = std::make_unique<g3attn_model>();
    m->config = w.checkpoint->config;
    *out = m.release();
  });
}

g3attn_status g3attn_weights_random(uint64_t seed, g3attn_dtype dtype, g3attn_weights** out) {
  return guard("g3attn_weights_random", G3ATTN_ERROR_ARGUMENT, [&] {
    need(out, "out");
    *out = nullptr;
    auto w = std::make_shared<Weights>();
    w->kind = Weights::Kind::Random;
    w->seed = seed;
    w->dtype = to_dtype(enum_value(dtype), "dtype");
    auto h = std::make_unique<g3attn_weights>();
    h->s = std::move(w);
    *out = h.release();
  });
}

g3attn_status g3attn_weights_from_tensors(const g3attn_tensors* tensors, g3attn_weights** out) {
  return guard("g3attn_weights_from_tensors", G3ATTN_ERROR_ARGUMENT, [&] {
    need(out, "out");
    *out = nullptr;
    const g3attn_tensors& t = *need(tensors, "tensors");
    to_dtype(enum_value(t.dtype), "tensors.dtype");
    to_dtype(enum_value(t.norm_dtype), "tensors.norm_dtype");
    need(t.q_proj, "tensors.q_proj");
    need(t.k_proj, "tensors.k_proj");
    need(t.v_proj, "tensors.v_proj");
    need(t.o_proj, "tensors.o_proj");
    need(t.q_norm, "tensors.q_norm");
    need(t.k_norm, "tensors.k_norm");
    need(t.input_norm, "tensors.input_norm");
    need(t.post_norm, "tensors.post_norm");
    auto w = std::make_shared<Weights>();
    w->kind = Weights::Kind::Tensors;
    w->tensors = t;
    auto h = std::make_unique<g3attn_weights>();
    h->s = std::move(w);
    *out = h.release();
  });
}

void g3attn_weights_free(g3attn_weights* weights) { delete weights; }

g3attn_status g3attn_weights_read(const g3attn_weights* weights, const g3attn_model* model, int layer,
                                  g3attn_tensor tensor, float* dst, size_t count) {
  return guard("g3attn_weights_read", G3ATTN_ERROR_INPUT, [&] {
    const Weights& w = *need(weights, "weights")->s;
    const ModelConfig& c = need(model, "model")->config;
    if (layer < 0 || layer >= c.num_layers)
      fail(G3ATTN_ERROR_ARGUMENT, "layer " + std::to_string(layer) + " is outside 0.." +
                                      std::to_string(c.num_layers - 1) + " of model " + c.name);
    const int ti = enum_value(tensor);
    if (ti < G3ATTN_Q_PROJ || ti > G3ATTN_POST_NORM)
      fail(G3ATTN_ERROR_ARGUMENT, "tensor = " + std::to_string(ti) + " is not a g3attn_tensor");
    need(dst, "dst");
    const LayerSpec s = layer_spec(c, layer);
    const std::vector<int64_t> shape = tensor_shape(s, ti);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (count != size_t(n))
      fail(G3ATTN_ERROR_ARGUMENT, std::string("count = ") + std::to_string(count) + " but " +
                                      kTensors[ti].field + " of layer " + std::to_string(layer) + " has " +
                                      std::to_string(n) + " elements");
    std::vector<float> v;
    if (w.kind == Weights::Kind::Checkpoint) {
      // Only this tensor is read from the mapping.
      const TensorSource& src = w.checkpoint->source;
      const std::string name = find_layer_prefix(src, layer) + kTensors[ti].hf;
      const TensorView* t = src.find(name);
      if (!t) fail(G3ATTN_ERROR_INPUT, src.describe + ": missing tensor " + name);
      if (t->shape != shape) fail(G3ATTN_ERROR_INPUT, src.describe + ": tensor " + name + " does not have the shape the model needs");
      v = t->to_f32();
    } else {
      const LayerWeights lw = w.load(s, HeadRange{0, s.num_kv_heads});
      switch (ti) {
        case G3ATTN_Q_PROJ: v = lw.q_proj.to_f32(); break;
        case G3ATTN_K_PROJ: v = lw.k_proj.to_f32(); break;
        case G3ATTN_V_PROJ: v = lw.v_proj.to_f32(); break;
        case G3ATTN_O_PROJ: v = lw.o_proj.to_f32(); break;
        case G3ATTN_Q_NORM: v = lw.q_norm; break;
        case G3ATTN_K_NORM: v = lw.k_norm; break;
        case G3ATTN_INPUT_NORM: v = lw.input_norm; break;
        case G3ATTN_POST_NORM: v = lw.post_norm; break;
      }
    }
    std::memcpy(dst, v.data(), v.size() * sizeof(float));
  });
}

}  // extern "C"
