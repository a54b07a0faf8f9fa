// The C++ tile loop of the AMX core (SPEC.md section 1.3 steps E-I in the
// bf16 compute mode of kernel_contract.h), around the Xbyak tile kernels of
// amx_core.cc. One call holds every query row of one KV head (T tokens x G
// heads, row r = t G + g, padded with zero rows to row groups of 32):
//
//   q -> bf16 once; O = 0; m, l = nothing seen (FlashOps)
//   tile configuration (ldtilecfg)
//   for each block of kb keys that some row of the call sees (a block also
//   ends where a ring's stored positions wrap):
//     K block -> K^T pairs, V block -> key pairs (bf16, rounded to nearest
//       even from an f32 cache; invalid and missing slots' V are zeros)
//     for each row group: classify the block against the group
//       (mask_rule.h): hidden from every row (skip: a local layer costs
//       O(T x W), the causal corner of a prefill tile is skipped), visible in
//       full (no per-element mask) or partial;
//       S = Q K^T                  tile kernel (32-key steps no row sees skipped)
//       online softmax, a row at a time (FlashOps, templates/softmax-inl.h):
//         the row's own class; on a partial block, runs of 32-key sub-tiles
//         (hidden: zero weights; visible: unmasked; partial: masked)
//       P = bf16(p)
//       O = O corr + P V           tile kernel
//     with prefetches of the next block's cache rows between the rows
//   tilerelease
//   out = O / l, lse = m + log l   FlashOps (zeros and -inf for a row that saw
//                                  no key)
//
// The softmax sum l is of the f32 weights and the product uses bf16(p), as
// the contract's bf16 mode states: out = sum_s bf16(p_s) bf16(v_s) / sum_s p_s.
// Calls of fewer than Config::min_rows rows run on the Highway core of the
// same key instead (decode: one token brings G rows to a 16-row tile).
//
// No global -m flags: the conversions are functions under `#pragma GCC
// target` (AVX-512 with AVX512_BF16, which every AMX CPU has); the loop
// itself and its buffers are baseline code, reached only after
// amx_permission.h said the CPU and the kernel allow the tiles.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "generator/xbyak/amx_core.h"
#include "templates/mask_rule.h"
// Included before the target region so its code is baseline (scratch.h).
#include "templates/scratch.h"

