// Highway kernels for the attention block's projections and row RMSNorm:
//   - GEMM / GEMV  c[m][n] = sum_k a[m][k] * W[n][k]   (SPEC 1.3 steps A and J,
//     the einsums "BTD,NDH->BTNH", "BSD,CKDH->CBSKH" and "BTNH,NHD->BTD" written
//     as one matrix product against HF's [out, in] matrix W);
//   - RMSNorm rows  y = x * rsqrt(mean(x^2) + eps) * (1 + w) [+ residual]
//     (SPEC 2.1; the block's pre-norm, and its post-norm followed by the
//     residual add of SPEC 1.2 step 4).
// The arguments and the packed weight layout are those of
// templates/kernel_contract.h (g3_gemm_args, G3_PANEL, g3_rmsnorm_fn).
//
// This is a Highway "-inl.h" module: projections.cc includes it once per
// target through hwy/foreach_target.h, so the include guard below flips on
// every pass instead of blocking re-inclusion. Included on its own it
// compiles for the static target, which keeps it valid C++ by itself.
//
// Shapes are runtime values: a GEMM needs no compile-time shape to be fast
// (DESIGN.md, "The specialisation key"), so one instance serves every model.

#if defined(G3ATTN_TEMPLATES_PROJECTIONS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef G3ATTN_TEMPLATES_PROJECTIONS_INL_H_
#undef G3ATTN_TEMPLATES_PROJECTIONS_INL_H_
#else
#define G3ATTN_TEMPLATES_PROJECTIONS_INL_H_
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "bf16-inl.h"
#include "kernel_contract.h"
#include "scratch.h"

HWY_BEFORE_NAMESPACE();
namespace g3 {
namespace HWY_NAMESPACE {
namespace proj {

namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
// Every x86 target has a compile-time vector length; the register tiles below
// are sized from it.
constexpr size_t kLanes = hn::MaxLanes(DF());
static_assert(G3_PANEL % kLanes == 0, "a panel must be a whole number of vectors");

// ---------------------------------------------------------------------------
// Register tile of the prefill GEMM: kMR rows of A times kCV vectors of
// output columns, all kMR * kCV accumulators live in registers for a whole
// K block. Per k step the tile loads kCV weight vectors and broadcasts kMR
// values of A, then issues kMR * kCV FMAs, so the FMA units, not the loads,
// set the pace as long as the accumulators fit the register file:
//   AVX-512 (32 zmm): 12 x 2 = 24 accumulators, one tile covers a whole
//                     32-column panel;
//   AVX2 / SSE (16 registers): 6 x 2 = 12 accumulators over 16 or 8 columns,
//                     a panel is walked in 2 or 4 column slices;
//   scalar: 4 x 4.
// (14 x 2 on AVX-512 measured no faster than 12 x 2.) The G3_PROJ_* macros
// below exist only so that block sizes can be re-measured without editing
// this file; the defaults are the measured best on Zen 4.
// ---------------------------------------------------------------------------
#ifndef G3_PROJ_MR512
#define G3_PROJ_MR512 12
#endif
constexpr size_t kMR = kLanes >= 16 ? G3_PROJ_MR512 : (kLanes >= 4 ? 6 : 4);
constexpr size_t kCV = kLanes >= 4 ? 2 : 4;
constexpr size_t kSliceCols = kCV * kLanes;
static_assert(G3_PANEL % kSliceCols == 0, "column slices must tile a panel");

// K block: the weight block of one panel (G3_PANEL x kKC f32 = 64 KiB) stays
// in L2 while every row tile of the M block streams past it; each register
// tile runs kKC FMA steps between loads/stores of c. Measured on Zen 4 with
// the 1B projections (512 x 1536 x 1152): 512 beat 128 and 256 by 5-10%, 768
// was no better.
#ifndef G3_PROJ_KC
#define G3_PROJ_KC 512
#endif
#ifndef G3_PROJ_MC_ROWS
#define G3_PROJ_MC_ROWS 192
#endif
constexpr size_t kKC = G3_PROJ_KC;
// M block: the packed A block (kMC x kKC f32, 384 KiB) stays in L2 (1 MiB
// on Zen 4) while all panels of this call's column range stream past it, so
// the weights are read from memory ceil(M / kMC) times.
constexpr size_t kMC = kMR * std::max<size_t>(1, G3_PROJ_MC_ROWS / kMR);

// Largest M that takes the GEMV path (decode and small batches), which runs
// groups of up to 4 rows straight off the packed weights, so W is read
// ceil(M / 4) times. Up to here that beats the blocked path, whose row tiles
// would be partly padding and whose packing and bf16 staging serve only one
// or two tiles: measured on Zen 4 (K = 1152, N = 1536, weights in cache) the
// GEMV groups run at 95-117 GFLOP/s for M = 5..24 on AVX2 and AVX-512, the
// blocked path at 36-113. 16 keeps the re-reads (at most 4) affordable when
// the weights come from DRAM.
#ifndef G3_PROJ_GEMV_MAX_ROWS
#define G3_PROJ_GEMV_MAX_ROWS 16
#endif
constexpr size_t kGemvMaxRows = G3_PROJ_GEMV_MAX_ROWS;

// Loads kLanes bf16 values (the upper halves of f32 values) as f32. The bf16
// tag is derived from the f32 one by Rebind (same lane count), and the
// widening goes through u16 -> u32 so it compiles on HWY_SCALAR too
// (TOOLCHAIN.md, Highway pitfall 1). The conversion is exact.
HWY_INLINE hn::Vec<DF> LoadBF16(const uint16_t* HWY_RESTRICT p) {
  const DF df;
  const hn::RebindToUnsigned<DF> du32;
  const hn::Rebind<uint16_t, DF> du16;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, p))));
}

