// The scalar reference: the in-project oracle every fast path is tested
// against. Clear over clever; double accumulation throughout.
//
// Two levels:
//  - the official block (SPEC.md sections 1 and 2): dense caller mask, the
//    official full-length KV cache layout, K_MASK replacement, softmax over
//    all S slots (a fully masked row gives the official uniform average);
//  - the kernel contract (templates/kernel_contract.h) implemented in plain
//    scalar code with the structured mask: the "reference" backend.
#pragma once
#include <cstdint>
#include <vector>

#include "generator/catalogue.h"
#include "generator/kernel_key.h"
#include "runtime/io/layer_weights.h"
#include "templates/kernel_contract.h"

namespace g3::ref {

// K_MASK of SPEC 1.3 step G: replaces (does not add to) masked logits.
constexpr double kMask = -2.3819763e38;

// SPEC 2.1: y = x * rsqrt(mean(x^2) + eps) * (1 + w), in double.
void rms_norm(const float* x, int64_t n, const float* w, double eps, float* y);
// SPEC 2.2: half-split RoPE of one head vector of length dh, in place.
// Angles in double: theta_i = pos / base^(2i/dh) / scale.
void rope(float* x, int64_t dh, int64_t pos, double base, double scale);
// The value a dot product sees in compute mode `compute` (G3_COMPUTE_F32 or
// G3_COMPUTE_BF16, kernel_contract.h): x itself, or x rounded to f32 and then
// to bf16 (nearest even).
double operand(double x, int32_t compute);
// SPEC 1.4 sliding rule on positions: |qpos - kpos| < W.
bool sliding_visible(int64_t qpos, int64_t kpos, int64_t window);

// The official per-layer KV cache (SPEC 1.5), f32: k and v are
// [B][S][Nkv][dh], positions [B][S], one shared end_index.
struct Cache {
  int64_t B = 0, S = 0;
  int Nkv = 0, dh = 0;
  std::vector<float> k, v;
  std::vector<int32_t> positions;
  int64_t end_index = 0;
  static Cache zeros(int64_t B, int64_t S, int Nkv, int dh);
};

// Caller mask as the golden cases and the official helpers build it for a
// call without cache: mask[b][t][s] = key_real[b][s] && s <= t.
// key_real may be null (all real).
std::vector<uint8_t> causal_mask(const int32_t* key_real, int64_t B, int64_t T);

// SPEC 1.3 Attention: u [B][T][D] (already pre-normed), positions [B][T],
// mask [B][T][S] with S = cache ? cache->S : T. Writes out [B][T][D].
// With a cache, the T new rows are written at min(end_index mod S, S - T)
// and end_index advances by T (SPEC 1.5). kv_dtype is how K and V are
// stored: BF16 rounds each element once, to nearest even, as it enters the
// cache (or the fresh keys); q and the softmax weights stay exact. compute
// is the compute mode (kernel_contract.h): BF16 rounds the inputs of every
// dot product (u and the weights for the projections, q and K for the
// logits, the softmax weights and V, the attention output for o_proj).
void attention(const LayerSpec& spec, const LayerWeights& w, const float* u, const int32_t* positions, int64_t B,
               int64_t T, const uint8_t* mask, Cache* cache, float* out, DType kv_dtype = DType::F32,
               DType compute = DType::F32);

// SPEC 1.2 steps 1-4: u = RMSNorm(x); a = Attention(u); y = x + RMSNorm(a).
// attn_out (optional) receives a before the post-norm.
void block(const LayerSpec& spec, const LayerWeights& w, const float* x, const int32_t* positions, int64_t B,
           int64_t T, const uint8_t* mask, Cache* cache, float* block_out, float* attn_out,
           DType kv_dtype = DType::F32, DType compute = DType::F32);

// The kernel contract in scalar code (structured mask; rows with no visible
// key get zeros and lse = -inf).
void qk(const g3_qk_args* a);
void core(const g3_core_args* a);
void gemm(const g3_gemm_args* a);
void rmsnorm(const float* x, int64_t rows, int64_t n, int64_t x_stride, const float* w, float eps,
             const float* residual, float* y, int64_t y_stride);
const g3_kernel_table& kernel_table();

}  // namespace g3::ref