namespace g3::amx {

namespace {

// The K and V cache rows of the next block, brought towards L2 in small
// doses between the current block's steps. Preparing a block reads K and V
// from wherever the cache lives (a 4096-position f32 head of 256 is 8 MB,
// past L2), and a core's few outstanding misses make that phase run at
// last-level-cache latency; spread over the block's compute the same lines
// arrive while the tile and softmax work runs (about 15% faster at head_dim
// 128, f32 K/V, 4096 positions, on the Xeon this was written on). Issued in
// one burst they would stall the core just as the demand loads do.
struct Prefetch {
  const char* k = nullptr;
  const char* v = nullptr;
  size_t bytes = 0, pos = 0, per_dose = 0;
  void start(const g3_core_args* a, const g3_tile_info& t, int64_t dh, size_t esz, int64_t doses) {
    const size_t row = size_t(dh) * esz;
    k = static_cast<const char*>(a->k) + size_t(t.s0) * row;
    v = static_cast<const char*>(a->v) + size_t(t.s0) * row;
    bytes = size_t(t.s1 - t.s0) * row;
    per_dose = (bytes / 64 + size_t(doses) - 1) / size_t(doses);
  }
  void dose() {
    for (size_t i = 0; i < per_dose && pos < bytes; ++i, pos += 64) {
      _mm_prefetch(k + pos, _MM_HINT_T1);
      _mm_prefetch(v + pos, _MM_HINT_T1);
    }
  }
};

// The tile loop's buffers, per thread, grown on demand and reused across
// calls (templates/scratch.h: 64-byte aligned, so no tile row straddles two
// cache lines).
struct Buffers {
  Scratch<uint16_t> q, p;
  Scratch<uint32_t> kt, vp;
  Scratch<float> s, o, m, l, corr;
  Scratch<int32_t> kp, kv;
  Scratch<g3_row_bounds> rb;
  Scratch<g3_row_set> sets;
  Scratch<g3_tile_info> sub;
};

// Keys per sub-tile of a block that is partial for a row or a group: the 32
// keys of a pair of key tiles in the QK kernel and of one step of the PV
// kernel, so a sub-tile hidden from a whole group is skipped by both.
constexpr int64_t kSub = 32;

// One row's softmax step over a block that is partial for it: the block's
// sub-tiles of kSub keys, classified against the row (mask_rule.h), in runs
// of one class. A hidden run gets zero weights and no step; a fully visible
// run a step without per-element masking; a partial run the masked step.
// Each step is an online-softmax step of its own (templates/softmax-inl.h):
// when it raises the row's maximum, the weights of the runs before it are
// rescaled by its factor, and the row's factor for O is the product. The
// masked step costs about 2.5 times the unmasked one per key, and the
// blocks that are partial for a row (the causal diagonal, a window's edge,
// a ring's wrap) are mostly hidden or fully visible keys around one edge.
void partial_row(const FlashOps& fo, int64_t k0, float* srow, const int32_t* kp, const int32_t* kv,
                 const g3_row_bounds* rb, float* m, float* l, float* corr, const g3_tile_info* sub, int kb) {
  g3_row_set one = g3_row_set_empty();
  g3_row_set_add(&one, *rb);
  float total = 1.0f;
  const int nsub = int(kb / kSub);
  for (int u0 = 0; u0 < nsub;) {
    const int cls = g3_classify(&sub[u0], &one);
    int u1 = u0 + 1;
    while (u1 < nsub && g3_classify(&sub[u1], &one) == cls) ++u1;
    const int64_t c0 = u0 * kSub, c1 = u1 * kSub;
    if (cls == G3_TILE_SKIP) {
      std::memset(srow + c0, 0, size_t(c1 - c0) * sizeof(float));
    } else {
      float cr = 1.0f;
      fo.softmax_tile(srow + c0, 0, 1, c1 - c0, cls == G3_TILE_FULL, k0 + c0, kp + c0, kv + c0, rb, m, l, &cr);
      if (cr != 1.0f) {
        for (int64_t j = 0; j < c0; ++j) srow[j] *= cr;
        total *= cr;
      }
    }
    u0 = u1;
  }
  *corr = total;
}

}  // namespace

// GCC 12 reports the deliberately undefined pass-through operand inside
// several AVX-512 intrinsics as "may be used uninitialized" (a false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")

namespace {

// 32 floats -> 32 bf16 in order, rounded to nearest even (vcvtne2ps2bf16
// puts its second operand in the low half).
inline __m512i to_bf16_32(const float* x) {
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
}

// rows x n floats (row strides in elements) -> bf16; n a multiple of 32.
void rows_to_bf16(const float* src, int64_t src_stride, uint16_t* dst, int64_t dst_stride, int64_t rows, int n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < n; i += 32)
      _mm512_storeu_si512(dst + r * dst_stride + i, to_bf16_32(src + r * src_stride + i));
}

// In-register transpose of 16 x 16 dwords: r[i] lane j becomes r[j] lane i.
inline void transpose16(__m512i r[16]) {
  __m512i a[16], b[16];
  // Pairs of rows interleaved by dword, then by qword: b[4g + c] holds, in
  // 128-bit lane L, column 4L + c of rows 4g .. 4g + 3.
  for (int i = 0; i < 16; i += 2) {
    a[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    a[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {
    b[g + 0] = _mm512_unpacklo_epi64(a[g + 0], a[g + 2]);
    b[g + 1] = _mm512_unpackhi_epi64(a[g + 0], a[g + 2]);
    b[g + 2] = _mm512_unpacklo_epi64(a[g + 1], a[g + 3]);
    b[g + 3] = _mm512_unpackhi_epi64(a[g + 1], a[g + 3]);
  }
  // Gather the four row quartets of each column from lane L: two rounds of
  // 128-bit shuffles (0x88 takes lanes 0 and 2 of each source, 0xdd 1 and 3).
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x88);
    const __m512i x1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xdd);
    const __m512i y0 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x88);
    const __m512i y1 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xdd);
    r[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);       // lane 0: column c
    r[4 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);   // lane 1: column 4 + c
    r[8 + c] = _mm512_shuffle_i32x4(x0, y0, 0xdd);   // lane 2: column 8 + c
    r[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xdd);  // lane 3: column 12 + c
  }
}

