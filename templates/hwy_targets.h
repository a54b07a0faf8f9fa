/* The x86 Highway targets g3attn knows, as one list: the --isa names, their
 * order and their Highway target bits are written here and nowhere else.
 * Every table that hands out per-target entry points (the attention keys,
 * the projections, the online softmax) expands G3_HWY_FOR_EACH_TARGET with
 * its own entry macro, and generator/isa.cc builds the ISA table from
 * G3_HWY_FOR_EVERY_TARGET, so names, bits and order cannot differ between
 * them. `g3attn generate` copies this file next to attention_key-inl.h.
 *
 * X(bit, name, ns): bit is Highway's target bit (HWY_AVX2, ...), name its
 * lower-case name (the --isa spelling), ns the namespace foreach_target
 * compiles that target into (N_AVX2, ...). Both lists run best first, the
 * order in which "best" tries them. Include after <hwy/highway.h>; expand
 * G3_HWY_FOR_EACH_TARGET only under HWY_ONCE, where every target's namespace
 * has been compiled. */
#ifndef G3ATTN_HWY_TARGETS_H_
#define G3ATTN_HWY_TARGETS_H_

/* The list itself: E(X, T, name) once per target, T being the suffix of
 * Highway's HWY_<T> bit and N_<T> namespace. */
#define G3_HWY_TARGET_LIST_(E, X) \
  E(X, AVX3_DL, "avx3_dl") E(X, AVX3, "avx3") E(X, AVX2, "avx2") E(X, SSE4, "sse4") E(X, SSSE3, "ssse3") \
  E(X, SCALAR, "scalar")

/* G3_HWY_IF_<T>(x) is x when this translation unit compiles target T
 * (HWY_TARGETS), else nothing: the namespace N_<T> exists only then. */
#if HWY_TARGETS & HWY_AVX3_DL
#define G3_HWY_IF_AVX3_DL(x) x
#else
#define G3_HWY_IF_AVX3_DL(x)
#endif
#if HWY_TARGETS & HWY_AVX3
#define G3_HWY_IF_AVX3(x) x
#else
#define G3_HWY_IF_AVX3(x)
#endif
#if HWY_TARGETS & HWY_AVX2
#define G3_HWY_IF_AVX2(x) x
#else
#define G3_HWY_IF_AVX2(x)
#endif
#if HWY_TARGETS & HWY_SSE4
#define G3_HWY_IF_SSE4(x) x
#else
#define G3_HWY_IF_SSE4(x)
#endif
#if HWY_TARGETS & HWY_SSSE3
#define G3_HWY_IF_SSSE3(x) x
#else
#define G3_HWY_IF_SSSE3(x)
#endif
#if HWY_TARGETS & HWY_SCALAR
#define G3_HWY_IF_SCALAR(x) x
#else
#define G3_HWY_IF_SCALAR(x)
#endif

#define G3_HWY_EVERY_ENTRY_(X, T, name) X(HWY_##T, name, N_##T)
#define G3_HWY_COMPILED_ENTRY_(X, T, name) G3_HWY_IF_##T(X(HWY_##T, name, N_##T))

/* Every target, compiled or not (ns must then go unused). */
#define G3_HWY_FOR_EVERY_TARGET(X) G3_HWY_TARGET_LIST_(G3_HWY_EVERY_ENTRY_, X)
/* The targets compiled into this translation unit. */
#define G3_HWY_FOR_EACH_TARGET(X) G3_HWY_TARGET_LIST_(G3_HWY_COMPILED_ENTRY_, X)

#endif /* G3ATTN_HWY_TARGETS_H_ */
