// The AMX attention core: SPEC.md section 1.3 steps E-I on Intel AMX tiles
// for kernel keys in the bf16 compute mode (kernel_contract.h,
// G3_COMPUTE_BF16: q, K, the softmax weights p and V rounded to bf16 before
// their products, f32 accumulation, softmax in f32). The tile micro-kernels
// are emitted with Xbyak per key (amx_core.cc, where the layouts, the tile
// shapes and the generated code are described); the C++ tile loop around
// them (amx_driver.cc) prepares K and V per key block, classifies tiles with
// mask_rule.h and runs the shared online softmax (FlashOps). Calls with few
// query rows (decode) go to the Highway core of the same key: a tile has 16
// rows and one token brings only G of them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "generator/backend_api.h"
#include "generator/highway/flash_ops.h"
#include "generator/kernel_key.h"
#include "templates/kernel_contract.h"

namespace g3::amx {

// What the emitted code bakes in.
struct Config {
  int head_dim = 0;    // a multiple of 32, at most kMaxHeadDim
  int group = 0;       // G: query heads per KV head, folded into the rows
  int window = 0;      // W (local layers) or 0; the mask reads it at run time
  bool bf16_kv = false;
  // Keys per block: the unit of K/V preparation, tile classification and of
  // one online-softmax step. 128 keys make the P.V kernel run 4 tile dot
  // products per load and store of its accumulators (see amx_core.cc).
  int kb = 128;
  // Query rows (tokens x G) per row group: two tiles of 16.
  static constexpr int kRows = 32;
  // Calls with fewer query rows (T x G) than this run on the Highway core:
  // at G = 2 over 4096 keys (head_dim 256, one thread), 8-row calls took 1.2x
  // the f32 Xbyak core's time on the tiles and 16-row calls 0.7x.
  int min_rows = 16;
  static constexpr int kMaxHeadDim = 1024;
  // Row strides of the tile loop's buffers, in elements: one cache line more
  // than the row, so the 16 rows of a tile do not crowd a few cache sets and
  // a tile load does not alias (4 KB apart) the tile stores before it (5-10%
  // on the tile kernels alone).
  int q_ld() const { return head_dim + 32; }   // bf16 queries
  int kt_ld() const { return kb + 16; }        // K^T dwords
  int s_ld() const { return kb + 16; }         // f32 logits
  int p_ld() const { return kb + 32; }         // bf16 weights
  int vp_ld() const { return head_dim + 16; }  // V pair dwords
  int o_ld() const { return head_dim + 16; }   // f32 accumulators
};

// Argument blocks of the micro-kernels (one pointer in rdi).
struct QkCall {
  const uint16_t* q;  // [kRows][q_ld] bf16 queries of one row group
  const uint32_t* kt; // [head_dim/2][kt_ld] dwords: pair d of key s at kt[d*kt_ld + s]
  float* s;           // [kRows][s_ld] f32 logits out
  uint64_t live;      // bit j: compute keys 32j .. 32j + 31 (others are left as they were)
};
struct PvCall {
  const uint16_t* p;  // [kRows][p_ld] bf16 softmax weights
  const uint32_t* vp; // [kb/2][vp_ld] dwords: (v[2i][h], v[2i+1][h]) at vp[i*vp_ld + h]
  float* o;           // [kRows][o_ld] f32 accumulators: o = o * corr + p . v
  const float* corr;  // [kRows] online-softmax rescale factors; null: all 1, skip the rescale
  uint64_t live;      // bit c: keys 32c .. 32c + 31 take part (the others' weights are all 0)
};
using QkFn = void (*)(const QkCall*);
using PvFn = void (*)(const PvCall*);
using TileFn = void (*)(const void*);

// Everything the tile loop needs for one key.
struct Context {
  Config cfg;
  const FlashOps* flash = nullptr;
  QkFn qk = nullptr;
  PvFn pv = nullptr;
  TileFn tile_config = nullptr;   // ldtilecfg [arg]
  TileFn tile_release = nullptr;  // tilerelease (the argument is ignored)
  const uint8_t* palette = nullptr;  // the ldtilecfg operand (64 bytes)
  g3_core_fn small = nullptr;     // the Highway core of the same key (calls below min_rows)
};

// The tile loop (amx_driver.cc).
void core(const Context* ctx, const g3_core_args* a);

// Whether the AMX core can serve (key, isa cap) here; why not in *why.
bool plan(const KernelKey& key, const std::string& isa, Config* cfg, std::string* why);

// Options for tests and measurements.
struct Options {
  int min_rows = -1;  // >= 0: replaces Config::min_rows (0 sends every call to the tiles)
};
BackendKernels kernels(const KernelKey& key, const std::string& isa, const Options& opt);

}  // namespace g3::amx

namespace g3 {

// The backend table's entry points (runtime/dispatch/backends.cc), in the
// style of generator/backend_api.h.
bool amx_available(const KernelKey& key, const std::string& isa, std::string* why);
BackendKernels amx_kernels(const KernelKey& key, const std::string& isa);

}  // namespace g3
