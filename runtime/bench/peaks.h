// This machine's peaks, measured in the same run as the bench rows so every
// row can be read as a fraction of what the hardware did a moment earlier
// (the machine is shared, so a peak from a datasheet or an old run would lie).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace g3::bench {

struct Peaks {
  int threads = 1;
  double fp32_gflops = 0;              // register-resident FMA loop, all threads
  std::string fp32_isa;                // "avx512f" | "avx2+fma" | "scalar"
  std::optional<double> bf16_gflops;   // vdpbf16ps loop; empty without AVX512_BF16
  // AMX tdpbf16ps loop (2x2 accumulator tiles); empty where this process
  // may not use AMX tiles, and then amx_unavailable says why.
  std::optional<double> amx_gflops;
  std::string amx_unavailable;
  double dram_read_gbs = 0;            // vectorised sum over arrays far beyond the LLC
  double dram_bytes = 0;               // total size of those arrays
};

// Runs each measurement on `threads` std::threads at once and keeps the best
// of a few trials. Takes about a second and 1 GiB of memory briefly.
Peaks measure_peaks(int threads);

// DRAM read bandwidth alone (what measure_peaks reports as dram_read_gbs):
// a vectorised sum over arrays of at least 1 GiB and 4x the last-level
// cache. About half a second.
struct DramRead {
  double gbs = 0;    // best of three timed passes
  double bytes = 0;  // total size of the arrays read
};
DramRead measure_dram_read(int threads);

// The arrays measure_dram_read reads, kept for repeated passes: `g3attn run`
// reads them between decode steps, because on a shared machine the DRAM
// rate can double or halve from one second to the next (a 2-thread read
// loop on an AMD EPYC Zen 4 VM went between 30 and 69 GB/s in runs of 0.02
// to 27 s). Construction allocates and first-touches them and makes one
// untimed pass (the TLB); throws std::bad_alloc when they do not fit.
class DramProbe {
 public:
  explicit DramProbe(int threads);
  double pass_gbs();  // one timed pass over every array, in GB/s
  double bytes() const { return double(per_) * double(slices_.size()); }

 private:
  size_t per_ = 0;                              // bytes per thread's array
  std::vector<std::shared_ptr<uint8_t>> slices_;  // one per thread
};

// Last-level cache size in bytes from sysfs (0 when unknown): decode rows
// whose K/V fit in it can read faster than DRAM.
long long llc_bytes();
// The L3's size in bytes from sysfs (0 when it reports no level-3 cache).
long long l3_bytes();

}  // namespace g3::bench
