// Scratch memory of the attention and projection kernels: one grow-only,
// 64-byte aligned buffer, meant to be held per thread and per call site
// (`static thread_local Scratch<float> scratch;`), so the kernels allocate
// nothing in steady state: a decode step calls them hundreds of times and
// must not pay for malloc each time. Contents are not kept across a growth,
// and a buffer is never shrunk.
//
// Plain C++ over Highway's aligned allocator, not a per-target module: the
// Highway templates, the Xbyak tile loop and the projections all use this one
// type. It must be included outside any `#pragma GCC target` region or
// HWY_BEFORE_NAMESPACE(), so that its code is compiled for the baseline ISA
// whichever kernel includes it first.
#ifndef G3ATTN_TEMPLATES_SCRATCH_H_
#define G3ATTN_TEMPLATES_SCRATCH_H_

#include <stddef.h>
#include <stdlib.h>

#include <new>

#include "hwy/aligned_allocator.h"

namespace g3 {

template <typename T>
class Scratch {
 public:
  // At least `n` elements, 64-byte aligned (HWY_ALIGNMENT) and rounded up to
  // whole 64-byte lines, so vector code may read the rest of the last line.
  // The pointer stays valid until a later Get asks for more.
  T* Get(size_t n) {
    if (n > size_) {
      const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
      const size_t items = (bytes + sizeof(T) - 1) / sizeof(T);
      p_ = hwy::AllocateAligned<T>(items);
      if (!p_) {
        size_ = 0;
        OutOfMemory();
      }
      size_ = items;
    }
    return p_.get();
  }

 private:
  // A kernel cannot return an error through the C contract, so failing to
  // grow is std::bad_alloc where exceptions exist (the runtime reports it)
  // and an abort where they do not (a generated tree may be built without).
  [[noreturn]] static void OutOfMemory() {
#if defined(__cpp_exceptions)
    throw std::bad_alloc();
#else
    abort();
#endif
  }

  hwy::AlignedFreeUniquePtr<T[]> p_{nullptr, hwy::AlignedFreer()};
  size_t size_ = 0;
};

}  // namespace g3

#endif  // G3ATTN_TEMPLATES_SCRATCH_H_
