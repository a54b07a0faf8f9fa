#include "runtime/dispatch/big_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace g3 {

namespace {
constexpr size_t kLine = 64;

// The bytes a buffer really has: the line past the end, rounded to whole
// alignment units.
size_t rounded(size_t bytes, size_t align) { return (bytes + kLine + align - 1) / align * align; }
size_t alignment(size_t bytes) { return bytes >= kHugePagesFrom ? kHugePageBytes : kLine; }

// n bytes (a multiple of 2 MiB) of a fresh mapping, 2 MiB aligned: map one
// huge page more, then return the slack on either side.
uint8_t* map_huge(size_t n) {
  void* raw = mmap(nullptr, n + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (aligned > start) munmap(raw, aligned - start);
  if (start + kHugePageBytes > aligned) munmap(reinterpret_cast<void*>(aligned + n), start + kHugePageBytes - aligned);
  madvise(reinterpret_cast<void*>(aligned), n, MADV_HUGEPAGE);  // advice: 4 KiB pages where refused
  return reinterpret_cast<uint8_t*>(aligned);
}
}  // namespace

std::shared_ptr<uint8_t> alloc_big(size_t bytes) {
  const size_t align = alignment(bytes), n = rounded(bytes, align);
  if (align == kHugePageBytes) return std::shared_ptr<uint8_t>(map_huge(n), [n](uint8_t* p) { munmap(p, n); });
  void* p = std::aligned_alloc(align, n);
  if (!p) throw std::bad_alloc();
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
}

std::shared_ptr<uint8_t> alloc_big_zeroed(size_t bytes) {
  auto p = alloc_big(bytes);
  std::memset(p.get(), 0, rounded(bytes, alignment(bytes)));
  return p;
}

}  // namespace g3
