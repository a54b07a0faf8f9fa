// The C++ tile loop around the Xbyak micro-kernels (SPEC.md section 1.3
// steps E-I with the structured mask of kernel_contract.h). Included by
// core_driver.cc once per instruction set, inside `#pragma GCC target`, with
// G3X_NS (namespace) and G3X_VL (f32 lanes) defined.
//
// Per query tile (Tq tokens x G heads = R rows, all in one tile so every
// K/V element is loaded once per group):
//   for each key block of kb keys:
//     classify against the tile's rows (mask_rule.h): hidden (skip: a local
//       layer costs O(T x W)), fully visible, or partial;
//     S = Q.K^T                  JIT QK kernel on the transposed key block
//     masked online softmax      the shared step of templates/softmax-inl.h
//                                (FlashOps, compiled for the same ISA)
//     O = O * corr + P.V         JIT PV kernel
//   out = O / l, lse = m + log l (the shared row finish).

namespace G3X_NS {

#define G3X_INLINE static inline __attribute__((always_inline))

// Round n floats (n a multiple of VL) to bf16 and store them as consecutive
// halves, i.e. n/2 dwords of pairs (x[2i] low, x[2i+1] high), the operand
// layout of vdpbf16ps. Only reached on the vdpbf16ps path (AVX-512).
G3X_INLINE void to_bf16_pairs(const float* x, uint16_t* dst, int n) {
#if G3X_VL == 16
  for (int i = 0; i < n; i += 16) {
    __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<__m256i&>(h));
  }
#else
  for (int i = 0; i < n; ++i) dst[i] = f32_to_bf16(x[i]);
#endif
}

// Rounds n floats (n a multiple of VL) to bf16 in place, to nearest even,
// as to_bf16_pairs does (the values stay floats).
G3X_INLINE void round_to_bf16(float* x, int n) {
#if G3X_VL == 16
  for (int i = 0; i < n; i += 16) {
    __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<__m256i&>(h)), 16);
    _mm512_storeu_ps(x + i, _mm512_castsi512_ps(w));
  }
#else
  for (int i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
#endif
}

// The tile loop's buffers, per thread, grown on demand and reused across
// calls (templates/scratch.h, included by core_driver.cc outside the target
// regions).
struct Buffers {
  Scratch<uint32_t> q, kt, vp, vpad;
  Scratch<float> s, o, m, l, corr;
  Scratch<uint16_t> pb;
  Scratch<int32_t> kp, kv;
  Scratch<g3_row_bounds> rb;
  std::vector<uint8_t> kt_done, vp_done;
  std::vector<g3_tile_info> blocks;
  std::vector<g3_row_bounds> rows;
};

