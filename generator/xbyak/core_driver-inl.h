// The C++ tile loop around the Xbyak micro-kernels (SPEC.md section 1.3
// steps E-I with the structured mask of kernel_contract.h). Included by
// core_driver.cc once per instruction set, inside `#pragma GCC target`, with
// G3X_NS (namespace) and G3X_VL (f32 lanes) defined; the vector code uses
// GCC vector extensions so one text serves AVX2 and AVX-512.
//
// Per query tile (Tq tokens x G heads = R rows, all in one tile so every
// K/V element is loaded once per group):
//   for each key block of kb keys:
//     classify against the tile's query positions: hidden (skip: a local
//       layer costs O(T x W)), fully visible, or partial (mask per element);
//     S = Q.K^T                  JIT QK kernel on the transposed key block
//     online softmax (FlashAttention): m' = max(m, rowmax S),
//       corr = exp(m - m'), P = exp(S - m'), l = l * corr + rowsum P
//     O = O * corr + P.V         JIT PV kernel
//   out = O / l, lse = m + log l; rows that saw no visible key: zeros, -inf.

namespace G3X_NS {

constexpr int VL = G3X_VL;
typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));

#define G3X_INLINE static inline __attribute__((always_inline))

G3X_INLINE vf vload(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
G3X_INLINE void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
G3X_INLINE vf vsplat(float x) { return vf{} + x; }
G3X_INLINE vf vmax(vf a, vf b) { return a > b ? a : b; }

// exp(x) for x <= 0 (the arguments here are logits minus their running
// maximum): Cody-Waite reduction x = n ln2 + r, a degree-6 polynomial for
// e^r on |r| <= ln2/2 (relative error about 2 ulp), and 2^n through the
// exponent bits. x below -87 (including -inf, a hidden key) gives exactly 0.
G3X_INLINE vf vexp(vf x) {
  const vf xc = vmax(x, vsplat(-87.0f));
  const vf t = xc * 1.44269504088896341f;
  const vf n = (t + 12582912.0f) - 12582912.0f;  // round to nearest
  vf r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vf p = vsplat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &e, sizeof scale);
  const vf y = p * scale;
  return x < vsplat(-87.0f) ? vf{} : y;
}

G3X_INLINE float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < VL; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
G3X_INLINE float hsum(vf v) {
  float s = 0;
  for (int i = 0; i < VL; ++i) s += v[i];
  return s;
}

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

// Per-thread buffers, grown on demand and reused across calls.
template <typename T>
struct Buf {
  T* p = nullptr;
  size_t n = 0;
  ~Buf() { std::free(p); }
  T* get(size_t want) {
    if (want > n) {
      std::free(p);
      size_t bytes = ((want * sizeof(T) + 63) / 64) * 64;
      p = static_cast<T*>(std::aligned_alloc(64, bytes));
      if (!p) throw std::bad_alloc();
      n = want;
    }
    return p;
  }
};

