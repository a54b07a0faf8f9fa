// The Xbyak micro-kernels of the attention core: Q.K^T over head_dim and
// the P.V accumulation (SPEC.md section 1.3 steps E and I), emitted per
// CoreConfig in AVX2 or AVX-512, with vdpbf16ps for bf16 K/V where allowed.
//
// QK (f32, AVX-512, 12 rows, two key vectors; the inner loop is unrolled by 4
// over head_dim; listing from G3ATTN_XBYAK_DUMP + objdump):
//     vmovups zmm24,[rax]              ; K^T row h, keys 0..15
//     vmovups zmm25,[rax+0x40]         ; keys 16..31
//     vbroadcastss zmm26,[rdx]         ; q[row 0][h]
//     vfmadd231ps zmm0,zmm24,zmm26     ; s[0][0..15]  += q[0][h] * k[0..15][h]
//     vfmadd231ps zmm1,zmm25,zmm26     ; s[0][16..31] += q[0][h] * k[16..31][h]
//     vbroadcastss zmm26,[rdx+0x400]   ; q[row 1][h] (row stride head_dim*4)
//     ...                              ; rows 2..11: 22 more FMAs
//     vmovups zmm24,[rax+0x80]         ; next h
//     ...
//     add rax,0x200 ; add rdx,0x10 ; sub rcx,4 ; jne
// On the vdpbf16ps path the broadcast is vpbroadcastd of one bf16 pair of q
// and vdpbf16ps replaces vfmadd231ps: each instruction does 32 MACs (pairs
// of head_dim) instead of 16.
//
// PV (f32, AVX-512, 6 rows x 4 head_dim vectors held in zmm0..23; first the
// accumulators are loaded and rescaled by the online-softmax factor,
//     vbroadcastss zmm28,[r11] ; vmulps zmm0,zmm28,[r10] ; ... ; then):
//     vmovups zmm24,[rcx]              ; v[k][h0..h0+15]
//     vmovups zmm25,[rcx+0x40]
//     vmovups zmm26,[rcx+0x80]
//     vmovups zmm27,[rcx+0xc0]
//     vbroadcastss zmm28,[rax]         ; p[row 0][k]
//     vfmadd231ps zmm0,zmm24,zmm28     ; o[0][h0..] += p[0][k] * v[k][h0..]
//     vfmadd231ps zmm1,zmm25,zmm28
//     ...                              ; 24 FMAs per key
//     add rax,4 ; add rcx,0x400 ; dec rdx ; jne
// On the vdpbf16ps path v is the key-pair-interleaved repack of the bf16 V
// tile and p one bf16 pair of keys, so one instruction covers two keys.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <xbyak/xbyak.h>
#include <xbyak/xbyak_util.h>

#include "generator/xbyak/jit_plumbing.h"
#include "generator/xbyak/xbyak_core.h"

namespace g3::xbyak {

namespace {

using namespace Xbyak;

constexpr size_t kCodeSize = 1 << 14;  // the largest kernel is about 6 KB

// Common to both kernels: vector registers of the configured width.
struct JitBase : CodeGenerator {
  explicit JitBase(const CoreConfig& c) : CodeGenerator(kCodeSize), cfg(c) {}
  const CoreConfig cfg;
  Xmm vec(int i) const { return cfg.isa == Isa::Avx512 ? Xmm(Zmm(i)) : Xmm(Ymm(i)); }
  int vbytes() const { return cfg.vl * 4; }
  // Broadcast one dword (an f32 or a bf16 pair) into a vector register.
  void bcast(const Xmm& x, const Address& a) {
    if (cfg.bf16_dot) vpbroadcastd(x, a);
    else vbroadcastss(x, a);
  }
  // acc += a * b: an FMA, or a pairwise bf16 dot product.
  void mac(const Xmm& acc, const Xmm& a, const Xmm& b) {
    if (cfg.bf16_dot) vdpbf16ps(acc, a, b);
    else vfmadd231ps(acc, a, b);
  }
  // The row loop of every kernel: full blocks of RB rows while RB remain,
  // then the remainder (< RB <= 16 rows) in blocks of 8, 4, 2 and 1, so a
  // kernel has at most five row-block bodies, which keeps generation short
  // (Xbyak emits an EVEX instruction in about 50 ns). step(n) emits the
  // body for n rows and advances the kernel's row pointers past them.
  void row_blocks(const Reg64& rows, int RB, const std::function<void(int)>& step) {
    Label l_blocks, l_tail;
    L(l_blocks);
    cmp(rows, RB);
    jl(l_tail, T_NEAR);
    step(RB);
    sub(rows, RB);
    jmp(l_blocks, T_NEAR);
    L(l_tail);
    for (int n = 8; n >= 1; n /= 2) {
      if (n >= RB) continue;
      Label skip;
      cmp(rows, n);
      jl(skip, T_NEAR);
      step(n);
      sub(rows, n);
      L(skip);
    }
  }
};

// S[r][0..tk) = sum over d of q[r][d] * kt[d][0..tk), for r < rows.
struct QkJit : JitBase {
  // Named registers (System V: the argument block arrives in rdi).
  const Reg64 reg_args = rdi, reg_q = r8, reg_kt = r9, reg_s = r10, reg_rows = r11;
  const Reg64 reg_pk = rax, reg_pq = rdx, reg_cnt = rcx;
  static constexpr int kNv = 2;  // key vectors per sub-tile

