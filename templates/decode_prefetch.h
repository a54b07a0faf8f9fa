// How far ahead of its reads a decode core asks for K and V rows (SPEC.md
// 1.3 steps E-I for a few query rows over a long cache, where the core runs
// at the memory's pace). One rule for every backend: the Highway core
// (attention-inl.h) and the LLVM and Xbyak JIT cores, which include this
// header from generator/. Plain C++, nothing of Highway.
//
// Why a software prefetch at all: one thread's demand misses alone do not
// keep enough reads in flight to reach the DRAM rate. Why this distance:
// kDecodePrefetchBytes of K and V together, into L1, keeps the prefetched
// rows to a quarter of the smallest L1 data cache of a current x86 core
// (32 KiB). Before, the Highway core asked 48 keys ahead (48 KiB of K and V
// in bf16 at head_dim 256, 96 KiB in f32) into L2: into L1 at that distance
// had been 1.07-1.63x slower on an AMD EPYC Zen 4, whose L1 is 32 KiB, as
// rows were pushed out before their loads came. 8 KiB into L1 against the
// 48 keys into L2, flipped decode step by decode step inside one `g3attn
// run` (128 steps, median block time of each layer kind; AMD EPYC Zen 5, 2
// threads; the same switch with nothing to flip reads 0.99-1.01 on local
// layers, 0.95-0.99 on global ones): f32 KV (4 keys) local blocks
// 0.93-0.94x, global 0.79-0.87x; bf16 (8 keys) local 0.97x, global
// 0.80-0.95x. 16 KiB into L1 measured alike for f32 but less well for bf16
// (global 0.91-0.96x), 24 keys into L2 0.94-0.99x, 96 keys into L2
// 0.97-1.03x.
//
// This is the default, not a rule for every CPU: on an AMD EPYC Zen 4 (32
// KiB L1), the same rows asked for 16 KiB ahead into L2 (prefetcht1) took
// 0.6-0.9x the time of 8 KiB into L1 (2026-12-07, `bench --phase decode
// --model 1b,4b --context 2048,32768 --kv-dtype f32,bf16`, 3 alternations;
// asking for K in the logits and V in P.V, each just ahead of its own
// loads, did not help; 16-32 KiB ahead into L2, V's rows asked for a few
// lines per step of P.V did, in the Highway core (attention-inl.h,
// CoreDecodeGroup) and then in the LLVM and Xbyak decode loops, which are
// the same loops). So g3_core_args carries the distance and level,
// `g3attn tune` measures the candidates on the CPU at hand
// (runtime/dispatch/prefetch_route.h), and this default serves calls that
// pass zero; the Highway core and the LLVM and Xbyak cores honour both.
#pragma once
#include <stddef.h>

constexpr size_t kDecodePrefetchBytes = 8 * 1024;

// The distance in keys for cache rows of head_dim elements of esz bytes
// (K and V rows alike): `hint_bytes` (g3_core_args::prefetch_bytes; zero or
// less: kDecodePrefetchBytes) over a K row plus a V row, at least one key.
constexpr size_t g3_decode_prefetch_keys(size_t head_dim, size_t esz, long hint_bytes = 0) {
  const size_t bytes = hint_bytes > 0 ? size_t(hint_bytes) : kDecodePrefetchBytes;
  return bytes / (2 * head_dim * esz) > 0 ? bytes / (2 * head_dim * esz) : 1;
}
