// One kernel key's entry points: the contract's QK and core functions with
// the key's constants baked in, compiled once per Highway target.
//
// A generated source #defines the constants below, names a namespace for the
// key (G3_KEY_NS) and includes this file through Highway's foreach_target
// (HWY_TARGET_INCLUDE). Every constant has a default meaning "take it from
// the call's arguments", so this file compiled with no definitions at all is
// the generic kernel that serves keys not generated at build time.
//
// Defined per target:   g3::G3_KEY_NS::N_<TARGET>::Qk / Core
// Defined once (HWY_ONCE): g3::G3_KEY_NS::Targets, a g3_hwy_key_targets_fn.

#ifndef G3_KEY_NS
#define G3_KEY_NS generic
#endif
// head_dim; 0: g3_qk_args::head_dim / g3_core_args::head_dim.
#ifndef G3_HEAD_DIM
#define G3_HEAD_DIM 0
#endif
// Query heads per KV head (G = N / Nkv); 0: g3_core_args::group.
#ifndef G3_GROUP
#define G3_GROUP 0
#endif
// KV cache element type: G3_DTYPE_F32 (0), G3_DTYPE_BF16 (1); -1: kv_dtype.
#ifndef G3_KV_DTYPE
#define G3_KV_DTYPE -1
#endif
// RoPE base and linear scale of the layer kind (SPEC 2.2); 0: rope_base /
// rope_scale of g3_qk_args.
#ifndef G3_ROPE_BASE
#define G3_ROPE_BASE 0.0
#endif
#ifndef G3_ROPE_SCALE
#define G3_ROPE_SCALE 0.0
#endif
// Query scale alpha (SPEC 1.3 step C.2); 0: g3_qk_args::alpha.
#ifndef G3_ALPHA
#define G3_ALPHA 0.0f
#endif
// The sliding window W (0 = global) is part of the key but is always read
// from g3_core_args::window: it only bounds tiles and masks, where a
// constant saves nothing. Kept here so a generated source states it.
#ifndef G3_WINDOW
#define G3_WINDOW -1
#endif
// The compute mode (kernel_contract.h): G3_COMPUTE_F32 (0) or
// G3_COMPUTE_BF16 (1); -1: g3_core_args::compute.
#ifndef G3_COMPUTE
#define G3_COMPUTE -1
#endif

#include "attention-inl.h"

HWY_BEFORE_NAMESPACE();
namespace g3 {
namespace G3_KEY_NS {
namespace HWY_NAMESPACE {

void Qk(const g3_qk_args* a) {
  const double base = G3_ROPE_BASE > 0 ? double(G3_ROPE_BASE) : a->rope_base;
  const double scale = G3_ROPE_SCALE > 0 ? double(G3_ROPE_SCALE) : a->rope_scale;
  const float alpha = G3_ALPHA > 0 ? float(G3_ALPHA) : a->alpha;
  g3::HWY_NAMESPACE::attn::Qk<G3_HEAD_DIM, G3_KV_DTYPE>(a, base, scale, alpha);
}

void Core(const g3_core_args* a) {
  g3::HWY_NAMESPACE::attn::Core<G3_HEAD_DIM, G3_GROUP, G3_KV_DTYPE, G3_COMPUTE>(a);
}

}  // namespace HWY_NAMESPACE
}  // namespace G3_KEY_NS
}  // namespace g3
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "attention_registry.h"
#include "hwy_targets.h"

namespace g3 {
namespace G3_KEY_NS {

// Best target first, so a caller asking for "best" takes the first entry the
// CPU supports.
#define G3_KEY_TARGET_ENTRY(bit, name, ns) {bit, name, &ns::Qk, &ns::Core},
static const g3_hwy_target_kernels kTargets[] = {G3_HWY_FOR_EACH_TARGET(G3_KEY_TARGET_ENTRY)};
#undef G3_KEY_TARGET_ENTRY

const g3_hwy_target_kernels* Targets(int* count) {
  *count = int(sizeof(kTargets) / sizeof(kTargets[0]));
  return kTargets;
}

}  // namespace G3_KEY_NS
}  // namespace g3
#endif  // HWY_ONCE
