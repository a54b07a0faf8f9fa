#include "runtime/dispatch/onednn_matmul.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "generator/bf16.h"
#include "generator/xbyak/amx_permission.h"
#include "runtime/dispatch/big_buffer.h"

namespace g3 {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

// The row count the weights' layout is chosen for. oneDNN 2.6 picks the
// same weights layout for every M on the CPUs measured (M = 1 to 2048 gave
// one layout on Emerald Rapids, bf16 and f32), and every later primitive
// is created against the layout chosen here, so it is the layout, not M,
// that this fixes.
constexpr int64_t kLayoutRows = 512;

// The process's CPU engine, made once. Before it is made oneDNN is capped
// below AMX when this process may not use AMX tiles (G3ATTN_AMX=off, or
// Linux refused the tile data): "never use AMX tiles" then holds for the
// projections too. oneDNN reads its ISA cap once, so the variable is read
// when the first oneDNN projection is prepared.
dnnl::engine& cpu_engine() {
  static dnnl::engine eng = [] {
    if (!amx::unavailable_reason().empty()) dnnl::set_max_cpu_isa(dnnl::cpu_isa::avx512_core_bf16);
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return eng;
}

// A stream per thread: blocks of one call run on several threads at once.
dnnl::stream& thread_stream() {
  thread_local dnnl::stream s(cpu_engine());
  return s;
}

// Holds OpenMP to one thread in this thread while oneDNN creates or runs a
// primitive. oneDNN sizes its parallel regions from omp_get_max_threads()
// when a primitive is created and again when it runs; with one thread it
// runs inline and never starts an OpenMP team, whose threads would spin on
// the pool's cores after every call (see the header).
class OneOmpThread {
 public:
  OneOmpThread() : prev_(omp_get_max_threads()) {
    if (prev_ != 1) omp_set_num_threads(1);
  }
  ~OneOmpThread() {
    if (prev_ != 1) omp_set_num_threads(prev_);
  }
  OneOmpThread(const OneOmpThread&) = delete;
  OneOmpThread& operator=(const OneOmpThread&) = delete;

 private:
  int prev_;
};

Dt data_type(DType compute) { return compute == DType::BF16 ? Dt::bf16 : Dt::f32; }

// The scratchpad is ours (scratchpad_mode::user): with oneDNN's own
// ("library") scratchpad, blocks of one call executing the same primitive
// on several pool threads at once produced wrong results now and then on
// AMX (the test of awkward shapes on three threads caught it), and each
// thread gets its own grow-only buffer here instead, which also keeps
// oneDNN from allocating during a call.
dnnl::matmul::primitive_desc matmul_pd(int64_t M, int64_t K, int64_t N, DType compute, const memory::desc& weights) {
  memory::desc src({M, K}, data_type(compute), Tag::ab);
  memory::desc dst({M, N}, Dt::f32, Tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, cpu_engine());
}

// Grow-only, 64-byte aligned buffers per thread: 0 and 1 are the dense
// staging buffers of a call (see run), in the calling thread, whose rows the
// pool's threads write disjointly; 2 is the oneDNN scratchpad of the thread
// that executes a block.
uint8_t* scratch_bytes(int which, size_t n) {
  struct Buf {
    uint8_t* p = nullptr;
    size_t size = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf v[3];
  Buf& b = v[which];
  if (b.size < n) {
    const size_t bytes = (n + 63) / 64 * 64;
    void* mem = std::aligned_alloc(64, bytes);
    if (!mem) throw std::bad_alloc();
    std::free(b.p);
    b.p = static_cast<uint8_t*>(mem);
    b.size = bytes;
  }
  return b.p;
}

// The contract's rounding (generator/bf16.h) sixteen lanes at a time: add
// 0x7fff plus the lowest kept bit, keep the upper half; NaN keeps its upper
// half with the quiet bit set. Bit for bit the scalar rule. GCC 12's
// AVX-512 headers seed some intrinsics with a deliberately undefined
// vector and then warn about it (-Wmaybe-uninitialized), hence the pragma.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) void round_row_avx512(const float* a, int64_t K, uint16_t* d) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(a + k));
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + k), _mm512_cvtepi32_epi16(r));
  }
  for (; k < K; ++k) d[k] = f32_to_bf16(a[k]);
}
#pragma GCC diagnostic pop

