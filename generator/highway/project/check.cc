// Smoke test of the generated library: for every key, on the best ISA, one
// query against two keys, compared with the softmax computed by hand.
#include <math.h>
#include <stdio.h>

#include <string>
#include <vector>

#include "attention_registry.h"

int main() {
  int bad = 0;
  for (int i = 0; i < g3_hwy_key_count; ++i) {
    g3_kernel_table t;
    if (!g3_hwy_lookup(g3_hwy_keys[i].key, "best", &t)) {
      printf("%s: not available here\n", g3_hwy_keys[i].key);
      ++bad;
      continue;
    }
    int n = 0;
    const g3_hwy_target_kernels* tg = g3_hwy_keys[i].targets(&n);
    (void)tg;
    // Parse head_dim, group and kv dtype back from the key string.
    int dh = 0, g = 0;
    sscanf(g3_hwy_keys[i].key, "dh%d_g%d", &dh, &g);
    const bool bf16 = std::string(g3_hwy_keys[i].key).find("_kvbf16") != std::string::npos;
    std::vector<float> q(size_t(g) * dh, 0.0f), out(size_t(g) * dh, 0.0f), kf(2 * size_t(dh)), vf(2 * size_t(dh));
    std::vector<uint16_t> kb(2 * size_t(dh)), vb(2 * size_t(dh));
    for (int h = 0; h < dh; ++h) {
      for (int gg = 0; gg < g; ++gg) q[size_t(gg) * dh + h] = (h == 0) ? 1.0f : 0.0f;
      kf[h] = 0.0f;
      kf[size_t(dh) + h] = h == 0 ? 1.0f : 0.0f;  // logits 0 and 1
      vf[h] = 1.0f;
      vf[size_t(dh) + h] = 3.0f;
      kb[h] = 0;
      kb[size_t(dh) + h] = h == 0 ? 0x3f80 : 0;
      vb[h] = 0x3f80;                 // 1.0
      vb[size_t(dh) + h] = 0x4040;    // 3.0
    }
    int32_t qpos = 1, kpos[2] = {0, 1};
    uint8_t valid[2] = {1, 1};
    g3_core_args a = {};
    a.T = 1;
    a.q = q.data();
    a.q_stride = int64_t(g) * dh;
    a.qpos = &qpos;
    a.k = bf16 ? (const void*)kb.data() : (const void*)kf.data();
    a.v = bf16 ? (const void*)vb.data() : (const void*)vf.data();
    a.S = 2;
    a.kpos = kpos;
    a.kvalid = valid;
    a.out = out.data();
    a.out_stride = int64_t(g) * dh;
    a.head_dim = dh;
    a.group = g;
    a.window = 0;
    a.kv_dtype = bf16 ? G3_DTYPE_BF16 : G3_DTYPE_F32;
    t.core(&a);
    const double w1 = exp(1.0) / (1.0 + exp(1.0)), want = (1.0 - w1) * 1.0 + w1 * 3.0;
    const double err = fabs(out[0] - want);
    printf("%-48s %-8s out %.6f want %.6f %s\n", g3_hwy_keys[i].key, g3_hwy_best_isa(), out[0], want,
           err < 1e-4 ? "ok" : "WRONG");
    if (err >= 1e-4) ++bad;
  }
  return bad == 0 ? 0 : 1;
}
