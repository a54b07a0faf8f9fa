// The attention templates compiled on their own, every constant at its
// default (see templates.cmake): a compile check, not part of any library.
#define G3_KEY_NS selfcheck
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention_key-inl.h"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "attention_key-inl.h"
