// The Highway emitter: kernel keys in, C++ sources out (DESIGN.md "Rooms":
// pure, key in, code out). Used by the g3attn-gen tool that CMake runs at
// build time and by `g3attn generate`, so both write the same text.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "generator/catalogue.h"
#include "generator/kernel_key.h"

namespace g3::hwygen {

struct SourceFile {
  std::string name;  // file name, no directory
  std::string text;
};

// The attention key string: KernelKey::str() without the weight dtype, which
// the attention stages do not depend on (so bf16- and f32-weight layers share
// one kernel). This is the string the registry maps to kernels.
std::string attention_key(const KernelKey& k);
// A C identifier fragment for it (key_ident of the attention key).
std::string attention_ident(const KernelKey& k);

// Distinct attention keys of the models for the given KV dtypes, in
// first-use order (model order, then layer order, then dtype).
std::vector<KernelKey> attention_keys(const std::vector<ModelConfig>& models, const std::vector<DType>& kv);

// One source per key: defines the key's constants and includes
// attention_key-inl.h through Highway's foreach_target. With `slots` > 0,
// files are named hwy_attention_key_NN.cc for NN < slots and unused slots
// get an empty source (CMake must know output names before the keys are
// known); otherwise one file per key named after it. Throws InputError when
// there are more keys than slots.
std::vector<SourceFile> key_sources(const std::vector<KernelKey>& keys, int slots);
// The registry source: g3_hwy_keys, g3_hwy_lookup, g3_hwy_best_isa.
SourceFile registry_source(const std::vector<KernelKey>& keys);

// For a standalone tree (`g3attn generate`), from the files of
// generator/highway/project/ (embedded at build time) with the keys filled
// in: a CMakeLists.txt building the sources into a static library with
// nothing but Highway, and a README listing the keys.
SourceFile standalone_cmakelists(const std::vector<KernelKey>& keys);
SourceFile standalone_readme(const std::vector<KernelKey>& keys, const std::vector<std::string>& models);
// A small program that checks the library: every key on the best ISA, one
// tiny core call against a two-key softmax computed by hand.
SourceFile standalone_check();

// Their text, embedded at build time (file name, content). Defined in
// g3_highway only (embedded_templates.cc in the build tree).
const std::vector<std::pair<std::string, std::string>>& embedded_templates();

}  // namespace g3::hwygen
