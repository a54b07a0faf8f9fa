// KV caches of the runtime (DESIGN.md "Rooms": global layers full length,
// local layers a ring), in the layout of templates/kernel_contract.h: per
// sequence and per KV head the slots are contiguous, [Nkv][slots][dh], f32 or
// bf16, with a stored RoPE position and a validity byte per slot.
//
// Why a ring is exact. The attention core's structured mask makes a slot
// visible to a query iff it is valid, kpos <= qpos and (local) qpos - kpos < W
// (SPEC.md 1.4: the window is measured in positions, not slots). Only real
// tokens are written, and a row's real tokens must have strictly increasing
// positions (checked), so the keys a query at position p can see on a local
// layer are among the W - 1 real tokens written before it plus itself. A call
// that writes C real tokens needs, for its first query, the W - 1 tokens
// before the call, and for its last query the C tokens of the call: W - 1 + C
// tokens in all. A ring of W + C - 1 slots written in arrival order therefore
// never overwrites a key that a query of the same call can still see (the
// slot reused by the call's token n held token n - (W + C - 1), which is at
// least W positions before the call's first query). Decode (C = 1) needs
// exactly W slots. Slot order inside the ring does not matter: the core
// reads each slot's position, so wrap-around costs nothing.
//
// Global layers keep every real token of a row in a buffer of `context`
// slots, written in order, so slot order equals position order there and a
// query tile can stop scanning at the last slot whose position it may see.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "generator/catalogue.h"
#include "generator/kernel_key.h"

namespace g3 {

// Slots a local layer keeps: W + chunk - 1 (see above), never more than the
// context. chunk = the most real tokens one call writes per row (1 = decode).
int64_t ring_slots(int64_t window, int64_t chunk, int64_t context);

// K and V bytes of a whole model's caches (positions and validity bytes,
// 5 bytes per slot, are not counted). `ring`: what this runtime allocates,
// global layers full length and local layers ring_slots(W, chunk, context);
// `full_length`: the official layout, every layer `context` slots.
struct KvBytes {
  uint64_t ring = 0, full_length = 0;
};
KvBytes kv_bytes(const ModelConfig& m, int64_t context, int64_t batch, DType dtype, int64_t chunk);

class LayerKvCache {
 public:
  // `chunk` as in ring_slots; ignored on global layers.
  LayerKvCache(const LayerSpec& spec, DType dtype, int64_t batch, int64_t context, int64_t chunk);
  // The same cache over K and V memory its caller owns (the C API's
  // caller-provided caches): each buffer holds batch x sequence_bytes() in
  // the layout above and must outlive the cache. The memory is not cleared:
  // slots count as empty until written, so whatever they hold never reaches
  // an output.
  LayerKvCache(const LayerSpec& spec, DType dtype, int64_t batch, int64_t context, int64_t chunk, void* k, void* v);
  // Bytes of one sequence's K (or V) cache: Nkv x capacity() x head_dim elements.
  size_t sequence_bytes() const { return seq_bytes_; }

  int64_t batch() const { return batch_; }
  int64_t capacity() const { return slots_; }  // slots per KV head of one sequence
  int64_t context() const { return context_; }
  bool is_ring() const { return ring_; }
  DType dtype() const { return dtype_; }
  size_t element_size() const { return dtype_ == DType::F32 ? 4 : 2; }
  // K/V bytes allocated (both caches, all sequences).
  uint64_t bytes() const;

  // Sequence b's caches: KV head j starts at element j * capacity() * head_dim.
  void* k(int64_t b) { return k_.get() + size_t(b) * seq_bytes_; }
  void* v(int64_t b) { return v_.get() + size_t(b) * seq_bytes_; }
  const void* k(int64_t b) const { return k_.get() + size_t(b) * seq_bytes_; }
  const void* v(int64_t b) const { return v_.get() + size_t(b) * seq_bytes_; }
  const int32_t* kpos(int64_t b) const { return pos_.data() + b * slots_; }
  const uint8_t* kvalid(int64_t b) const { return valid_.data() + b * slots_; }
  // Real tokens written to row b since the last reset.
  int64_t written(int64_t b) const { return written_[size_t(b)]; }
  // Slots 0..used(b)-1 may hold tokens; the rest were never written.
  int64_t used(int64_t b) const { return written_[size_t(b)] < slots_ ? written_[size_t(b)] : slots_; }
  // Position of row b's last real token, -1 when the row is empty.
  int64_t last_position(int64_t b) const { return last_pos_[size_t(b)]; }

  // Appending is split in two so that a call over many rows (and, in the
  // model, many chunks and layers) is all or nothing: the caller checks every
  // row first and appends only when all passed, so a refused call changes
  // nothing.
  //
  // check_append throws InputError unless row b may take these T tokens
  // (real == null or real[t] != 0 marks a real token; padding is never
  // written), given that they arrive in block calls of at most `chunk`
  // tokens: every real token's position is non-negative and above the
  // previous real one (the row's last cached position first), the row stays
  // within the context, and no block call brings a ring more real tokens
  // than the chunk it was sized for. It changes nothing.
  void check_append(int64_t b, const int32_t* pos, const uint8_t* real, int64_t T, int64_t chunk) const;
  // Assigns slots to one block call's T tokens of row b, which check_append
  // must have accepted (alone, or as part of a longer call): real tokens get
  // the next slots in arrival order (ring: modulo the capacity) and their
  // positions and validity are stored; padding tokens get slot -1 (not
  // written, so they are never keys).
  void append(int64_t b, const int32_t* pos, const uint8_t* real, int64_t T, int64_t* slot) noexcept;

  void reset();  // every row empty

 private:
  // Sizes and bookkeeping shared by both constructors (not the K/V memory).
  void init(const LayerSpec& spec, DType dtype, int64_t batch, int64_t context, int64_t chunk);
  int head_dim_ = 0, kv_heads_ = 0;
  DType dtype_ = DType::F32;
  int64_t batch_ = 0, context_ = 0, slots_ = 0, chunk_ = 1;
  bool ring_ = false;
  size_t seq_bytes_ = 0;
  std::shared_ptr<uint8_t> k_, v_;
  std::vector<int32_t> pos_;
  std::vector<uint8_t> valid_;
  std::vector<int64_t> written_;
  std::vector<int64_t> last_pos_;
};

}  // namespace g3
