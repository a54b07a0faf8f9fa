#include "runtime/exec/decode_traffic.h"

#include <algorithm>

namespace g3 {

static double element_bytes(DType t) { return t == DType::BF16 ? 2.0 : 4.0; }

DecodeTraffic decode_traffic(const ModelConfig& m, DType weight_dtype, DType kv_dtype, int64_t batch, int64_t context) {
  DecodeTraffic t;
  for (int i = 0; i < m.num_layers; ++i) {
    const LayerSpec s = layer_spec(m, i);
    const double D = s.hidden_size, H = s.head_dim, N = s.num_heads, Nkv = s.num_kv_heads;
    // SPEC 1.3 steps A and J: q/k/v rows (N + 2 Nkv) H by D, o_proj D by N H.
    t.weight_bytes += ((N + 2 * Nkv) * H * D + D * N * H) * element_bytes(weight_dtype);
    // A local layer's query sees at most the window's positions (SPEC 1.4).
    const int64_t seen = s.window > 0 ? std::min<int64_t>(context, s.window) : context;
    t.kv_bytes += double(batch) * 2.0 * Nkv * double(seen) * H * element_bytes(kv_dtype);
  }
  return t;
}

}  // namespace g3
