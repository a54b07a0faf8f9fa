// Fuzz harness for the safetensors reader (g3::SafeTensorsFile::from_bytes,
// runtime/safetensors.h). On success every tensor's bytes must lie inside
// the data section and match shape x dtype size; converting each one to f32
// reads all of its bytes, so ASan sees any view that points outside.
#include <cstddef>
#include <cstdint>

#include "runtime/io/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  g3fuzz::expect_ok_or_input_error("safetensors", [&] {
    auto f = g3::SafeTensorsFile::from_bytes(data, size, "fuzz.safetensors");
    uint64_t total = 0;
    for (const auto& [name, t] : f->tensors()) {
      if (t.name != name) g3fuzz::bug("safetensors", "tensor view name differs from its key");
      const size_t esize = t.dtype == g3::TensorDType::F32 ? 4 : 2;
      if (static_cast<uint64_t>(t.numel()) * esize != t.nbytes)
        g3fuzz::bug("safetensors", "tensor " + name + ": shape x dtype size != byte span");
      if (t.nbytes && !t.data) g3fuzz::bug("safetensors", "tensor " + name + ": no data pointer");
      total += t.nbytes;
      std::vector<float> v = t.to_f32();
      if (v.size() != static_cast<size_t>(t.numel())) g3fuzz::bug("safetensors", "to_f32 size mismatch");
      (void)&f->get(name);
    }
    // The tensors tile the data section exactly, so their sizes cannot add
    // up to more than the input.
    if (total > size) g3fuzz::bug("safetensors", "tensors claim more bytes than the file has");
    (void)f->has("model.layers.0.self_attn.q_proj.weight");
    // A missing tensor is an InputError, which the wrapper accepts.
    (void)f->get("model.layers.0.self_attn.q_proj.weight");
  });
  return 0;
}
