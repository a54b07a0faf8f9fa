#include "runtime/exec/block.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>

#include "generator/errors.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/prefetch_route.h"

namespace g3 {

// The contract's name of a key's compute mode.
static int32_t contract_compute(const KernelKey& k) {
  return k.compute == DType::BF16 ? G3_COMPUTE_BF16 : G3_COMPUTE_F32;
}

static WeightMatrix stack_rows(const std::vector<const WeightMatrix*>& parts) {
  WeightMatrix out;
  out.cols = parts[0]->cols;
  out.dtype = parts[0]->dtype;
  for (const WeightMatrix* p : parts)
    if (p->dtype != out.dtype) out.dtype = DType::F32;  // mixed dtypes: widen
  for (const WeightMatrix* p : parts) {
    out.rows += p->rows;
    if (out.dtype == DType::BF16) {
      out.bf16.insert(out.bf16.end(), p->bf16.begin(), p->bf16.end());
    } else {
      std::vector<float> f = p->to_f32();
      out.f32.insert(out.f32.end(), f.begin(), f.end());
    }
  }
  return out;
}

void set_layer_projection(PreparedLayer& L, Phase phase, ProjProvider p) {
  if (p == ProjProvider::Onednn && !L.onednn_qkv) {
    const std::string why = onednn_unavailable_reason(L.key.compute);
    if (!why.empty()) throw InputError("--proj onednn: " + why);
    L.onednn_qkv = std::make_shared<const OnednnMatmul>(L.wqkv);
    L.onednn_o = std::make_shared<const OnednnMatmul>(L.wo);
  }
  L.proj[size_t(phase)] = p;
}

// Resolves both phases of a layer's projection request for the layer's
// kernels (onednn_route.h); `isa` is the resolved ISA the layer was asked for.
static void route_projections(PreparedLayer& L, ProjectionRoute request, const std::string& isa) {
  L.proj_route = request;
  for (Phase ph : {Phase::Prefill, Phase::Decode}) {
    const KernelChoice& k = ph == Phase::Decode ? L.decode : L.kernels;
    set_layer_projection(L, ph,
                         resolve_projection(request, ph, L.key.compute, k.stages[Stage::Gemm], isa != best_isa()));
  }
}

// The layer's kernels for each phase as `backend` resolves them, and
// under auto the profile's choices by context.
static void choose_kernels(PreparedLayer& L, const std::string& backend, const std::string& isa) {
  L.kernels = kernels_for(L.key, backend, isa, Phase::Prefill);
  L.decode = kernels_for(L.key, backend, isa, Phase::Decode);
  for (Phase ph : {Phase::Prefill, Phase::Decode}) {
    auto& at = L.by_context[size_t(ph)];
    at.clear();
    if (backend != "auto") continue;
    for (const ContextRoute& c : context_routes(L.key, ph, isa))
      at.push_back({c.from, kernels_for(L.key, c.route, isa)});
  }
}

PreparedLayer prepare_layer(const LayerSpec& spec, const LayerWeights& w, DType kv_dtype, const std::string& backend,
                            const std::string& isa, DType compute, ProjectionRoute proj) {
  PreparedLayer L;
  L.spec = spec;
  L.key = kernel_key(spec, kv_dtype, compute == DType::BF16 ? DType::BF16 : w.q_proj.dtype, compute);
  choose_kernels(L, backend, isa);
  L.wqkv = pack_weights(stack_rows({&w.q_proj, &w.k_proj, &w.v_proj}), compute);
  L.wo = pack_weights(w.o_proj, compute);
  L.q_norm = w.q_norm;
  L.k_norm = w.k_norm;
  L.input_norm = w.input_norm;
  L.post_norm = w.post_norm;
  route_projections(L, proj, isa);
  return L;
}

PreparedLayer with_kernels(const PreparedLayer& base, DType kv_dtype, const std::string& backend,
                           const std::string& isa) {
  PreparedLayer L = base;  // PackedWeights share their storage
  L.key = kernel_key(base.spec, kv_dtype, base.key.weight_dtype, base.key.compute);
  choose_kernels(L, backend, isa);
  route_projections(L, base.proj_route, isa);
  return L;
}

void run_block_nocache(const PreparedLayer& L, const float* x, const int32_t* positions, const int32_t* key_real,
                       int64_t B, int64_t T, float* block_out, float* attn_out) {
  const LayerSpec& s = L.spec;
  const g3_kernel_table& k = L.kernels.kernels.table;
  const int64_t D = s.hidden_size, H = s.head_dim, N = s.num_heads, K = s.num_kv_heads, G = N / K;
  const int64_t QKV = (N + 2 * K) * H;
  const size_t esz = L.key.kv_dtype == DType::F32 ? 4 : 2;

  std::vector<float> u(size_t(T * D)), qkv(size_t(T * QKV)), q(size_t(T * N * H)), enc(size_t(T * N * H)),
      a(size_t(T * D));
  std::vector<uint8_t> kcache(size_t(K * T * H) * esz), vcache(size_t(K * T * H) * esz);
  std::vector<uint8_t> valid(static_cast<size_t>(T));
  std::vector<int64_t> slot(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) slot[t] = t;
  // This path has no pool: a oneDNN projection runs its blocks in turn.
  const OnednnMatmul::ParallelFor serial = [](int64_t n, const std::function<void(int64_t)>& fn) {
    for (int64_t i = 0; i < n; ++i) fn(i);
  };

  for (int64_t b = 0; b < B; ++b) {
    const float* xb = x + b * T * D;
    const int32_t* pb = positions + b * T;
    // Step 1: pre-norm; step A: fused q/k/v projection.
    k.rmsnorm(xb, T, D, D, L.input_norm.data(), s.rms_eps, nullptr, u.data(), D);
    if (L.proj_for_rows(T) == ProjProvider::Onednn) {
      L.onednn_qkv->run(u.data(), T, D, qkv.data(), QKV, serial);
    } else {
      g3_gemm_args ga = L.wqkv.args(u.data(), T, D, qkv.data(), QKV, 0, QKV);
      k.gemm(&ga);
    }
    // Steps B-D: QK-norm, RoPE, alpha; K/V into this row's cache (slot t = token t).
    g3_qk_args qa{};
    qa.T = T;
    qa.num_heads = int32_t(N);
    qa.num_kv_heads = int32_t(K);
    qa.q = qkv.data();
    qa.q_stride = QKV;
    qa.k = qkv.data() + N * H;
    qa.v = qkv.data() + (N + K) * H;
    qa.kv_stride = QKV;
    qa.pos = pb;
    qa.q_norm = L.q_norm.data();
    qa.k_norm = L.k_norm.data();
    qa.q_out = q.data();
    qa.q_out_stride = N * H;
    qa.k_cache = kcache.data();
    qa.v_cache = vcache.data();
    qa.cache_head_stride = T;
    qa.slot = slot.data();
    qa.head_dim = int32_t(H);
    qa.kv_dtype = L.key.kv_dtype == DType::F32 ? G3_DTYPE_F32 : G3_DTYPE_BF16;
    qa.alpha = s.alpha;
    qa.eps = s.rms_eps;
    qa.rope_base = s.rope_base;
    qa.rope_scale = s.rope_scale;
    k.qk(&qa);
    for (int64_t t = 0; t < T; ++t) valid[t] = key_real ? key_real[b * T + t] != 0 : 1;
    // Steps E-I per KV head, its G query heads together.
    for (int64_t j = 0; j < K; ++j) {
      g3_core_args ca{};
      ca.T = T;
      ca.q = q.data() + j * G * H;
      ca.q_stride = N * H;
      ca.qpos = pb;
      ca.k = kcache.data() + size_t(j * T * H) * esz;
      ca.v = vcache.data() + size_t(j * T * H) * esz;
      ca.S = T;
      ca.kpos = pb;
      ca.kvalid = valid.data();
      ca.out = enc.data() + j * G * H;
      ca.out_stride = N * H;
      ca.lse = nullptr;
      ca.head_dim = int32_t(H);
      ca.group = int32_t(G);
      ca.window = s.window;
      ca.kv_dtype = qa.kv_dtype;
      // Keys are this call's tokens in order: causality by slot (SPEC 1.4),
      // positions only feed RoPE and the window, whatever they are.
      ca.causal = G3_CAUSAL_SLOTS;
      ca.causal_offset = 0;
      ca.compute = contract_compute(L.key);
      k.core(&ca);
    }
    // Step J: output projection; steps 3-4: post-norm and residual.
    float* ab = attn_out ? attn_out + b * T * D : a.data();
    if (L.proj_for_rows(T) == ProjProvider::Onednn) {
      L.onednn_o->run(enc.data(), T, N * H, ab, D, serial);
    } else {
      g3_gemm_args go = L.wo.args(enc.data(), T, N * H, ab, D, 0, D);
      k.gemm(&go);
    }
    k.rmsnorm(ab, T, D, D, L.post_norm.data(), s.rms_eps, xb, block_out + b * T * D, D);
  }
}

}  // namespace g3

