// The AMX micro-kernels of the bf16-compute attention core, emitted with
// Xbyak per key, and the backend's entry points (SPEC.md section 1.3: step E
// is the QK kernel, step I the PV kernel; steps G-H, the structured mask and
// the online softmax, are the shared FlashOps code the tile loop in
// amx_driver.cc calls between them).
//
// The tile instructions. tdpbf16ps C, A, B multiplies a tile A of M rows x
// 32 bf16 (one 64-byte row per output row) by a tile B of 16 rows, each
// holding 16 dwords that are PAIRS of bf16 along the sum: B row k, dword n
// is (b[2k][n], b[2k+1][n]). It adds into C, M rows x 16 f32:
//   C[m][n] += sum_k A[m][2k] B[k][2n] + A[m][2k+1] B[k][2n+1]   (k < 16),
// products of bf16 values exact in f32 and sums in f32 (inputs and outputs
// that are denormal are flushed to zero, which a bf16 logit or weight of
// order 1e-38 never notices). All eight tile registers are configured alike:
// 16 rows x 64 bytes.
//
// Layouts, and why.
//  * Logits: S = Q K^T with A = Q (queries in bf16, row-major [rows][dh], a
//    copy rounded once per call) and B = K^T in pairs: kt[d][s] is the dword
//    (k[s][2d], k[s][2d+1]), a 16 x 16 dword transpose of the cache rows.
//    The other orientation, S^T = K Q^T, would load K tiles straight from a
//    bf16 cache, but gives the logits transposed: the softmax (FlashOps,
//    rows of keys) would need every 16 x 16 score tile transposed, R x kb
//    dwords per key block, where K^T costs kb x dh/2 dwords per block and is
//    shared by every row group of the call. The runtime's prefill calls have
//    R = 64 tokens x G rows (128 for Gemma 3 4B and 27B), so transposing K
//    is never more work (equal at head_dim 256, half at 128), an f32 cache
//    needs a conversion pass per block anyway (the transposed store is that
//    pass), and the logits land in the row layout the softmax reads.
//  * Values: O += P V with A = P (the softmax weights rounded to bf16,
//    [rows][kb]) and B = V in key pairs: vp[i][h] is the dword
//    (v[2i][h], v[2i+1][h]), the pair-interleaved layout tdpbf16ps wants,
//    repacked per key block (kb/2 x dh dwords) from f32 or bf16 cache rows.
//    Invalid slots and slots past the end are zeros there, so a NaN in an
//    invalid slot meets only p = 0 weights of zero values. A cache layout
//    that stored V pre-paired would save the repack (about 1/R of the P.V
//    work per block), but the runtime's caches, the decode cores and every
//    other backend read the contract's row layout.
//  * Blocking: 2 x 2 accumulator tiles (two row tiles = 32 query rows, the
//    row group, times two column tiles of 16), two A tiles and two B tiles:
//    every loaded tile feeds two tdpbf16ps, the shape that reaches the tile
//    peak. QK: for each pair of key tiles, the dh/32 steps of the sum; PV:
//    for each pair of head_dim tiles, the accumulators (the f32 output O,
//    kept in memory across key blocks because the online softmax rescales
//    it between blocks) are loaded once, take kb/32 tile products (4 at the
//    default 128 keys per block) and are stored once. A bit mask (`live`)
//    skips the 32-key steps that no row of the group sees.
//  * Strides: every buffer row is one cache line longer than its data
//    (Config::q_ld and the others), so the 16 rows of a tile spread over the
//    cache sets and tile loads do not alias the tile stores before them.
//    Measured alone, with their operands in L1 or L2, both kernels run one
//    tdpbf16ps per 18-26 TSC cycles on the 2.6 GHz Xeon this was written on.
//
// QK, head_dim 256, kb 128 (G3ATTN_XBYAK_DUMP, then objdump -D -b binary
// -mi386:x86-64 -M intel; strides 0x240 = 576 bytes):
//     mov r8,[rdi] ; mov r9,[rdi+0x8] ; mov r10,[rdi+0x10]  ; q, kt, s
//     mov eax,0x240 ; mov ecx,0x240 ; mov edx,0x240        ; row strides of q, kt, s
//     mov r11,[rdi+0x18]                                   ; live
//     bt r11,0x0 ; jae <next pair>                         ; keys 0-31 hidden: skip
//     tilezero tmm0 ... tilezero tmm3
//     tileloadd tmm4,[r8+rax*1]          ; q rows 0-15, dims 0-31
//     tileloadd tmm6,[r9+rcx*1]          ; pairs 0-15 (dims 0-31) of keys 0-15
//     tdpbf16ps tmm0,tmm4,tmm6
//     tileloadd tmm7,[r9+rcx*1+0x40]     ; keys 16-31
//     tdpbf16ps tmm1,tmm4,tmm7
//     tileloadd tmm5,[r8+rax*1+0x2400]   ; q rows 16-31
//     tdpbf16ps tmm2,tmm5,tmm6
//     tdpbf16ps tmm3,tmm5,tmm7
//     tileloadd tmm4,[r8+rax*1+0x40]     ; dims 32-63 ...
//     tileloadd tmm6,[r9+rcx*1+0x2400]   ; ... pairs 16-31: 7 steps in all
//     ...
//     tilestored [r10+rdx*1],tmm0 ; tilestored [r10+rdx*1+0x40],tmm1
//     tilestored [r10+rdx*1+0x2400],tmm2 ; tilestored [r10+rdx*1+0x2440],tmm3
//     bt r11,0x1 ; jae ...                                 ; keys 32-63, then 64-95, 96-127
//     ...
//     ret
// PV, head_dim 256, kb 128 (strides: p 0x140, vp and O 0x440):
//     mov r8,[rdi] ; mov r9,[rdi+0x8] ; mov r10,[rdi+0x10] ; mov r11,[rdi+0x18]
//     test r11,r11 ; je <tiles>          ; no factor: no rescale
//     mov rdx,r10 ; mov esi,0x20         ; 32 rows:
//     cmp DWORD PTR [r11],0x3f800000 ; je <next row>        ; factor 1.0
//     vbroadcastss zmm31,[r11]
//     vmulps zmm0,zmm31,[rdx] ; vmovups [rdx],zmm0         ; 16 vectors of O's row
//     ...
//   tiles:
//     mov eax,0x140 ; mov ecx,0x440 ; mov edx,0x440 ; mov r11,[rdi+0x20]
//     tileloadd tmm0,[r10+rdx*1]         ; O rows 0-15, h 0-15
//     tileloadd tmm1,[r10+rdx*1+0x40]    ; h 16-31
//     tileloadd tmm2,[r10+rdx*1+0x4400]  ; rows 16-31
//     tileloadd tmm3,[r10+rdx*1+0x4440]
//     bt r11,0x0 ; jae <next keys>
//     tileloadd tmm4,[r8+rax*1]          ; p rows 0-15, keys 0-31
//     tileloadd tmm6,[r9+rcx*1]          ; key pairs 0-15, h 0-15
//     tdpbf16ps tmm0,tmm4,tmm6
//     tileloadd tmm7,[r9+rcx*1+0x40]     ; h 16-31
//     tdpbf16ps tmm1,tmm4,tmm7
//     tileloadd tmm5,[r8+rax*1+0x1400]   ; p rows 16-31
//     tdpbf16ps tmm2,tmm5,tmm6
//     tdpbf16ps tmm3,tmm5,tmm7
//     bt r11,0x1 ; jae ...               ; keys 32-63 (pairs 16-31 at +0x4400), 64-95, 96-127
//     ...
//     tilestored [r10+rdx*1],tmm0 ... (4)
//     ...                                ; 7 more head_dim tile pairs (+0x80 each)
//     vzeroupper ; ret
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <xbyak/xbyak.h>

