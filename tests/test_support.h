// Helpers shared by the Catch2 suites: where things are, running the g3attn
// command, scratch directories, the golden cases and tolerance checks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

namespace g3test {

std::string golden_dir();   // ../shared/golden, read in place
std::string g3attn_bin();   // the built command
std::string source_dir();
std::vector<std::string> golden_cases();  // sub-directories holding a config.json

// A fresh directory under the build tree, removed when the object dies.
struct TempDir {
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
  std::string file(const std::string& name) const { return path + "/" + name; }
};

struct CmdResult {
  int exit_code = -1;
  std::string out, err;
};
// Runs `g3attn <args>` (args are shell-quoted here), capturing both streams.
// `env` is a prefix such as "G3ATTN_ISA=avx2" (may be empty).
CmdResult run_g3attn(const std::vector<std::string>& args, const std::string& env = "");
CmdResult run_shell(const std::string& command);

void write_text(const std::string& path, const std::string& text);
std::string read_text(const std::string& path);
std::vector<uint8_t> read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes);
bool file_exists(const std::string& path);
// Number of entries in a directory (to check nothing was left behind).
int count_entries(const std::string& dir);

// Elementwise |a - b| <= atol + rtol * |b| over the rows where row_ok is
// true (row = one token, `width` floats). Returns the max abs difference over
// checked rows and the number of violations through `bad`.
double max_abs_diff(const float* a, const float* b, int64_t rows, int64_t width,
                    const std::vector<bool>& row_ok, double atol, double rtol, int64_t* bad);

// The small geometry of the runtime suites: D64, N4, Nkv2, dh16, window W,
// global rope scale 8, one layer per entry of `kinds`.
g3::ModelConfig tiny_model(std::vector<g3::LayerKind> kinds, int window = 4);
// Checkpoint-like random bf16 weights from a seed (random_layer_weights).
g3::WeightSource random_weights(uint64_t seed);
// n samples of N(0, 1) from a seed.
std::vector<float> randn(size_t n, uint64_t seed);

// One golden case through run_apply (the `g3attn apply` code path) on a
// backend and ISA ("" = $G3ATTN_ISA or best), compared on valid rows with
// the golden README's tolerances (10x looser at positions >= 100000).
// Prints one line with the max differences.
struct GoldenCheck {
  std::string backend, isa;  // what actually ran
  double attn_max = 0, block_max = 0;
  int64_t bad_attn = 0, bad_block = 0;
};
GoldenCheck check_golden_case(const std::string& name, const std::string& backend, const std::string& isa);

}  // namespace g3test
