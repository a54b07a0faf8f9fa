#include "runtime/exec/kv_cache.h"

#include <algorithm>

#include "generator/errors.h"
#include "runtime/dispatch/big_buffer.h"

namespace g3 {

int64_t ring_slots(int64_t window, int64_t chunk, int64_t context) {
  if (chunk < 1) chunk = 1;
  return std::min(context, window + chunk - 1);
}

KvBytes kv_bytes(const ModelConfig& m, int64_t context, int64_t batch, DType dtype, int64_t chunk) {
  KvBytes r;
  const uint64_t per_slot = uint64_t(2) * uint64_t(m.num_kv_heads) * uint64_t(m.head_dim) *
                            (dtype == DType::F32 ? 4u : 2u) * uint64_t(batch);
  for (const LayerSpec& l : layer_specs(m)) {
    const int64_t slots = l.window > 0 ? ring_slots(l.window, chunk, context) : context;
    r.ring += per_slot * uint64_t(slots);
    r.full_length += per_slot * uint64_t(context);
  }
  return r;
}

LayerKvCache::LayerKvCache(const LayerSpec& spec, DType dtype, int64_t batch, int64_t context, int64_t chunk) {
  init(spec, dtype, batch, context, chunk);
  // K and V in one buffer (V from the first line after K), so a small
  // cache still goes on huge pages (big_buffer.h): 1B's local layers' rings
  // (1023 slots: just under 1 MiB each of K and V in f32, 512 KiB in bf16)
  // were on 4 KiB pages, and their decode rows took 0.75-0.88x the time
  // once they were not (AMD EPYC Zen 4 VM, two threads, `g3attn bench
  // --phase decode --model 1b`, old and new binaries alternating).
  const size_t k_bytes = seq_bytes_ * size_t(batch), v_at = (k_bytes + 63) / 64 * 64;
  const std::shared_ptr<uint8_t> both = alloc_big_zeroed(v_at + k_bytes);
  k_ = both;
  v_ = std::shared_ptr<uint8_t>(both, both.get() + v_at);
}

LayerKvCache::LayerKvCache(const LayerSpec& spec, DType dtype, int64_t batch, int64_t context, int64_t chunk, void* k,
                           void* v) {
  init(spec, dtype, batch, context, chunk);
  if (!k || !v) throw InputError("KV cache: null K or V buffer");
  // Not owned: the deleters do nothing.
  k_ = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(k), [](uint8_t*) {});
  v_ = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(v), [](uint8_t*) {});
}

void LayerKvCache::init(const LayerSpec& spec, DType dtype, int64_t batch, int64_t context, int64_t chunk) {
  if (batch < 1 || context < 1) throw InputError("KV cache: batch and context must be at least 1");
  head_dim_ = spec.head_dim;
  kv_heads_ = spec.num_kv_heads;
  dtype_ = dtype;
  batch_ = batch;
  context_ = context;
  chunk_ = std::max<int64_t>(1, chunk);
  slots_ = spec.window > 0 ? ring_slots(spec.window, chunk_, context) : context;
  ring_ = slots_ < context;
  seq_bytes_ = size_t(kv_heads_) * size_t(slots_) * size_t(head_dim_) * element_size();
  pos_.assign(size_t(batch * slots_), 0);
  valid_.assign(size_t(batch * slots_), 0);
  written_.assign(size_t(batch), 0);
  last_pos_.assign(size_t(batch), -1);
}

uint64_t LayerKvCache::bytes() const { return uint64_t(2) * seq_bytes_ * uint64_t(batch_); }

void LayerKvCache::reset() {
  std::fill(valid_.begin(), valid_.end(), 0);
  std::fill(pos_.begin(), pos_.end(), 0);
  std::fill(written_.begin(), written_.end(), 0);
  std::fill(last_pos_.begin(), last_pos_.end(), -1);
}

void LayerKvCache::check_append(int64_t b, const int32_t* pos, const uint8_t* real, int64_t T, int64_t chunk) const {
  // Messages name the row and the token index in the caller's call, which
  // for the model is the whole prompt, not one chunk of it.
  auto where = [&](int64_t t) { return "row " + std::to_string(b) + ", token " + std::to_string(t) + ": "; };
  if (chunk < 1) chunk = 1;
  int64_t last = last_pos_[size_t(b)], n_real = 0;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t t1 = std::min(T, t0 + chunk);
    int64_t n_call = 0;
    for (int64_t t = t0; t < t1; ++t) {
      if (real && !real[t]) continue;
      if (pos[t] < 0) throw InputError(where(t) + "negative position " + std::to_string(pos[t]) + " for a real token");
      if (pos[t] <= last)
        throw InputError(where(t) + "position " + std::to_string(pos[t]) +
                         " does not follow the row's previous real position " + std::to_string(last) +
                         " (positions of real tokens must increase)");
      last = pos[t];
      ++n_call;
    }
    // A ring of W + chunk_ - 1 slots is exact only while one block call
    // writes at most chunk_ real tokens to a row (see the header).
    if (ring_ && n_call > chunk_)
      throw InputError(where(t0) + "a block call writes " + std::to_string(n_call) +
                       " tokens to the row but the local-layer ring was sized for chunks of " +
                       std::to_string(chunk_));
    n_real += n_call;
  }
  const int64_t w = written_[size_t(b)];
  if (w + n_real > context_)
    throw InputError("row " + std::to_string(b) + ": " + std::to_string(w) + " cached and " + std::to_string(n_real) +
                     " new tokens exceed the context of " + std::to_string(context_));
}

void LayerKvCache::append(int64_t b, const int32_t* pos, const uint8_t* real, int64_t T, int64_t* slot) noexcept {
  int64_t& w = written_[size_t(b)];
  int32_t* kp = pos_.data() + b * slots_;
  uint8_t* kv = valid_.data() + b * slots_;
  for (int64_t t = 0; t < T; ++t) {
    if (real && !real[t]) {
      slot[t] = -1;
      continue;
    }
    const int64_t s = ring_ ? w % slots_ : w;
    slot[t] = s;
    kp[s] = pos[t];
    kv[s] = 1;
    last_pos_[size_t(b)] = pos[t];
    ++w;
  }
}

}  // namespace g3
