// g3attn-hwy-timing: times the Highway attention core on one thread, side by
// side on the same buffers, for the 4B shapes where the core's speed matters:
//   prefill: 4B global key (head_dim 256, G 2), T new tokens over S positions, f32 KV
//   local:   4B local key (W 1024), T tokens at the end of S = 4096 and S = 32768
//   decode:  4B global, T = 1 over S positions, bf16 KV (bytes streamed / s)
// FLOPs count 4 * head_dim per visible (query head, key) pair (QK and PV).
// Not a test: numbers depend on the machine. Times are the calling thread's
// CPU time (best of the repeats), which a shared, loaded machine distorts less
// than wall time.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "generator/backend_api.h"
#include "generator/catalogue.h"
#include "generator/kernel_key.h"

// Thread CPU time, not wall time: the machine is shared, and CPU time of the
// calling thread is what the kernel itself costs (it is single-threaded).
double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

namespace {

struct Case {
  int64_t T, S;
  int dh, G, W;
  g3::DType kv;
};

double visible_pairs(const std::vector<int32_t>& qpos, const std::vector<int32_t>& kpos, int G, int W) {
  double n = 0;
  for (int32_t q : qpos)
    for (int32_t k : kpos)
      if (k <= q && (W == 0 || q - k < W)) n += G;
  return n;
}

// Runs core once per repeat over a fresh-looking cache; returns the best time.
double time_core(const g3::BackendKernels& kb, const Case& c, int reps, double* pairs, double* bytes) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  const size_t esz = c.kv == g3::DType::F32 ? 4 : 2;
  std::vector<float> q(size_t(c.T * c.G * c.dh)), out(q.size());
  for (auto& x : q) x = nd(rng) * 0.0625f;
  std::vector<uint8_t> k(size_t(c.S * c.dh) * esz), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = uint8_t(rng());
    v[i] = uint8_t(rng());
  }
  if (esz == 4) {  // keep values sane: random floats in [-1, 1]
    float* kf = reinterpret_cast<float*>(k.data());
    float* vf = reinterpret_cast<float*>(v.data());
    for (int64_t i = 0; i < c.S * c.dh; ++i) kf[i] = nd(rng), vf[i] = nd(rng);
  } else {
    uint16_t* kb16 = reinterpret_cast<uint16_t*>(k.data());
    uint16_t* vb16 = reinterpret_cast<uint16_t*>(v.data());
    for (int64_t i = 0; i < c.S * c.dh; ++i) {
      float a = nd(rng), b = nd(rng);
      uint32_t ua, ub;
      std::memcpy(&ua, &a, 4);
      std::memcpy(&ub, &b, 4);
      kb16[i] = uint16_t(ua >> 16);
      vb16[i] = uint16_t(ub >> 16);
    }
  }
  std::vector<int32_t> kpos(size_t(c.S)), qpos(size_t(c.T));
  std::vector<uint8_t> valid(size_t(c.S), 1);
  for (int64_t s = 0; s < c.S; ++s) kpos[size_t(s)] = int32_t(s);
  for (int64_t t = 0; t < c.T; ++t) qpos[size_t(t)] = int32_t(c.S - c.T + t);
  g3_core_args a{};
  a.T = c.T;
  a.q = q.data();
  a.q_stride = c.G * c.dh;
  a.qpos = qpos.data();
  a.k = k.data();
  a.v = v.data();
  a.S = c.S;
  a.kpos = kpos.data();
  a.kvalid = valid.data();
  a.out = out.data();
  a.out_stride = c.G * c.dh;
  a.head_dim = c.dh;
  a.group = c.G;
  a.window = c.W;
  a.kv_dtype = c.kv == g3::DType::F32 ? G3_DTYPE_F32 : G3_DTYPE_BF16;
  *pairs = visible_pairs(qpos, kpos, c.G, c.W);
  // Bytes a decode step must stream: K and V of every slot it scans.
  *bytes = double(c.S) * c.dh * esz * 2;
  double best = 1e30;
  kb.table.core(&a);  // warm-up
  for (int r = 0; r < reps; ++r) {
    const double t0 = cpu_now();
    kb.table.core(&a);
    best = std::min(best, cpu_now() - t0);
  }
  return best;
}

g3::KernelKey key4b(int W, g3::DType kv) {
  g3::ModelConfig m = g3::builtin_model("4b");
  for (const auto& l : g3::layer_specs(m))
    if ((W > 0) == (l.window > 0)) return g3::kernel_key(l, kv, g3::DType::BF16);
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  std::string isa = argc > 1 ? argv[1] : "avx3_dl";
  int reps = argc > 2 ? std::atoi(argv[2]) : 3;
  std::string filter = argc > 3 ? argv[3] : "";
  if (isa == "--help") {
    std::printf("usage: g3attn-hwy-timing [ISA (default avx3_dl)] [repeats (default 3)] [row filter substring]\n");
    return 0;
  }
  struct Row {
    const char* name;
    Case c;
  } rows[] = {
      {"prefill global f32 T512 S4096", {512, 4096, 256, 2, 0, g3::DType::F32}},
      {"prefill global bf16 T512 S4096", {512, 4096, 256, 2, 0, g3::DType::BF16}},
      {"prefill local f32 T512 S4096", {512, 4096, 256, 2, 1024, g3::DType::F32}},
      {"prefill local f32 T512 S32768", {512, 32768, 256, 2, 1024, g3::DType::F32}},
      {"decode global bf16 T1 S32768", {1, 32768, 256, 2, 0, g3::DType::BF16}},
      {"decode global f32 T1 S32768", {1, 32768, 256, 2, 0, g3::DType::F32}},
      {"decode global bf16 T1 S2048 (in cache)", {1, 2048, 256, 2, 0, g3::DType::BF16}},
  };
  if (filter.empty() || filter == "stream") {
    // The machine's read bandwidth right now, as the decode rows see it: one
    // thread summing a 256 MiB buffer (integer adds, so it vectorises without
    // -march and the loop is bound by memory, not arithmetic).
    std::vector<uint64_t> buf(size_t(32) << 20, 1);
    uint64_t sum = 0;
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      const double t0 = cpu_now();
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (size_t i = 0; i < buf.size(); i += 4) s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
      sum += s0 + s1 + s2 + s3;
      best = std::min(best, cpu_now() - t0);
    }
    std::printf("%-34s %s  %9.3f ms  %7s         %6.1f GB/s (check %llu)\n", "stream read 256 MiB (1 thread)", "    ",
                best * 1e3, "", double(buf.size() * 8) / best * 1e-9, (unsigned long long)sum);
  }
  for (const auto& r : rows) {
    if (!filter.empty() && std::string(r.name).find(filter) == std::string::npos) continue;
    g3::BackendKernels kb = g3::highway_kernels(key4b(r.c.W, r.c.kv), isa);
    double pairs = 0, bytes = 0;
    double s = time_core(kb, r.c, reps, &pairs, &bytes);
    std::printf("%-34s isa %-7s %s  %9.3f ms  %7.1f GFLOP/s  %6.1f GB/s\n", r.name, kb.isa.c_str(),
                kb.specialised ? "spec" : "gen ", s * 1e3, 4.0 * r.c.dh * pairs / s * 1e-9, bytes / s * 1e-9);
  }
  return 0;
}
