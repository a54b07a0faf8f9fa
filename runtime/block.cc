#include "block.h"

#include <cmath>
#include <cstring>

namespace g3 {

static WeightMatrix stack_rows(const std::vector<const WeightMatrix*>& parts) {
  WeightMatrix out;
  out.cols = parts[0]->cols;
  out.dtype = parts[0]->dtype;
  for (const WeightMatrix* p : parts)
    if (p->dtype != out.dtype) out.dtype = DType::F32;  // mixed dtypes: widen
  for (const WeightMatrix* p : parts) {
    out.rows += p->rows;
    if (out.dtype == DType::BF16) {
      out.bf16.insert(out.bf16.end(), p->bf16.begin(), p->bf16.end());
    } else {
      std::vector<float> f = p->to_f32();
      out.f32.insert(out.f32.end(), f.begin(), f.end());
    }
  }
  return out;
}

PreparedLayer prepare_layer(const LayerSpec& spec, const LayerWeights& w, DType kv_dtype, const std::string& backend,
                            const std::string& isa) {
  PreparedLayer L;
  L.spec = spec;
  L.key = kernel_key(spec, kv_dtype, w.q_proj.dtype);
  L.kernels = kernels_for(L.key, backend, isa);
  L.wqkv = pack_weights(stack_rows({&w.q_proj, &w.k_proj, &w.v_proj}));
  L.wo = pack_weights(w.o_proj);
  L.q_norm = w.q_norm;
  L.k_norm = w.k_norm;
  L.input_norm = w.input_norm;
  L.post_norm = w.post_norm;
  return L;
}

void run_block_nocache(const PreparedLayer& L, const float* x, const int32_t* positions, const int32_t* key_real,
                       int64_t B, int64_t T, float* block_out, float* attn_out) {
  const LayerSpec& s = L.spec;
  const g3_kernel_table& k = L.kernels.kernels.table;
  const int64_t D = s.hidden_size, H = s.head_dim, N = s.num_heads, K = s.num_kv_heads, G = N / K;
  const int64_t QKV = (N + 2 * K) * H;
  const size_t esz = L.key.kv_dtype == DType::F32 ? 4 : 2;

  std::vector<float> u(size_t(T * D)), qkv(size_t(T * QKV)), q(size_t(T * N * H)), enc(size_t(T * N * H)),
      a(size_t(T * D));
  std::vector<uint8_t> kcache(size_t(K * T * H) * esz), vcache(size_t(K * T * H) * esz);
  std::vector<uint8_t> valid(static_cast<size_t>(T));
  std::vector<int64_t> slot(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) slot[t] = t;

  for (int64_t b = 0; b < B; ++b) {
    const float* xb = x + b * T * D;
    const int32_t* pb = positions + b * T;
    // Step 1: pre-norm; step A: fused q/k/v projection.
    k.rmsnorm(xb, T, D, D, L.input_norm.data(), s.rms_eps, nullptr, u.data(), D);
    g3_gemm_args ga = L.wqkv.args(u.data(), T, D, qkv.data(), QKV, 0, QKV);
    k.gemm(&ga);
    // Steps B-D: QK-norm, RoPE, alpha; K/V into this row's cache (slot t = token t).
    g3_qk_args qa{};
    qa.T = T;
    qa.num_heads = int32_t(N);
    qa.num_kv_heads = int32_t(K);
    qa.q = qkv.data();
    qa.q_stride = QKV;
    qa.k = qkv.data() + N * H;
    qa.v = qkv.data() + (N + K) * H;
    qa.kv_stride = QKV;
    qa.pos = pb;
    qa.q_norm = L.q_norm.data();
    qa.k_norm = L.k_norm.data();
    qa.q_out = q.data();
    qa.q_out_stride = N * H;
    qa.k_cache = kcache.data();
    qa.v_cache = vcache.data();
    qa.cache_head_stride = T;
    qa.slot = slot.data();
    qa.head_dim = int32_t(H);
    qa.kv_dtype = L.key.kv_dtype == DType::F32 ? G3_DTYPE_F32 : G3_DTYPE_BF16;
    qa.alpha = s.alpha;
    qa.eps = s.rms_eps;
    qa.rope_base = s.rope_base;
    qa.rope_scale = s.rope_scale;
    k.qk(&qa);
    for (int64_t t = 0; t < T; ++t) valid[t] = key_real ? key_real[b * T + t] != 0 : 1;
    // Steps E-I per KV head, its G query heads together.
    for (int64_t j = 0; j < K; ++j) {
      g3_core_args ca{};
      ca.T = T;
      ca.q = q.data() + j * G * H;
      ca.q_stride = N * H;
      ca.qpos = pb;
      ca.k = kcache.data() + size_t(j * T * H) * esz;
      ca.v = vcache.data() + size_t(j * T * H) * esz;
      ca.S = T;
      ca.kpos = pb;
      ca.kvalid = valid.data();
      ca.out = enc.data() + j * G * H;
      ca.out_stride = N * H;
      ca.lse = nullptr;
      ca.head_dim = int32_t(H);
      ca.group = int32_t(G);
      ca.window = s.window;
      ca.kv_dtype = qa.kv_dtype;
      k.core(&ca);
    }
    // Step J: output projection; steps 3-4: post-norm and residual.
    float* ab = attn_out ? attn_out + b * T * D : a.data();
    g3_gemm_args go = L.wo.args(enc.data(), T, N * H, ab, D, 0, D);
    k.gemm(&go);
    k.rmsnorm(ab, T, D, D, L.post_norm.data(), s.rms_eps, xb, block_out + b * T * D, D);
  }
}

}  // namespace g3