  explicit QkJit(const CoreConfig& c) : JitBase(c) { generate(); }

  Xmm acc(int r, int v) const { return vec(r * kNv + v); }
  Xmm kreg(int v) const { return vec(cfg.qk_rows * kNv + v); }
  Xmm breg() const { return vec(cfg.qk_rows * kNv + kNv); }

  void generate() {
    const int depth = cfg.qk_depth();
    const int qrow = depth * 4;  // bytes per q row
    const int RB = cfg.qk_rows;
    mov(reg_q, ptr[reg_args + offsetof(QkCall, q)]);
    mov(reg_kt, ptr[reg_args + offsetof(QkCall, kt)]);
    mov(reg_s, ptr[reg_args + offsetof(QkCall, s)]);
    mov(reg_rows, ptr[reg_args + offsetof(QkCall, rows)]);
    row_blocks(reg_rows, RB, [&](int n) {
      block(n, depth);
      add(reg_q, n * qrow);
      add(reg_s, n * cfg.kb * 4);
    });
    vzeroupper();
    ret();
  }

  void block(int n, int depth) {
    const int qrow = depth * 4, krow = cfg.tk * 4;
    const int unroll = depth % 4 == 0 ? 4 : depth % 2 == 0 ? 2 : 1;
    for (int r = 0; r < n; ++r)
      for (int v = 0; v < kNv; ++v) vxorps(acc(r, v), acc(r, v), acc(r, v));
    mov(reg_pk, reg_kt);
    mov(reg_pq, reg_q);
    mov(reg_cnt, depth);
    Label loop;
    L(loop);
    for (int u = 0; u < unroll; ++u) {
      for (int v = 0; v < kNv; ++v) vmovups(kreg(v), ptr[reg_pk + u * krow + v * vbytes()]);
      for (int r = 0; r < n; ++r) {
        bcast(breg(), ptr[reg_pq + r * qrow + u * 4]);
        for (int v = 0; v < kNv; ++v) mac(acc(r, v), kreg(v), breg());
      }
    }
    add(reg_pk, unroll * krow);
    add(reg_pq, unroll * 4);
    sub(reg_cnt, unroll);
    jnz(loop, T_NEAR);
    for (int r = 0; r < n; ++r)
      for (int v = 0; v < kNv; ++v) vmovups(ptr[reg_s + r * cfg.kb * 4 + v * vbytes()], acc(r, v));
  }
};

// Decode and other few-row tiles (up to 8 rows, 4 at a time): S = Q.K^T
// with K read in its cache layout, no transposition, one key row at a time,
// whole and in address order (what a hardware prefetcher follows best on a
// stream from DRAM; the Highway decode core's DecodeLogits). Two
// accumulators per row take alternate head_dim vectors, q comes from memory
// as the FMA's operand, and each (row, key) pair ends in a horizontal sum.
// With so few rows the loop is bound by streaming K, and the transposition
// the QK kernel needs would cost more than the sums (decode at G = 2, 4096
// keys: 5x faster).
//     prefetcht1 [rcx+rdx] ; ... [rcx+rdx+0x3c0]    ; the K row QkCall::ahead bytes ahead
//     vmovups zmm8,[rcx]                             ; 16 dims of the key
//     vfmadd231ps zmm0,zmm8,[r8]                     ; q row 0
//     vfmadd231ps zmm2,zmm8,[r8+0x400]               ; q row 1 ...
//     vmovups zmm9,[rcx+0x40]                        ; the next 16 (accumulators 1, 3, ...)
// Decode runs at the memory's pace, so per key the kernel asks for the K
// row QkCall::ahead bytes ahead (the call's hint or templates/
// decode_prefetch.h's default, in whole keys), and into L1 the V row as
// well (into L2, PvDirectJit asks for V). One kernel per cache level asked
// for: prefetcht0 (L1) or prefetcht1 (L2).
struct QkDirectJit : JitBase {
  const Reg64 reg_args = rdi, reg_q = r8, reg_k = r9, reg_s = r10, reg_rows = r11;
  const Reg64 reg_sw = rsi, reg_kw = rcx, reg_cnt = rax;
  const Reg64 reg_pk = rdx;  // QkCall::ahead: K prefetch at [reg_kw + reg_pk]
  const Reg64 reg_pv = rbx;  // v_minus_k + ahead: V prefetch at [reg_kw + reg_pv]
  static constexpr int kRows = 4;
  const bool l2;             // prefetcht1 (into L2) instead of prefetcht0

