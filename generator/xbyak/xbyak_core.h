// The Xbyak backend's attention core (SPEC.md section 1.3 steps E-I):
// a configuration per kernel key, JIT'd micro-kernels for the hot loops
// (Q.K^T over head_dim: `qk` on transposed key tiles for many query rows,
// `qk_direct` on keys in cache layout for decode-sized tiles; and `pv`, the
// P.V accumulation, with `pv_direct` for decode-sized tiles) and the C++
// tile loop that drives them (mask classification per tile, online
// softmax, exp; core_driver-inl.h).
//
// Layout in the style of oneDNN's x64 JIT: a config struct, one class per
// kernel deriving from Xbyak::CodeGenerator with its registers as named
// members and one generate(); the constructor emits, getCode<Fn>() hands
// out a typed function. Representative listings are in jit_core_kernels.cc.
// Environment:
//   G3ATTN_XBYAK_DUMP=DIR   write the raw bytes of every emitted kernel to
//                           DIR/<key>_<isa>[_dpbf16]_<kernel>.bin; disassemble with
//                           objdump -D -b binary -mi386:x86-64 -M intel FILE
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "generator/backend_api.h"
#include "generator/highway/flash_ops.h"
#include "generator/kernel_key.h"
#include "templates/kernel_contract.h"
#include "templates/mask_rule.h"

namespace g3::xbyak {

enum class Isa { Avx2, Avx512 };

// Everything the emitted code bakes in. The QK kernel works on a key
// sub-tile of `tk` keys (two vectors), the tile loop on key blocks of
// `kb` keys (several sub-tiles) so the P.V kernel sees enough keys per call
// to amortise loading and rescaling its output accumulators.
struct CoreConfig {
  int head_dim = 0;
  int group = 0;
  int window = 0;
  bool bf16_kv = false;   // K/V cache elements are bf16
  bool bf16_dot = false;  // use vdpbf16ps (q and p rounded to bf16); needs bf16_kv and AVX512_BF16
  Isa isa = Isa::Avx512;
  int vl = 16;            // f32 lanes per vector
  int tk = 32;            // keys per QK sub-tile = 2 vectors
  int kb = 64;            // keys per key block (multiple of tk)
  int qk_rows = 12;       // query rows held in registers by the QK kernel
  int pv_rows = 6;        // rows held by the PV kernel
  int pv_vecs = 4;        // head_dim vectors per row held by the PV kernel
  int q_tile_rows = 32;   // target rows (tokens x G) per query tile

  static CoreConfig make(const KernelKey& key, Isa isa, bool bf16_dot);
  // Inner dimension of the QK kernel: head_dim f32 elements, or head_dim/2
  // bf16 pairs (one dword each) on the vdpbf16ps path.
  int qk_depth() const { return bf16_dot ? head_dim / 2 : head_dim; }
};

// Argument blocks of the micro-kernels (one pointer argument in rdi keeps
// the calling convention trivial).
struct QkCall {
  const void* q;     // [rows][qk_depth] dwords: f32 q, or bf16 pairs of q
  const void* kt;    // [qk_depth][tk] dwords: transposed key sub-tile
  float* s;          // [rows][kb] f32 logits; columns 0..tk-1 are written
  int64_t rows;
  // Keys to compute. The direct kernel (decode), which reads keys straight
  // from cache rows, writes columns 0..keys-1 (at most kb); the transposed
  // kernel always computes its sub-tile's tk.
  int64_t keys;
  // Direct kernel only: bytes from a K row to the V row of the same slot
  // (a->v - a->k), so it can prefetch both (templates/decode_prefetch.h).
  int64_t v_minus_k;
  // Direct kernel only: how many bytes past each K (and V) row it reads it
  // asks for (the call's prefetch hint in whole keys, kernel_contract.h).
  int64_t ahead;
};
struct PvCall {
  const void* p;     // [rows][kb] f32, or [rows][kb/2] bf16 pairs of p
  const void* v;     // f32 or bf16 cache rows [nk][head_dim], or bf16 key pairs [nk][head_dim] dwords
  float* o;          // [rows][head_dim] f32 accumulators: o = o * corr + p . v
  const float* corr; // [rows] online-softmax rescale factors
  int64_t rows;
  int64_t nk;        // keys (or key pairs on the vdpbf16ps path) in this block, >= 1
  // Direct kernel into L2 only: how many bytes past each V row it reads it
  // asks for (as QkCall::ahead).
  int64_t ahead;
};
using QkFn = void (*)(const QkCall*);
using PvFn = void (*)(const PvCall*);

// The state the C++ tile loop needs: the config, the micro-kernels and the
// shared online softmax compiled for the same ISA.
struct CoreContext {
  CoreConfig cfg;
  const FlashOps* flash = nullptr;
  QkFn qk = nullptr;
  PvFn pv = nullptr;
  // QK for tiles of few rows (decode) on keys in cache layout (QkCall::kt
  // = the block's first cache row, QkCall::keys rows read), prefetching
  // into L1 (qk_direct) or L2 (qk_direct_l2), as the call's hint says.
  QkFn qk_direct = nullptr, qk_direct_l2 = nullptr;
  // P.V for the same tiles with f32 p (rounded to bf16 on the vdpbf16ps
  // path) and V in cache layout; the L2 kernel asks for V's rows ahead,
  // which qk_direct_l2 leaves to it (qk_direct asks for K's and V's rows
  // into L1). Present whenever qk_direct is.
  PvFn pv_direct = nullptr, pv_direct_l2 = nullptr;
};

// The tile loops, one per instruction set (core_driver.cc).
void core_avx512(const CoreContext* ctx, const g3_core_args* a);
void core_avx2(const CoreContext* ctx, const g3_core_args* a);

// The emitted kernels for one config plus the entry trampoline that turns
// the contract's context-free g3_core_fn into a call of the tile loop with
// this context. Owns the code; generation time in gen_ms.
struct CoreKernels;
std::shared_ptr<CoreKernels> build_core(const CoreConfig& cfg, const std::string& dump_name);
g3_core_fn core_entry(const CoreKernels& k);
double core_gen_ms(const CoreKernels& k);
size_t core_code_bytes(const CoreKernels& k);

// What the backend decides for a (key, cap): the config or why not.
struct Options {
  // vdpbf16ps on bf16 K/V rounds q and the softmax weights to bf16 as well:
  // that is the bf16 compute mode, which keys with compute bf16 get anyway;
  // for f32-compute keys it is never the meaning of bf16 KV storage, so the
  // public entry points leave it off and only tests turn it on.
  bool allow_bf16_dot = false;
};
bool plan(const KernelKey& key, const std::string& isa_cap, const Options& opt, CoreConfig* cfg, std::string* why);
// xbyak_kernels with options (the public entry point uses the defaults).
BackendKernels kernels(const KernelKey& key, const std::string& isa_cap, const Options& opt);

}  // namespace g3::xbyak
