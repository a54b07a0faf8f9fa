// Fuzz harness for the .npy reader (g3::parse_npy, runtime/npy.h).
// A successful parse must describe exactly the data it returns: the
// element count of the shape equals the length of the filled vector, and
// the other vector stays empty.
#include <cstddef>
#include <cstdint>

#include "runtime/io/npy.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  g3fuzz::expect_ok_or_input_error("npy", [&] {
    g3::NpyArray a = g3::parse_npy(data, size, "fuzz.npy");
    const int64_t n = a.size();
    if (n < 0) g3fuzz::bug("npy", "negative element count");
    for (int64_t d : a.shape)
      if (d < 0) g3fuzz::bug("npy", "negative dimension accepted");
    if (a.type == g3::NpyArray::Type::F32) {
      if (a.f32.size() != static_cast<size_t>(n) || !a.i32.empty())
        g3fuzz::bug("npy", "f32 array holds a different number of elements than its shape says");
      // Touch every element so a short buffer would show up under ASan.
      volatile float sink = 0;
      for (float v : a.f32) sink = sink + v;
    } else {
      if (a.i32.size() != static_cast<size_t>(n) || !a.f32.empty())
        g3fuzz::bug("npy", "i32 array holds a different number of elements than its shape says");
      volatile int64_t sink = 0;
      for (int32_t v : a.i32) sink = sink + v;
    }
    // What we read must survive a round trip through our own writer.
    std::vector<uint8_t> again = a.type == g3::NpyArray::Type::F32 ? g3::npy_bytes_f32(a.f32.data(), a.shape)
                                                                   : g3::npy_bytes_i32(a.i32.data(), a.shape);
    g3::NpyArray b = g3::parse_npy(again.data(), again.size(), "roundtrip.npy");
    if (b.shape != a.shape || b.type != a.type) g3fuzz::bug("npy", "round trip changed the shape or dtype");
  });
  return 0;
}