  QkDirectJit(const CoreConfig& c, bool into_l2) : JitBase(c), l2(into_l2) { generate(); }

  Xmm acc(int r, int u) const { return vec(r * 2 + u); }
  Xmm kreg(int u) const { return vec(2 * kRows + u); }
  int tmp() const { return 2 * kRows + 2; }
  bool widen() const { return cfg.bf16_kv && !cfg.bf16_dot; }
  int krow() const { return cfg.head_dim * (cfg.bf16_kv ? 2 : 4); }  // bytes per cache row
  int steps() const { return cfg.bf16_dot ? cfg.head_dim / 32 : cfg.head_dim / cfg.vl; }

  void ask(const Address& a) {
    if (l2) prefetcht1(a);
    else prefetcht0(a);
  }

  void generate() {
    mov(reg_q, ptr[reg_args + offsetof(QkCall, q)]);
    mov(reg_k, ptr[reg_args + offsetof(QkCall, kt)]);
    mov(reg_s, ptr[reg_args + offsetof(QkCall, s)]);
    mov(reg_rows, ptr[reg_args + offsetof(QkCall, rows)]);
    push(reg_pv);  // callee-saved
    mov(reg_pk, ptr[reg_args + offsetof(QkCall, ahead)]);
    mov(reg_pv, ptr[reg_args + offsetof(QkCall, v_minus_k)]);
    add(reg_pv, reg_pk);
    row_blocks(reg_rows, kRows, [&](int n) {
      block(n);
      add(reg_q, n * cfg.qk_depth() * 4);
      add(reg_s, n * cfg.kb * 4);
    });
    pop(reg_pv);
    vzeroupper();
    ret();
  }

