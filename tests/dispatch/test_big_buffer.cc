// Big buffers (KV caches, packed weights, the bench's reads): every size
// gives the bytes asked for plus a 64-byte line, zeroed where promised,
// aligned to a line, and to 2 MiB from 512 KiB on (what madvise's huge pages
// need); and, where transparent huge pages are on, backed by them.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/dispatch/big_buffer.h"

using namespace g3;

namespace {
constexpr size_t kHugePage = kHugePageBytes;
constexpr size_t kHugeFrom = kHugePagesFrom;
const size_t kSizes[] = {1, 63, 64, 4096, kHugeFrom - 1, kHugeFrom, kHugePage - 1, kHugePage, 5 * kHugePage + 3};
}  // namespace

TEST_CASE("alloc_big_zeroed: zeroed through the extra line, aligned by size", "[big_buffer]") {
  for (size_t bytes : kSizes) {
    CAPTURE(bytes);
    auto p = alloc_big_zeroed(bytes);
    REQUIRE(p);
    const auto addr = reinterpret_cast<uintptr_t>(p.get());
    CHECK(addr % (bytes >= kHugeFrom ? kHugePage : 64) == 0);
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes + 64; ++i) nonzero += p.get()[i] != 0;
    CHECK(nonzero == 0);
    std::memset(p.get(), 0xab, bytes + 64);  // all of it is writable
  }
}

TEST_CASE("alloc_big: writable through the extra line, aligned by size", "[big_buffer]") {
  for (size_t bytes : kSizes) {
    CAPTURE(bytes);
    auto p = alloc_big(bytes);
    REQUIRE(p);
    CHECK(reinterpret_cast<uintptr_t>(p.get()) % (bytes >= kHugeFrom ? kHugePage : 64) == 0);
    std::memset(p.get(), 1, bytes + 64);
  }
}

TEST_CASE("alloc_big: buffers outlive each other in any order", "[big_buffer]") {
  // Mapped buffers are returned to the system when their last owner goes;
  // neighbours must stay intact (the slack around each mapping is unmapped).
  auto a = alloc_big_zeroed(3 * kHugePage);
  auto b = alloc_big_zeroed(kHugePage + 1);
  std::memset(b.get(), 7, kHugePage + 1);
  a.reset();
  auto c = alloc_big_zeroed(2 * kHugePage);
  size_t sevens = 0;
  for (size_t i = 0; i < kHugePage + 1; ++i) sevens += b.get()[i] == 7;
  CHECK(sevens == kHugePage + 1);
  CHECK(c.get()[2 * kHugePage + 63] == 0);
}

namespace {
// The kB of huge pages backing the mapping that holds `p`, from
// /proc/self/smaps; -1 when the mapping is not found.
long huge_kb_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = lo <= addr && addr < hi;
      continue;
    }
    long kb = 0;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %ld kB", &kb) == 1) return kb;
  }
  return -1;
}
}  // namespace

TEST_CASE("alloc_big: huge pages even where malloc's memory was faulted in before", "[big_buffer]") {
  std::ifstream mode_file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(mode_file, mode);
  if (mode.find("[never]") != std::string::npos || mode.empty()) {
    WARN("transparent huge pages are off (" << mode << "): nothing to check");
    return;
  }
  // glibc's malloc serves a block below its mmap threshold from its heap,
  // and the threshold rises to the size of a mapped block once that is
  // freed. So after a 30 MiB block comes and goes, blocks of a few MiB
  // that are written and freed leave faulted-in 4 KiB pages in the heap,
  // which is where malloc would put the next buffer of that size (an
  // aligned_alloc of it got no huge page at all on Debian 12).
  void* volatile big = std::malloc(15 * kHugePage);  // volatile: the pair is not optimised away
  std::memset(big, 1, 64);
  std::free(big);
  std::vector<void*> used;
  for (int i = 0; i < 8; ++i) {
    used.push_back(std::malloc(3 * kHugePage));
    std::memset(used.back(), 1, 3 * kHugePage);
  }
  for (void* p : used) std::free(p);
  auto b = alloc_big_zeroed(8 * kHugePage);
  CHECK(huge_kb_of(b.get()) >= 4 * 2048);
}