// Transposes key block b into kt: sub-tile st, depth d, key k at
// kt[(st * depth + d) * tk + k], as dwords: f32 keys, bf16 pairs of head_dim
// (vdpbf16ps path), or bf16 keys widened to f32. Slots past S read as 0.
static void transpose_keys(const CoreConfig& c, const void* kbase, int64_t S, int64_t k0, uint32_t* kt) {
  const int depth = c.qk_depth(), tk = c.tk, dh = c.head_dim;
#if G3X_VL == 16
  // 16 x 16 dword transposes in registers (4 shuffle rounds), about four
  // elements per cycle instead of one: decode streams every key through here.
  if (depth % 16 == 0) {
    const bool widen = c.bf16_kv && !c.bf16_dot;
    for (int kg = 0; kg < c.kb / 16; ++kg) {
      const int64_t key0 = k0 + kg * 16;
      const int st = kg * 16 / tk, kin = kg * 16 % tk;
      for (int d0 = 0; d0 < depth; d0 += 16) {
        __m512i r[16], u[16];
        for (int i = 0; i < 16; ++i) {
          const int64_t slot = key0 + i;
          if (slot >= S) {
            r[i] = _mm512_setzero_si512();
          } else if (widen) {
            const uint16_t* src = static_cast<const uint16_t*>(kbase) + slot * dh + d0;
            r[i] = _mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))), 16);
          } else {
            r[i] = _mm512_loadu_si512(static_cast<const uint32_t*>(kbase) + slot * depth + d0);
          }
        }
        for (int i = 0; i < 16; i += 2) {
          u[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
          u[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
        }
        for (int i = 0; i < 16; i += 4)
          for (int j = 0; j < 2; ++j) {
            r[i + j] = _mm512_unpacklo_epi64(u[i + j], u[i + j + 2]);
            r[i + j + 2] = _mm512_unpackhi_epi64(u[i + j], u[i + j + 2]);
          }
        // Now r[i] holds, per 128-bit lane L (dims d0+4L..), rows 4(i/4)..+3
        // of dim (i%4) within the lane; two 128-bit shuffle rounds finish.
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 2; ++j) {
            u[i + 8 * j] = _mm512_shuffle_i32x4(r[i + 8 * j], r[i + 8 * j + 4], 0x88);
            u[i + 8 * j + 4] = _mm512_shuffle_i32x4(r[i + 8 * j], r[i + 8 * j + 4], 0xdd);
          }
        for (int i = 0; i < 8; ++i) {
          r[i] = _mm512_shuffle_i32x4(u[i], u[i + 8], 0x88);
          r[i + 8] = _mm512_shuffle_i32x4(u[i], u[i + 8], 0xdd);
        }
        // r[x], x = a + 4b + 8c, now holds dim d0 + off(a) + 4b + 8c of the
        // 16 keys, where the 64-bit unpack swapped the middle two: off = 0 2 1 3.
        for (int x = 0; x < 16; ++x) {
          static constexpr int kOff[4] = {0, 2, 1, 3};
          const int dim = kOff[x % 4] + 4 * ((x / 4) % 2) + 8 * (x / 8);
          _mm512_storeu_si512(kt + (int64_t(st) * depth + d0 + dim) * tk + kin, r[x]);
        }
      }
    }
    return;
  }
#elif G3X_VL == 8
  // The same in 8 x 8 blocks of ymm registers (three shuffle rounds); the
  // element loop below stores one dword per cycle at a stride of tk, which
  // cost about 6% of an AVX2 local prefill.
  if (depth % 8 == 0) {
    const bool widen = c.bf16_kv;  // no vdpbf16ps without AVX-512
    for (int kg = 0; kg < c.kb / 8; ++kg) {
      const int64_t key0 = k0 + kg * 8;
      const int st = kg * 8 / tk, kin = kg * 8 % tk;
      for (int d0 = 0; d0 < depth; d0 += 8) {
        __m256 r[8], t[8];
        for (int i = 0; i < 8; ++i) {
          const int64_t slot = key0 + i;
          if (slot >= S) {
            r[i] = _mm256_setzero_ps();
          } else if (widen) {
            const uint16_t* src = static_cast<const uint16_t*>(kbase) + slot * dh + d0;
            r[i] = _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))), 16));
          } else {
            r[i] = _mm256_loadu_ps(static_cast<const float*>(kbase) + slot * depth + d0);
          }
        }
        // Pairs of keys interleaved, then quads: t[4q + j] holds dims j
        // (low 128 bits) and j + 4 (high) of keys 4q..4q+3.
        for (int q = 0; q < 2; ++q) {
          const __m256 a0 = _mm256_unpacklo_ps(r[4 * q], r[4 * q + 1]), a1 = _mm256_unpackhi_ps(r[4 * q], r[4 * q + 1]);
          const __m256 b0 = _mm256_unpacklo_ps(r[4 * q + 2], r[4 * q + 3]),
                       b1 = _mm256_unpackhi_ps(r[4 * q + 2], r[4 * q + 3]);
          t[4 * q] = _mm256_shuffle_ps(a0, b0, 0x44);
          t[4 * q + 1] = _mm256_shuffle_ps(a0, b0, 0xee);
          t[4 * q + 2] = _mm256_shuffle_ps(a1, b1, 0x44);
          t[4 * q + 3] = _mm256_shuffle_ps(a1, b1, 0xee);
        }
        for (int j = 0; j < 4; ++j) {
          float* lo = reinterpret_cast<float*>(kt + (int64_t(st) * depth + d0 + j) * tk + kin);
          float* hi = reinterpret_cast<float*>(kt + (int64_t(st) * depth + d0 + j + 4) * tk + kin);
          _mm256_storeu_ps(lo, _mm256_permute2f128_ps(t[j], t[j + 4], 0x20));
          _mm256_storeu_ps(hi, _mm256_permute2f128_ps(t[j], t[j + 4], 0x31));
        }
      }
    }
    return;
  }
