#include "runtime/exec/head_range.h"

#include <cmath>
#include <cstring>
#include <string>

#include "generator/errors.h"
#include "runtime/io/safetensors.h"

namespace g3 {

void check_head_range(const LayerSpec& full, HeadRange r) {
  if (r.begin < 0 || r.end <= r.begin || r.end > full.num_kv_heads)
    throw InputError("layer " + std::to_string(full.index) + ": KV head range [" + std::to_string(r.begin) + ", " +
                     std::to_string(r.end) + ") is not a non-empty range inside [0, " +
                     std::to_string(full.num_kv_heads) + ")");
}

LayerSpec head_range_spec(const LayerSpec& full, HeadRange r) {
  check_head_range(full, r);
  LayerSpec s = full;
  s.num_kv_heads = r.size();
  s.num_heads = r.size() * full.group();
  return s;
}

namespace {

// Rows [r0, r1) and columns [c0, c1) of a matrix, dtype kept.
WeightMatrix sub_matrix(const WeightMatrix& m, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  WeightMatrix out;
  out.dtype = m.dtype;
  out.rows = r1 - r0;
  out.cols = c1 - c0;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t at = r * m.cols;
    if (m.dtype == DType::BF16) out.bf16.insert(out.bf16.end(), m.bf16.begin() + at + c0, m.bf16.begin() + at + c1);
    else out.f32.insert(out.f32.end(), m.f32.begin() + at + c0, m.f32.begin() + at + c1);
  }
  return out;
}

// Rows [r0, r1) and columns [c0, c1) of a 2-D tensor in the checkpoint,
// copied out of the mapping: bf16 stays bf16, F32 and F16 become f32. Only
// the bytes of the block are read. Non-finite values are refused, as the
// whole-layer loader refuses them.
WeightMatrix read_block(const TensorSource& src, const TensorView& t, int64_t r0, int64_t r1, int64_t c0,
                        int64_t c1) {
  const int64_t cols = t.shape[1];
  const size_t esz = t.dtype == TensorDType::F32 ? 4 : 2;
  WeightMatrix m;
  m.rows = r1 - r0;
  m.cols = c1 - c0;
  m.dtype = t.dtype == TensorDType::BF16 ? DType::BF16 : DType::F32;
  for (int64_t r = r0; r < r1; ++r) {
    // One row's columns as a view of their own, so TensorView's conversions
    // (exact for bf16 and f16) read only those bytes.
    TensorView row;
    row.dtype = t.dtype;
    row.shape = {c1 - c0};
    row.data = t.data + size_t(r * cols + c0) * esz;
    row.nbytes = size_t(c1 - c0) * esz;
    if (m.dtype == DType::BF16) {
      const size_t at = m.bf16.size();
      m.bf16.resize(at + size_t(c1 - c0));
      std::memcpy(m.bf16.data() + at, row.data, row.nbytes);
    } else {
      std::vector<float> f = row.to_f32();
      m.f32.insert(m.f32.end(), f.begin(), f.end());
    }
  }
  const size_t n = size_t(m.rows * m.cols);
  for (size_t i = 0; i < n; ++i) {
    const bool finite = m.dtype == DType::BF16 ? (m.bf16[i] & 0x7f80u) != 0x7f80u : std::isfinite(m.f32[i]);
    if (!finite)
      throw InputError(src.describe + ": tensor " + t.name + " holds a non-finite value at row " +
                       std::to_string(r0 + int64_t(i) / m.cols) + ", column " +
                       std::to_string(c0 + int64_t(i) % m.cols));
  }
  return m;
}

std::vector<float> read_vector(const TensorSource& src, const TensorView& t) {
  std::vector<float> v = t.to_f32();
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      throw InputError(src.describe + ": tensor " + t.name + " holds a non-finite value at element " +
                       std::to_string(i));
  return v;
}

}  // namespace

