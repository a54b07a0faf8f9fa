// kernels_by_key.cpp: an engine that owns its loops, its weights' layout and
// its KV caches, and takes only the kernels from g3attn. It asks the model
// for a layer's kernel key, looks the key up (g3attn_kernels_for_key: the
// g3_kernel_table of g3attn/kernel_contract.h), and runs the block stage by
// stage on its own buffers: pre-norm, the fused q/k/v projection, QK-norm +
// RoPE + cache write, the attention core per KV head, the output projection,
// post-norm + residual. It then runs the same tokens through the library's
// own layer (g3attn_block) and prints the largest difference.
//
//   kernels_by_key CONFIG WEIGHTS [LAYER [PROMPT [DECODE [OUT]]]]
//
// As prefill_decode.c: LAYER defaults to the config's layer_index, else 0;
// PROMPT 10 tokens in one call, then DECODE (3) single-token calls; OUT
// receives this program's block output as raw float32 [PROMPT + DECODE][D].
//
// Build against an installed g3attn:
//   c++ -std=c++17 kernels_by_key.cpp $(pkg-config --cflags --libs g3attn)
#include <g3attn/g3attn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

void check(g3attn_status s) {
  if (s != G3ATTN_OK) {
    std::fprintf(stderr, "kernels_by_key: %s (%s)\n", g3attn_last_error(), g3attn_status_name(s));
    std::exit(1);
  }
}

// A projection matrix in the contract's panel layout (kernel_contract.h,
// G3_PANEL): panel p holds, for each input column k in order, the G3_PANEL
// values W[p * G3_PANEL + j][k]; rows past the end are zero.
struct Packed {
  int64_t rows = 0, cols = 0;
  std::vector<float> data;
};

Packed pack(const std::vector<float>& w, int64_t rows, int64_t cols) {
  Packed p;
  p.rows = rows;
  p.cols = cols;
  const int64_t panels = (rows + G3_PANEL - 1) / G3_PANEL;
  p.data.assign(size_t(panels * cols * G3_PANEL), 0.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k)
      p.data[size_t(((r / G3_PANEL) * cols + k) * G3_PANEL + r % G3_PANEL)] = w[size_t(r * cols + k)];
  return p;
}

// c[M][rows of W] = a[M][cols of W] . W^T
void gemm(const g3_kernel_table& k, const Packed& w, const float* a, int64_t M, float* c) {
  g3_gemm_args g{};
  g.M = M;
  g.K = w.cols;
  g.N = w.rows;
  g.a = a;
  g.lda = w.cols;
  g.w = w.data.data();
  g.w_dtype = G3_DTYPE_F32;
  g.n_begin = 0;
  g.n_end = w.rows;
  g.c = c;
  g.ldc = w.rows;
  g.compute = G3_COMPUTE_F32;
  k.gemm(&g);
}

