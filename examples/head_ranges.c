/* head_ranges.c: one layer split into two head ranges, as a tensor-parallel
 * engine splits it across ranks. Range 0 runs KV heads [0, Nkv/2) with
 * their query heads, range 1 the rest; each has only its rows of
 * q/k/v_proj, its columns of o_proj and its own KV cache, and returns its
 * share of the attention output (g3attn_attention). The shares are summed
 * (an all-reduce, between ranks) and the post-norm and residual applied once
 * (g3attn_finish). The program runs the whole layer beside them and prints
 * the largest difference.
 *
 *   head_ranges MODEL|CONFIG [WEIGHTS|random [LAYER [PROMPT [OUT]]]]
 *
 * MODEL is a built-in size (270m 1b 4b 12b 27b), CONFIG a config.json
 * path; WEIGHTS a checkpoint (file, index or directory) or "random" (the
 * default: seed 1, bf16). LAYER defaults to the config's layer_index, else
 * 0; PROMPT to 12 tokens, prefilled in one call, followed by 2 decode steps.
 * OUT, when given, receives the split layer's block output of every token as
 * raw float32 [PROMPT + 2][hidden_size]. Inputs as in prefill_decode.c.
 *
 * Build against an installed g3attn:
 *   cc -std=c99 head_ranges.c $(pkg-config --cflags --libs g3attn) -lm */