#include "generator/errors.h"
#include "generator/isa.h"
#include "generator/xbyak/amx_core.h"
#include "generator/xbyak/amx_permission.h"
#include "generator/xbyak/jit_plumbing.h"

namespace g3::amx {

namespace {

using namespace Xbyak;

constexpr int kR = Config::kRows;

// Both tile kernels accumulate a 32-row block into a 2x2 grid of f32 tiles
// (tmm0-3: rows 0-15 and 16-31 by columns 0-15 and 16-31) from two A tiles
// (tmm4, tmm5: the two 16-row halves) and two B tiles (tmm6, tmm7: the two
// 16-column halves, in pairs of bf16). One step loads each once and issues
// the four products, each load placed after the product that frees its
// register's predecessor.
struct TileJit : CodeGenerator {
  explicit TileJit(size_t bytes) : CodeGenerator(bytes) {}
  void tile_2x2_step(const Address& a_top, const Address& a_bottom, const Address& b_left, const Address& b_right) {
    tileloadd(tmm4, a_top);
    tileloadd(tmm6, b_left);
    tdpbf16ps(tmm0, tmm4, tmm6);
    tileloadd(tmm7, b_right);
    tdpbf16ps(tmm1, tmm4, tmm7);
    tileloadd(tmm5, a_bottom);
    tdpbf16ps(tmm2, tmm5, tmm6);
    tdpbf16ps(tmm3, tmm5, tmm7);
  }
};

// S[32][kb] = Q[32][dh] . K^T for one row group and one key block.
struct QkJit : TileJit {
  const Config cfg;
  const Reg64 reg_args = rdi, reg_q = r8, reg_kt = r9, reg_s = r10;
  const Reg64 reg_qstride = rax, reg_kstride = rcx, reg_sstride = rdx, reg_live = r11;

