// The tile loop of the Xbyak backend, compiled once per instruction set.
// No global -m flags: each copy is a region under `#pragma GCC target`, so
// only these functions may use AVX2 or AVX-512, and the backend calls a copy
// only after checking the CPU (xbyak_backend.cc).
#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

// The AVX2 copy's to_bf16_pairs (never reached, as vdpbf16ps needs AVX-512,
// but it must compile) rounds with the project's one scalar f32_to_bf16.
#include "generator/bf16.h"
#include "generator/xbyak/xbyak_core.h"
// The decode prefetch's default distance (the tile loop passes it to qk_direct).
#include "templates/decode_prefetch.h"
// The per-thread buffers of the tile loop; included here, before the target
// regions, so the buffer code is compiled for the baseline ISA only once.
#include "templates/scratch.h"

namespace g3::xbyak {

// GCC 12 reports the deliberately undefined pass-through operand inside
// several AVX-512 intrinsics as "may be used uninitialized" (a false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,bmi,bmi2")
#define G3X_NS avx512_impl
#define G3X_VL 16
#include "generator/xbyak/core_driver-inl.h"
#undef G3X_NS
#undef G3X_VL
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2")
#define G3X_NS avx2_impl
#define G3X_VL 8
#include "generator/xbyak/core_driver-inl.h"
#undef G3X_NS
#undef G3X_VL
#pragma GCC pop_options

#pragma GCC diagnostic pop

void core_avx512(const CoreContext* ctx, const g3_core_args* a) { avx512_impl::core(ctx, a); }
void core_avx2(const CoreContext* ctx, const g3_core_args* a) { avx2_impl::core(ctx, a); }

}  // namespace g3::xbyak
