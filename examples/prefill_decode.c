/* prefill_decode.c: one layer of a Gemma 3 checkpoint through the g3attn C
 * API. It loads a config.json and a safetensors checkpoint, makes the layer
 * and a KV cache the library owns (a ring on local layers, full length on
 * global ones), prefills a prompt in chunks and then decodes a few tokens,
 * one call per token, as an engine's layer loop would.
 *
 *   prefill_decode CONFIG WEIGHTS [LAYER [PROMPT [DECODE [CHUNK [OUT]]]]]
 *
 * WEIGHTS is a .safetensors file, a model.safetensors.index.json, or a
 * directory holding either. LAYER defaults to the config's layer_index (the
 * golden cases carry one), else 0; PROMPT 10, DECODE 3, CHUNK 4. OUT, when
 * given, receives the block output of every token as raw float32
 * [PROMPT + DECODE][hidden_size]. The environment variable G3ATTN_ISA caps
 * the ISA, as for the g3attn command.
 *
 * The inputs stand in for an engine's hidden states: x[t][d] =
 * sin(0.7 (t + 1) + 1.3 (d + 1)), at positions 0, 1, 2, ...
 *
 * Build against an installed g3attn:
 *   cc -std=c99 prefill_decode.c $(pkg-config --cflags --libs g3attn) -lm
 * or with CMake: find_package(g3attn CONFIG REQUIRED), then link g3attn::g3attn. */
#include <g3attn/g3attn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Every g3attn call returns a status; on failure the message says why. */
#define CHECK(call)                                                                              \
  do {                                                                                           \
    g3attn_status status_ = (call);                                                              \
    if (status_ != G3ATTN_OK) {                                                                  \
      fprintf(stderr, "prefill_decode: %s (%s)\n", g3attn_last_error(), g3attn_status_name(status_)); \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: prefill_decode CONFIG WEIGHTS [LAYER [PROMPT [DECODE [CHUNK [OUT]]]]]\n");
    return 2;
  }
  g3attn_model* model;
  CHECK(g3attn_model_load(argv[1], &model));
  g3attn_model_info info;
  CHECK(g3attn_model_get_info(model, &info));
  const int layer_index = argc > 3 ? atoi(argv[3]) : (info.layer_index >= 0 ? info.layer_index : 0);
  const int64_t prompt = argc > 4 ? atoll(argv[4]) : 10;
  const int64_t decode = argc > 5 ? atoll(argv[5]) : 3;
  const int64_t chunk = argc > 6 ? atoll(argv[6]) : 4;
  const char* out_path = argc > 7 ? argv[7] : NULL;
  if (prompt < 1 || decode < 0 || chunk < 1) {
    fprintf(stderr, "prefill_decode: PROMPT and CHUNK must be at least 1, DECODE at least 0\n");
    return 2;
  }

  /* The defaults: backend auto, ISA best (or $G3ATTN_ISA), f32 KV, every core. */
  g3attn_context* ctx;
  CHECK(g3attn_context_create(NULL, &ctx));
  g3attn_weights* weights;
  CHECK(g3attn_weights_open(argv[2], model, &weights));
  g3attn_layer* layer;
  CHECK(g3attn_layer_create(ctx, model, layer_index, weights, &layer));
  /* The layer keeps its own packed copy: the checkpoint may go now. */
  g3attn_weights_free(weights);

  g3attn_layer_route route;
  CHECK(g3attn_layer_describe(layer, &route));
  const int64_t total = prompt + decode, D = route.hidden_size;
  g3attn_cache* cache;
  CHECK(g3attn_cache_create(layer, 1, total, chunk, &cache));
  uint64_t cache_bytes;
  CHECK(g3attn_cache_bytes(cache, &cache_bytes));
  printf("g3attn %s (ABI %d): model %s, layer %d (%s", g3attn_version(), g3attn_abi_version(), info.name,
         route.index, route.kind == G3ATTN_LOCAL ? "local" : "global");
  if (route.kind == G3ATTN_LOCAL) printf(", window %d", route.window);
  printf(")\nkernel %s: backend %s, isa %s\n", route.key, route.backend, route.isa);

  float* x = malloc(sizeof(float) * (size_t)(total * D));
  float* y = malloc(sizeof(float) * (size_t)(total * D));
  int32_t* pos = malloc(sizeof(int32_t) * (size_t)total);
  if (!x || !y || !pos) {
    fprintf(stderr, "prefill_decode: out of memory\n");
    return 1;
  }
  for (int64_t t = 0; t < total; ++t) {
    pos[t] = (int32_t)t;
    for (int64_t d = 0; d < D; ++d) x[t * D + d] = (float)sin(0.7 * (double)(t + 1) + 1.3 * (double)(d + 1));
  }

  /* Prefill: the prompt in chunks of at most `chunk` tokens (one row). */
  for (int64_t t0 = 0; t0 < prompt; t0 += chunk) {
    const int64_t n = prompt - t0 < chunk ? prompt - t0 : chunk;
    CHECK(g3attn_block(layer, cache, x + t0 * D, pos + t0, NULL, 1, n, y + t0 * D, NULL, 0));
  }
  g3attn_cache_view view;
  CHECK(g3attn_cache_row(cache, 0, &view));
  printf("prefill: %lld tokens in chunks of %lld; the cache holds %lld of them in %lld slots (%s, %llu bytes)\n",
         (long long)prompt, (long long)chunk, (long long)(view.written < view.slots ? view.written : view.slots),
         (long long)view.slots, view.ring ? "ring" : "full length", (unsigned long long)cache_bytes);
  /* Decode: one token per call. */
  for (int64_t t = prompt; t < total; ++t) {
    CHECK(g3attn_decode(layer, cache, x + t * D, pos + t, 1, y + t * D, 0));
    printf("decode: position %lld  y[0..3] = %.6f %.6f %.6f %.6f\n", (long long)t, y[t * D], y[t * D + 1],
           y[t * D + 2], y[t * D + 3]);
  }
  double sum = 0;
  for (int64_t i = 0; i < total * D; ++i) sum += fabs(y[i]);
  printf("sum |y| over %lld tokens: %.6f\n", (long long)total, sum);

  if (out_path) {
    FILE* f = fopen(out_path, "wb");
    if (!f || fwrite(y, sizeof(float), (size_t)(total * D), f) != (size_t)(total * D) || fclose(f) != 0) {
      fprintf(stderr, "prefill_decode: cannot write %s\n", out_path);
      return 1;
    }
  }
  free(x);
  free(y);
  free(pos);
  g3attn_cache_free(cache);
  g3attn_layer_free(layer);
  g3attn_context_free(ctx);
  g3attn_model_free(model);
  return 0;
}