  void block(int n) {
    const int qrow = cfg.qk_depth() * 4;
    const int kstep = widen() ? cfg.vl * 2 : vbytes();  // bytes of K per vector
    const int U = steps() >= 2 ? 2 : 1;
    Label key, done;
    mov(reg_kw, reg_k);
    mov(reg_sw, reg_s);
    mov(reg_cnt, ptr[reg_args + offsetof(QkCall, keys)]);
    test(reg_cnt, reg_cnt);
    jz(done, T_NEAR);
    L(key);
    for (int l = 0; l < (krow() + 63) / 64; ++l) {
      ask(ptr[reg_kw + reg_pk + l * 64]);
      if (!l2) ask(ptr[reg_kw + reg_pv + l * 64]);
    }
    for (int r = 0; r < n; ++r)
      for (int u = 0; u < U; ++u) vxorps(acc(r, u), acc(r, u), acc(r, u));
    for (int i = 0; i < steps(); ++i) {
      const Xmm k = kreg(i % U);
      if (widen()) {
        vpmovzxwd(k, ptr[reg_kw + i * kstep]);
        vpslld(k, k, 16);
      } else {
        vmovups(k, ptr[reg_kw + i * kstep]);
      }
      for (int r = 0; r < n; ++r) {
        const Address qa = ptr[reg_q + r * qrow + i * vbytes()];
        if (cfg.bf16_dot) vdpbf16ps(acc(r, i % U), k, qa);
        else vfmadd231ps(acc(r, i % U), k, qa);
      }
    }
    // Horizontal sums: (512 ->) 256 -> 128 -> 64 -> 32 bits.
    const int t = tmp();
    for (int r = 0; r < n; ++r) {
      const int i = acc(r, 0).getIdx();
      if (U == 2) vaddps(acc(r, 0), acc(r, 0), acc(r, 1));
      if (cfg.isa == Isa::Avx512) {
        vextractf64x4(Ymm(t), Zmm(i), 1);
        vaddps(Ymm(i), Ymm(i), Ymm(t));
        vextractf32x4(Xmm(t), Ymm(i), 1);
      } else {
        vextractf128(Xmm(t), Ymm(i), 1);
      }
      vaddps(Xmm(i), Xmm(i), Xmm(t));
      vmovhlps(Xmm(t), Xmm(t), Xmm(i));
      vaddps(Xmm(i), Xmm(i), Xmm(t));
      vmovshdup(Xmm(t), Xmm(i));
      vaddss(Xmm(i), Xmm(i), Xmm(t));
      vmovss(ptr[reg_sw + r * cfg.kb * 4], Xmm(i));
    }
    add(reg_kw, krow());
    add(reg_sw, 4);
    dec(reg_cnt);
    jnz(key, T_NEAR);
    L(done);
  }
};

// o[r][:] = o[r][:] * corr[r] + sum over k of p[r][k] * v[k][:], for r < rows.
struct PvJit : JitBase {
  const Reg64 reg_args = rdi, reg_p = r8, reg_v = r9, reg_o = r10, reg_corr = r11, reg_rows = rsi;
  const Reg64 reg_pk = rax, reg_vk = rcx, reg_cnt = rdx, reg_hblk = rbx;

  explicit PvJit(const CoreConfig& c) : JitBase(c) { generate(); }

  Xmm acc(int r, int b) const { return vec(r * cfg.pv_vecs + b); }
  Xmm vreg(int b) const { return vec(cfg.pv_rows * cfg.pv_vecs + b); }
  Xmm breg() const { return vec(cfg.pv_rows * cfg.pv_vecs + cfg.pv_vecs); }

  // Bytes per p row and per step of the key loop in v.
  int prow() const { return cfg.bf16_dot ? cfg.kb * 2 : cfg.kb * 4; }
  int vstep() const { return cfg.bf16_kv && !cfg.bf16_dot ? cfg.head_dim * 2 : cfg.head_dim * 4; }

  void generate() {
    const int RB = cfg.pv_rows;
    mov(reg_p, ptr[reg_args + offsetof(PvCall, p)]);
    mov(reg_v, ptr[reg_args + offsetof(PvCall, v)]);
    mov(reg_o, ptr[reg_args + offsetof(PvCall, o)]);
    mov(reg_corr, ptr[reg_args + offsetof(PvCall, corr)]);
    mov(reg_rows, ptr[reg_args + offsetof(PvCall, rows)]);
    push(reg_hblk);  // callee-saved
    row_blocks(reg_rows, RB, [&](int n) {
      block(n);
      add(reg_p, n * prow());
      add(reg_o, n * cfg.head_dim * 4);
      add(reg_corr, n * 4);
    });
    pop(reg_hblk);
    vzeroupper();
    ret();
  }

  // Load the b-th head_dim vector of the current key (widening bf16 to f32
  // on the plain path: a bf16 is the upper half of an f32).
  void load_v(const Xmm& x, int hoff) {
    if (cfg.bf16_kv && !cfg.bf16_dot) {
      vpmovzxwd(x, ptr[reg_vk + hoff * 2]);
      vpslld(x, x, 16);
    } else {
      vmovups(x, ptr[reg_vk + hoff * 4]);
    }
  }

