// Machine peaks for `g3attn bench`. The hot loops carry their ISA in a
// function target attribute and are chosen at run time with
// __builtin_cpu_supports, so the binary stays portable (no global -m flags).
#include "runtime/bench/peaks.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "generator/xbyak/amx_permission.h"
#include "runtime/dispatch/big_buffer.h"

namespace g3::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Runs body(thread_index) on n threads released together and returns the
// wall time in seconds from the release to the last thread's end.
double run_threads(int n, const std::function<void(int)>& body) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<Clock::time_point> ends(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  ts.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      body(i);
      ends[static_cast<size_t>(i)] = Clock::now();
    });
  while (ready.load() < n) std::this_thread::yield();
  Clock::time_point start = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& t : ts) t.join();
  Clock::time_point end = *std::max_element(ends.begin(), ends.end());
  return std::chrono::duration<double>(end - start).count();
}

// Horizontal sum through memory: GCC 12's _mm512_reduce_add_ps trips
// -Wuninitialized inside its own header.
__attribute__((target("avx512f"))) float hsum512(__m512 v) {
  alignas(64) float out[16];
  _mm512_store_ps(out, v);
  float s = 0;
  for (float x : out) s += x;
  return s;
}

// Sixteen independent accumulators: Zen 4 retires one 512-bit FMA per cycle
// with a 4-cycle latency, so at least 4 chains are needed to saturate it and
// 16 leave room for other cores' (and Intel's two-port) needs. Each
// iteration is 16 FMAs x 16 lanes x 2 flops. The recurrence a = a*b + c
// converges to c/(1-b) = 1, so no value drifts to denormal or infinity.
__attribute__((target("avx512f"))) float fma_loop_avx512(int64_t iters) {
  __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
  __m512 a0 = _mm512_set1_ps(0.1f), a1 = _mm512_set1_ps(0.2f), a2 = _mm512_set1_ps(0.3f),
         a3 = _mm512_set1_ps(0.4f), a4 = _mm512_set1_ps(0.5f), a5 = _mm512_set1_ps(0.6f),
         a6 = _mm512_set1_ps(0.7f), a7 = _mm512_set1_ps(0.8f), a8 = _mm512_set1_ps(0.9f),
         a9 = _mm512_set1_ps(1.1f), a10 = _mm512_set1_ps(1.2f), a11 = _mm512_set1_ps(1.3f),
         a12 = _mm512_set1_ps(1.4f), a13 = _mm512_set1_ps(1.5f), a14 = _mm512_set1_ps(1.6f),
         a15 = _mm512_set1_ps(1.7f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm512_fmadd_ps(a0, b, c);
    a1 = _mm512_fmadd_ps(a1, b, c);
    a2 = _mm512_fmadd_ps(a2, b, c);
    a3 = _mm512_fmadd_ps(a3, b, c);
    a4 = _mm512_fmadd_ps(a4, b, c);
    a5 = _mm512_fmadd_ps(a5, b, c);
    a6 = _mm512_fmadd_ps(a6, b, c);
    a7 = _mm512_fmadd_ps(a7, b, c);
    a8 = _mm512_fmadd_ps(a8, b, c);
    a9 = _mm512_fmadd_ps(a9, b, c);
    a10 = _mm512_fmadd_ps(a10, b, c);
    a11 = _mm512_fmadd_ps(a11, b, c);
    a12 = _mm512_fmadd_ps(a12, b, c);
    a13 = _mm512_fmadd_ps(a13, b, c);
    a14 = _mm512_fmadd_ps(a14, b, c);
    a15 = _mm512_fmadd_ps(a15, b, c);
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                                     _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15))));
  return hsum512(s);
}
constexpr double kFlopsPerIterAvx512 = 16.0 * 16 * 2;