// Copies rows [0, rows) and columns [col_lo, col_hi) of an R x W tile to c, adding to what is there when `accumulate`. Used for the ragged
// edges (M tail, the zero-padded last panel, column sub-ranges).
template <size_t R, size_t W>
HWY_INLINE void StorePartial(const float* HWY_RESTRICT tile, size_t rows, size_t col_lo, size_t col_hi,
                             float* HWY_RESTRICT c, int64_t ldc, bool accumulate) {
  for (size_t i = 0; i < rows && i < R; ++i) {
    float* HWY_RESTRICT cr = c + static_cast<int64_t>(i) * ldc;
    for (size_t j = col_lo; j < col_hi; ++j) cr[j] = accumulate ? cr[j] + tile[i * W + j] : tile[i * W + j];
  }
}

// The register tile (see kMR above). ap holds the packed A tile: for each k,
// the kMR row values side by side, so the broadcasts walk one pointer. wp is
// the weight block at this slice's first column; consecutive k are wstride
// floats apart. c is the tile's first output element. Kept out of line (and
// `inline` for the one-definition rule, as this header may be included by
// several translation units) so its 24 accumulators get the whole register
// file to themselves.
HWY_NOINLINE inline void MicroTile(size_t kc, const float* HWY_RESTRICT ap, const float* HWY_RESTRICT wp,
                            size_t wstride, float* HWY_RESTRICT c, int64_t ldc, size_t rows, size_t col_lo, size_t col_hi,
                            bool accumulate) {
  const DF df;
  using V = hn::Vec<DF>;
  // The c tile is read (later K blocks) or written back only after the K
  // loop, by which time a large output has left the cache; asking for its
  // lines now lets those misses overlap with the FMAs instead of stalling
  // on them at the end. (Cheap insurance: on the 1B shapes the gain was
  // within measurement noise.)
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < kSliceCols; j += 64 / sizeof(float))
      __builtin_prefetch(c + static_cast<int64_t>(i) * ldc + j, 1, 3);
  V acc[kMR][kCV];
  for (size_t i = 0; i < kMR; ++i)
    for (size_t v = 0; v < kCV; ++v) acc[i][v] = hn::Zero(df);

  for (size_t k = 0; k < kc; ++k) {
    V w[kCV];
    for (size_t v = 0; v < kCV; ++v) w[v] = hn::LoadU(df, wp + k * wstride + v * kLanes);
    const float* HWY_RESTRICT ak = ap + k * kMR;
    for (size_t i = 0; i < kMR; ++i) {
      const V a = hn::Set(df, ak[i]);
      for (size_t v = 0; v < kCV; ++v) acc[i][v] = hn::MulAdd(a, w[v], acc[i][v]);
    }
  }

  if (rows == kMR && col_lo == 0 && col_hi == kSliceCols) {
    for (size_t i = 0; i < kMR; ++i) {
      float* HWY_RESTRICT cr = c + static_cast<int64_t>(i) * ldc;
      for (size_t v = 0; v < kCV; ++v) {
        V r = acc[i][v];
        if (accumulate) r = hn::Add(r, hn::LoadU(df, cr + v * kLanes));
        hn::StoreU(r, df, cr + v * kLanes);
      }
    }
    return;
  }
  HWY_ALIGN float tile[kMR * kSliceCols];
  for (size_t i = 0; i < kMR; ++i)
    for (size_t v = 0; v < kCV; ++v) hn::Store(acc[i][v], df, tile + i * kSliceCols + v * kLanes);
  StorePartial<kMR, kSliceCols>(tile, rows, col_lo, col_hi, c, ldc, accumulate);
}

