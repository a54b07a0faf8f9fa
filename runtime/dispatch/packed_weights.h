// Projection weights repacked once at load into the kernel contract's panel
// layout (G3_PANEL output columns interleaved along K), so every GEMM and
// GEMV backend streams them contiguously. bf16 stays bf16.
#pragma once
#include <cstdint>
#include <memory>

#include "runtime/io/layer_weights.h"
#include "templates/kernel_contract.h"

namespace g3 {

struct PackedWeights {
  DType dtype = DType::F32;
  // The compute mode the weights serve (args() passes it on): in bf16 the
  // weights are bf16 and the GEMM rounds its activations to bf16.
  DType compute = DType::F32;
  int64_t N = 0;  // output columns (rows of the HF matrix)
  int64_t K = 0;  // inner dimension
  std::shared_ptr<uint8_t> storage;  // 64-byte aligned
  const void* data() const { return storage.get(); }
  int64_t panels() const { return (N + G3_PANEL - 1) / G3_PANEL; }
  size_t bytes() const;
  // The contract's arguments for c[M][N] = a[M][K] . W^T over columns [n0, n1).
  g3_gemm_args args(const float* a, int64_t M, int64_t lda, float* c, int64_t ldc, int64_t n0, int64_t n1) const;
};

// compute == BF16 packs f32 weights rounded to bf16 (nearest even).
PackedWeights pack_weights(const WeightMatrix& w, DType compute = DType::F32);

// Element (n, k) of the original matrix, read back from the packed layout.
float packed_at(const PackedWeights& p, int64_t n, int64_t k);

}  // namespace g3