#endif
  for (int st = 0; st < c.kb / tk; ++st) {
    uint32_t* dst = kt + int64_t(st) * depth * tk;
    for (int k = 0; k < tk; ++k) {
      const int64_t slot = k0 + st * tk + k;
      if (slot >= S) {
        for (int d = 0; d < depth; ++d) dst[d * tk + k] = 0;
      } else if (c.bf16_kv && !c.bf16_dot) {
        const uint16_t* src = static_cast<const uint16_t*>(kbase) + slot * dh;
        for (int d = 0; d < depth; ++d) dst[d * tk + k] = uint32_t(src[d]) << 16;
      } else {
        // f32 keys (dh dwords) or bf16 pairs (dh/2 dwords) alike.
        const uint32_t* src = static_cast<const uint32_t*>(kbase) + slot * depth;
        for (int d = 0; d < depth; ++d) dst[d * tk + k] = src[d];
      }
    }
  }
}

// vdpbf16ps path: V block b repacked so each dword holds the same head_dim
// element of two consecutive keys, (v[2i][h] low, v[2i+1][h] high): the
// P.V product then pairs along the key axis, which is the axis it sums over.
static void repack_values(const CoreConfig& c, const void* vbase, const uint8_t* kvalid, int64_t S, int64_t k0,
                          uint32_t* vp) {
#if G3X_VL == 16
  const int dh = c.head_dim;
  alignas(64) static const uint16_t kIdx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i idx = _mm512_load_si512(kIdx);
  const uint16_t* v = static_cast<const uint16_t*>(vbase);
  for (int i = 0; i < c.kb / 2; ++i) {
    const int64_t sa = k0 + 2 * i, sb = sa + 1;
    for (int h = 0; h < dh; h += 16) {
      __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
      // Invalid slots read as zero (they may hold NaN; p is 0 there).
      if (sa < S && kvalid[sa])
        a = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + sa * dh + h)));
      if (sb < S && kvalid[sb])
        b = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + sb * dh + h)));
      _mm512_storeu_si512(vp + int64_t(i) * dh + h, _mm512_permutex2var_epi16(a, idx, b));
    }
  }
#else
  (void)c, (void)vbase, (void)kvalid, (void)S, (void)k0, (void)vp;
#endif
}

// Tiles of at most this many rows (decode: T = 1, so R = G) take the
// direct QK kernel (at G = 8 and 4096 keys it is 3x faster than
// transposing), and on the plain path the direct P.V kernel.
constexpr int64_t kDirectRows = 8;