#include <g3attn/g3attn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                              \
  do {                                                                                           \
    g3attn_status status_ = (call);                                                              \
    if (status_ != G3ATTN_OK) {                                                                  \
      fprintf(stderr, "head_ranges: %s (%s)\n", g3attn_last_error(), g3attn_status_name(status_)); \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

static double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= m)) m = d; /* NaN counts as a difference */
  }
  return m;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: head_ranges MODEL|CONFIG [WEIGHTS|random [LAYER [PROMPT [OUT]]]]\n");
    return 2;
  }
  const char* source = argv[1];
  const size_t len = strlen(source);
  g3attn_model* model;
  if (len > 5 && strcmp(source + len - 5, ".json") == 0) CHECK(g3attn_model_load(source, &model));
  else CHECK(g3attn_model_builtin(source, &model));
  g3attn_model_info info;
  CHECK(g3attn_model_get_info(model, &info));
  g3attn_weights* weights;
  if (argc > 2 && strcmp(argv[2], "random") != 0) CHECK(g3attn_weights_open(argv[2], model, &weights));
  else CHECK(g3attn_weights_random(1, G3ATTN_BF16, &weights));
  const int layer_index = argc > 3 ? atoi(argv[3]) : (info.layer_index >= 0 ? info.layer_index : 0);
  const int64_t prompt = argc > 4 ? atoll(argv[4]) : 12, steps = 2, total = prompt + steps;
  const char* out_path = argc > 5 ? argv[5] : NULL;
  if (prompt < 1) {
    fprintf(stderr, "head_ranges: PROMPT must be at least 1\n");
    return 2;
  }
  if (info.num_kv_heads < 2) {
    fprintf(stderr, "head_ranges: model %s has one KV head; a split needs two or more\n", info.name);
    return 2;
  }

  g3attn_context* ctx;
  CHECK(g3attn_context_create(NULL, &ctx));
  const int K = info.num_kv_heads, half = K / 2;
  g3attn_layer *whole, *part[2];
  CHECK(g3attn_layer_create(ctx, model, layer_index, weights, &whole));
  CHECK(g3attn_layer_create_heads(ctx, model, layer_index, weights, 0, half, &part[0]));
  CHECK(g3attn_layer_create_heads(ctx, model, layer_index, weights, half, K, &part[1]));
  g3attn_weights_free(weights);

  /* One cache per layer object: each range keeps only its KV heads. */
  g3attn_cache *whole_cache, *part_cache[2];
  CHECK(g3attn_cache_create(whole, 1, total, prompt, &whole_cache));
  CHECK(g3attn_cache_create(part[0], 1, total, prompt, &part_cache[0]));
  CHECK(g3attn_cache_create(part[1], 1, total, prompt, &part_cache[1]));

  g3attn_layer_route r;
  CHECK(g3attn_layer_describe(whole, &r));
  const int64_t D = r.hidden_size;
  printf("model %s, layer %d (%s): %d query heads, %d KV heads; kernel %s on %s\n", info.name, r.index,
         r.kind == G3ATTN_LOCAL ? "local" : "global", r.num_heads, r.num_kv_heads, r.key, r.backend);
  uint64_t bytes;
  CHECK(g3attn_cache_bytes(whole_cache, &bytes));
  printf("whole layer: KV cache %llu bytes\n", (unsigned long long)bytes);
  for (int i = 0; i < 2; ++i) {
    CHECK(g3attn_layer_describe(part[i], &r));
    CHECK(g3attn_cache_bytes(part_cache[i], &bytes));
    printf("range %d: KV heads [%d, %d), %d query heads, KV cache %llu bytes\n", i, r.kv_begin, r.kv_end,
           r.num_heads, (unsigned long long)bytes);
  }

  const size_t n = (size_t)(total * D);
  float* x = malloc(sizeof(float) * n);
  float* y_whole = malloc(sizeof(float) * n);
  float* a_whole = malloc(sizeof(float) * n);
  float* y_split = malloc(sizeof(float) * n);
  float* a_sum = malloc(sizeof(float) * n);
  float* a_part = malloc(sizeof(float) * n);
  int32_t* pos = malloc(sizeof(int32_t) * (size_t)total);
  if (!x || !y_whole || !a_whole || !y_split || !a_sum || !a_part || !pos) {
    fprintf(stderr, "head_ranges: out of memory\n");
    return 1;
  }
  for (int64_t t = 0; t < total; ++t) {
    pos[t] = (int32_t)t;
    for (int64_t d = 0; d < D; ++d) x[t * D + d] = (float)sin(0.7 * (double)(t + 1) + 1.3 * (double)(d + 1));
  }

  /* The prompt in one call, then one call per decode step; each call runs
   * the whole layer, then both ranges, sums their shares and finishes. */
  for (int64_t t0 = 0; t0 < total; t0 += (t0 == 0 ? prompt : 1)) {
    const int64_t T = t0 == 0 ? prompt : 1;
    const size_t at = (size_t)(t0 * D), m = (size_t)(T * D);
    CHECK(g3attn_block(whole, whole_cache, x + at, pos + t0, NULL, 1, T, y_whole + at, a_whole + at, 0));
    for (size_t i = 0; i < m; ++i) a_sum[at + i] = 0;
    for (int p = 0; p < 2; ++p) {
      CHECK(g3attn_attention(part[p], part_cache[p], x + at, pos + t0, NULL, 1, T, a_part, 0));
      for (size_t i = 0; i < m; ++i) a_sum[at + i] += a_part[i];
    }
    CHECK(g3attn_finish(part[0], x + at, a_sum + at, T, y_split + at, 0));
  }
  printf("attention output: max |whole - (range 0 + range 1)| = %.3g\n", max_abs_diff(a_whole, a_sum, (int64_t)n));
  printf("block output:     max |whole - split| = %.3g over %lld tokens\n", max_abs_diff(y_whole, y_split, (int64_t)n),
         (long long)total);

  if (out_path) {
    FILE* f = fopen(out_path, "wb");
    if (!f || fwrite(y_split, sizeof(float), n, f) != n || fclose(f) != 0) {
      fprintf(stderr, "head_ranges: cannot write %s\n", out_path);
      return 1;
    }
  }
  free(x);
  free(y_whole);
  free(a_whole);
  free(y_split);
  free(a_sum);
  free(a_part);
  free(pos);
  for (int i = 0; i < 2; ++i) {
    g3attn_cache_free(part_cache[i]);
    g3attn_layer_free(part[i]);
  }
  g3attn_cache_free(whole_cache);
  g3attn_layer_free(whole);
  g3attn_context_free(ctx);
  g3attn_model_free(model);
  return 0;
}