bool has_avx512f() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return yes;
}

}  // namespace

void round_rows_to_bf16(const float* a, int64_t lda, int64_t K, int64_t r0, int64_t r1, uint16_t* dst) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* src = a + r * lda;
    uint16_t* d = dst + r * K;
    if (has_avx512f()) {
      round_row_avx512(src, K, d);
    } else {
      for (int64_t k = 0; k < K; ++k) d[k] = f32_to_bf16(src[k]);
    }
  }
}

std::string onednn_unavailable_reason(DType compute) {
  try {
    OneOmpThread one;
    const Dt dt = data_type(compute);
    memory::desc w({64, 64}, dt, Tag::any);
    (void)matmul_pd(16, 64, 64, compute, w);
    return "";
  } catch (const dnnl::error& e) {
    return std::string("oneDNN cannot create a ") + to_string(compute) + " matmul here: " + e.what();
  }
}

struct OnednnMatmul::Impl {
  int64_t N = 0, K = 0;
  DType compute = DType::F32;
  memory::desc wdesc;                // the weights in oneDNN's layout
  std::shared_ptr<uint8_t> weights;  // 64-byte aligned, wdesc.get_size() bytes
  mutable std::mutex mu;
  // Primitives per row count of a block (kOnednnBlockRows, and the ragged
  // last blocks' counts), made on first use and kept.
  struct Prim {
    dnnl::matmul p;
    memory::desc src, dst, scratch;
    std::string impl;
  };
  mutable std::map<int64_t, std::shared_ptr<const Prim>> prims;

  const Prim& prim(int64_t rows) const {
    std::lock_guard<std::mutex> lock(mu);
    auto it = prims.find(rows);
    if (it != prims.end()) return *it->second;
    OneOmpThread one;
    auto pd = matmul_pd(rows, K, N, compute, wdesc);
    auto p = std::make_shared<Prim>(Prim{dnnl::matmul(pd), pd.src_desc(), pd.dst_desc(), pd.scratchpad_desc(),
                                         pd.impl_info_str()});
    return *prims.emplace(rows, std::move(p)).first->second;
  }
};

OnednnMatmul::OnednnMatmul(const PackedWeights& w) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.N = w.N;
  I.K = w.K;
  I.compute = w.compute;
  if (w.N <= 0 || w.K <= 0) throw std::runtime_error("oneDNN projection: empty weight matrix");
  OneOmpThread one;
  const Dt dt = data_type(w.compute);
  const size_t esz = w.compute == DType::BF16 ? 2 : 4;
  // HF's [N][K] matrix rebuilt from the panels, in the mode's element type:
  // oneDNN reorders from it (dims {K, N}, K fastest). bf16 weights widen to
  // f32 exactly in the f32 mode; in the bf16 mode they are bf16 already.
  std::vector<uint8_t> dense(size_t(w.N * w.K) * esz);
  for (int64_t n = 0; n < w.N; ++n) {
    const int64_t panel = n / G3_PANEL, j = n % G3_PANEL;
    for (int64_t k = 0; k < w.K; ++k) {
      const size_t idx = (size_t(panel) * size_t(w.K) + size_t(k)) * G3_PANEL + size_t(j);
      const size_t out = size_t(n * w.K + k);
      if (w.compute == DType::BF16) {
        const uint16_t v = w.dtype == DType::BF16 ? static_cast<const uint16_t*>(w.data())[idx]
                                                  : f32_to_bf16(static_cast<const float*>(w.data())[idx]);
        reinterpret_cast<uint16_t*>(dense.data())[out] = v;
      } else {
        reinterpret_cast<float*>(dense.data())[out] = w.dtype == DType::F32
                                                          ? static_cast<const float*>(w.data())[idx]
                                                          : bf16_to_f32(static_cast<const uint16_t*>(w.data())[idx]);
      }
    }
  }
  auto pd = matmul_pd(kLayoutRows, w.K, w.N, w.compute, memory::desc({w.K, w.N}, dt, Tag::any));
  I.wdesc = pd.weights_desc();
  const size_t bytes = I.wdesc.get_size();
  // A big buffer like the Highway GEMM's packed weights (big_buffer.h): the
  // projections stream these every call, so they belong on 2 MiB pages too.
  I.weights = alloc_big(bytes);
  memory src(memory::desc({w.K, w.N}, dt, Tag::ba), cpu_engine(), dense.data());
  memory dst(I.wdesc, cpu_engine(), I.weights.get());
  dnnl::stream& s = thread_stream();
  dnnl::reorder(src, dst).execute(s, src, dst);
  s.wait();
}