  explicit QkJit(const Config& c) : TileJit(code_size(c)), cfg(c) { generate(); }
  // About 40 bytes per tile instruction, 8 per step of 32 dims.
  static size_t code_size(const Config& c) { return 4096 + size_t(c.kb / 32) * (c.head_dim / 32) * 8 * 48; }

  void generate() {
    const int dh = cfg.head_dim, kb = cfg.kb;
    const int qs = cfg.q_ld() * 2, ks = cfg.kt_ld() * 4, ss = cfg.s_ld() * 4;  // row strides in bytes
    mov(reg_q, ptr[reg_args + offsetof(QkCall, q)]);
    mov(reg_kt, ptr[reg_args + offsetof(QkCall, kt)]);
    mov(reg_s, ptr[reg_args + offsetof(QkCall, s)]);
    mov(reg_qstride, qs);
    mov(reg_kstride, ks);
    mov(reg_sstride, ss);
    mov(reg_live, ptr[reg_args + offsetof(QkCall, live)]);
    for (int j = 0; j < kb / 32; ++j) {  // pairs of key tiles
      Label skip;
      bt(reg_live, j);  // keys no row of the group sees: nothing to compute
      jnc(skip, T_NEAR);
      for (int t = 0; t < 4; ++t) tilezero(Tmm(t));
      for (int c = 0; c < dh / 32; ++c) {  // 32 dims (16 pairs) per step
        tile_2x2_step(ptr[reg_q + reg_qstride * 1 + c * 64], ptr[reg_q + reg_qstride * 1 + 16 * qs + c * 64],
                      ptr[reg_kt + reg_kstride * 1 + c * 16 * ks + j * 128],
                      ptr[reg_kt + reg_kstride * 1 + c * 16 * ks + j * 128 + 64]);
      }
      tilestored(ptr[reg_s + reg_sstride * 1 + j * 128], tmm0);
      tilestored(ptr[reg_s + reg_sstride * 1 + j * 128 + 64], tmm1);
      tilestored(ptr[reg_s + reg_sstride * 1 + 16 * ss + j * 128], tmm2);
      tilestored(ptr[reg_s + reg_sstride * 1 + 16 * ss + j * 128 + 64], tmm3);
      L(skip);
    }
    ret();
  }
};

// O[32][dh] = O * corr + P[32][kb] . V for one row group and one key block.
struct PvJit : TileJit {
  const Config cfg;
  const Reg64 reg_args = rdi, reg_p = r8, reg_vp = r9, reg_o = r10, reg_corr = r11;
  const Reg64 reg_pstride = rax, reg_vstride = rcx, reg_ostride = rdx, reg_row = rdx, reg_cnt = rsi;
  const Reg64 reg_live = r11;  // after the rescale, which walks reg_corr

  explicit PvJit(const Config& c) : TileJit(code_size(c)), cfg(c) { generate(); }
  // About 40 bytes per tile instruction and 16 per vector of the rescale.
  static size_t code_size(const Config& c) {
    return 4096 + size_t(c.head_dim / 32) * (c.kb / 32 + 2) * 8 * 48 + size_t(c.head_dim / 16) * 32;
  }

