/* The kernel contract: the one ABI that every backend (scalar reference,
 * Highway AOT, LLVM ORC, Xbyak) implements for a kernel key.
 *
 * Plain C: functions over plain pointers and strides, no STL, so generated,
 * JIT-compiled and hand-written code are interchangeable and a test can run
 * all of them on the same buffers. `g3attn generate` copies this header next
 * to the generated sources, so it must stay self-contained.
 *
 * Stages (SPEC.md section 1.3):
 *   g3_qk_fn    steps B-D: QK RMSNorm (1+w), RoPE (half-split), q *= alpha,
 *               and the write of K (post-RoPE) and V (raw) into the cache;
 *   g3_core_fn  steps E-I: logits, structured mask, softmax, P.V for the G
 *               query heads that share one KV head;
 *   g3_gemm_fn  steps A and J: the projections, C = A . W^T with W packed.
 *
 * Cache layout (DESIGN.md): per sequence and per KV head, slots are
 * contiguous: element h of slot s of KV head j is at
 * (j * cache_head_stride + s) * head_dim. Elements are f32 or bf16
 * (upper 16 bits of an f32, round-to-nearest-even when written).
 *
 * Structured mask (DESIGN.md "Masks"; implemented once, in mask_rule.h):
 * key slot s is visible to query t iff
 *   kvalid[s] != 0
 *   && causal(t, s)
 *   && (window == 0 || |qpos[t] - kpos[s]| < window)     (int64 arithmetic)
 * where causal(t, s) is, by g3_core_args::causal,
 *   G3_CAUSAL_POSITIONS:  kpos[s] <= qpos[t]
 *   G3_CAUSAL_SLOTS:      s <= t + causal_offset
 * SPEC 1.4 and 1.6: in the official code causality comes from the caller's
 * mask (slot order), never from positions; positions only feed RoPE and the
 * sliding window, which is symmetric. A call whose keys are its own tokens
 * (no cache) uses G3_CAUSAL_SLOTS, so packed documents, repeated positions,
 * gaps and decreasing positions all mean what they mean officially. A KV
 * cache whose real tokens have strictly increasing positions per row (the
 * runtime's caches refuse anything else) may use G3_CAUSAL_POSITIONS: there
 * position order is arrival order, so the two rules agree, and a ring buffer
 * need not keep its slots in order. Slots with kvalid == 0 never touch an
 * output, whatever bits they hold (NaN and Inf included).
 * A query with no visible key gets an all-zero output and lse = -inf (the
 * block reference keeps the official uniform average; such rows are
 * don't-care).
 */
#ifndef G3ATTN_KERNEL_CONTRACT_H_
#define G3ATTN_KERNEL_CONTRACT_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { G3_DTYPE_F32 = 0, G3_DTYPE_BF16 = 1 };
/* g3_core_args::causal; zero-initialised arguments mean G3_CAUSAL_POSITIONS. */
enum { G3_CAUSAL_POSITIONS = 0, G3_CAUSAL_SLOTS = 1 };
/* The compute mode of a call (zero-initialised: f32). G3_COMPUTE_BF16: the
 * inputs of every dot product are rounded to bf16 (nearest even) before
 * their products, which accumulate in f32: in the core q and K for the
 * logits, the softmax weights p and V for P.V (the softmax itself, its max
 * and its sum l stay f32: out = sum_s bf16(p_s) bf16(v_s) / sum_s p_s); in a
 * GEMM the activations a (the weights are bf16 in this mode). */
enum { G3_COMPUTE_F32 = 0, G3_COMPUTE_BF16 = 1 };

/* Packed projection weights: output columns are grouped in panels of
 * G3_PANEL. Panel p holds, for k = 0..K-1 in order, the G3_PANEL values
 * W[p*G3_PANEL + j][k], j = 0..G3_PANEL-1 (W is HF's [out, in] matrix);
 * columns past the end of W are zero. Element type f32 or bf16. */
#define G3_PANEL 32

/* Stage B-D. Tokens are independent, so callers may split t freely. */
typedef struct g3_qk_args {
  int64_t T;               /* tokens */
  int32_t num_heads;       /* N */
  int32_t num_kv_heads;    /* Nkv */
  const float* q;          /* raw q projection: token t, head n at q + t*q_stride + n*head_dim */
  int64_t q_stride;
  const float* k;          /* raw k projection: token t, KV head j at k + t*kv_stride + j*head_dim */
  const float* v;          /* raw v projection, same layout as k */
  int64_t kv_stride;
  const int32_t* pos;      /* [T] RoPE positions (>= 0) */
  const float* q_norm;     /* [head_dim], zero-centred: multiply by (1 + w) */
  const float* k_norm;     /* [head_dim] */
  float* q_out;            /* normed, rotated, alpha-scaled q; same layout as q with q_out_stride */
  int64_t q_out_stride;
  void* k_cache;           /* the sequence's cache, layout above, dtype kv_dtype */
  void* v_cache;
  int64_t cache_head_stride;  /* slots per KV head in k_cache / v_cache */
  const int64_t* slot;     /* [T] slot receiving token t's K/V; < 0 means do not write */
  /* The key's constants at run time. Specialised kernels have them baked in
   * and must only be called with matching values; generic kernels read them. */
  int32_t head_dim;
  int32_t kv_dtype;        /* G3_DTYPE_F32 | G3_DTYPE_BF16 */
  float alpha;             /* query_pre_attn_scalar^-1/2 */
  float eps;               /* RMSNorm epsilon inside the rsqrt */
  double rope_base;        /* beta of this layer kind */
  double rope_scale;       /* sigma >= 1: angles are divided by it */
} g3_qk_args;

