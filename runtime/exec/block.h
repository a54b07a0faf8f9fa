// One layer's attention block on the fast kernels: weights packed once,
// kernels resolved once (one dispatch at the top, same-target calls below),
// then called through the kernel contract. Two entry points: without a cache
// (`g3attn apply`, the golden cases) and with a KV cache, threaded (the
// model stack of model.h: chunked prefill and decode).
#pragma once
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "generator/catalogue.h"
#include "generator/kernel_key.h"
#include "runtime/dispatch/kernel_registry.h"
#include "runtime/dispatch/onednn_matmul.h"
#include "runtime/dispatch/onednn_route.h"
#include "runtime/dispatch/packed_weights.h"
#include "runtime/exec/kv_cache.h"
#include "runtime/exec/thread_pool.h"
#include "runtime/io/layer_weights.h"

namespace g3 {

struct PreparedLayer {
  LayerSpec spec;
  KernelKey key;
  // The kernels of prefill-sized calls, and of decode-sized ones (at most
  // BlockSplit::decode_max_tokens tokens per row): the same unless `auto`
  // found another backend faster for one phase (profile.h).
  KernelChoice kernels, decode;
  // Under auto, where the profile found another backend fastest at some
  // contexts (context_routes in profile.h): per phase, each choice with the
  // smallest context it serves, in rising order; empty when one choice
  // serves every context.
  struct AtContext {
    int64_t from = 0;
    KernelChoice choice;
  };
  std::vector<AtContext> by_context[2];
  // The kernels of a call of T tokens per row into a cache that has seen
  // `context` real tokens (this call's included).
  const KernelChoice& for_call(int64_t T, int64_t decode_max_tokens, int64_t context) const {
    const Phase ph = T <= decode_max_tokens ? Phase::Decode : Phase::Prefill;
    const KernelChoice* c = ph == Phase::Decode ? &decode : &kernels;
    for (const AtContext& a : by_context[size_t(ph)])
      if (context >= a.from) c = &a.choice;
    return *c;
  }
  // q, k and v projections fused into one [N*dh + 2*Nkv*dh, D] matrix so the
  // normed input is streamed once; then the output projection.
  PackedWeights wqkv, wo;
  std::vector<float> q_norm, k_norm, input_norm, post_norm;
  // Who runs the projection stage (onednn_route.h): what the layer asked
  // for, the provider of each phase (indexed by Phase) and, when a phase
  // runs on oneDNN, both matrices in oneDNN's layout (shared by copies).
  ProjectionRoute proj_route = ProjectionRoute::Auto;
  ProjProvider proj[2] = {ProjProvider::Highway, ProjProvider::Highway};
  std::shared_ptr<const OnednnMatmul> onednn_qkv, onednn_o;
  ProjProvider proj_for_rows(int64_t rows) const { return proj[size_t(projection_phase(rows))]; }
};

// compute: the compute mode (kernel_key.h); bf16 packs the weights as bf16.
// proj: the projection provider asked for (auto: onednn_route.h's table).
PreparedLayer prepare_layer(const LayerSpec& spec, const LayerWeights& w, DType kv_dtype, const std::string& backend,
                            const std::string& isa, DType compute = DType::F32,
                            ProjectionRoute proj = ProjectionRoute::Auto);

// Sets the projection provider of one phase of a prepared layer, making its
// oneDNN matrices on first need: the per-layer hook of a tune profile, and
// how bench times each provider. InputError when oneDNN cannot serve it.
void set_layer_projection(PreparedLayer& L, Phase phase, ProjProvider p);

// One block call without a cache, as `g3attn apply` and the golden cases
// run it: B rows of T tokens; keys are this call's tokens; key_real[b*T+s]
// marks real tokens (null: all real). Rows with no visible key are
// don't-care (zeros in attn_out). attn_out may be null.
void run_block_nocache(const PreparedLayer& L, const float* x, const int32_t* positions, const int32_t* key_real,
                       int64_t B, int64_t T, float* block_out, float* attn_out);

// An allocator of whole 64-byte lines: the kernels read a head's row of the
// scratch below as full vectors, and a row that starts mid-line splits every
// such load across two lines (std::vector's default alignment is 16 bytes).
template <class T>
struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <class U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const LineAligned<U>&) const { return true; }
};

// Buffers reused from call to call and layer to layer (sized on first use).
struct BlockScratch {
  std::vector<float, LineAligned<float>> u, qkv, q, enc, a, part_out, part_lse;
  std::vector<int64_t> slot;
  std::vector<int32_t> pieces_done;  // per KV head of a decode call: its pieces finished so far
};