// The AVX2 fallback: 12 chains of 8 lanes (two FMA ports x latency 4 = 8
// chains in flight, plus margin). Flops per iteration: 12 x 8 x 2.
__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iters) {
  __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  __m256 a0 = _mm256_set1_ps(0.1f), a1 = _mm256_set1_ps(0.2f), a2 = _mm256_set1_ps(0.3f),
         a3 = _mm256_set1_ps(0.4f), a4 = _mm256_set1_ps(0.5f), a5 = _mm256_set1_ps(0.6f),
         a6 = _mm256_set1_ps(0.7f), a7 = _mm256_set1_ps(0.8f), a8 = _mm256_set1_ps(0.9f),
         a9 = _mm256_set1_ps(1.1f), a10 = _mm256_set1_ps(1.2f), a11 = _mm256_set1_ps(1.3f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm256_fmadd_ps(a0, b, c);
    a1 = _mm256_fmadd_ps(a1, b, c);
    a2 = _mm256_fmadd_ps(a2, b, c);
    a3 = _mm256_fmadd_ps(a3, b, c);
    a4 = _mm256_fmadd_ps(a4, b, c);
    a5 = _mm256_fmadd_ps(a5, b, c);
    a6 = _mm256_fmadd_ps(a6, b, c);
    a7 = _mm256_fmadd_ps(a7, b, c);
    a8 = _mm256_fmadd_ps(a8, b, c);
    a9 = _mm256_fmadd_ps(a9, b, c);
    a10 = _mm256_fmadd_ps(a10, b, c);
    a11 = _mm256_fmadd_ps(a11, b, c);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
constexpr double kFlopsPerIterAvx2 = 12.0 * 8 * 2;

// Scalar last resort for CPUs without AVX2: eight chains of plain floats.
float fma_loop_scalar(int64_t iters) {
  float a[8] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
  for (int64_t i = 0; i < iters; ++i)
    for (float& x : a) x = x * 0.999999f + 1e-6f;
  return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}
constexpr double kFlopsPerIterScalar = 8.0 * 2;

// vdpbf16ps: each of the 16 f32 lanes accumulates two bf16 products, i.e.
// 4 flops per lane per instruction (2 multiplies, 2 adds), 64 per zmm.
// Sixteen chains cover its latency. Inputs are bf16 0.5 (0x3f00), so the
// accumulators grow by 0.5 per step and stay far from overflow.
__attribute__((target("avx512bf16,avx512f"))) float bf16_loop(int64_t iters) {
  __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f00);
  // Distinct starting values keep the compiler from merging identical chains.
  __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2), a3 = _mm512_set1_ps(3),
         a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5), a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7),
         a8 = _mm512_set1_ps(8), a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11),
         a12 = _mm512_set1_ps(12), a13 = _mm512_set1_ps(13), a14 = _mm512_set1_ps(14), a15 = _mm512_set1_ps(15);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = _mm512_dpbf16_ps(a0, x, x);
    a1 = _mm512_dpbf16_ps(a1, x, x);
    a2 = _mm512_dpbf16_ps(a2, x, x);
    a3 = _mm512_dpbf16_ps(a3, x, x);
    a4 = _mm512_dpbf16_ps(a4, x, x);
    a5 = _mm512_dpbf16_ps(a5, x, x);
    a6 = _mm512_dpbf16_ps(a6, x, x);
    a7 = _mm512_dpbf16_ps(a7, x, x);
    a8 = _mm512_dpbf16_ps(a8, x, x);
    a9 = _mm512_dpbf16_ps(a9, x, x);
    a10 = _mm512_dpbf16_ps(a10, x, x);
    a11 = _mm512_dpbf16_ps(a11, x, x);
    a12 = _mm512_dpbf16_ps(a12, x, x);
    a13 = _mm512_dpbf16_ps(a13, x, x);
    a14 = _mm512_dpbf16_ps(a14, x, x);
    a15 = _mm512_dpbf16_ps(a15, x, x);
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                                     _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15))));
  return hsum512(s);
}
constexpr double kFlopsPerIterBf16 = 16.0 * 64;

// AMX tdpbf16ps: one instruction multiplies a 16 x 32 bf16 tile by a
// 32 x 16 one (stored as 16 rows of bf16 pairs) into a 16 x 16 f32 tile,
// 16 x 16 x 32 x 2 = 16384 flops. Four accumulator tiles (0-3) over two A
// tiles (4, 5) and two B tiles (6, 7), the 2x2 arrangement of the AMX
// attention core, keep independent dot products in flight; the operands
// stay in their tiles, so the loop measures the tile unit alone. Inputs are
// bf16 2^-8 (0x3b80): each instruction adds 32 x 2^-16 to an accumulator,
// far from overflow. The tile configuration (palette 1) is per thread.
__attribute__((target("amx-tile,amx-bf16"))) float amx_loop(int64_t iters) {
  alignas(64) uint8_t cfg[64] = {};
  cfg[0] = 1;  // palette 1
  for (int t = 0; t < 8; ++t) {
    cfg[16 + 2 * t] = 64;  // bytes per row (colsb), little-endian u16
    cfg[48 + t] = 16;      // rows
  }
  alignas(64) uint16_t src[16 * 32];
  for (auto& v : src) v = 0x3b80;
  alignas(64) float out[16 * 16];
  _tile_loadconfig(cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}
constexpr double kFlopsPerIterAmx = 4.0 * 16 * 16 * 32 * 2;

// Streaming read: four independent vector sums so the loads, not the add
// latency, are the limit.
__attribute__((target("avx2"))) float sum_avx2(const float* p, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
    s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

// SSE2 is part of x86-64, so this needs no attribute.
float sum_sse2(const float* p, size_t n) {
  __m128 s0 = _mm_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 16 <= n; i += 16) {
    s0 = _mm_add_ps(s0, _mm_load_ps(p + i));
    s1 = _mm_add_ps(s1, _mm_load_ps(p + i + 4));
    s2 = _mm_add_ps(s2, _mm_load_ps(p + i + 8));
    s3 = _mm_add_ps(s3, _mm_load_ps(p + i + 12));
  }
  alignas(16) float out[4];
  _mm_store_ps(out, _mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));
  return out[0] + out[1] + out[2] + out[3];
}