// Keys k0 .. k0 + kb - 1 as K^T in bf16 pairs: kt[d * kb + s] = (k[s][2d],
// k[s][2d+1]); slots past the cache read as zeros. Invalid slots are copied
// as they are (NaN included): only their own logit column sees them, and the
// softmax masks that column.
void prep_keys(const void* k, bool bf16, int64_t S, int64_t k0, int kb, int dh, uint32_t* kt, int64_t ld) {
  for (int kg = 0; kg < kb; kg += 16)
    for (int d0 = 0; d0 < dh / 2; d0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t slot = k0 + kg + i;
        if (slot >= S)
          r[i] = _mm512_setzero_si512();
        else if (bf16)
          r[i] = _mm512_loadu_si512(static_cast<const uint16_t*>(k) + slot * dh + 2 * d0);
        else
          r[i] = to_bf16_32(static_cast<const float*>(k) + slot * dh + 2 * d0);
      }
      transpose16(r);
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(kt + int64_t(d0 + j) * ld + kg, r[j]);
    }
}

// Values k0 .. k0 + kb - 1 in key pairs: vp[i * dh + h] = (v[2i][h],
// v[2i+1][h]). Invalid slots and slots past the cache are zeros, so whatever
// they hold (NaN, Inf) meets only zero weights as zeros.
void prep_values(const void* v, bool bf16, const uint8_t* kvalid, int64_t S, int64_t k0, int kb, int dh,
                 uint32_t* vp, int64_t ld) {
  alignas(64) static const uint16_t kLo[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                               8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static const uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                               24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  alignas(64) static const uint16_t kPair[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i lo = _mm512_load_si512(kLo), hi = _mm512_load_si512(kHi), pair = _mm512_load_si512(kPair);
  for (int i = 0; i < kb / 2; ++i) {
    const int64_t sa = k0 + 2 * i, sb = sa + 1;
    const bool a_ok = sa < S && kvalid[sa], b_ok = sb < S && kvalid[sb];
    uint32_t* dst = vp + int64_t(i) * ld;
    if (bf16) {
      const uint16_t* va = static_cast<const uint16_t*>(v) + sa * dh;
      const uint16_t* vb = static_cast<const uint16_t*>(v) + sb * dh;
      for (int h = 0; h < dh; h += 32) {
        const __m512i a = a_ok ? _mm512_loadu_si512(va + h) : _mm512_setzero_si512();
        const __m512i b = b_ok ? _mm512_loadu_si512(vb + h) : _mm512_setzero_si512();
        _mm512_storeu_si512(dst + h, _mm512_permutex2var_epi16(a, lo, b));
        _mm512_storeu_si512(dst + h + 16, _mm512_permutex2var_epi16(a, hi, b));
      }
    } else {
      const float* va = static_cast<const float*>(v) + sa * dh;
      const float* vb = static_cast<const float*>(v) + sb * dh;
      for (int h = 0; h < dh; h += 16) {
        const __m512 a = a_ok ? _mm512_loadu_ps(va + h) : _mm512_setzero_ps();
        const __m512 b = b_ok ? _mm512_loadu_ps(vb + h) : _mm512_setzero_ps();
        // [a(16) | b(16)] in bf16, then interleaved into pairs.
        const __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(b, a);
        _mm512_storeu_si512(dst + h, _mm512_permutexvar_epi16(pair, ab));
      }
    }
  }
}

}  // namespace

#pragma GCC pop_options
#pragma GCC diagnostic pop

void core(const Context* ctx, const g3_core_args* a) {
  const Config& c = ctx->cfg;
  const int64_t T = a->T, S = a->S, dh = c.head_dim, G = c.group, kb = c.kb;
  constexpr int64_t kR = Config::kRows;
  if (T <= 0) return;
  if (T * G < c.min_rows) {
    ctx->small(a);
    return;
  }
  static thread_local Buffers b;
  const FlashOps& fo = *ctx->flash;
  const int64_t R = T * G, Rp = (R + kR - 1) / kR * kR, ngroups = Rp / kR;

  // Row bounds (mask_rule.h) per row, their extremes per row group and for
  // the whole call; padding rows see nothing and are left out of the sets.
  g3_row_bounds* rb = b.rb.Get(size_t(Rp));
  g3_row_set* sets = b.sets.Get(size_t(ngroups));
  for (int64_t i = 0; i < ngroups; ++i) sets[i] = g3_row_set_empty();
  for (int64_t t = 0; t < T; ++t) {
    const g3_row_bounds bt = g3_bounds_of(a, t);
    for (int64_t g = 0; g < G; ++g) {
      rb[t * G + g] = bt;
      g3_row_set_add(&sets[(t * G + g) / kR], bt);
    }
  }
  for (int64_t r = R; r < Rp; ++r) rb[r] = g3_bounds_none();
  g3_row_set all = g3_row_set_empty();
  for (int64_t i = 0; i < ngroups; ++i) g3_row_set_merge(&all, &sets[i]);

  const int64_t q_ld = c.q_ld(), kt_ld = c.kt_ld(), s_ld = c.s_ld(), p_ld = c.p_ld(), vp_ld = c.vp_ld(),
                o_ld = c.o_ld();
  uint16_t* qb = b.q.Get(size_t(Rp * q_ld));
  for (int64_t t = 0; t < T; ++t) rows_to_bf16(a->q + t * a->q_stride, dh, qb + t * G * q_ld, q_ld, G, int(dh));
  std::memset(qb + R * q_ld, 0, size_t((Rp - R) * q_ld) * sizeof(uint16_t));
  float* o = b.o.Get(size_t(Rp * o_ld));
  std::memset(o, 0, size_t(Rp * o_ld) * sizeof(float));
  float* m = b.m.Get(size_t(Rp));
  float* l = b.l.Get(size_t(Rp));
  float* corr = b.corr.Get(size_t(Rp));
  fo.init_rows(Rp, m, l);
  uint32_t* kt = b.kt.Get(size_t(dh / 2 * kt_ld));
  uint32_t* vp = b.vp.Get(size_t(kb / 2 * vp_ld));
  float* s = b.s.Get(size_t(kR * s_ld));
  uint16_t* p = b.p.Get(size_t(kR * p_ld));
  int32_t* kp = b.kp.Get(size_t(kb));
  int32_t* kv = b.kv.Get(size_t(kb));
  g3_tile_info* sub = b.sub.Get(size_t(kb / kSub));
  const bool bf16 = c.bf16_kv;

  // Blocks of kb slots, except that one ends where the stored positions
  // first go down: a ring buffer (a local layer's cache) wraps there, and a
  // block holding both the newest and the oldest positions would be partial
  // for every row. A block [k0, k1) is summarised as if the cache ended at
  // k1, so the slots after it read as missing (zeros, masked).
  int64_t wrap = 0;
  for (int64_t s0 = 1, prev = -1; s0 < S; ++s0) {
    if (!a->kvalid[s0 - 1]) continue;
    prev = s0 - 1;
    if (a->kvalid[s0] && a->kpos[s0] < a->kpos[prev]) {
      wrap = s0;
      break;
    }
  }
  auto block_end = [&](int64_t k0) { return std::min(k0 < wrap ? wrap : S, k0 + kb); };
  g3_core_args upto = *a;  // `a` with S = the current block's end
  // The blocks some row of the call sees, in slot order: `next` is the
  // first from k0 on (s0 == S when none is left).
  g3_tile_info next{};
  auto find_next = [&](int64_t k0) {
    for (; k0 < S; k0 = block_end(k0)) {
      upto.S = block_end(k0);
      next = g3_tile_info_of(&upto, k0, kb);
      if (g3_classify(&next, &all) != G3_TILE_SKIP) return;
    }
    next.s0 = S;
  };
  find_next(0);
  ctx->tile_config(ctx->palette);
  while (next.s0 < S) {
    const g3_tile_info ti = next;
    const int64_t k0 = ti.s0;
    const int64_t k1 = ti.s1;  // the block's end (at most k0 + kb)
    prep_keys(a->k, bf16, k1, k0, int(kb), int(dh), kt, kt_ld);
    prep_values(a->v, bf16, a->kvalid, k1, k0, int(kb), int(dh), vp, vp_ld);
    find_next(k1);
    Prefetch pf;
    if (next.s0 < S) pf.start(a, next, dh, bf16 ? 2 : 4, ngroups * (kR + 2));
    bool have_mask = false;
    for (int64_t grp = 0; grp < ngroups; ++grp) {
      const int cls = g3_classify(&ti, &sets[grp]);
      if (cls == G3_TILE_SKIP) continue;
      if (cls != G3_TILE_FULL && !have_mask) {
        // The block's positions and validity for per-element masking (slots
        // past the cache are invalid), and its sub-tiles' summaries.
        for (int64_t j = 0; j < kb; ++j) {
          const int64_t slot = k0 + j;
          kp[j] = slot < k1 ? a->kpos[slot] : 0;
          kv[j] = slot < k1 && a->kvalid[slot] ? -1 : 0;
        }
        upto.S = k1;
        for (int64_t u = 0; u < kb / kSub; ++u) sub[u] = g3_tile_info_of(&upto, k0 + u * kSub, kSub);
        have_mask = true;
      }
      const int64_t r0 = grp * kR;
      // Step E: logits of the group's 32 rows against the block.
      // The 32-key sub-tiles some row of the group sees: the tile kernels
      // skip the others (a partial block is often half hidden from a group).
      uint64_t live = ~uint64_t(0);
      if (cls != G3_TILE_FULL) {
        live = 0;
        for (int64_t u = 0; u < kb / kSub; ++u)
          if (g3_classify(&sub[u], &sets[grp]) != G3_TILE_SKIP) live |= uint64_t(1) << u;
      }
      const QkCall qc{qb + r0 * q_ld, kt, s, live};
      ctx->qk(&qc);
      pf.dose();
      // Steps G-H: the shared masked online softmax, a row at a time so the
      // prefetch doses come between them, and each row classified on its own
      // when the group's rows differ: a row the block is hidden from (padding
      // rows; on a local layer's ring, the rows past the wrapped slots' window)
      // gets zero weights and no softmax step, and a row that sees all of it
      // needs no per-element mask.
      for (int64_t r = 0; r < kR; ++r) {
        const int64_t row = r0 + r;
        int rcls = cls;
        if (cls != G3_TILE_FULL) {
          g3_row_set one = g3_row_set_empty();
          g3_row_set_add(&one, rb[row]);
          rcls = g3_classify(&ti, &one);
        }
        float* srow = s + r * s_ld;
        if (rcls == G3_TILE_SKIP) {
          std::memset(srow, 0, size_t(kb) * sizeof(float));
          corr[row] = 1.0f;
        } else if (rcls == G3_TILE_FULL) {
          fo.softmax_tile(srow, s_ld, 1, kb, 1, k0, kp, kv, rb + row, m + row, l + row, corr + row);
        } else {
          partial_row(fo, k0, srow, kp, kv, rb + row, m + row, l + row, corr + row, sub, int(kb));
        }
        pf.dose();
      }
      // Step I with bf16 weights: O = O corr + bf16(p) V.
      rows_to_bf16(s, s_ld, p, p_ld, kR, int(kb));
      bool ones = true;
      for (int64_t r = 0; r < kR; ++r) ones = ones && corr[r0 + r] == 1.0f;
      const PvCall pc{p, vp, o + r0 * o_ld, ones ? nullptr : corr + r0, live};
      ctx->pv(&pc);
      pf.dose();
    }
  }
  ctx->tile_release(nullptr);

  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r = t * G + g;
      fo.finish_row(o + r * o_ld, m[r], l[r], dh, a->out + t * a->out_stride + g * dh,
                    a->lse ? a->lse + t * G + g : nullptr);
    }
}

}  // namespace g3::amx
