// Hugging Face checkpoints for the model stack: a config.json plus either one
// model.safetensors or shards listed by model.safetensors.index.json
// ("weight_map": tensor name -> shard file). Only the attention-block tensors
// are ever read (load_layer_weights); everything else in the files is
// ignored, and bf16 tensors stay bf16.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "generator/catalogue.h"
#include "runtime/io/layer_weights.h"
#include "runtime/io/safetensors.h"

namespace g3 {

struct Checkpoint {
  ModelConfig config;
  std::string describe;                                  // the file or directory, for messages
  std::vector<std::shared_ptr<SafeTensorsFile>> files;   // every shard, opened and validated
  TensorSource source;                                   // keeps `files` alive through its closure
  // One layer's attention weights, shapes checked against the config.
  LayerWeights layer(const LayerSpec& spec) const { return load_layer_weights(source, spec); }
};

// `weights` is a .safetensors file, a model.safetensors.index.json file, or a
// directory holding model.safetensors.index.json (preferred) or
// model.safetensors. `config` is the model to load; null means the
// config.json beside the weights (in the directory, or the file's directory).
// The index is validated before anything is read: it must be a JSON object
// with a "weight_map" object of string values, and every shard it names must
// be a relative path inside the directory (no "..", not absolute, not a
// symlink leading outside) that exists as a regular file. Every problem is an
// InputError naming the file.
Checkpoint open_checkpoint(const std::string& weights, const ModelConfig* config);

}  // namespace g3