struct Scratch {
  Buf<uint32_t> q, kt, vp, kpad, vpad;
  Buf<float> s, p, o, m, l, corr;
  Buf<uint16_t> pb;
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
// direct QK kernel: at G = 8 and 4096 keys it is 3x faster than transposing.
constexpr int64_t kDirectRows = 8;

static void core(const CoreContext* ctx, const g3_core_args* a) {
  const CoreConfig& c = ctx->cfg;
  const int64_t T = a->T, S = a->S, dh = c.head_dim, G = c.group;
  const int kb = c.kb, depth = c.qk_depth();
  if (T <= 0) return;
  static thread_local Scratch sc;

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
  uint32_t* kt_all = sc.kt.get(keep ? kt_block * nblocks : kt_block);
  uint32_t* vp_all = c.bf16_dot ? sc.vp.get(keep ? vp_block * nblocks : vp_block) : nullptr;
  if (keep) {
    sc.kt_done.assign(size_t(nblocks), 0);
    sc.vp_done.assign(size_t(nblocks), 0);
  }

  const int64_t Rmax = Tq * G;
  uint32_t* qs = sc.q.get(size_t(Rmax * depth));
  float* s = sc.s.get(size_t(Rmax * kb));
  float* p = sc.p.get(size_t(Rmax * kb));
  uint16_t* pb = sc.pb.get(size_t(Rmax * kb));
  float* o = sc.o.get(size_t(Rmax * dh));
  float* m = sc.m.get(size_t(Rmax));
  float* l = sc.l.get(size_t(Rmax));
  float* corr = sc.corr.get(size_t(Rmax));
  const size_t esz = c.bf16_kv ? 2 : 4;
  void* kpad = sc.kpad.get(size_t(kb * dh));
  void* vpad = sc.vpad.get(size_t(kb * dh));
  const float ninf = -std::numeric_limits<float>::infinity();

  for (int64_t t0 = 0; t0 < T; t0 += Tq) {
    const int64_t nt = std::min(Tq, T - t0), R = nt * G;
    const bool direct = ctx->qk_direct && R <= kDirectRows;
    g3_row_set rs = g3_row_set_empty();
    for (int64_t t = 0; t < nt; ++t) {
      g3_row_set_add(&rs, sc.rows[size_t(t0 + t)]);
      for (int64_t g = 0; g < G; ++g) {
        const float* src = a->q + (t0 + t) * a->q_stride + g * dh;
        const int64_t r = t * G + g;
        if (c.bf16_dot) to_bf16_pairs(src, reinterpret_cast<uint16_t*>(qs + r * depth), int(dh));
        else std::memcpy(qs + r * depth, src, size_t(dh) * 4);
      }
    }
    std::memset(o, 0, size_t(R * dh) * 4);
    for (int64_t r = 0; r < R; ++r) m[r] = ninf, l[r] = 0;

    for (int64_t b = 0; b < nblocks; ++b) {
      const g3_tile_info& bi = sc.blocks[size_t(b)];
      const int cls = g3_classify(&bi, &rs);
      if (cls == G3_TILE_SKIP) continue;  // hidden from every query of the tile
      const bool full = cls == G3_TILE_FULL;
      const int64_t k0 = b * kb, nk = std::min<int64_t>(kb, S - k0);

      // Step E: logits. Few rows (decode): straight from the cache rows, the
      // last partial block through a zero-padded copy.
      if (direct) {
        const void* kblk = static_cast<const char*>(a->k) + size_t(k0 * dh) * esz;
        if (nk < kb) {
          std::memset(kpad, 0, size_t(kb * dh) * esz);
          std::memcpy(kpad, kblk, size_t(nk * dh) * esz);
          kblk = kpad;
        }
        QkCall qc{qs, kblk, s, R};
        ctx->qk_direct(&qc);
        for (int64_t r = 0; r < R; ++r)
          for (int64_t k = nk; k < kb; ++k) s[r * kb + k] = ninf;
      }
      uint32_t* kt = keep ? kt_all + kt_block * b : kt_all;
      if (!direct && (!keep || !sc.kt_done[size_t(b)])) {
        transpose_keys(c, a->k, S, k0, kt);
        if (keep) sc.kt_done[size_t(b)] = 1;
      }
      for (int st = 0; st < kb / c.tk && !direct; ++st) {
        if (st * c.tk >= nk) {
          for (int64_t r = 0; r < R; ++r)
            for (int k = st * c.tk; k < kb; ++k) s[r * kb + k] = ninf;
          break;
        }
        QkCall qc{qs, kt + int64_t(st) * depth * c.tk, s + st * c.tk, R};
        ctx->qk(&qc);
      }
      // Step G, structured: hidden logits become -inf (excluded exactly).
      if (!full) {
        for (int64_t t = 0; t < nt; ++t) {
          const g3_row_bounds rb = sc.rows[size_t(t0 + t)];
          for (int64_t k = 0; k < kb; ++k) {
            const int64_t slot = k0 + k;
            const bool vis = slot < S && g3_visible(rb, slot, a->kpos[slot], a->kvalid[slot]);
            if (!vis)
              for (int64_t g = 0; g < G; ++g) s[(t * G + g) * kb + k] = ninf;
          }
        }
      }
      // Step H, online: rescale what was accumulated to the new row maximum.
      for (int64_t r = 0; r < R; ++r) {
        float* sr = s + r * kb;
        float* pr = p + r * kb;
        vf mx = vsplat(ninf);
        for (int j = 0; j < kb; j += VL) mx = vmax(mx, vload(sr + j));
        const float mnew = std::max(m[r], hmax(mx));
        if (mnew == ninf) {  // nothing visible yet: keep O = 0, l = 0
          corr[r] = 1.f;
          std::memset(pr, 0, size_t(kb) * 4);
          continue;
        }
        const float cr = std::exp(m[r] - mnew);  // exp(-inf) = 0 on the first visible block
        vf sum{};
        for (int j = 0; j < kb; j += VL) {
          const vf e = vexp(vload(sr + j) - mnew);
          sum += e;
          vstore(pr + j, e);
        }
        l[r] = l[r] * cr + hsum(sum);
        m[r] = mnew;
        corr[r] = cr;
      }
      // Step I: O = O * corr + P.V.
      PvCall pc{p, nullptr, o, corr, R, nk};
      if (c.bf16_dot) {
        for (int64_t r = 0; r < R; ++r) to_bf16_pairs(p + r * kb, pb + r * kb, kb);
        uint32_t* vp = keep ? vp_all + vp_block * b : vp_all;
        if (!keep || !sc.vp_done[size_t(b)]) {
          repack_values(c, a->v, a->kvalid, S, k0, vp);
          if (keep) sc.vp_done[size_t(b)] = 1;
        }
        pc.p = pb;
        pc.v = vp;
        pc.nk = (nk + 1) / 2;
      } else {
        pc.v = static_cast<const char*>(a->v) + size_t(k0 * dh) * esz;
        if (!bi.all) {
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
      ctx->pv(&pc);
    }

    // Normalise; rows with no visible key are zeros with lse = -inf.
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t r = t * G + g;
        float* dst = a->out + (t0 + t) * a->out_stride + g * dh;
        const bool none = m[r] == ninf || !(l[r] > 0);
        const float inv = none ? 0.f : 1.f / l[r];
        for (int64_t h = 0; h < dh; h += VL) vstore(dst + h, vload(o + r * dh + h) * inv);
        if (a->lse) a->lse[(t0 + t) * G + g] = none ? ninf : m[r] + std::log(l[r]);
      }
  }
}

#undef G3X_INLINE

}  // namespace G3X_NS