// Sink for results so the loops are not optimised away.
std::atomic<float> g_sink{0};

// Best of `trials` runs of an `iters`-iteration loop on every thread, as
// GFLOP/s. The iteration count is first scaled so one trial lasts ~80 ms.
double loop_gflops(int threads, float (*loop)(int64_t), double flops_per_iter) {
  int64_t iters = 1 << 16;
  for (;;) {
    double s = run_threads(1, [&](int) { g_sink.store(loop(iters)); });
    if (s > 0.02 || iters > (int64_t{1} << 34)) {
      iters = static_cast<int64_t>(double(iters) * 0.08 / std::max(s, 1e-6));
      break;
    }
    iters *= 4;
  }
  iters = std::max<int64_t>(iters, 1000);
  double best = 0;
  for (int trial = 0; trial < 3; ++trial) {
    double s = run_threads(threads, [&](int) { g_sink.store(loop(iters)); });
    best = std::max(best, flops_per_iter * double(iters) * threads / s / 1e9);
  }
  return best;
}

}  // namespace

// cpu0's cache `index` from sysfs: its level and size in bytes (0 when absent).
static std::pair<int, long long> sysfs_cache(int index) {
  const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
  std::ifstream fs(dir + "size"), fl(dir + "level");
  std::string s;
  int level = 0;
  if (!(fs >> s) || s.empty() || !(fl >> level)) return {0, 0};
  long long v = std::atoll(s.c_str());
  const char unit = s.back();
  if (unit == 'K') v *= 1024;
  if (unit == 'M') v *= 1024 * 1024;
  return {level, std::max(0LL, v)};
}

long long llc_bytes() {
  // index3 is the L3 on x86 Linux; fall back to the highest index present.
  for (int idx = 4; idx >= 2; --idx)
    if (const long long v = sysfs_cache(idx).second; v > 0) return v;
  return 0;
}

long long l3_bytes() {
  for (int idx = 2; idx <= 4; ++idx)
    if (const auto [level, v] = sysfs_cache(idx); level == 3 && v > 0) return v;
  return 0;
}

Peaks measure_peaks(int threads) {
  Peaks p;
  p.threads = threads;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    p.fp32_isa = "avx512f";
    p.fp32_gflops = loop_gflops(threads, fma_loop_avx512, kFlopsPerIterAvx512);
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    p.fp32_isa = "avx2+fma";
    p.fp32_gflops = loop_gflops(threads, fma_loop_avx2, kFlopsPerIterAvx2);
  } else {
    p.fp32_isa = "scalar";
    p.fp32_gflops = loop_gflops(threads, fma_loop_scalar, kFlopsPerIterScalar);
  }
  if (__builtin_cpu_supports("avx512bf16")) p.bf16_gflops = loop_gflops(threads, bf16_loop, kFlopsPerIterBf16);
  // The tile data must be granted first (once per process, amx_permission.h);
  // without it the first tile instruction faults.
  p.amx_unavailable = amx::unavailable_reason();
  if (p.amx_unavailable.empty()) p.amx_gflops = loop_gflops(threads, amx_loop, kFlopsPerIterAmx);

  const DramRead d = measure_dram_read(threads);
  p.dram_read_gbs = d.gbs;
  p.dram_bytes = d.bytes;
  return p;
}

DramProbe::DramProbe(int threads) {
  // At least 1 GiB and four times the last-level cache (480 MiB on some
  // Xeons), one array per thread, each first touched by the thread that
  // reads it so its pages are local.
  threads = std::max(1, threads);
  const size_t total = std::max<size_t>(size_t{1} << 30, 4 * size_t(std::max(0LL, llc_bytes())));
  per_ = total / size_t(threads) / 4096 * 4096;
  for (int t = 0; t < threads; ++t) slices_.push_back(alloc_big(per_));  // 2 MiB pages, as the runtime's buffers
  const size_t n = per_ / sizeof(float);
  run_threads(threads, [&](int t) {
    float* s = reinterpret_cast<float*>(slices_[size_t(t)].get());
    for (size_t i = 0; i < n; ++i) s[i] = 1.0f;
  });
  pass_gbs();  // a first pass, not reported: it warms the TLB
}

double DramProbe::pass_gbs() {
  const size_t n = per_ / sizeof(float);
  const bool avx2 = __builtin_cpu_supports("avx2");
  const double sec = run_threads(int(slices_.size()), [&](int t) {
    const float* s = reinterpret_cast<const float*>(slices_[size_t(t)].get());
    g_sink.store(avx2 ? sum_avx2(s, n) : sum_sse2(s, n));
  });
  return bytes() / sec / 1e9;
}

DramRead measure_dram_read(int threads) {
  DramProbe probe(threads);
  DramRead d;
  for (int trial = 0; trial < 3; ++trial) d.gbs = std::max(d.gbs, probe.pass_gbs());
  d.bytes = probe.bytes();
  return d;
}

}  // namespace g3::bench
