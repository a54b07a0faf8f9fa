// Helpers shared by the Catch2 suites: where things are, running the g3attn
// command, scratch directories, the golden cases and tolerance checks.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/exec/apply.h"
#include "runtime/exec/model.h"

namespace g3test {

std::string g3attn_bin();   // the built command
std::string source_dir();

// The golden cases, decided at run time (tests/golden/README.md):
// $G3ATTN_GOLDEN_DIR when set, else ../shared/golden beside the project when
// it exists (both the full set), else the in-repository subset tests/golden
// (the three tiny cases). The first call prints one line saying which set
// and from where; a G3ATTN_GOLDEN_DIR that is not a directory throws.
struct GoldenSet {
  std::string dir;
  bool full = false;   // the full set of ../shared/golden, not the subset
  std::string source;  // "$G3ATTN_GOLDEN_DIR", "../shared/golden" or "in-repo subset"
};
const GoldenSet& golden_set();
std::string golden_dir();
// Sub-directories holding a config.json, sorted. Throws when there are fewer
// than the set has (10 full, 3 subset), so a half-copied set cannot pass.
std::vector<std::string> golden_cases();
// The path of one file of one case; throws std::runtime_error naming the
// path and the set when it does not exist (a clear test failure, where
// reading a missing file used to crash the caller).
std::string golden_file(const std::string& name, const std::string& file);
// The `g3attn apply` request of golden case `name`: its config, weights,
// input, positions and, where the case has one, its attention mask.
g3::ApplyRequest golden_apply_request(const std::string& name);
// For a test that needs a case only the full set has: true when the case is
// there. On the subset it prints "skipped: <what> (needs golden case <name>,
// only in the full set)" and returns false; when the full set lacks the case
// it throws, so a missing case never passes silently.
bool need_golden_case(const std::string& name, const std::string& what);

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
// Whole-file reads; both throw std::runtime_error naming the path when the
// file cannot be opened, rather than returning nothing for callers to index.
std::string read_text(const std::string& path);
std::vector<uint8_t> read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes);
// The bytes of a safetensors file written by hand: the header's length (8
// bytes, little-endian), the JSON header as given (padding is the caller's),
// then the data section.
std::vector<uint8_t> safetensors_bytes(const std::string& header, const std::vector<uint8_t>& data);
// Runs read() here while a thread writes `data` into a FIFO at `path`
// (made if missing; a shell's <(...) is one), then `extra` zero bytes, or
// as many as go in before the reader has gone (the writes then fail with
// EPIPE: SIGPIPE is ignored from then on). What read() threw (its what()),
// or "" when it returned; the writer has finished either way.
std::string read_from_fifo(const std::string& path, const std::string& data, size_t extra,
                           const std::function<void()>& read);
bool file_exists(const std::string& path);
// Number of entries in a directory (to check nothing was left behind).
int count_entries(const std::string& dir);
// Paths of the entries of a directory whose names end in `suffix`.
std::vector<std::string> files_ending(const std::string& dir, const std::string& suffix);

// Redirects this process's stderr to the file `path` while alive, so
// warnings can be checked.
class StderrCapture {
 public:
  explicit StderrCapture(const std::string& path);
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;
  // Only restores: the test may have read and removed the file already, and
  // a destructor must not throw (read_text does for a missing file).
  ~StderrCapture();
  // Restores stderr and returns what was captured.
  std::string finish();
  const std::string path;

 private:
  void restore();
  int saved_ = -1;
};

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

// Which ISAs and backends a test can run here, decided from the backend
// table (is the backend in this build, what does it say about the ISA),
// CPUID and Highway's compiled targets rather than from the kernel registry
// under test, so that a registry falling back to Highway can never pass for
// an llvm or xbyak test. Whatever is left out is printed by name:
// "skipped: <backend> <isa> (why)".
//
// Highway targets this build compiled and this CPU runs, lowest first.
std::vector<std::string> highway_test_isas();
// How a test reaches a backend: through the runtime (the kernel registry,
// run_apply, prepare_layer), which also needs Highway compiled for the ISA
// because Highway serves the stages a JIT leaves out; or by calling the
// backend's own kernels, which needs only this CPU to run the ISA.
enum class Through { Runtime, Kernel };
// Whether `backend` (any --backend name but auto) serves cap `isa` ("best"
// allowed) in this build on this CPU; prints the skip line when not.
// Through the runtime it is asked about a plain f32 key (head_dim 64);
// through its kernels only whether it is built and the CPU runs the ISA,
// since which keys it serves there is the caller's question
// (Backend::why_unavailable).
bool backend_runs_here(const std::string& backend, const std::string& isa, Through via = Through::Runtime);

// For the lifetime of the object (a global in a suite that builds JIT
// kernels), G3ATTN_CACHE_DIR points to a fresh scratch directory: the suite
// exercises the compiler every time and never fills the user's cache.
struct ScratchJitCache {
  ScratchJitCache();
  TempDir dir;
};

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