// ---------------------------------------------------------------------------
// The cached, threaded block (model stack).

namespace g3 {

namespace {

template <class V>
void grow(V& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// c[M][N] = a[M][K] . W^T (SPEC 1.3 steps A and J), split into row blocks x
// column groups of whole panels, as the contract requires. A call of few
// rows (decode) reads each weight once and runs at the memory's pace: its
// columns are cut into a few long runs of panels per thread, so each thread
// streams contiguous memory and all finish together (4-panel items split
// 1B's output projection 5:4 between two threads).
void parallel_gemm(ThreadPool& pool, const g3_kernel_table& k, const PackedWeights& W, const float* a, int64_t M,
                   int64_t lda, float* c, int64_t ldc, const BlockSplit& sp) {
  int64_t rb = sp.row_block, cb = sp.col_panels * G3_PANEL;
  if (M <= sp.gemv_rows) {
    const int64_t panels = (W.N + G3_PANEL - 1) / G3_PANEL, items = sp.gemv_items_per_thread * pool.size();
    rb = std::max<int64_t>(M, 1);
    cb = (panels + items - 1) / items * G3_PANEL;
  }
  const int64_t nr = (M + rb - 1) / rb, nc = (W.N + cb - 1) / cb;
  pool.parallel_for(nr * nc, [&](int64_t i) {
    const int64_t r0 = (i / nc) * rb, r1 = std::min(M, r0 + rb);
    const int64_t n0 = (i % nc) * cb, n1 = std::min(W.N, n0 + cb);
    g3_gemm_args g = W.args(a + r0 * lda, r1 - r0, lda, c + r0 * ldc, ldc, n0, n1);
    k.gemm(&g);
  });
}

// The pool as oneDNN's provider takes it (it splits a call into row blocks
// over the caller's threads).
OnednnMatmul::ParallelFor pool_for_each(ThreadPool& pool) {
  return [&pool](int64_t n, const std::function<void(int64_t)>& fn) { pool.parallel_for(n, fn); };
}

// The real tokens the cache has seen, the most of any row: the context a
// call's kernels are chosen by (PreparedLayer::for_call).
int64_t seen_tokens(const LayerKvCache& cache) {
  int64_t n = 0;
  for (int64_t b = 0; b < cache.batch(); ++b) n = std::max(n, cache.written(b));
  return n;
}

// The smallest and largest position among queries t0..t1-1.
std::pair<int32_t, int32_t> query_range(const int32_t* pos, int64_t t0, int64_t t1) {
  const auto [lo, hi] = std::minmax_element(pos + t0, pos + t1);
  return {*lo, *hi};
}

// Whether a query with a position in q = [min, max] may see a key in slots
// s0..s1-1 of row b: a real key at or before the largest position and inside
// the smallest one's window (SPEC 1.4's mask, loosened to the range; the
// kernel's mask decides exactly).
bool tile_may_see(const LayerKvCache& cache, int64_t b, std::pair<int32_t, int32_t> q, int32_t window, int64_t s0,
                  int64_t s1) {
  const int32_t* kp = cache.kpos(b);
  const uint8_t* kv = cache.kvalid(b);
  for (int64_t x = s0; x < s1; ++x)
    if (kv[x] && kp[x] <= q.second && (window <= 0 || int64_t(kp[x]) > int64_t(q.first) - window)) return true;
  return false;
}

}  // namespace

void reserve_scratch(const PreparedLayer& L, int64_t R, BlockScratch& S) {
  const LayerSpec& s = L.spec;
  const int64_t D = s.hidden_size, H = s.head_dim, N = s.num_heads, K = s.num_kv_heads;
  grow(S.u, size_t(R * D));
  grow(S.qkv, size_t(R * (N + 2 * K) * H));
  grow(S.q, size_t(R * N * H));
  grow(S.enc, size_t(R * N * H));
  grow(S.a, size_t(R * D));
  grow(S.slot, size_t(R));
}

void run_qkv_projection(const PreparedLayer& L, int64_t R, ThreadPool& pool, BlockScratch& S, const BlockSplit& sp) {
  const LayerSpec& s = L.spec;
  const int64_t D = s.hidden_size, QKV = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
  if (L.proj_for_rows(R) == ProjProvider::Onednn) {
    L.onednn_qkv->run(S.u.data(), R, D, S.qkv.data(), QKV, pool_for_each(pool));
    return;
  }
  parallel_gemm(pool, L.kernels.kernels.table, L.wqkv, S.u.data(), R, D, S.qkv.data(), QKV, sp);
}

void run_out_projection(const PreparedLayer& L, int64_t R, ThreadPool& pool, BlockScratch& S, const BlockSplit& sp) {
  const LayerSpec& s = L.spec;
  if (L.proj_for_rows(R) == ProjProvider::Onednn) {
    L.onednn_o->run(S.enc.data(), R, int64_t(s.num_heads) * s.head_dim, S.a.data(), s.hidden_size,
                    pool_for_each(pool));
    return;
  }
  parallel_gemm(pool, L.kernels.kernels.table, L.wo, S.enc.data(), R, int64_t(s.num_heads) * s.head_dim, S.a.data(),
                s.hidden_size, sp);
}

void run_attention_core(const PreparedLayer& L, const LayerKvCache& cache, const int32_t* positions, int64_t B,
                        int64_t T, ThreadPool& pool, BlockScratch& S, const BlockSplit& sp) {
  const LayerSpec& s = L.spec;
  const g3_kernel_table& k = L.for_call(T, sp.decode_max_tokens, seen_tokens(cache)).kernels.table;
  const int64_t H = s.head_dim, N = s.num_heads, K = s.num_kv_heads, G = N / K;
  const int32_t kvd = L.key.kv_dtype == DType::F32 ? G3_DTYPE_F32 : G3_DTYPE_BF16;
  const size_t esz = cache.element_size();
  const int64_t cap = cache.capacity();
  // Steps E-I: the attention core for each KV head and its G query heads.
  const DecodePrefetch prefetch = decode_prefetch();
  auto core_args = [&](int64_t b, int64_t j, int64_t t0, int64_t t1, int64_t s0, int64_t s1, float* out,
                       int64_t out_stride, float* lse) {
    const int64_t r0 = b * T + t0;
    const uint8_t* kb = static_cast<const uint8_t*>(cache.k(b)) + size_t((j * cap + s0) * H) * esz;
    const uint8_t* vb = static_cast<const uint8_t*>(cache.v(b)) + size_t((j * cap + s0) * H) * esz;
    g3_core_args ca{};
    ca.T = t1 - t0;
    ca.q = S.q.data() + r0 * N * H + j * G * H;
    ca.q_stride = N * H;
    ca.qpos = positions + r0;
    ca.k = kb;
    ca.v = vb;
    ca.S = s1 - s0;
    ca.kpos = cache.kpos(b) + s0;
    ca.kvalid = cache.kvalid(b) + s0;
    ca.out = out;
    ca.out_stride = out_stride;
    ca.lse = lse;
    ca.head_dim = int32_t(H);
    ca.group = int32_t(G);
    ca.window = s.window;
    ca.kv_dtype = kvd;
    ca.compute = contract_compute(L.key);
    ca.prefetch_bytes = prefetch.bytes;
    ca.prefetch_level = prefetch.level;
    return ca;
  };
  // The slots row b's queries t0..t1-1 may see, as at most two spans of
  // slot indices; the mask (SPEC 1.4) decides within them.
  //  - Full length: slots are in position order, so a span starts at the
  //    first position a query of the tile may see (the window on local
  //    layers) and ends after the last one <= the tile's largest query
  //    position (the causal tile skip).
  //  - Ring: the newest min(used, W - 1 + T) slots. Positions rise with
  //    every real token written, so a query at p, which sees positions
  //    above p - W, sees at most W - 1 tokens written before this call plus
  //    this call's T, all among the newest; older slots hold only keys
  //    outside every window. Where they wrap around the ring's end they are
  //    two spans.
  struct Spans {
    int n = 0;
    int64_t s0[2] = {0, 0}, s1[2] = {0, 0};
  };
  auto spans = [&](int64_t b, int64_t t0, int64_t t1) -> Spans {
    Spans sp_;
    const int64_t used = cache.used(b);
    if (used == 0) return sp_;
    if (cache.is_ring()) {
      const int64_t n = std::min(used, int64_t(s.window) - 1 + T), end = cache.written(b) % cap;
      if (end == 0 || end >= n) {
        const int64_t e = end == 0 ? used : end;
        sp_ = {1, {e - n, 0}, {e, 0}};
      } else {
        sp_ = {2, {cap - (n - end), 0}, {cap, end}};
      }
      return sp_;
    }
    const auto [qmin, qmax] = query_range(positions + b * T, t0, t1);
    const int32_t* kp = cache.kpos(b);
    const int64_t e = std::upper_bound(kp, kp + used, qmax) - kp;
    int64_t b0 = 0;
    if (s.window > 0) b0 = std::lower_bound(kp, kp + e, int64_t(qmin) - s.window + 1) - kp;
    if (b0 < e) sp_ = {1, {b0, 0}, {e, 0}};
    return sp_;
  };

  // Decode-sized calls cut each row's visible slots (its spans, in order)
  // into equal pieces that run in parallel: about sp.decode_items items over
  // the B x K heads, none shorter than sp.kv_chunk slots. The cut depends on
  // the cache, not on the pool, so results do not either. A piece that
  // crosses a wrapped ring's end is two kernel calls in one item: pieces cut
  // at the wrap instead gave the few slots past it an item of their own, and
  // 1B's local decode over 4096 positions (508 + 4 slots) took 1.12-1.27x the
  // time of an unwrapped ring (AMD EPYC Zen 5, 2 threads).
  auto visible = [](const Spans& v) {
    int64_t len = 0;
    for (int e = 0; e < v.n; ++e) len += v.s1[e] - v.s0[e];
    return len;
  };
  int64_t nch = 0, chunk = 0;
  bool wrapped = false;
  if (T <= sp.decode_max_tokens) {
    int64_t longest = 0;
    for (int64_t b = 0; b < B; ++b) {
      const Spans v = spans(b, 0, T);
      longest = std::max(longest, visible(v));
      wrapped |= v.n == 2;
    }
    const int64_t per_head = std::max<int64_t>(1, (sp.decode_items + B * K - 1) / (B * K));
    chunk = std::max(sp.kv_chunk, (longest + per_head - 1) / per_head);
    nch = std::max<int64_t>(1, longest / chunk);
  }
  if (nch <= 1 && !wrapped) {
    const int64_t qt = sp.query_tile, nqt = (T + qt - 1) / qt;
    pool.parallel_for(B * K * nqt, [&](int64_t i) {
      const int64_t b = i / (K * nqt), j = (i / nqt) % K, t0 = (i % nqt) * qt, t1 = std::min(T, t0 + qt);
      float* out = S.enc.data() + (b * T + t0) * N * H + j * G * H;
      Spans v = spans(b, t0, t1);
      // A wrapped ring's span that none of the tile's queries sees is
      // dropped, so a tile that sees one span scans it alone.
      if (v.n == 2) {
        const auto q = query_range(positions + b * T, t0, t1);
        Spans seen;
        for (int e = 0; e < 2; ++e)
          if (tile_may_see(cache, b, q, s.window, v.s0[e], v.s1[e])) {
            seen.s0[seen.n] = v.s0[e];
            seen.s1[seen.n++] = v.s1[e];
          }
        v = seen;
      }
      if (v.n == 0) {  // nothing visible (a tile of leading padding): zeros, like the kernels
        for (int64_t t = t0; t < t1; ++t) std::fill(out + (t - t0) * N * H, out + (t - t0) * N * H + G * H, 0.f);
        return;
      }
      // A tile that sees both spans scans the whole ring in one call (the
      // kernels take slots in any order): the key block that holds the wrap
      // mixes the newest and oldest positions and is masked key by key. Two
      // calls merged by log-sum-exp measured no faster (4B local prefill over
      // 4096 positions, where every tile sees both spans; AMD EPYC Zen 5).
      const int64_t s0 = v.n == 1 ? v.s0[0] : 0, s1 = v.n == 1 ? v.s1[0] : cache.used(b);
      g3_core_args ca = core_args(b, j, t0, t1, s0, s1, out, N * H, nullptr);
      k.core(&ca);
    });
  } else {
    // Each KV head's pieces run in parallel, each kernel call returning its
    // normalised output and log-sum-exp; the last of a head's pieces to
    // finish merges them (one parallel region, not a second one for the
    // merge: a decode step is short enough for a fork-join to show), always
    // in the same order, so the result does not depend on which thread merges:
    //   o = sum_c exp(lse_c - m) o_c / sum_c exp(lse_c - m),  m = max_c lse_c.
    const int64_t per = T * G * H;  // one partial output: two per (b, j, piece), one per kernel call
    grow(S.part_out, size_t(B * K * nch * 2 * per));
    grow(S.part_lse, size_t(B * K * nch * 2 * T * G));
    S.pieces_done.assign(size_t(B * K), 0);
    const int64_t parts = 2 * nch;  // partials per head
    auto merge = [&](int64_t i) {  // head i = b * K + j
      const int64_t b = i / K, j = i % K;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t g = 0; g < G; ++g) {
          float m = -INFINITY;
          for (int64_t c = 0; c < parts; ++c) m = std::max(m, S.part_lse[size_t(((i * parts + c) * T + t) * G + g)]);
          float* dst = S.enc.data() + (b * T + t) * N * H + (j * G + g) * H;
          std::fill(dst, dst + H, 0.f);
          if (m == -INFINITY) continue;  // no visible key: zeros, like the kernels
          float wsum = 0;
          for (int64_t c = 0; c < parts; ++c) {
            const float l = S.part_lse[size_t(((i * parts + c) * T + t) * G + g)];
            if (l == -INFINITY) continue;  // an empty piece or call: its output is not written
            const float w = std::exp(l - m);
            wsum += w;
            const float* o = S.part_out.data() + (i * parts + c) * per + (t * G + g) * H;
            for (int64_t h = 0; h < H; ++h) dst[h] += w * o[h];
          }
          for (int64_t h = 0; h < H; ++h) dst[h] /= wsum;
        }
    };
    pool.parallel_for(B * K * nch, [&](int64_t i) {
      const int64_t b = i / (K * nch), j = (i / nch) % K, c = i % nch;
      // Piece c of row b covers its visible offsets [o0, o1): in span 0,
      // then in span 1 past the wrap.
      const Spans v = spans(b, 0, T);
      const int64_t len = visible(v), n = std::max<int64_t>(1, len / chunk);
      const int64_t o0 = c < n ? len * c / n : 0, o1 = c < n ? len * (c + 1) / n : 0;
      const int64_t len0 = v.n > 0 ? v.s1[0] - v.s0[0] : 0;
      for (int64_t sub = 0; sub < 2; ++sub) {
        const int64_t lo = sub == 0 ? std::min(o0, len0) : std::max(o0, len0) - len0;
        const int64_t hi = sub == 0 ? std::min(o1, len0) : std::max(o1, len0) - len0;
        float* out = S.part_out.data() + (2 * i + sub) * per;
        float* lse = S.part_lse.data() + (2 * i + sub) * T * G;
        if (lo >= hi) {
          std::fill(lse, lse + T * G, -INFINITY);
          continue;
        }
        const int64_t base = v.s0[sub];
        g3_core_args ca = core_args(b, j, 0, T, base + lo, base + hi, out, G * H, lse);
        k.core(&ca);
      }
      // acq_rel: the merging thread sees every other piece's partials.
      const int64_t head = b * K + j;
      if (std::atomic_ref<int32_t>(S.pieces_done[size_t(head)]).fetch_add(1, std::memory_order_acq_rel) == nch - 1)
        merge(head);
    });
  }

}

const char* BlockStageTimes::name(int i) {
  static const char* const names[kCount] = {"cache_slots",       "pre_norm",       "qkv_projection", "qk_rope_cache",
                                            "attention_core",    "out_projection", "post_norm"};
  return i >= 0 && i < kCount ? names[i] : "";
}

void run_block_cached(const PreparedLayer& L, LayerKvCache& cache, const float* x, const int32_t* positions,
                      const uint8_t* real, int64_t B, int64_t T, float* y, ThreadPool& pool, BlockScratch& S,
                      const BlockSplit& sp, BlockStageTimes* times) {
  // Stage i ends at mark(i): its wall time is the time since the last mark.
  using Clock = std::chrono::steady_clock;
  Clock::time_point last = times ? Clock::now() : Clock::time_point{};
  auto mark = [&](int i) {
    if (!times) return;
    const Clock::time_point now = Clock::now();
    times->ms[i] = std::chrono::duration<double, std::milli>(now - last).count();
    last = now;
  };
  if (times) *times = BlockStageTimes{};
  const LayerSpec& s = L.spec;
  const int64_t D = s.hidden_size, H = s.head_dim, N = s.num_heads, K = s.num_kv_heads;
  const int64_t QKV = (N + 2 * K) * H, R = B * T;
  const int32_t kvd = L.key.kv_dtype == DType::F32 ? G3_DTYPE_F32 : G3_DTYPE_BF16;
  const int64_t cap = cache.capacity();
  if (B != cache.batch()) throw InputError("block: batch " + std::to_string(B) + " does not match the cache's " +
                                           std::to_string(cache.batch()));
  if (T < 1) return;

  reserve_scratch(L, R, S);

  // Slots first (serial, cheap), before any kernel runs: every row is checked
  // before any row takes a slot, so a refused call leaves the cache as it
  // was; then each real token gets the slot its K/V goes to.
  for (int64_t b = 0; b < B; ++b) cache.check_append(b, positions + b * T, real ? real + b * T : nullptr, T, T);
  for (int64_t b = 0; b < B; ++b) cache.append(b, positions + b * T, real ? real + b * T : nullptr, T, &S.slot[b * T]);
  const g3_kernel_table& k = L.for_call(T, sp.decode_max_tokens, seen_tokens(cache)).kernels.table;
  mark(0);

  // Step 1: pre-norm (SPEC 1.2 / 2.1).
  const int64_t tb = sp.token_block, ntb = (R + tb - 1) / tb;
  pool.parallel_for(ntb, [&](int64_t i) {
    const int64_t r0 = i * tb, r1 = std::min(R, r0 + tb);
    k.rmsnorm(x + r0 * D, r1 - r0, D, D, L.input_norm.data(), s.rms_eps, nullptr, S.u.data() + r0 * D, D);
  });
  mark(1);
  // Step A: the fused q/k/v projection.
  run_qkv_projection(L, R, pool, S, sp);
  mark(2);

  // Steps B-D: QK-norm, RoPE, alpha, cache write; tokens of a row are
  // independent and their slots distinct, so token blocks run in parallel.
  const int64_t tblocks = (T + tb - 1) / tb;
  pool.parallel_for(B * tblocks, [&](int64_t i) {
    const int64_t b = i / tblocks, t0 = (i % tblocks) * tb, t1 = std::min(T, t0 + tb);
    const int64_t r0 = b * T + t0;
    g3_qk_args qa{};
    qa.T = t1 - t0;
    qa.num_heads = int32_t(N);
    qa.num_kv_heads = int32_t(K);
    qa.q = S.qkv.data() + r0 * QKV;
    qa.q_stride = QKV;
    qa.k = qa.q + N * H;
    qa.v = qa.q + (N + K) * H;
    qa.kv_stride = QKV;
    qa.pos = positions + r0;
    qa.q_norm = L.q_norm.data();
    qa.k_norm = L.k_norm.data();
    qa.q_out = S.q.data() + r0 * N * H;
    qa.q_out_stride = N * H;
    qa.k_cache = cache.k(b);
    qa.v_cache = cache.v(b);
    qa.cache_head_stride = cap;
    qa.slot = S.slot.data() + r0;
    qa.head_dim = int32_t(H);
    qa.kv_dtype = kvd;
    qa.alpha = s.alpha;
    qa.eps = s.rms_eps;
    qa.rope_base = s.rope_base;
    qa.rope_scale = s.rope_scale;
    k.qk(&qa);
  });

  // Steps E-I: the attention core; step J: the output projection; steps
  // 3-4: post-norm and the residual.
  mark(3);
  run_attention_core(L, cache, positions, B, T, pool, S, sp);
  mark(4);
  run_out_projection(L, R, pool, S, sp);
  mark(5);
  if (!y) return;  // the attention part alone: its output stays in S.a
  pool.parallel_for(ntb, [&](int64_t i) {
    const int64_t r0 = i * tb, r1 = std::min(R, r0 + tb);
    k.rmsnorm(S.a.data() + r0 * D, r1 - r0, D, D, L.post_norm.data(), s.rms_eps, x + r0 * D, y + r0 * D, D);
  });
  mark(6);
}

}  // namespace g3