LayerWeights slice_head_range(const LayerWeights& w, const LayerSpec& full, HeadRange r) {
  check_head_range(full, r);
  const int64_t H = full.head_dim, G = full.group();
  const int64_t D = full.hidden_size, N = full.num_heads, K = full.num_kv_heads;
  if (w.q_proj.rows != N * H || w.k_proj.rows != K * H || w.v_proj.rows != K * H || w.o_proj.cols != N * H)
    throw InputError("layer " + std::to_string(full.index) + ": weights do not have the layer's head counts");
  const int64_t q0 = r.begin * G * H, q1 = r.end * G * H, k0 = r.begin * H, k1 = r.end * H;
  LayerWeights s;
  s.q_proj = sub_matrix(w.q_proj, q0, q1, 0, D);
  s.k_proj = sub_matrix(w.k_proj, k0, k1, 0, D);
  s.v_proj = sub_matrix(w.v_proj, k0, k1, 0, D);
  s.o_proj = sub_matrix(w.o_proj, 0, D, q0, q1);
  s.q_norm = w.q_norm;
  s.k_norm = w.k_norm;
  s.input_norm = w.input_norm;
  s.post_norm = w.post_norm;
  return s;
}

LayerWeights load_head_range_weights(const TensorSource& src, const LayerSpec& full, HeadRange r) {
  check_head_range(full, r);
  if (r.begin == 0 && r.end == full.num_kv_heads) return load_layer_weights(src, full);
  const std::string p = find_layer_prefix(src, full.index);
  const int64_t D = full.hidden_size, H = full.head_dim, N = full.num_heads, K = full.num_kv_heads, G = full.group();
  const int64_t q0 = r.begin * G * H, q1 = r.end * G * H, k0 = r.begin * H, k1 = r.end * H;
  LayerWeights w;
  w.q_proj = read_block(src, need_tensor(src, p + "self_attn.q_proj.weight", {N * H, D}, "[num_heads*head_dim, hidden_size]"),
                        q0, q1, 0, D);
  w.k_proj = read_block(
      src, need_tensor(src, p + "self_attn.k_proj.weight", {K * H, D}, "[num_kv_heads*head_dim, hidden_size]"), k0, k1, 0, D);
  w.v_proj = read_block(
      src, need_tensor(src, p + "self_attn.v_proj.weight", {K * H, D}, "[num_kv_heads*head_dim, hidden_size]"), k0, k1, 0, D);
  w.o_proj = read_block(src, need_tensor(src, p + "self_attn.o_proj.weight", {D, N * H}, "[hidden_size, num_heads*head_dim]"),
                        0, D, q0, q1);
  w.q_norm = read_vector(src, need_tensor(src, p + "self_attn.q_norm.weight", {H}, "[head_dim]"));
  w.k_norm = read_vector(src, need_tensor(src, p + "self_attn.k_norm.weight", {H}, "[head_dim]"));
  w.input_norm = read_vector(src, need_tensor(src, p + "input_layernorm.weight", {D}, "[hidden_size]"));
  w.post_norm = read_vector(src, need_tensor(src, p + "post_attention_layernorm.weight", {D}, "[hidden_size]"));
  return w;
}

std::vector<HeadRange> even_head_ranges(const LayerSpec& full, int parts) {
  const int K = full.num_kv_heads;
  if (parts < 1 || K % parts != 0) {
    std::string valid;
    for (int d = 1; d <= K; ++d)
      if (K % d == 0) valid += (valid.empty() ? "" : ", ") + std::to_string(d);
    throw InputError(std::to_string(parts) + " head ranges do not divide the " + std::to_string(K) +
                     " KV heads of layer " + std::to_string(full.index) + " (valid: " + valid + ")");
  }
  std::vector<HeadRange> out;
  for (int i = 0; i < parts; ++i) out.push_back({i * K / parts, (i + 1) * K / parts});
  return out;
}

}  // namespace g3