// How run_block_cached splits its work. Where items are summed (KV chunks
// merged by lse) the split depends only on the shapes and the machine's core
// count, never on the pool's size, so results are bit-identical for any
// --threads; GEMM items each compute whole output columns, so their split
// may follow the pool.
struct BlockSplit {
  int64_t row_block = 64;          // GEMM rows per work item
  int64_t col_panels = 4;          // GEMM output columns per item, in G3_PANEL units
  int64_t gemv_rows = 16;          // GEMM calls of at most this many rows stream their weights:
  int64_t gemv_items_per_thread = 2;  // their columns go to this many contiguous items per thread
  int64_t token_block = 32;        // rows per rmsnorm / qk item
  int64_t query_tile = 64;         // query tokens per attention-core item
  // Decode: a long cache is cut into pieces, merged by lse, for about
  // decode_items core items per call (2 per hardware thread), none shorter
  // than kv_chunk slots. Few, long pieces: each costs a kernel call, a
  // finish and a share of the merge. On AMD EPYC Zen 5 (2 threads), 8 items
  // instead of 64 took 4B's global decode over 4096 to 0.76x the time, and
  // 4 instead of 8 the decode rows of 1B and 4B to 0.93-0.96x (median).
  int64_t kv_chunk = 256;
  int64_t decode_items = 2 * int64_t(ThreadPool::default_threads());
  int64_t decode_max_tokens = 8;   // calls with at most this many tokens split KV
};

// The stages of one block call, in order, as BlockStageTimes names them:
// cache slots (checks and slot assignment), pre-norm (step 1), the fused
// q/k/v projection (A), QK-norm + RoPE + alpha + cache write (B-D), the
// attention core (E-I), the output projection (J), post-norm and residual
// (3-4).
struct BlockStageTimes {
  static constexpr int kCount = 7;
  static const char* name(int i);
  double ms[kCount] = {};  // wall time of each stage of the call
};

// One block call that appends to a KV cache: B rows of T new tokens each,
// x and y [B][T][D] (y must not alias x), positions [B][T]; real[b*T+t] == 0
// marks a padding token (never written to the cache, its output row is
// computed but is don't-care when it sees no key); real may be null. Keys are
// every real token the cache holds for the row, including this call's.
// Equals the official full-length layout (SPEC 1.3-1.6) for every row with at
// least one visible key, within f32 rounding. y may be null: the call then
// stops after the output projection, before the post-norm, and leaves the
// attention output [B*T][D] in scratch.a (the C API's attention call, and a
// head range's partial output projection, which is summed before the
// post-norm; see head_range.h). `times`, when given, receives the wall time
// of each stage of the call (`g3attn bench`'s block rows report them);
// stages the call skips (y null: the post-norm) stay 0.
void run_block_cached(const PreparedLayer& L, LayerKvCache& cache, const float* x, const int32_t* positions,
                      const uint8_t* real, int64_t B, int64_t T, float* y, ThreadPool& pool, BlockScratch& scratch,
                      const BlockSplit& split = {}, BlockStageTimes* times = nullptr);

// The stages of run_block_cached that `g3attn bench` times on their own
// (its prefill, decode and projections rows), exactly as the block runs them.
// Sizes the scratch for a call of R = B * T rows.
void reserve_scratch(const PreparedLayer& L, int64_t R, BlockScratch& scratch);
// Step A: scratch.u [R][D] -> scratch.qkv [R][(N + 2 Nkv) dh].
void run_qkv_projection(const PreparedLayer& L, int64_t R, ThreadPool& pool, BlockScratch& scratch,
                        const BlockSplit& split = {});
// Step J: scratch.enc [R][N dh] -> scratch.a [R][D].
void run_out_projection(const PreparedLayer& L, int64_t R, ThreadPool& pool, BlockScratch& scratch,
                        const BlockSplit& split = {});
// Steps E-I once the call's K/V are in `cache` and its alpha-scaled queries
// in scratch.q [B][T][N][dh]: scratch.enc [B][T][N][dh]. Query tiles per KV
// head; short calls (decode) split long caches into chunks merged by their
// log-sum-exp.
void run_attention_core(const PreparedLayer& L, const LayerKvCache& cache, const int32_t* positions, int64_t B,
                        int64_t T, ThreadPool& pool, BlockScratch& scratch, const BlockSplit& split = {});

// The same layer with the kernels of another KV dtype, backend or ISA (and
// the same compute mode); the packed weights are shared, not copied.
PreparedLayer with_kernels(const PreparedLayer& base, DType kv_dtype, const std::string& backend,
                           const std::string& isa);

}  // namespace g3
