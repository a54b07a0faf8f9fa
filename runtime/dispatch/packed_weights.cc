#include "runtime/dispatch/packed_weights.h"

#include "generator/bf16.h"
#include "runtime/dispatch/big_buffer.h"

namespace g3 {

size_t PackedWeights::bytes() const {
  return static_cast<size_t>(panels()) * G3_PANEL * K * (dtype == DType::F32 ? 4 : 2);
}

g3_gemm_args PackedWeights::args(const float* a, int64_t M, int64_t lda, float* c, int64_t ldc, int64_t n0,
                                 int64_t n1) const {
  g3_gemm_args g{};
  g.M = M;
  g.K = K;
  g.N = N;
  g.a = a;
  g.lda = lda;
  g.w = data();
  g.w_dtype = dtype == DType::F32 ? G3_DTYPE_F32 : G3_DTYPE_BF16;
  g.n_begin = n0;
  g.n_end = n1;
  g.c = c;
  g.ldc = ldc;
  g.compute = compute == DType::BF16 ? G3_COMPUTE_BF16 : G3_COMPUTE_F32;
  return g;
}

PackedWeights pack_weights(const WeightMatrix& w, DType compute) {
  PackedWeights p;
  p.dtype = compute == DType::BF16 ? DType::BF16 : w.dtype;
  p.compute = compute;
  p.N = w.rows;
  p.K = w.cols;
  size_t bytes = p.bytes();
  p.storage = alloc_big_zeroed(bytes);
  void* mem = p.storage.get();
  for (int64_t n = 0; n < p.N; ++n) {
    int64_t panel = n / G3_PANEL, j = n % G3_PANEL;
    for (int64_t k = 0; k < p.K; ++k) {
      size_t idx = (static_cast<size_t>(panel) * p.K + k) * G3_PANEL + j;
      if (p.dtype == DType::F32) reinterpret_cast<float*>(mem)[idx] = w.f32[n * w.cols + k];
      else if (w.dtype == DType::BF16) reinterpret_cast<uint16_t*>(mem)[idx] = w.bf16[n * w.cols + k];
      else reinterpret_cast<uint16_t*>(mem)[idx] = f32_to_bf16(w.f32[n * w.cols + k]);
    }
  }
  return p;
}

float packed_at(const PackedWeights& p, int64_t n, int64_t k) {
  size_t idx = (static_cast<size_t>(n / G3_PANEL) * p.K + k) * G3_PANEL + n % G3_PANEL;
  if (p.dtype == DType::F32) return static_cast<const float*>(p.data())[idx];
  return bf16_to_f32(static_cast<const uint16_t*>(p.data())[idx]);
}

}  // namespace g3
