// The safetensors format: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the
// raw little-endian data. Read through mmap; validated strictly so a crafted
// file can never make us read outside the mapping.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace g3 {

enum class TensorDType { F32, BF16, F16 };
const char* to_string(TensorDType d);

struct TensorView {
  std::string name;
  TensorDType dtype = TensorDType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the file mapping
  size_t nbytes = 0;
  int64_t numel() const;
  // Converts to f32 (bf16 and f16 exactly).
  std::vector<float> to_f32() const;
};

class SafeTensorsFile {
 public:
  // Maps and validates the file: header length within the file, header is a
  // JSON object, every dtype known, every shape non-negative, offsets in
  // range, contiguous from 0, non-overlapping, covering the data section
  // exactly, and shape x dtype size == byte span. Throws InputError naming
  // the file and the problem.
  static std::shared_ptr<SafeTensorsFile> open(const std::string& path);
  // Same checks over bytes in memory (fuzzing, tests). The bytes are copied.
  static std::shared_ptr<SafeTensorsFile> from_bytes(const uint8_t* data, size_t size,
                                                     const std::string& name);
  ~SafeTensorsFile();
  SafeTensorsFile(const SafeTensorsFile&) = delete;
  SafeTensorsFile& operator=(const SafeTensorsFile&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const;
  // Throws InputError "<file>: missing tensor <name>" when absent.
  const TensorView& get(const std::string& name) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafeTensorsFile() = default;
  void parse(const std::string& name);
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::vector<uint8_t> owned_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// HF layer-name prefixes, tried in this order (SPEC 3.4).
const std::vector<std::string>& hf_layer_prefixes();

}  // namespace g3