  // n rows; a loop over head_dim blocks of pv_vecs vectors, each with the
  // key loop inside. reg_o and reg_v walk the blocks and are restored after.
  void block(int n) {
    const int NB = cfg.pv_vecs, orow = cfg.head_dim * 4, hstep = NB * cfg.vl;
    const int vesz = cfg.bf16_kv && !cfg.bf16_dot ? 2 : 4;
    mov(reg_hblk, cfg.head_dim / hstep);
    Label hloop, loop;
    L(hloop);
    for (int r = 0; r < n; ++r) {
      vbroadcastss(breg(), ptr[reg_corr + r * 4]);
      for (int b = 0; b < NB; ++b) vmulps(acc(r, b), breg(), ptr[reg_o + r * orow + b * vbytes()]);
    }
    mov(reg_pk, reg_p);
    mov(reg_vk, reg_v);
    mov(reg_cnt, ptr[reg_args + offsetof(PvCall, nk)]);
    L(loop);
    for (int b = 0; b < NB; ++b) load_v(vreg(b), b * cfg.vl);
    for (int r = 0; r < n; ++r) {
      bcast(breg(), ptr[reg_pk + r * prow()]);
      for (int b = 0; b < NB; ++b) mac(acc(r, b), vreg(b), breg());
    }
    add(reg_pk, 4);
    add(reg_vk, vstep());
    dec(reg_cnt);
    jnz(loop, T_NEAR);
    for (int r = 0; r < n; ++r)
      for (int b = 0; b < NB; ++b) vmovups(ptr[reg_o + r * orow + b * vbytes()], acc(r, b));
    add(reg_o, hstep * 4);
    add(reg_v, hstep * vesz);
    dec(reg_hblk);
    jnz(hloop, T_NEAR);
    sub(reg_o, cfg.head_dim * 4);
    sub(reg_v, cfg.head_dim * vesz);
  }
};

// Decode and other few-row tiles on the plain path (f32 p; f32 or bf16 V in
// cache layout): o[r] = o[r] * corr[r] + sum over k of p[r][k] * v[k], four
// keys per pass over o (rows x head_dim floats, which stay in L1), each
// pass reading the four V rows whole and in address order, where PvJit
// walks a block's V rows a column block at a time (the Highway decode
// core's DecodePV). The last 1-3 keys go one at a time.
// Per step over head_dim (f32 V, AVX-512, into L2; p[r][k..k+3] were
// broadcast into zmm9..zmm24 before the pass):
//     prefetcht1 [r14] ; ... [r14+0xc0] ; add r14,0x100  ; this step's share of the V rows ahead
//     vmovups zmm0,[r12] ; ... zmm3,[r12+0xc00]    ; 16 dims of keys k..k+3
//     vmovups zmm4,[r13]                           ; o[0][h..h+15]
//     vfmadd231ps zmm4,zmm0,zmm9 ; ... zmm3,zmm12  ; += p[0][k+j] * v[k+j]
//     vmovups [r13],zmm4 ; ...                     ; rows 1..3 alike
//     add r12,0x40 ; add r13,0x40 ; dec r15 ; jne
// The kernel for L2 asks for the V rows PvCall::ahead bytes ahead, a few
// lines per step over head_dim, so the requests run through the whole pass.
struct PvDirectJit : JitBase {
  const Reg64 reg_args = rdi, reg_p = r8, reg_v = r9, reg_o = r10, reg_corr = r11, reg_rows = rsi;
  const Reg64 reg_pk = rax, reg_vk = rcx, reg_cnt = rdx, reg_ahead = rbx;
  const Reg64 reg_vw = r12, reg_ow = r13, reg_pf = r14, reg_h = r15;  // the walk over head_dim
  static constexpr int kRows = 4, kKeys = 4;
  const bool ask;  // prefetcht1 of V rows PvCall::ahead bytes ahead

  PvDirectJit(const CoreConfig& c, bool into_l2) : JitBase(c), ask(into_l2) { generate(); }

  Xmm vreg(int j) const { return vec(j); }
  Xmm oreg(int r) const { return vec(kKeys + r); }
  Xmm tmp() const { return vec(kKeys + kRows); }
  // p[r][k..k+3] held in registers where they fit (AVX-512's 32), else
  // broadcast at each use.
  bool p_in_regs() const { return cfg.isa == Isa::Avx512; }
  Xmm preg(int r, int j) const { return vec(kKeys + kRows + 1 + r * kKeys + j); }
  bool widen() const { return cfg.bf16_kv; }
  int vrow() const { return cfg.head_dim * (widen() ? 2 : 4); }  // bytes per cache row
  int vstep() const { return widen() ? cfg.vl * 2 : vbytes(); }  // bytes of a V row per vector
  int steps() const { return cfg.head_dim / cfg.vl; }