/* Stage E-I for one KV head and its G query heads. */
typedef struct g3_core_args {
  int64_t T;               /* query tokens */
  const float* q;          /* token t, group head g at q + t*q_stride + g*head_dim (already alpha-scaled) */
  int64_t q_stride;
  const int32_t* qpos;     /* [T] */
  const void* k;           /* this KV head's keys: slot s at k + s*head_dim elements */
  const void* v;           /* values, same layout */
  int64_t S;               /* slots 0..S-1 are scanned */
  const int32_t* kpos;     /* [S] stored position of each slot */
  const uint8_t* kvalid;   /* [S] nonzero: the slot holds a real token */
  float* out;              /* token t, head g at out + t*out_stride + g*head_dim; normalised */
  int64_t out_stride;
  float* lse;              /* optional [T*G], index t*G+g: natural log of sum(exp(logit)) over
                              visible keys, -INFINITY when none; lets callers merge KV chunks */
  int32_t head_dim;
  int32_t group;           /* G = N / Nkv */
  int32_t window;          /* W on local layers, 0 on global layers */
  int32_t kv_dtype;
  int32_t causal;          /* G3_CAUSAL_POSITIONS or G3_CAUSAL_SLOTS (see the mask above) */
  int64_t causal_offset;   /* G3_CAUSAL_SLOTS: query t sees slots s <= t + causal_offset */
  int32_t compute;         /* G3_COMPUTE_F32 or G3_COMPUTE_BF16 */
  /* A speed hint for decode-sized calls (a few query rows over a long
   * cache, which run at the memory's pace): how far ahead of its loads the
   * core asks for K and V rows (bytes of K and V together) and into which
   * cache level (G3_PREFETCH_L1 or G3_PREFETCH_L2). Zero: the core's
   * default (decode_prefetch.h). Which is fastest depends on the CPU, so
   * the runtime passes what `g3attn tune` measured. It never changes an
   * output. */
  int32_t prefetch_bytes;
  int32_t prefetch_level;
} g3_core_args;
enum { G3_PREFETCH_DEFAULT = 0, G3_PREFETCH_L1 = 1, G3_PREFETCH_L2 = 2 };

/* Steps A and J: c[m][n] = sum_k a[m][k] * W[n][k] for m < M, n_begin <= n < n_end.
 * n_begin is a multiple of G3_PANEL; n_end is a multiple of G3_PANEL or N. */
typedef struct g3_gemm_args {
  int64_t M, K, N;         /* N = rows of W (output columns) */
  const float* a;          /* [M][K] with row stride lda */
  int64_t lda;
  const void* w;           /* packed as described at G3_PANEL */
  int32_t w_dtype;
  int64_t n_begin, n_end;
  float* c;                /* [M][N] with row stride ldc */
  int64_t ldc;
  int32_t compute;         /* G3_COMPUTE_F32 or G3_COMPUTE_BF16 (a rounded to bf16) */
} g3_gemm_args;

typedef void (*g3_qk_fn)(const g3_qk_args*);
typedef void (*g3_core_fn)(const g3_core_args*);
typedef void (*g3_gemm_fn)(const g3_gemm_args*);

/* RMSNorm over rows of n floats (SPEC 2.1): y = x * rsqrt(mean(x^2) + eps) * (1 + w),
 * then y += residual when residual is not null (the block's post-norm + residual);
 * residual rows have the stride y_stride. y may alias x. */
typedef void (*g3_rmsnorm_fn)(const float* x, int64_t rows, int64_t n, int64_t x_stride,
                              const float* w, float eps, const float* residual,
                              float* y, int64_t y_stride);

/* What one backend offers for one kernel key on one ISA. A null entry means
 * "not provided": the runtime takes that stage from the Highway backend. */
typedef struct g3_kernel_table {
  g3_qk_fn qk;
  g3_core_fn core;
  g3_gemm_fn gemm;
  g3_rmsnorm_fn rmsnorm;
} g3_kernel_table;

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* G3ATTN_KERNEL_CONTRACT_H_ */
