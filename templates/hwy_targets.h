/* The Highway targets g3attn compiles, as one list: every table that hands
 * out per-target entry points (the attention keys, the projections, the
 * online softmax) expands G3_HWY_FOR_EACH_TARGET with its own entry macro,
 * so the names, bits and order cannot differ from table to table.
 *
 * X(bit, name, ns) is expanded once per target in HWY_TARGETS, best first:
 * bit is Highway's target bit (HWY_AVX2, ...), name its lower-case name
 * (the --isa spelling), ns the namespace foreach_target compiled it into.
 * Include after <hwy/highway.h>, under HWY_ONCE. */
#ifndef G3ATTN_HWY_TARGETS_H_
#define G3ATTN_HWY_TARGETS_H_

#if HWY_TARGETS & HWY_AVX3_DL
#define G3_HWY_TARGET_AVX3_DL(X) X(HWY_AVX3_DL, "avx3_dl", N_AVX3_DL)
#else
#define G3_HWY_TARGET_AVX3_DL(X)
#endif
#if HWY_TARGETS & HWY_AVX3
#define G3_HWY_TARGET_AVX3(X) X(HWY_AVX3, "avx3", N_AVX3)
#else
#define G3_HWY_TARGET_AVX3(X)
#endif
#if HWY_TARGETS & HWY_AVX2
#define G3_HWY_TARGET_AVX2(X) X(HWY_AVX2, "avx2", N_AVX2)
#else
#define G3_HWY_TARGET_AVX2(X)
#endif
#if HWY_TARGETS & HWY_SSE4
#define G3_HWY_TARGET_SSE4(X) X(HWY_SSE4, "sse4", N_SSE4)
#else
#define G3_HWY_TARGET_SSE4(X)
#endif
#if HWY_TARGETS & HWY_SSSE3
#define G3_HWY_TARGET_SSSE3(X) X(HWY_SSSE3, "ssse3", N_SSSE3)
#else
#define G3_HWY_TARGET_SSSE3(X)
#endif
#if HWY_TARGETS & HWY_SCALAR
#define G3_HWY_TARGET_SCALAR(X) X(HWY_SCALAR, "scalar", N_SCALAR)
#else
#define G3_HWY_TARGET_SCALAR(X)
#endif

#define G3_HWY_FOR_EACH_TARGET(X)                                                                    \
  G3_HWY_TARGET_AVX3_DL(X) G3_HWY_TARGET_AVX3(X) G3_HWY_TARGET_AVX2(X) G3_HWY_TARGET_SSE4(X) \
  G3_HWY_TARGET_SSSE3(X) G3_HWY_TARGET_SCALAR(X)

#endif /* G3ATTN_HWY_TARGETS_H_ */