// Packs rows [m0, m0 + mc) x columns [k0, k0 + kc) of A into row tiles of kMR
// rows, k-major inside a tile; rows past mc are zero so the tail tile can run
// the full register tile (its extra rows are never stored).
HWY_INLINE void PackA(const float* HWY_RESTRICT a, int64_t lda, size_t m0, size_t mc, size_t k0, size_t kc,
                      float* HWY_RESTRICT out) {
  const size_t tiles = (mc + kMR - 1) / kMR;
  for (size_t t = 0; t < tiles; ++t) {
    float* HWY_RESTRICT o = out + t * kMR * kc;
    for (size_t i = 0; i < kMR; ++i) {
      const size_t m = t * kMR + i;
      if (m < mc) {
        const float* HWY_RESTRICT ar = a + static_cast<int64_t>(m0 + m) * lda + static_cast<int64_t>(k0);
        for (size_t k = 0; k < kc; ++k) o[k * kMR + i] = ar[k];
      } else {
        for (size_t k = 0; k < kc; ++k) o[k * kMR + i] = 0.0f;
      }
    }
  }
}

// Stages one panel's K block (G3_PANEL x kc, k-major) in f32 and slice-major
// order: slice s holds, for each k, its kSliceCols columns contiguously. bf16
// is widened once here, so the register tile runs the same FMA-only loop for
// both dtypes and the conversion is paid once per M block, not once per row
// tile; when a panel has several slices (AVX2, SSE, scalar), each slice's
// weights become one contiguous stream instead of part of every 128-byte row.
constexpr size_t kSlices = G3_PANEL / kSliceCols;
template <bool kBF16>
HWY_INLINE void StageBlock(const void* HWY_RESTRICT w, size_t kc, float* HWY_RESTRICT out) {
  const DF df;
  for (size_t k = 0; k < kc; ++k)
    for (size_t s = 0; s < kSlices; ++s)
      for (size_t v = 0; v < kCV; ++v) {
        const size_t src = k * G3_PANEL + s * kSliceCols + v * kLanes;
        float* HWY_RESTRICT dst = out + (s * kc + k) * kSliceCols + v * kLanes;
        if constexpr (kBF16) {
          hn::Store(LoadBF16(static_cast<const uint16_t*>(w) + src), df, dst);
        } else {
          hn::Store(hn::LoadU(df, static_cast<const float*>(w) + src), df, dst);
        }
      }
}

