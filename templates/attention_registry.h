/* The table the Highway attention sources hand out: for each kernel key
 * (a stable readable string, see g3::KernelKey::str() without the weight
 * dtype, which attention does not depend on) and each compiled Highway
 * target, the contract's QK and core functions (kernel_contract.h).
 *
 * Every generated per-key source defines one g3_hwy_key_targets_fn; the
 * generated registry source lists them and implements the lookups below.
 * Plain C types, so a C or C++ engine can use the generated sources as they
 * are (see the README that `g3attn generate` writes). */
#ifndef G3ATTN_ATTENTION_REGISTRY_H_
#define G3ATTN_ATTENTION_REGISTRY_H_

#include <stdint.h>

#include "kernel_contract.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One compiled Highway target of one key. */
typedef struct g3_hwy_target_kernels {
  int64_t target;   /* Highway target bit (HWY_AVX2, ...) */
  const char* isa;  /* its lower-case name: scalar ssse3 sse4 avx2 avx3 avx3_dl */
  g3_qk_fn qk;
  g3_core_fn core;
} g3_hwy_target_kernels;

/* Returns the key's per-target table (best target first) and its length. */
typedef const g3_hwy_target_kernels* (*g3_hwy_key_targets_fn)(int* count);

typedef struct g3_hwy_key_entry {
  const char* key;                /* e.g. "dh256_g2_local1024_b10000_s1_a0.0625_kvf32" */
  g3_hwy_key_targets_fn targets;
} g3_hwy_key_entry;

/* The keys generated into this build, in generation order. */
extern const g3_hwy_key_entry g3_hwy_keys[];
extern const int g3_hwy_key_count;

/* Fills out->qk and out->core (gemm and rmsnorm are left null) for `key` on
 * `isa`, where isa is a target name or "best" (the best target that is both
 * compiled and supported by this CPU). Returns 1 on success, 0 when the key
 * was not generated or the target is not compiled or not supported here. */
int g3_hwy_lookup(const char* key, const char* isa, g3_kernel_table* out);

/* The name of the best target compiled and supported here. */
const char* g3_hwy_best_isa(void);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* G3ATTN_ATTENTION_REGISTRY_H_ */
