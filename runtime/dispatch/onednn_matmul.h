// The projections (SPEC 1.3 steps A and J, c = a . W^T) through oneDNN's
// matmul primitive, the second provider of the projection stage beside
// Highway's GEMM/GEMV (onednn_route.h says which one runs when).
//
// oneDNN picks its implementation per CPU at run time: AMX tiles
// (tdpbf16ps) for bf16 on Sapphire and Emerald Rapids, vdpbf16ps on Zen 4,
// AVX-512 FMA for f32. Two rules keep it fast:
//   - the weights are reordered once, at load, into the layout oneDNN
//     prefers (format_tag::any), which does not depend on the number of
//     rows M; the packed panel copy of PackedWeights is the source;
//   - primitives are created once per shape (M and the row strides) and
//     reused by every later call of that shape: creating one costs more
//     than running it.
//
// Numerics follow the kernel contract (g3_gemm_args::compute): in the f32
// mode the weights are widened to f32 (exactly) and the products and sums
// are f32; in the bf16 mode the activations are rounded to bf16 here, by
// the contract's rule (generator/bf16.h: nearest even, NaN kept), before
// oneDNN sees them, and oneDNN multiplies bf16 by bf16 into f32 sums. The
// only differences from ref::gemm are the order of the f32 additions and,
// on AMX and vdpbf16ps, subnormal bf16 inputs read as zero.
//
// Threads. Debian builds oneDNN on OpenMP, so every call would otherwise
// start an OpenMP team beside the runtime's pool and leave it spinning
// after the call, on cores the pool's next stage needs. Instead the pool
// splits a call into row blocks of fixed height (the split depends only
// on the shape, so results are the same for any thread count) and each
// block runs oneDNN with OpenMP held to one thread in the calling thread:
// no OpenMP team ever starts. The other arrangement (one call with
// omp_set_num_threads(pool size) while the pool waits) measured slower for
// the whole block here; README's oneDNN section has the numbers.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/dispatch/packed_weights.h"

namespace g3 {

// Rows per block of a split call. oneDNN's fast kernels (brgemm) read and
// write dense matrices only, so a call splits along its rows (each block a
// dense slice of the activations and of the output, against all of the
// weights, which stay in the last-level cache across blocks). 128 rows
// make four even blocks of a 512-token chunk and a block's call far longer
// than its overhead.
inline constexpr int64_t kOnednnBlockRows = 128;

// "" when oneDNN can run projections of this compute mode here, else why
// not (it could not create a matmul primitive on this CPU).
std::string onednn_unavailable_reason(DType compute);

class OnednnMatmul {
 public:
  // Reorders w (packed panels, f32 or bf16) into oneDNN's layout for
  // w.compute: f32 weights in the f32 mode, bf16 in the bf16 mode.
  // std::runtime_error when oneDNN cannot serve the shape.
  explicit OnednnMatmul(const PackedWeights& w);
  ~OnednnMatmul();
  OnednnMatmul(const OnednnMatmul&) = delete;
  OnednnMatmul& operator=(const OnednnMatmul&) = delete;

  int64_t N() const;
  int64_t K() const;
  DType compute() const;
  size_t bytes() const;  // the reordered weights
  // oneDNN's implementation for calls of M rows, e.g.
  // "brg:avx512_core_amx_bf16" (creates the primitives of that shape).
  std::string implementation(int64_t M) const;

  // One call: c[m][n] = sum_k a[m][k] W[n][k] for m < M, all n, rows of a
  // lda floats apart and of c ldc floats apart. `parallel_for(n, fn)` runs
  // fn(0..n-1) spread over the caller's threads (the runtime's pool); each
  // block of kOnednnBlockRows rows rounds its activations (bf16 mode) and
  // runs oneDNN on them.
  using ParallelFor = std::function<void(int64_t, const std::function<void(int64_t)>&)>;
  void run(const float* a, int64_t M, int64_t lda, float* c, int64_t ldc, const ParallelFor& parallel_for) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Rounds rows [r0, r1) of a [.][K] f32 matrix (row stride lda) to bf16 by the
// contract's rule into dst (row stride K). Exposed for the tests.
void round_rows_to_bf16(const float* a, int64_t lda, int64_t K, int64_t r0, int64_t r1, uint16_t* dst);

}  // namespace g3
