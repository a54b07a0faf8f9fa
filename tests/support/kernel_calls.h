// Random calls of the two attention stages of the kernel contract
// (templates/kernel_contract.h), each a struct owning every buffer of one
// call, with args() filling the contract's argument struct. The suites build
// g3_core_args and g3_qk_args here and nowhere else, so a field added to the
// contract is set in one place.
#pragma once
#include <cstdint>
#include <vector>

#include "generator/kernel_key.h"
#include "templates/kernel_contract.h"

namespace g3test {

// ---------------------------------------------------------------------------
// Attention core (g3_core_fn): one KV head and its G query heads.

// How the cache slots hold their positions (G3_CAUSAL_POSITIONS calls).
enum class SlotOrder {
  Sorted,    // slot s holds position base + s
  Ring,      // a ring buffer that wrapped: rotated by S/3, every 7th pair swapped
  Shuffled,  // any order
};

struct CoreSpec {
  int head_dim = 64, group = 1, window = 0;  // window 0: a global layer
  int64_t T = 1, S = 1;                      // query tokens, key slots
  g3::DType kv = g3::DType::F32;
  g3::DType compute = g3::DType::F32;  // the compute mode (kernel_contract.h)
  // G3_CAUSAL_POSITIONS: a cache holding positions base .. base + S - 1 in
  // `order`; queries at the latest positions, newest first unless Sorted,
  // and for T > 2 one row that sees at most three keys and one that sees
  // none. G3_CAUSAL_SLOTS: the keys are the call's own tokens (S == T) at
  // packed positions (new documents, repeats, gaps past any window,
  // backward steps), so position order and token order differ.
  int causal = G3_CAUSAL_POSITIONS;
  SlotOrder order = SlotOrder::Shuffled;
  int32_t base = 5;              // first stored position (G3_CAUSAL_POSITIONS)
  bool shuffle_queries = false;  // queries in no particular order (G3_CAUSAL_POSITIONS)
  double invalid = 0.15;         // share of slots with kvalid == 0 (their K/V hold NaN, odd ones a junk position)
  bool lse = true;               // ask for lse (false: args() passes a null lse)
  // The values: Normal, queries N(0, q_scale^2) with a share q_spikes of
  // them four times larger, K and V N(0, 1); Uniform, queries
  // U(-q_scale, q_scale), K U(-1, 1), V U(-2, 2). The default scale, 1.5 /
  // sqrt(head_dim), gives normal logits of order 1 to 6, as alpha-scaled
  // unit-RMS heads do.
  enum class Values { Normal, Uniform } values = Values::Normal;
  double q_scale = 0;  // 0: 1.5 / sqrt(head_dim)
  double q_spikes = 0.05;
  uint32_t seed = 1;
};

struct CoreCall {
  CoreSpec spec;
  // Strides wider than G * head_dim, to catch stride mix-ups.
  int64_t q_stride = 0, out_stride = 0;
  std::vector<float> q;          // alpha-scaled queries [T][q_stride]
  std::vector<float> kf, vf;     // K/V [S][head_dim] as the kernel reads them (bf16-rounded for bf16 K/V)
  std::vector<uint16_t> kb, vb;  // the bf16 cache (bf16 K/V only)
  std::vector<int32_t> qpos, kpos;
  std::vector<uint8_t> kvalid;

  // Random values as CoreSpec::values says.
  static CoreCall random(const CoreSpec& spec);

  // The contract's arguments for this call writing to `out` and `lse`
  // (lse is passed as null when !spec.lse).
  g3_core_args args(float* out, float* lse) const;
  // Stores `value` (NaN, Inf, zero) in every element of every invalid slot.
  void fill_invalid(float value);
  bool row_sees_a_key(int64_t t) const;

  struct Outputs {
    std::vector<float> out, lse;
  };
  // Runs `fn` on outputs pre-filled with garbage (kGarbage), so a row or lse
  // never written shows, as does a write into the stride padding.
  Outputs run(g3_core_fn fn) const;
  static constexpr float kGarbage = 123.f;
};

// ---------------------------------------------------------------------------
// QK stage (g3_qk_fn): norms, RoPE, alpha and the cache write of T tokens.

struct QkSpec {
  int head_dim = 64, num_heads = 2, num_kv_heads = 1;
  int64_t T = 1;
  double rope_base = 10000, rope_scale = 1;
  float alpha = 0.125f;
  g3::DType kv = g3::DType::F32;
  uint32_t seed = 1;
};

struct QkCall {
  QkSpec spec;
  int64_t q_stride = 0, kv_stride = 0;  // odd strides wider than the heads
  int64_t S = 0;                        // cache slots per KV head (T + 7)
  std::vector<float> q, k, v, q_norm, k_norm;
  std::vector<int32_t> pos;   // every third token at a position up to 140000, the others at t
  std::vector<int64_t> slot;  // distinct slots in shuffled order; every fifth token -1 (not written)

  static QkCall random(const QkSpec& spec);
  size_t kv_elem_size() const { return spec.kv == g3::DType::F32 ? 4 : 2; }
  // Element i of a cache as f32.
  float cache_at(const std::vector<uint8_t>& cache, size_t i) const;

  struct Outputs {
    std::vector<float> q;
    std::vector<uint8_t> k_cache, v_cache;
  };
  // The contract's arguments writing to `o`, whose buffers are sized here and
  // pre-filled with garbage (q kGarbage, K 0xAB bytes, V 0xCD bytes), so
  // slots the call must not write can be checked.
  g3_qk_args args(Outputs& o) const;
  Outputs run(g3_qk_fn fn) const;
  static constexpr float kGarbage = -7.f;
};

}  // namespace g3test
