#include "runtime/exec/run.h"

#include <algorithm>
#include <memory>

#include <unistd.h>

#include "generator/errors.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/kernel_registry.h"

namespace g3 {

void check_run_request(const RunRequest& r) {
  if (r.prompt < 1) throw InputError("--prompt must be at least 1");
  if (r.decode < 0) throw InputError("--decode must not be negative");
  if (r.chunk < 1) throw InputError("--chunk must be at least 1");
  if (r.batch < 1) throw InputError("--batch must be at least 1");
  parse_backend(r.backend);
  isa_from_flag(r.isa);
  const ModelConfig& cfg = r.config;
  const int64_t L = r.prompt + r.decode;
  if (L > cfg.max_position_embeddings)
    throw InputError("--prompt + --decode = " + std::to_string(L) + " exceeds the model's max_position_embeddings " +
                     std::to_string(cfg.max_position_embeddings));
  // Refuse up front what cannot fit: the KV caches (plus the reference's
  // full-length f32 caches with --verify) and the weights, against RAM.
  const double ram = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  const KvBytes kv = kv_bytes(cfg, L, r.batch, r.kv_dtype, std::min(r.chunk, r.prompt));
  const double per_layer = double(cfg.hidden_size) * (cfg.num_heads + 2.0 * cfg.num_kv_heads) * cfg.head_dim +
                           double(cfg.num_heads) * cfg.head_dim * cfg.hidden_size;
  double need = double(kv.ring) + per_layer * cfg.num_layers * (r.weight_dtype == DType::F32 ? 4 : 2);
  if (r.verify) need += double(kv_bytes(cfg, L, r.batch, DType::F32, 0).full_length);
  if (ram > 0 && need > ram)
    throw InputError("this run needs about " + std::to_string(int64_t(need / double(1 << 30))) +
                     " GiB for KV caches and weights, more than this machine's " +
                     std::to_string(int64_t(ram / double(1 << 30))) + " GiB of RAM (lower --prompt, --batch)");
}

}  // namespace g3