  void generate() {
    const Reg64 saved[] = {reg_ahead, reg_vw, reg_ow, reg_pf, reg_h};  // callee-saved
    for (const Reg64& r : saved) push(r);
    mov(reg_p, ptr[reg_args + offsetof(PvCall, p)]);
    mov(reg_v, ptr[reg_args + offsetof(PvCall, v)]);
    mov(reg_o, ptr[reg_args + offsetof(PvCall, o)]);
    mov(reg_corr, ptr[reg_args + offsetof(PvCall, corr)]);
    mov(reg_rows, ptr[reg_args + offsetof(PvCall, rows)]);
    mov(reg_ahead, ptr[reg_args + offsetof(PvCall, ahead)]);
    row_blocks(reg_rows, kRows, [&](int n) {
      block(n);
      add(reg_p, n * cfg.kb * 4);
      add(reg_o, n * cfg.head_dim * 4);
      add(reg_corr, n * 4);
    });
    for (auto r = std::rbegin(saved); r != std::rend(saved); ++r) pop(*r);
    vzeroupper();
    ret();
  }

  // for (h = 0; h < steps(); ++h) body(): reg_vw and reg_ow walk V's and
  // o's vectors of step h.
  void over_h(const std::function<void()>& body) {
    Label h;
    mov(reg_vw, reg_vk);
    mov(reg_ow, reg_o);
    mov(reg_h, steps());
    L(h);
    body();
    add(reg_vw, vstep());
    add(reg_ow, vbytes());
    dec(reg_h);
    jnz(h, T_NEAR);
  }

  // One pass of `keys` keys over o; per step over head_dim, its share of
  // the lines of the V rows ahead (keys x vrow bytes from reg_vk + ahead).
  void pass(int n, int keys) {
    const int orow = cfg.head_dim * 4, prow = cfg.kb * 4;
    const int lines = (keys * vrow() + 63) / 64, per = (lines + steps() - 1) / steps();
    const bool held = p_in_regs() && keys == kKeys;
    if (held)
      for (int r = 0; r < n; ++r)
        for (int j = 0; j < keys; ++j) vbroadcastss(preg(r, j), ptr[reg_pk + r * prow + j * 4]);
    if (ask) lea(reg_pf, ptr[reg_vk + reg_ahead]);
    over_h([&] {
      if (ask) {
        for (int l = 0; l < per; ++l) prefetcht1(ptr[reg_pf + l * 64]);
        add(reg_pf, per * 64);
      }
      for (int j = 0; j < keys; ++j) {
        if (widen()) {
          vpmovzxwd(vreg(j), ptr[reg_vw + j * vrow()]);
          vpslld(vreg(j), vreg(j), 16);
        } else {
          vmovups(vreg(j), ptr[reg_vw + j * vrow()]);
        }
      }
      for (int r = 0; r < n; ++r) {
        vmovups(oreg(r), ptr[reg_ow + r * orow]);
        for (int j = 0; j < keys; ++j) {
          if (held) {
            vfmadd231ps(oreg(r), vreg(j), preg(r, j));
          } else {
            vbroadcastss(tmp(), ptr[reg_pk + r * prow + j * 4]);
            vfmadd231ps(oreg(r), vreg(j), tmp());
          }
        }
        vmovups(ptr[reg_ow + r * orow], oreg(r));
      }
    });
    add(reg_pk, keys * 4);
    add(reg_vk, keys * vrow());
  }

