// Buffers for the data a decode step streams from memory (KV caches, packed
// weights) and for the bench's reads of memory, on 2 MiB pages where Linux
// grants them. With 4 KiB pages every 4 KiB of a stream is a TLB miss, and
// under a hypervisor's nested paging a miss walks two page tables: on an AMD
// EPYC Zen 4 VM, 2 threads reading 1 MiB just after a 256 MiB read took
// 35.6 us on 4 KiB pages and 17.3 us on 2 MiB ones.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace g3 {

constexpr size_t kHugePageBytes = size_t{2} << 20;
// A quarter of a huge page: such a buffer maps at most 4x the memory asked
// for, a bigger one at most 2 MiB more (1B's local layers keep rings of
// 1023 slots, just under 1 MiB of K and V together in bf16).
constexpr size_t kHugePagesFrom = kHugePageBytes / 4;

// At least `bytes` bytes (and 64 more, so a vector kernel may read a whole
// line at the last element), 64-byte aligned, not initialised, freed when
// the last owner goes. Buffers of kHugePagesFrom bytes or more are fresh
// anonymous mappings aligned to 2 MiB and advised as huge pages (madvise
// MADV_HUGEPAGE, honoured when transparent huge pages are in "madvise" or
// "always" mode) before anything touches them, so the thread that first
// writes a page decides where it lives. Not malloc's memory: what malloc
// hands out again after a free is often already faulted in on 4 KiB pages,
// which the advice no longer changes (a 4B `g3attn run` had 0.8 of its 1.5
// GB of weights and KV caches on huge pages that way).
std::shared_ptr<uint8_t> alloc_big(size_t bytes);

// The same, zeroed (every page written once here, so none faults later in
// the middle of a timed step).
std::shared_ptr<uint8_t> alloc_big_zeroed(size_t bytes);

}  // namespace g3
