// The online softmax of templates/softmax-inl.h for cores that are not
// Highway code (the Xbyak tile loop, the LLVM JIT's emitted core): plain
// function pointers compiled for one Highway target, so every backend
// applies the same masked softmax step and row finish (SPEC 1.3 steps G-I).
#pragma once
#include <cstdint>
#include <string>

#include "templates/mask_rule.h"

namespace g3 {

struct FlashOps {
  // Rows that have seen nothing yet: m = the softmax's "nothing" value, l = 0.
  void (*init_rows)(int64_t n, float* m, float* l);
  // flash::SoftmaxTile: rows x width logits at S (row stride `stride`,
  // width a multiple of 16) become probabilities; kp and kv (-1 valid, 0 not)
  // describe slots s0 .. s0 + width - 1, padded with invalid slots past the
  // cache; full != 0 skips per-element masking (g3_classify said G3_TILE_FULL).
  void (*softmax_tile)(float* S, int64_t stride, int64_t rows, int64_t width, int32_t full, int64_t s0,
                       const int32_t* kp, const int32_t* kv, const g3_row_bounds* rb, float* m, float* l,
                       float* corr);
  // flash::FinishRow for one row of head_dim H: out = O / l, *lse = m + log l
  // (lse may be null); zeros and -inf when the row saw no key.
  void (*finish_row)(const float* O, float m, float l, int64_t H, float* out, float* lse);
  const char* isa;  // the Highway target these were compiled for
};

// The ops of the best Highway target compiled into this build that the CPU
// supports and that does not exceed `isa_cap` (a name of isa_names(), or
// "best": the JIT's own ISA, so the softmax never uses instructions the JIT
// may not).
const FlashOps& flash_ops(const std::string& isa_cap);

}  // namespace g3