  void block(int n) {
    const int orow = cfg.head_dim * 4;
    mov(reg_vk, reg_v);
    over_h([&] {  // o = o * corr
      for (int r = 0; r < n; ++r) {
        vbroadcastss(tmp(), ptr[reg_corr + r * 4]);
        vmulps(oreg(r), tmp(), ptr[reg_ow + r * orow]);
        vmovups(ptr[reg_ow + r * orow], oreg(r));
      }
    });
    mov(reg_pk, reg_p);
    mov(reg_cnt, ptr[reg_args + offsetof(PvCall, nk)]);
    Label four, one, done;
    L(four);
    cmp(reg_cnt, kKeys);
    jl(one, T_NEAR);
    pass(n, kKeys);
    sub(reg_cnt, kKeys);
    jmp(four, T_NEAR);
    L(one);
    test(reg_cnt, reg_cnt);
    jz(done, T_NEAR);
    pass(n, 1);
    dec(reg_cnt);
    jmp(one, T_NEAR);
    L(done);
  }
};

}  // namespace

struct CoreKernels {
  CoreContext ctx;
  std::unique_ptr<QkJit> qk;
  std::unique_ptr<PvJit> pv;
  std::unique_ptr<QkDirectJit> qk_direct, qk_direct_l2;
  std::unique_ptr<PvDirectJit> pv_direct, pv_direct_l2;
  std::unique_ptr<ContextEntry<CoreContext>> entry;
  double gen_ms = 0;
};

std::shared_ptr<CoreKernels> build_core(const CoreConfig& cfg, const std::string& dump_name) {
  auto t0 = std::chrono::steady_clock::now();
  auto k = std::make_shared<CoreKernels>();
  k->ctx.cfg = cfg;
  k->ctx.flash = &flash_ops(cfg.isa == Isa::Avx512 ? "avx3" : "avx2");
  k->qk = std::make_unique<QkJit>(cfg);
  k->pv = std::make_unique<PvJit>(cfg);
  k->ctx.qk = k->qk->getCode<QkFn>();
  k->ctx.pv = k->pv->getCode<PvFn>();
  if ((cfg.bf16_dot ? cfg.head_dim % 32 : cfg.head_dim % cfg.vl) == 0) {
    k->qk_direct = std::make_unique<QkDirectJit>(cfg, false);
    k->qk_direct_l2 = std::make_unique<QkDirectJit>(cfg, true);
    k->ctx.qk_direct = k->qk_direct->getCode<QkFn>();
    k->ctx.qk_direct_l2 = k->qk_direct_l2->getCode<QkFn>();
  }
  if (k->qk_direct) {
    k->pv_direct = std::make_unique<PvDirectJit>(cfg, false);
    k->pv_direct_l2 = std::make_unique<PvDirectJit>(cfg, true);
    k->ctx.pv_direct = k->pv_direct->getCode<PvFn>();
    k->ctx.pv_direct_l2 = k->pv_direct_l2->getCode<PvFn>();
  }
  k->entry = std::make_unique<ContextEntry<CoreContext>>(&k->ctx, cfg.isa == Isa::Avx512 ? &core_avx512 : &core_avx2);
  // Executable, no longer writable.
  k->qk->setProtectModeRE();
  k->pv->setProtectModeRE();
  if (k->qk_direct) k->qk_direct->setProtectModeRE();
  if (k->qk_direct_l2) k->qk_direct_l2->setProtectModeRE();
  if (k->pv_direct) k->pv_direct->setProtectModeRE();
  if (k->pv_direct_l2) k->pv_direct_l2->setProtectModeRE();
  k->entry->setProtectModeRE();
  k->gen_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  dump_code(dump_name, "qk", *k->qk);
  dump_code(dump_name, "pv", *k->pv);
  if (k->qk_direct) dump_code(dump_name, "qk_direct", *k->qk_direct);
  if (k->qk_direct_l2) dump_code(dump_name, "qk_direct_l2", *k->qk_direct_l2);
  if (k->pv_direct) dump_code(dump_name, "pv_direct", *k->pv_direct);
  if (k->pv_direct_l2) dump_code(dump_name, "pv_direct_l2", *k->pv_direct_l2);
  dump_code(dump_name, "entry", *k->entry);
  return k;
}

g3_core_fn core_entry(const CoreKernels& k) { return k.entry->getCode<g3_core_fn>(); }
double core_gen_ms(const CoreKernels& k) { return k.gen_ms; }
size_t core_code_bytes(const CoreKernels& k) {
  return k.qk->getSize() + k.pv->getSize() + k.entry->getSize() +
         (k.qk_direct ? k.qk_direct->getSize() + k.qk_direct_l2->getSize() : 0) +
         (k.pv_direct ? k.pv_direct->getSize() + k.pv_direct_l2->getSize() : 0);
}

}  // namespace g3::xbyak