OnednnMatmul::~OnednnMatmul() = default;

int64_t OnednnMatmul::N() const { return impl_->N; }
int64_t OnednnMatmul::K() const { return impl_->K; }
DType OnednnMatmul::compute() const { return impl_->compute; }
size_t OnednnMatmul::bytes() const { return impl_->wdesc.get_size(); }

std::string OnednnMatmul::implementation(int64_t M) const {
  const int64_t rows = std::min(M, kOnednnBlockRows);
  return impl_->prim(rows).impl;
}

void OnednnMatmul::run(const float* a, int64_t M, int64_t lda, float* c, int64_t ldc,
                       const ParallelFor& parallel_for) const {
  if (M <= 0) return;
  const Impl& I = *impl_;
  const int64_t K = I.K, N = I.N;
  // oneDNN's fast matmul kernels (brgemm) read a dense source and write a
  // dense destination: rows of exactly K and N elements. The bf16 mode
  // rounds the activations into a dense buffer anyway; a strided f32 source
  // or destination goes through one as well.
  const bool bf16 = I.compute == DType::BF16, stage_a = bf16 || lda != K, stage_c = ldc != N;
  uint8_t* a_buf = stage_a ? scratch_bytes(0, size_t(M * K) * (bf16 ? 2 : 4)) : nullptr;
  float* c_buf = stage_c ? reinterpret_cast<float*>(scratch_bytes(1, size_t(M * N) * 4)) : nullptr;
  const int64_t nblocks = (M + kOnednnBlockRows - 1) / kOnednnBlockRows;
  parallel_for(nblocks, [&](int64_t i) {
    const int64_t r0 = i * kOnednnBlockRows, rows = std::min(kOnednnBlockRows, M - r0);
    const void* src = a + r0 * lda;
    if (bf16) {
      round_rows_to_bf16(a + r0 * lda, lda, K, 0, rows, reinterpret_cast<uint16_t*>(a_buf) + r0 * K);
      src = reinterpret_cast<uint16_t*>(a_buf) + r0 * K;
    } else if (stage_a) {
      float* d = reinterpret_cast<float*>(a_buf) + r0 * K;
      for (int64_t r = 0; r < rows; ++r) std::memcpy(d + r * K, a + (r0 + r) * lda, size_t(K) * sizeof(float));
      src = d;
    }
    float* dst = stage_c ? c_buf + r0 * N : c + r0 * ldc;
    OneOmpThread one;
    const Impl::Prim& p = I.prim(rows);
    memory sm(p.src, cpu_engine(), const_cast<void*>(src));
    memory wm(I.wdesc, cpu_engine(), I.weights.get());
    memory dm(p.dst, cpu_engine(), dst);
    memory pad(p.scratch, cpu_engine(), scratch_bytes(2, std::max<size_t>(p.scratch.get_size(), 64)));
    dnnl::stream& s = thread_stream();
    p.p.execute(s, {{DNNL_ARG_SRC, sm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, dm}, {DNNL_ARG_SCRATCHPAD, pad}});
    s.wait();
    if (stage_c)
      for (int64_t r = 0; r < rows; ++r) std::memcpy(c + (r0 + r) * ldc, dst + r * N, size_t(N) * sizeof(float));
  });
}

}  // namespace g3
