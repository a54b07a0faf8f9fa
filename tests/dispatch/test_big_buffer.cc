// Big buffers (KV caches, packed weights, the bench's reads): every size
// gives the bytes asked for plus a 64-byte line, zeroed where promised,
// aligned to a line, and to 2 MiB from 2 MiB on (what madvise's huge pages
// need). Whether Linux grants huge pages depends on its settings, so that is
// not asserted.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "runtime/dispatch/big_buffer.h"

using namespace g3;

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
const size_t kSizes[] = {1, 63, 64, 4096, kHugePage - 1, kHugePage, 5 * kHugePage + 3};
}  // namespace

TEST_CASE("alloc_big_zeroed: zeroed through the extra line, aligned by size", "[big_buffer]") {
  for (size_t bytes : kSizes) {
    CAPTURE(bytes);
    auto p = alloc_big_zeroed(bytes);
    REQUIRE(p);
    const auto addr = reinterpret_cast<uintptr_t>(p.get());
    CHECK(addr % (bytes >= kHugePage ? kHugePage : 64) == 0);
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes + 64; ++i) nonzero += p.get()[i] != 0;
    CHECK(nonzero == 0);
    std::memset(p.get(), 0xab, bytes + 64);  // all of it is writable
  }
}

TEST_CASE("alloc_big: writable through the extra line, freed with free", "[big_buffer]") {
  for (size_t bytes : kSizes) {
    CAPTURE(bytes);
    void* p = alloc_big(bytes);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(p) % (bytes >= kHugePage ? kHugePage : 64) == 0);
    std::memset(p, 1, bytes + 64);
    std::free(p);
  }
}
