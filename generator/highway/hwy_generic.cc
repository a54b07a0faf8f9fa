// The generic attention kernels: the templates compiled with every constant
// left at its default ("read it from the arguments"), for every Highway
// target. They serve any key that g3attn-gen did not generate at build time
// (custom config.json files, test geometries).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "templates/attention_key-inl.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "templates/attention_key-inl.h"
