#include "runtime/dispatch/big_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace g3 {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kLine = 64;

// aligned_alloc's size: a whole number of alignment units.
size_t rounded(size_t bytes, size_t align) { return (bytes + kLine + align - 1) / align * align; }
size_t alignment(size_t bytes) { return bytes >= kHugePage ? kHugePage : kLine; }
}  // namespace

void* alloc_big(size_t bytes) {
  const size_t align = alignment(bytes), n = rounded(bytes, align);
  void* p = std::aligned_alloc(align, n);
  if (!p) throw std::bad_alloc();
  if (align == kHugePage) madvise(p, n, MADV_HUGEPAGE);  // advice: 4 KiB pages where refused
  return p;
}

std::shared_ptr<uint8_t> alloc_big_zeroed(size_t bytes) {
  void* p = alloc_big(bytes);
  std::memset(p, 0, rounded(bytes, alignment(bytes)));
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
}

}  // namespace g3