  void generate() {
    const int dh = cfg.head_dim, kb = cfg.kb;
    const int ps = cfg.p_ld() * 2, vs = cfg.vp_ld() * 4, os = cfg.o_ld() * 4;  // row strides in bytes
    mov(reg_p, ptr[reg_args + offsetof(PvCall, p)]);
    mov(reg_vp, ptr[reg_args + offsetof(PvCall, vp)]);
    mov(reg_o, ptr[reg_args + offsetof(PvCall, o)]);
    mov(reg_corr, ptr[reg_args + offsetof(PvCall, corr)]);
    // The online softmax's rescale of the rows' accumulators: skipped for a
    // row whose factor is 1 (its maximum did not move), and for the whole
    // group when no row's did (the driver passes null).
    Label l_tiles, l_row;
    test(reg_corr, reg_corr);
    jz(l_tiles, T_NEAR);
    mov(reg_row, reg_o);
    mov(reg_cnt, kR);
    L(l_row);
    Label l_next;
    cmp(dword[reg_corr], 0x3f800000);  // 1.0f: this row's maximum did not move
    je(l_next, T_NEAR);
    vbroadcastss(zmm31, ptr[reg_corr]);
    for (int h = 0; h < dh / 16; ++h) {
      const Zmm z(h % 30);
      vmulps(z, zmm31, ptr[reg_row + h * 64]);
      vmovups(ptr[reg_row + h * 64], z);
    }
    L(l_next);
    add(reg_row, os);
    add(reg_corr, 4);
    dec(reg_cnt);
    jnz(l_row, T_NEAR);
    L(l_tiles);
    mov(reg_pstride, ps);
    mov(reg_vstride, vs);
    mov(reg_ostride, os);
    mov(reg_live, ptr[reg_args + offsetof(PvCall, live)]);
    for (int hp = 0; hp < dh / 32; ++hp) {  // pairs of head_dim tiles
      tileloadd(tmm0, ptr[reg_o + reg_ostride * 1 + hp * 128]);
      tileloadd(tmm1, ptr[reg_o + reg_ostride * 1 + hp * 128 + 64]);
      tileloadd(tmm2, ptr[reg_o + reg_ostride * 1 + 16 * os + hp * 128]);
      tileloadd(tmm3, ptr[reg_o + reg_ostride * 1 + 16 * os + hp * 128 + 64]);
      for (int c = 0; c < kb / 32; ++c) {  // 32 keys (16 pairs) per step
        Label skip;
        bt(reg_live, c);  // keys no row of the group sees: all weights 0
        jnc(skip, T_NEAR);
        tile_2x2_step(ptr[reg_p + reg_pstride * 1 + c * 64], ptr[reg_p + reg_pstride * 1 + 16 * ps + c * 64],
                      ptr[reg_vp + reg_vstride * 1 + c * 16 * vs + hp * 128],
                      ptr[reg_vp + reg_vstride * 1 + c * 16 * vs + hp * 128 + 64]);
        L(skip);
      }
      tilestored(ptr[reg_o + reg_ostride * 1 + hp * 128], tmm0);
      tilestored(ptr[reg_o + reg_ostride * 1 + hp * 128 + 64], tmm1);
      tilestored(ptr[reg_o + reg_ostride * 1 + 16 * os + hp * 128], tmm2);
      tilestored(ptr[reg_o + reg_ostride * 1 + 16 * os + hp * 128 + 64], tmm3);
    }
    vzeroupper();
    ret();
  }
};

// The tile configuration of a thread: ldtilecfg at the start of every core
// call, tilerelease at its end, so no thread keeps the 8 KB tile state
// between calls (it would be saved and restored on every context switch)
// and the core needs no per-thread bookkeeping. A core call runs for far
// longer than the two instructions take.
struct TileConfigJit : CodeGenerator {
  TileConfigJit() : CodeGenerator(64) {
    ldtilecfg(ptr[rdi]);
    ret();
  }
};
struct TileReleaseJit : CodeGenerator {
  TileReleaseJit() : CodeGenerator(64) {
    tilerelease();
    ret();
  }
};

// The palette-1 configuration: every tile 16 rows of 64 bytes. One copy
// for every key, 64-byte aligned as ldtilecfg's operand is.
struct Palette {
  alignas(64) uint8_t bytes[64] = {};
  Palette() {
    bytes[0] = 1;  // palette 1
    for (int t = 0; t < 8; ++t) {
      bytes[16 + 2 * t] = 64;  // colsb: bytes per row (uint16, little endian)
      bytes[48 + t] = 16;      // rows
    }
  }
};
const Palette kPalette;

// The emitted code and the context it serves, alive as long as a kernel
// table refers to them (BackendKernels::owner).
struct Kernels {
  Context ctx;
  std::unique_ptr<QkJit> qk;
  std::unique_ptr<PvJit> pv;
  std::unique_ptr<TileConfigJit> config;
  std::unique_ptr<TileReleaseJit> release;
  std::unique_ptr<xbyak::ContextEntry<Context>> entry;
  std::shared_ptr<void> small_owner;  // the Highway kernels behind ctx.small
};

}  // namespace

bool plan(const KernelKey& key, const std::string& isa, Config* cfg, std::string* why) {
  auto fail = [&](const std::string& msg) {
    if (why) *why = msg;
    return false;
  };
  if (const std::string r = unavailable_reason(); !r.empty()) return fail(r);
  if (isa != "avx3_dl")
    return fail("the ISA cap " + isa +
                " excludes AMX tiles, which only --isa avx3_dl or best (on a CPU with AMX) allows");
  // The softmax steps (flash_ops) and decode-sized calls run Highway's
  // avx3_dl code, so the core needs that target in the build.
  if (!isa_compiled("avx3_dl"))
    return fail("the amx core runs its softmax and decode-sized calls on Highway's avx3_dl target, which "
                "this build did not compile (HWY_DISABLED_TARGETS)");
  if (key.compute != DType::BF16)
    return fail("the amx core computes in bf16, rounding q, K, p and V, and this kernel key is in the " +
                std::string(to_string(key.compute)) + " compute mode; --compute bf16 selects it");
  if (key.head_dim <= 0 || key.head_dim % 32 != 0 || key.head_dim > Config::kMaxHeadDim)
    return fail("head_dim " + std::to_string(key.head_dim) + " is not a multiple of 32 up to " +
                std::to_string(Config::kMaxHeadDim) +
                ": a bf16 tile row holds 32 elements, the K transpose and V repack step by 32, and the "
                "unrolled tile kernels grow with head_dim");
  if (key.group < 1 || key.group > 256) return fail("group " + std::to_string(key.group) + " outside 1..256");
  Config c;
  c.head_dim = key.head_dim;
  c.group = key.group;
  c.window = key.window;
  c.bf16_kv = key.kv_dtype == DType::BF16;
  *cfg = c;
  return true;
}

BackendKernels kernels(const KernelKey& key, const std::string& isa, const Options& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  Config cfg;
  std::string why;
  if (!plan(key, isa, &cfg, &why)) throw InputError("amx backend: " + why);
  if (opt.min_rows >= 0) cfg.min_rows = opt.min_rows;
  // Few-row calls (decode) run on the Highway core of the same key and ISA.
  BackendKernels hw = highway_kernels(key, isa);
  auto k = std::make_shared<Kernels>();
  k->ctx.cfg = cfg;
  k->ctx.flash = &flash_ops(isa);
  k->ctx.small = hw.table.core;
  k->small_owner = hw.owner;
  k->ctx.palette = kPalette.bytes;
  k->qk = std::make_unique<QkJit>(cfg);
  k->pv = std::make_unique<PvJit>(cfg);
  k->config = std::make_unique<TileConfigJit>();
  k->release = std::make_unique<TileReleaseJit>();
  k->entry = std::make_unique<xbyak::ContextEntry<Context>>(&k->ctx, &core);
  k->ctx.qk = k->qk->getCode<QkFn>();
  k->ctx.pv = k->pv->getCode<PvFn>();
  k->ctx.tile_config = k->config->getCode<TileFn>();
  k->ctx.tile_release = k->release->getCode<TileFn>();
  // Executable, no longer writable.
  k->qk->setProtectModeRE();
  k->pv->setProtectModeRE();
  k->config->setProtectModeRE();
  k->release->setProtectModeRE();
  k->entry->setProtectModeRE();
  const std::string name = key.ident();
  xbyak::dump_code(name, "amx_qk", *k->qk);
  xbyak::dump_code(name, "amx_pv", *k->pv);
  xbyak::dump_code(name, "amx_entry", *k->entry);

  BackendKernels out;
  out.table.core = k->entry->getCode<g3_core_fn>();
  out.isa = isa;
  out.specialised = true;
  out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const size_t bytes = k->qk->getSize() + k->pv->getSize() + k->config->getSize() + k->release->getSize() +
                       k->entry->getSize();
  out.note = "amx attention core: tdpbf16ps tiles, " + std::string(cfg.bf16_kv ? "bf16" : "f32 (rounded per block)") +
             " K/V, " + std::to_string(bytes) + " bytes of code; calls under " + std::to_string(cfg.min_rows) +
             " query rows on the highway core";
  out.owner = k;
  return out;
}

}  // namespace g3::amx

namespace g3 {

bool amx_available(const KernelKey& key, const std::string& isa, std::string* why) {
  amx::Config cfg;
  return amx::plan(key, isa, &cfg, why);
}

BackendKernels amx_kernels(const KernelKey& key, const std::string& isa) { return amx::kernels(key, isa, {}); }

}  // namespace g3