static void core(const CoreContext* ctx, const g3_core_args* a) {
  const CoreConfig& c = ctx->cfg;
  const int64_t T = a->T, S = a->S, dh = c.head_dim, G = c.group;
  const int kb = c.kb, depth = c.qk_depth();
  if (T <= 0) return;
  static thread_local Buffers sc;

  // Key blocks summarised (mask_rule.h), so a whole block can be classified
  // against a query tile in O(1).
  const int64_t nblocks = (S + kb - 1) / kb;
  sc.blocks.resize(size_t(nblocks));
  for (int64_t b = 0; b < nblocks; ++b) sc.blocks[size_t(b)] = g3_tile_info_of(a, b * kb, kb);
  sc.rows.resize(size_t(T));
  for (int64_t t = 0; t < T; ++t) sc.rows[size_t(t)] = g3_bounds_of(a, t);

  const int64_t Tq = std::max<int64_t>(1, c.q_tile_rows / G);
  const int64_t ntiles = (T + Tq - 1) / Tq;
  // With several query tiles the transposed keys (and repacked values) are
  // kept per block and reused; with one (decode) each block is used once.
  // Past 32 MB per thread (contexts beyond ~32k keys at head_dim 256) they
  // are redone per tile instead: a transpose costs about 2% of the tile's
  // FMAs at 96 rows, so the cache is a small win, not worth any memory.
  const size_t kt_block = size_t(c.kb / c.tk) * depth * c.tk;
  const size_t vp_block = size_t(kb / 2) * dh;
  const bool keep = ntiles > 1 && (kt_block + (c.bf16_dot ? vp_block : 0)) * 4 * size_t(nblocks) <= (size_t(32) << 20);
  uint32_t* kt_all = sc.kt.Get(keep ? kt_block * nblocks : kt_block);
  uint32_t* vp_all = c.bf16_dot ? sc.vp.Get(keep ? vp_block * nblocks : vp_block) : nullptr;
  if (keep) {
    sc.kt_done.assign(size_t(nblocks), 0);
    sc.vp_done.assign(size_t(nblocks), 0);
  }

  const int64_t Rmax = Tq * G;
  uint32_t* qs = sc.q.Get(size_t(Rmax * depth));
  float* s = sc.s.Get(size_t(Rmax * kb));  // logits, then probabilities in place
  uint16_t* pb = sc.pb.Get(size_t(Rmax * kb));
  float* o = sc.o.Get(size_t(Rmax * dh));
  float* m = sc.m.Get(size_t(Rmax));
  float* l = sc.l.Get(size_t(Rmax));
  float* corr = sc.corr.Get(size_t(Rmax));
  int32_t* kp = sc.kp.Get(size_t(kb));
  int32_t* kv = sc.kv.Get(size_t(kb));
  g3_row_bounds* rb = sc.rb.Get(size_t(Rmax));
  const size_t esz = c.bf16_kv ? 2 : 4;
  // The decode prefetch (kernel_contract.h): the call's hint, else
  // decode_prefetch.h's default, in whole keys, as bytes past each row read.
  const int64_t ahead = int64_t(g3_decode_prefetch_keys(size_t(dh), esz, a->prefetch_bytes) * size_t(dh) * esz);
  const bool into_l2 = a->prefetch_level == G3_PREFETCH_L2;
  const QkFn direct_fn = into_l2 ? ctx->qk_direct_l2 : ctx->qk_direct;
  const PvFn direct_pv = into_l2 ? ctx->pv_direct_l2 : ctx->pv_direct;
  void* vpad = sc.vpad.Get(size_t(kb * dh));
  const FlashOps& fo = *ctx->flash;

  for (int64_t t0 = 0; t0 < T; t0 += Tq) {
    const int64_t nt = std::min(Tq, T - t0), R = nt * G;
    const bool direct = ctx->qk_direct && R <= kDirectRows;
    g3_row_set rs = g3_row_set_empty();
    for (int64_t t = 0; t < nt; ++t) {
      g3_row_set_add(&rs, sc.rows[size_t(t0 + t)]);
      for (int64_t g = 0; g < G; ++g) {
        const float* src = a->q + (t0 + t) * a->q_stride + g * dh;
        const int64_t r = t * G + g;
        rb[r] = sc.rows[size_t(t0 + t)];
        if (c.bf16_dot) to_bf16_pairs(src, reinterpret_cast<uint16_t*>(qs + r * depth), int(dh));
        else std::memcpy(qs + r * depth, src, size_t(dh) * 4);
      }
    }
    std::memset(o, 0, size_t(R * dh) * 4);
    fo.init_rows(R, m, l);

    for (int64_t b = 0; b < nblocks; ++b) {
      const g3_tile_info& bi = sc.blocks[size_t(b)];
      const int cls = g3_classify(&bi, &rs);
      if (cls == G3_TILE_SKIP) continue;  // hidden from every query of the tile
      const int64_t k0 = b * kb, nk = std::min<int64_t>(kb, S - k0);

      // Step E: logits. Few rows (decode): straight from the cache rows,
      // one key at a time. Columns past nk keep what they held; the softmax
      // step masks them (slots past S are invalid).
      if (direct) {
        const char* kblk = static_cast<const char*>(a->k) + size_t(k0 * dh) * esz;
        const int64_t v_minus_k = int64_t(reinterpret_cast<uintptr_t>(a->v) - reinterpret_cast<uintptr_t>(a->k));
        QkCall qc{qs, kblk, s, R, nk, v_minus_k, ahead};
        direct_fn(&qc);
      } else {
        uint32_t* kt = keep ? kt_all + kt_block * b : kt_all;
        if (!keep || !sc.kt_done[size_t(b)]) {
          transpose_keys(c, a->k, S, k0, kt);
          if (keep) sc.kt_done[size_t(b)] = 1;
        }
        for (int st = 0; st < kb / c.tk && st * c.tk < nk; ++st) {
          QkCall qc{qs, kt + int64_t(st) * depth * c.tk, s + st * c.tk, R, c.tk, 0, 0};
          ctx->qk(&qc);
        }
      }
      // Steps G-H: the shared masked online softmax (templates/softmax-inl.h).
      if (cls != G3_TILE_FULL)
        for (int64_t k = 0; k < kb; ++k) {
          const int64_t slot = k0 + k;
          kp[k] = slot < S ? a->kpos[slot] : 0;
          kv[k] = slot < S && a->kvalid[slot] ? -1 : 0;
        }
      fo.softmax_tile(s, kb, R, kb, cls == G3_TILE_FULL, k0, kp, kv, rb, m, l, corr);
      // Step I: O = O * corr + P.V.
      PvCall pc{s, nullptr, o, corr, R, nk, ahead};
      if (c.bf16_dot && !direct) {
        for (int64_t r = 0; r < R; ++r) to_bf16_pairs(s + r * kb, pb + r * kb, kb);
        uint32_t* vp = keep ? vp_all + vp_block * b : vp_all;
        if (!keep || !sc.vp_done[size_t(b)]) {
          repack_values(c, a->v, a->kvalid, S, k0, vp);
          if (keep) sc.vp_done[size_t(b)] = 1;
        }
        pc.p = pb;
        pc.v = vp;
        pc.nk = (nk + 1) / 2;
      } else {
        // The direct P.V kernel widens bf16 V as it loads it: on the
        // vdpbf16ps path the probabilities are rounded to bf16 in place
        // (the bf16 compute mode's p), and V needs no repack.
        if (c.bf16_dot)
          for (int64_t r = 0; r < R; ++r) round_to_bf16(s + r * kb, kb);
        pc.v = static_cast<const char*>(a->v) + size_t(k0 * dh) * esz;
        // Only a block's first nk keys are read; a partial block whose keys
        // are all valid (the end of a cache or of a decode piece) needs no copy.
        bool clean = bi.all;
        if (!clean) {
          clean = true;
          for (int64_t k = 0; k < nk && clean; ++k) clean = a->kvalid[k0 + k] != 0;
        }
        if (!clean) {
          // Invalid slots may hold anything (even NaN), and 0 * NaN is NaN:
          // give the kernel a copy with those rows zeroed.
          char* vz = static_cast<char*>(vpad);
          for (int64_t k = 0; k < nk; ++k) {
            const size_t row = size_t(dh) * esz;
            if (a->kvalid[k0 + k]) std::memcpy(vz + k * row, static_cast<const char*>(pc.v) + k * row, row);
            else std::memset(vz + k * row, 0, row);
          }
          pc.v = vz;
        }
      }
      (direct ? direct_pv : ctx->pv)(&pc);
    }

    // Normalise (the shared row finish); rows with no visible key are zeros
    // with lse = -inf.
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t r = t * G + g;
        fo.finish_row(o + r * dh, m[r], l[r], dh, a->out + (t0 + t) * a->out_stride + g * dh,
                      a->lse ? a->lse + (t0 + t) * G + g : nullptr);
      }
  }
}

#undef G3X_INLINE

}  // namespace G3X_NS