std::vector<float> read(const g3attn_weights* w, const g3attn_model* m, int layer, g3attn_tensor t, size_t n) {
  std::vector<float> v(n);
  check(g3attn_weights_read(w, m, layer, t, v.data(), n));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: kernels_by_key CONFIG WEIGHTS [LAYER [PROMPT [DECODE [OUT]]]]\n");
    return 2;
  }
  g3attn_model* model;
  check(g3attn_model_load(argv[1], &model));
  g3attn_model_info info;
  check(g3attn_model_get_info(model, &info));
  const int layer = argc > 3 ? std::atoi(argv[3]) : (info.layer_index >= 0 ? info.layer_index : 0);
  const int64_t prompt = argc > 4 ? std::atoll(argv[4]) : 10, decode = argc > 5 ? std::atoll(argv[5]) : 3;
  const char* out_path = argc > 6 ? argv[6] : nullptr;
  if (prompt < 1 || decode < 0) {
    std::fprintf(stderr, "kernels_by_key: PROMPT must be at least 1, DECODE at least 0\n");
    return 2;
  }
  g3attn_layer_info L;
  check(g3attn_model_layer(model, layer, &L));
  const int64_t D = L.hidden_size, H = L.head_dim, N = L.num_heads, K = L.num_kv_heads, G = N / K;
  const int64_t QKV = (N + 2 * K) * H, total = prompt + decode;

  // The kernels: f32 weights (this program packs them as f32), f32 KV cache,
  // the f32 compute mode; auto backend, best ISA (or $G3ATTN_ISA).
  char key[G3ATTN_KEY_MAX];
  check(g3attn_model_layer_key(model, layer, G3ATTN_F32, G3ATTN_F32, G3ATTN_F32, key, sizeof key));
  g3attn_kernels kern;
  check(g3attn_kernels_for_key(key, nullptr, nullptr, &kern));
  const g3_kernel_table& k = kern.table;
  std::printf("layer %d (%s): key %s\nkernels: backend %s, isa %s%s\n", layer,
              L.kind == G3ATTN_LOCAL ? "local" : "global", key, kern.backend, kern.isa,
              kern.specialised ? "" : " (generic)");

  // This program's weights: read from the checkpoint as f32, q/k/v fused
  // into one matrix so the normed input is read once, then packed.
  g3attn_weights* weights;
  check(g3attn_weights_open(argv[2], model, &weights));
  std::vector<float> wqkv = read(weights, model, layer, G3ATTN_Q_PROJ, size_t(N * H * D));
  for (g3attn_tensor t : {G3ATTN_K_PROJ, G3ATTN_V_PROJ}) {
    std::vector<float> part = read(weights, model, layer, t, size_t(K * H * D));
    wqkv.insert(wqkv.end(), part.begin(), part.end());
  }
  const Packed Wqkv = pack(wqkv, QKV, D);
  const Packed Wo = pack(read(weights, model, layer, G3ATTN_O_PROJ, size_t(D * N * H)), D, N * H);
  const std::vector<float> q_norm = read(weights, model, layer, G3ATTN_Q_NORM, size_t(H));
  const std::vector<float> k_norm = read(weights, model, layer, G3ATTN_K_NORM, size_t(H));
  const std::vector<float> in_norm = read(weights, model, layer, G3ATTN_INPUT_NORM, size_t(D));
  const std::vector<float> post_norm = read(weights, model, layer, G3ATTN_POST_NORM, size_t(D));

  // This program's cache: one sequence, every token kept (slot = position),
  // [Nkv][slots][head_dim] as the contract reads it, with a position and a
  // validity byte per slot.
  const int64_t S = total;
  std::vector<float> k_cache(size_t(K * S * H)), v_cache(size_t(K * S * H));
  std::vector<int32_t> kpos(size_t(S), 0);
  std::vector<uint8_t> kvalid(size_t(S), 0);

  std::vector<float> x(size_t(total * D)), y(size_t(total * D));
  std::vector<int32_t> pos(static_cast<size_t>(total));
  for (int64_t t = 0; t < total; ++t) {
    pos[size_t(t)] = int32_t(t);
    for (int64_t d = 0; d < D; ++d) x[size_t(t * D + d)] = float(std::sin(0.7 * double(t + 1) + 1.3 * double(d + 1)));
  }

  std::vector<float> u, qkv, q, enc, a;
  std::vector<int64_t> slot;
  // One call: tokens [t0, t0 + T) of the sequence.
  auto step = [&](int64_t t0, int64_t T) {
    u.resize(size_t(T * D));
    qkv.resize(size_t(T * QKV));
    q.resize(size_t(T * N * H));
    enc.resize(size_t(T * N * H));
    a.resize(size_t(T * D));
    slot.resize(size_t(T));
    const float* xt = x.data() + t0 * D;
    const int32_t* pt = pos.data() + t0;
    // Pre-norm, then q, k and v in one GEMM.
    k.rmsnorm(xt, T, D, D, in_norm.data(), L.rms_eps, nullptr, u.data(), D);
    gemm(k, Wqkv, u.data(), T, qkv.data());
    // QK-norm, RoPE, q *= alpha, and K/V into this program's cache.
    for (int64_t t = 0; t < T; ++t) {
      slot[size_t(t)] = t0 + t;
      kpos[size_t(t0 + t)] = pt[t];
      kvalid[size_t(t0 + t)] = 1;
    }
    g3_qk_args qa{};
    qa.T = T;
    qa.num_heads = int32_t(N);
    qa.num_kv_heads = int32_t(K);
    qa.q = qkv.data();
    qa.q_stride = QKV;
    qa.k = qkv.data() + N * H;
    qa.v = qkv.data() + (N + K) * H;
    qa.kv_stride = QKV;
    qa.pos = pt;
    qa.q_norm = q_norm.data();
    qa.k_norm = k_norm.data();
    qa.q_out = q.data();
    qa.q_out_stride = N * H;
    qa.k_cache = k_cache.data();
    qa.v_cache = v_cache.data();
    qa.cache_head_stride = S;
    qa.slot = slot.data();
    qa.head_dim = int32_t(H);
    qa.kv_dtype = G3_DTYPE_F32;
    qa.alpha = L.alpha;
    qa.eps = L.rms_eps;
    qa.rope_base = L.rope_base;
    qa.rope_scale = L.rope_scale;
    k.qk(&qa);
    // The attention core, one KV head and its G query heads at a time, over
    // the slots written so far; causality by position (they increase).
    for (int64_t j = 0; j < K; ++j) {
      g3_core_args ca{};
      ca.T = T;
      ca.q = q.data() + j * G * H;
      ca.q_stride = N * H;
      ca.qpos = pt;
      ca.k = k_cache.data() + j * S * H;
      ca.v = v_cache.data() + j * S * H;
      ca.S = t0 + T;
      ca.kpos = kpos.data();
      ca.kvalid = kvalid.data();
      ca.out = enc.data() + j * G * H;
      ca.out_stride = N * H;
      ca.head_dim = int32_t(H);
      ca.group = int32_t(G);
      ca.window = L.window;
      ca.kv_dtype = G3_DTYPE_F32;
      ca.causal = G3_CAUSAL_POSITIONS;
      ca.compute = G3_COMPUTE_F32;
      k.core(&ca);
    }
    // Output projection, then post-norm plus the residual.
    gemm(k, Wo, enc.data(), T, a.data());
    k.rmsnorm(a.data(), T, D, D, post_norm.data(), L.rms_eps, xt, y.data() + t0 * D, D);
  };
  step(0, prompt);
  for (int64_t t = prompt; t < total; ++t) step(t, 1);

  // The same tokens through the library's own layer and cache.
  g3attn_options* opt;
  check(g3attn_options_create(&opt));
  check(g3attn_options_set_threads(opt, 1));
  g3attn_context* ctx;
  check(g3attn_context_create(opt, &ctx));
  g3attn_options_free(opt);
  g3attn_layer* lib_layer;
  check(g3attn_layer_create(ctx, model, layer, weights, &lib_layer));
  g3attn_cache* cache;
  check(g3attn_cache_create(lib_layer, 1, total, prompt, &cache));
  std::vector<float> y_lib(y.size());
  check(g3attn_block(lib_layer, cache, x.data(), pos.data(), nullptr, 1, prompt, y_lib.data(), nullptr, 1));
  for (int64_t t = prompt; t < total; ++t)
    check(g3attn_decode(lib_layer, cache, x.data() + t * D, pos.data() + t, 1, y_lib.data() + t * D, 1));
  double diff = 0, sum = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double d = std::fabs(double(y[i]) - double(y_lib[i]));
    if (!(d <= diff)) diff = d;
    sum += std::fabs(y[i]);
  }
  std::printf("%lld tokens (prompt %lld, decode %lld): sum |y| = %.6f\n", (long long)total, (long long)prompt,
              (long long)decode, sum);
  std::printf("max |own loops - g3attn_block| = %.3g\n", diff);

  if (out_path) {
    FILE* f = std::fopen(out_path, "wb");
    if (!f || std::fwrite(y.data(), sizeof(float), y.size(), f) != y.size() || std::fclose(f) != 0) {
      std::fprintf(stderr, "kernels_by_key: cannot write %s\n", out_path);
      return 1;
    }
  }
  g3attn_cache_free(cache);
  g3attn_layer_free(lib_layer);
  g3attn_context_free(ctx);
  g3attn_weights_free(weights);
  g3attn_model_free(model);
  return 0;
}