// Prefill path: K blocks outermost (so c is written on the first block and
// accumulated on later ones), then M blocks with A packed once per block,
// then the panels of [n_begin, n_end), then row tiles against one weight
// block that stays in cache.
inline void GemmBlocked(const g3_gemm_args& g) {
  const size_t M = static_cast<size_t>(g.M), K = static_cast<size_t>(g.K);
  const size_t p_begin = static_cast<size_t>(g.n_begin) / G3_PANEL;
  const size_t p_end = (static_cast<size_t>(g.n_end) + G3_PANEL - 1) / G3_PANEL;
  const bool bf16 = g.w_dtype == G3_DTYPE_BF16;

  // Per thread and grown on demand (scratch.h): packing must not call malloc
  // on every projection of a decode step.
  thread_local Scratch<float> a_scratch, w_scratch;
  const size_t mc_max = std::min(kMC, (M + kMR - 1) / kMR * kMR);
  float* HWY_RESTRICT apack = a_scratch.Get(mc_max * std::min(kKC, K));
  // f32 weights with a single slice per panel are used in place; everything
  // else is staged (see StageBlock).
  const bool staged = bf16 || kSlices > 1;
  float* HWY_RESTRICT wbuf = staged ? w_scratch.Get(G3_PANEL * std::min(kKC, K)) : nullptr;

  for (size_t k0 = 0; k0 < K; k0 += kKC) {
    const size_t kc = std::min(kKC, K - k0);
    const bool accumulate = k0 != 0;
    for (size_t m0 = 0; m0 < M; m0 += kMC) {
      const size_t mc = std::min(kMC, M - m0);
      const size_t tiles = (mc + kMR - 1) / kMR;
      PackA(g.a, g.lda, m0, mc, k0, kc, apack);
      for (size_t p = p_begin; p < p_end; ++p) {
        const size_t block = (p * K + k0) * G3_PANEL;  // element offset of this panel's K block
        const float* HWY_RESTRICT wblk;
        size_t wstride, slice_step;  // floats between consecutive k; between slices
        if (bf16) {
          StageBlock<true>(static_cast<const uint16_t*>(g.w) + block, kc, wbuf);
        } else if (staged) {
          StageBlock<false>(static_cast<const float*>(g.w) + block, kc, wbuf);
        }
        if (staged) {
          wblk = wbuf;
          wstride = kSliceCols;
          slice_step = kc * kSliceCols;
        } else {
          wblk = static_cast<const float*>(g.w) + block;
          wstride = G3_PANEL;
          slice_step = kSliceCols;
        }
        const int64_t col0 = static_cast<int64_t>(p * G3_PANEL);
        // Columns of this panel that belong to the call: the zero padding of
        // the last panel and anything outside [n_begin, n_end) is not stored.
        const int64_t lo = std::max<int64_t>(g.n_begin, col0), hi = std::min<int64_t>(g.n_end, col0 + G3_PANEL);
        for (size_t s = 0; s < G3_PANEL / kSliceCols; ++s) {
          const int64_t s0 = col0 + static_cast<int64_t>(s * kSliceCols);
          const int64_t slo = std::max(lo, s0), shi = std::min(hi, s0 + static_cast<int64_t>(kSliceCols));
          if (slo >= shi) continue;
          for (size_t t = 0; t < tiles; ++t) {
            const size_t m = m0 + t * kMR;
            MicroTile(kc, apack + t * kMR * kc, wblk + s * slice_step, wstride, g.c + static_cast<int64_t>(m) * g.ldc + s0,
                      g.ldc, std::min(kMR, M - m), static_cast<size_t>(slo - s0), static_cast<size_t>(shi - s0),
                      accumulate);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Decode path: a group of R <= 4 rows against the whole weight matrix in one
// pass. The weights are streamed once per group, straight from the packed
// layout (bf16 widened in registers), so for large matrices and M = 1 the
// loop runs at memory bandwidth; no packing, no scratch. The panel is walked
// in slices of kVPS vectors so that R * kVPS * kU accumulators fit the
// register file; kU independent accumulator sets (interleaved k) hide the
// FMA latency when R * kVPS alone is too few chains.
// ---------------------------------------------------------------------------
constexpr size_t kAccBudget = kLanes >= 16 ? 24 : 12;
// How far ahead of its reads a GEMV asks for weights. The hardware
// prefetcher alone keeps too few lines in flight for one thread to reach
// the DRAM rate; a software prefetch a few pages ahead does (measured on an
// AMD EPYC Zen 5, 27B decode projections, bf16: 45 GB/s without, 54 at 6 KiB
// ahead, 60 at 12 KiB, 56 at 24 KiB, against 62 for DRAM read).
constexpr size_t kGemvPrefetchBytes = 12 * 1024;

constexpr size_t FloorPow2(size_t x) {
  size_t p = 1;
  while (p * 2 <= x) p *= 2;
  return p;
}
template <size_t R>
constexpr size_t GemvVPS() {
  return std::min(G3_PANEL / kLanes, FloorPow2(std::max<size_t>(1, kAccBudget / R)));
}

template <size_t R, bool kBF16>
HWY_NOINLINE void GemvRows(const g3_gemm_args& g, size_t m0) {
  const DF df;
  using V = hn::Vec<DF>;
  constexpr size_t kVPS = GemvVPS<R>();
  constexpr size_t kU = FloorPow2(std::min<size_t>(4, std::max<size_t>(1, kAccBudget / (R * kVPS))));
  constexpr size_t kCols = kVPS * kLanes;
  static_assert(!kBF16 || kVPS % 2 == 0, "bf16 weights are widened two vectors at a time");
  const size_t K = static_cast<size_t>(g.K);
  constexpr size_t kWBytes = kBF16 ? 2 : 4;
  // Panel rows per 64-byte line, and how far ahead to prefetch (in rows).
  constexpr size_t kRowsPerLine = std::max<size_t>(1, 64 / (G3_PANEL * kWBytes));
  constexpr size_t kLinesPerRow = std::max<size_t>(1, G3_PANEL * kWBytes / 64);
  constexpr size_t kPrefetchRows = kGemvPrefetchBytes / (G3_PANEL * kWBytes);
  const size_t p_begin = static_cast<size_t>(g.n_begin) / G3_PANEL;
  const size_t p_end = (static_cast<size_t>(g.n_end) + G3_PANEL - 1) / G3_PANEL;
  const float* HWY_RESTRICT ar[R];
  for (size_t r = 0; r < R; ++r) ar[r] = g.a + static_cast<int64_t>(m0 + r) * g.lda;

  for (size_t p = p_begin; p < p_end; ++p) {
    const int64_t col0 = static_cast<int64_t>(p * G3_PANEL);
    const int64_t lo = std::max<int64_t>(g.n_begin, col0), hi = std::min<int64_t>(g.n_end, col0 + G3_PANEL);
    for (size_t s = 0; s < G3_PANEL / kCols; ++s) {
      const int64_t s0 = col0 + static_cast<int64_t>(s * kCols);
      const int64_t slo = std::max(lo, s0), shi = std::min(hi, s0 + static_cast<int64_t>(kCols));
      if (slo >= shi) continue;
      const size_t off = p * K * G3_PANEL + s * kCols;  // element offset of (panel p, k = 0, slice s)
      V acc[kU][R][kVPS];
      for (size_t u = 0; u < kU; ++u)
        for (size_t r = 0; r < R; ++r)
          for (size_t v = 0; v < kVPS; ++v) acc[u][r][v] = hn::Zero(df);
      size_t k = 0;
      // One k step: kVPS weight vectors, R broadcasts, R * kVPS FMAs into set u.
      // bf16 weights are widened without crossing 128-bit blocks: a vector
      // of u32 holds two bf16 columns per lane; shifting left by 16 gives the
      // even column as f32, masking the low half gives the odd one. The
      // accumulators thus hold the columns of a 2 * kLanes group as
      // (evens, odds); the store below puts them back in order. Against a
      // u16 -> u32 widening (a cross-lane shuffle per vector) this made the
      // AVX-512 bf16 GEMV from cache about 1.5x faster.
      auto step = [&](size_t kk, size_t u) HWY_ATTR {
        // A GEMV reads every weight once, so it runs at the memory's pace:
        // ask for the panel's rows kPrefetchRows ahead (past its end, the
        // next panel, which the next slice or item usually reads).
        if (kk % kRowsPerLine == 0) {
          const uint8_t* ahead = reinterpret_cast<const uint8_t*>(g.w) + (off + (kk + kPrefetchRows) * G3_PANEL) * kWBytes;
          for (size_t l = 0; l < kLinesPerRow; ++l) hwy::Prefetch(ahead + 64 * l);
        }
        V w[kVPS];
        if constexpr (kBF16) {
          const hn::RebindToUnsigned<DF> du32;
          const auto hi_mask = hn::Set(du32, 0xFFFF0000u);
          for (size_t v2 = 0; v2 < kVPS / 2; ++v2) {
            const uint16_t* src = static_cast<const uint16_t*>(g.w) + off + kk * G3_PANEL + v2 * 2 * kLanes;
            const auto pair = hn::LoadU(du32, reinterpret_cast<const uint32_t*>(src));
            w[2 * v2] = hn::BitCast(df, hn::ShiftLeft<16>(pair));
            w[2 * v2 + 1] = hn::BitCast(df, hn::And(pair, hi_mask));
          }
        } else {
          for (size_t v = 0; v < kVPS; ++v)
            w[v] = hn::LoadU(df, static_cast<const float*>(g.w) + off + kk * G3_PANEL + v * kLanes);
        }
        for (size_t r = 0; r < R; ++r) {
          const V a = hn::Set(df, ar[r][kk]);
          for (size_t v = 0; v < kVPS; ++v) acc[u][r][v] = hn::MulAdd(a, w[v], acc[u][r][v]);
        }
      };
      for (; k + kU <= K; k += kU)
        for (size_t u = 0; u < kU; ++u) step(k + u, u);
      for (; k < K; ++k) step(k, 0);
      for (size_t u = 1; u < kU; ++u)
        for (size_t r = 0; r < R; ++r)
          for (size_t v = 0; v < kVPS; ++v) acc[0][r][v] = hn::Add(acc[0][r][v], acc[u][r][v]);

      const size_t clo = static_cast<size_t>(slo - s0), chi = static_cast<size_t>(shi - s0);
      float* HWY_RESTRICT c = g.c + static_cast<int64_t>(m0) * g.ldc + s0;
      if (!kBF16 && clo == 0 && chi == kCols) {
        for (size_t r = 0; r < R; ++r)
          for (size_t v = 0; v < kVPS; ++v)
            hn::StoreU(acc[0][r][v], df, c + static_cast<int64_t>(r) * g.ldc + v * kLanes);
        continue;
      }
      HWY_ALIGN float tile[R * kCols];
      for (size_t r = 0; r < R; ++r)
        for (size_t v = 0; v < kVPS; ++v) hn::Store(acc[0][r][v], df, tile + r * kCols + v * kLanes);
      if constexpr (kBF16) {
        // Undo the (evens, odds) order: column j of group v2 sits in vector
        // 2 * v2 + (j & 1), lane j / 2.
        HWY_ALIGN float ordered[R * kCols];
        for (size_t r = 0; r < R; ++r)
          for (size_t col = 0; col < kCols; ++col) {
            const size_t v2 = col / (2 * kLanes), j = col % (2 * kLanes);
            ordered[r * kCols + col] = tile[r * kCols + (2 * v2 + (j & 1)) * kLanes + j / 2];
          }
        StorePartial<R, kCols>(ordered, R, clo, chi, c, g.ldc, false);
      } else {
        StorePartial<R, kCols>(tile, R, clo, chi, c, g.ldc, false);
      }
    }
  }
}

template <bool kBF16>
inline void GemvDispatch(const g3_gemm_args& g, size_t m0, size_t rows) {
  switch (rows) {
    case 1: GemvRows<1, kBF16>(g, m0); break;
    case 2: GemvRows<2, kBF16>(g, m0); break;
    case 3: GemvRows<3, kBF16>(g, m0); break;
    default: GemvRows<4, kBF16>(g, m0); break;
  }
}

// g3_gemm_fn: c[m][n] = sum_k a[m][k] * W[n][k] for m < M, n in [n_begin, n_end),
// f32 accumulation (SPEC 1.3 steps A and J). An empty range or M = 0 writes
// nothing; K = 0 writes zeros.
//
// In the bf16 compute mode (g.compute) the activations are rounded to bf16
// once, into a per-thread copy, and the kernels below run on it unchanged:
// the weights are bf16 in that mode, so every product is of two bf16 values.
inline void Gemm(const g3_gemm_args* args) {
  if (args->compute == G3_COMPUTE_BF16 && args->M > 0 && args->K > 0) {
    static thread_local Scratch<float> rounded;
    const size_t M = size_t(args->M), K = size_t(args->K);
    float* a = rounded.Get(M * K);
    const hn::ScalableTag<float> df;
    const size_t NL = hn::Lanes(df), Kv = K / NL * NL;
    for (size_t m = 0; m < M; ++m) {
      const float* src = args->a + int64_t(m) * args->lda;
      float* dst = a + m * K;
      for (size_t k = 0; k < Kv; k += NL) hn::StoreU(bf16::Round(df, hn::LoadU(df, src + k)), df, dst + k);
      const hn::CappedTag<float, 1> d1;
      for (size_t k = Kv; k < K; ++k) hn::StoreU(bf16::Round(d1, hn::LoadU(d1, src + k)), d1, dst + k);
    }
    g3_gemm_args f32 = *args;
    f32.a = a;
    f32.lda = int64_t(K);
    f32.compute = G3_COMPUTE_F32;
    Gemm(&f32);
    return;
  }
  const g3_gemm_args& g = *args;
  if (g.M <= 0 || g.n_end <= g.n_begin) return;
  if (g.K <= 0) {
    for (int64_t m = 0; m < g.M; ++m)
      for (int64_t n = g.n_begin; n < g.n_end; ++n) g.c[m * g.ldc + n] = 0.0f;
    return;
  }
  const size_t M = static_cast<size_t>(g.M);
  if (M <= kGemvMaxRows) {
    for (size_t m0 = 0; m0 < M; m0 += 4) {
      const size_t rows = std::min<size_t>(4, M - m0);
      if (g.w_dtype == G3_DTYPE_BF16) GemvDispatch<true>(g, m0, rows);
      else GemvDispatch<false>(g, m0, rows);
    }
    return;
  }
  GemmBlocked(g);
}

// ---------------------------------------------------------------------------
// g3_rmsnorm_fn (SPEC 2.1): per row, ms = mean(x^2);
// y = x * rsqrt(ms + eps) * (1 + w), then y += residual (rows of stride
// y_stride) when residual is given. y may alias x (and the residual): each
// element is read before it is written and rows are independent.
// Accuracy: the sum of squares runs in 4 x kLanes f32 partial sums, each
// over n / (4 kLanes) terms, which are then added in double; with
// nonnegative terms the relative error is at most about
// (n / (4 kLanes)) * 2^-24 (below 1e-6 for n <= 65536 on AVX2).
// ---------------------------------------------------------------------------
inline void RmsNorm(const float* x, int64_t rows, int64_t n, int64_t x_stride, const float* w, float eps,
                    const float* residual, float* y, int64_t y_stride) {
  const DF df;
  using V = hn::Vec<DF>;
  const size_t cols = n > 0 ? static_cast<size_t>(n) : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * x_stride;
    float* yr = y + r * y_stride;
    const float* rr = residual ? residual + r * y_stride : nullptr;

    V s0 = hn::Zero(df), s1 = hn::Zero(df), s2 = hn::Zero(df), s3 = hn::Zero(df);
    size_t i = 0;
    for (; i + 4 * kLanes <= cols; i += 4 * kLanes) {
      const V v0 = hn::LoadU(df, xr + i), v1 = hn::LoadU(df, xr + i + kLanes);
      const V v2 = hn::LoadU(df, xr + i + 2 * kLanes), v3 = hn::LoadU(df, xr + i + 3 * kLanes);
      s0 = hn::MulAdd(v0, v0, s0);
      s1 = hn::MulAdd(v1, v1, s1);
      s2 = hn::MulAdd(v2, v2, s2);
      s3 = hn::MulAdd(v3, v3, s3);
    }
    for (; i + kLanes <= cols; i += kLanes) {
      const V v0 = hn::LoadU(df, xr + i);
      s0 = hn::MulAdd(v0, v0, s0);
    }
    HWY_ALIGN float lanes[4 * kLanes];
    hn::Store(s0, df, lanes);
    hn::Store(s1, df, lanes + kLanes);
    hn::Store(s2, df, lanes + 2 * kLanes);
    hn::Store(s3, df, lanes + 3 * kLanes);
    double ss = 0.0;
    for (size_t j = 0; j < 4 * kLanes; ++j) ss += lanes[j];
    for (; i < cols; ++i) ss += double(xr[i]) * xr[i];
    const float inv = cols ? static_cast<float>(1.0 / std::sqrt(ss / double(cols) + double(eps))) : 0.0f;

    const V vinv = hn::Set(df, inv), one = hn::Set(df, 1.0f);
    i = 0;
    for (; i + kLanes <= cols; i += kLanes) {
      V o = hn::Mul(hn::Mul(hn::LoadU(df, xr + i), vinv), hn::Add(one, hn::LoadU(df, w + i)));
      if (rr) o = hn::Add(o, hn::LoadU(df, rr + i));
      hn::StoreU(o, df, yr + i);
    }
    for (; i < cols; ++i) {
      float o = xr[i] * inv * (1.0f + w[i]);
      if (rr) o += rr[i];
      yr[i] = o;
    }
  }
}

}  // namespace proj
}  // namespace HWY_NAMESPACE
}  // namespace g3
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
