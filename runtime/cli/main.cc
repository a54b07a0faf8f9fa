// g3attn: the command. Thin: parses arguments and calls the library.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>
#include <string>
#include <utility>

#include "generator/errors.h"
#include "runtime/cli/commands.h"

namespace {

const char* kHelp = R"(g3attn: the Gemma 3 attention block on CPU, specialised per model and layer kind.

Usage: g3attn COMMAND [OPTIONS]    (g3attn COMMAND --help for its options)

Commands:
  plan      per-layer routing of a model: kind, window, RoPE, alpha, kernel key, backend, ISA
  apply     run one layer's block on real weights and .npy inputs, write .npy outputs
  run       the whole attention stack: chunked prefill + decode, timings, KV memory
  bench     per-ISA, per-backend performance table with this machine's measured peaks
  generate  write the specialised Highway sources of a model for another engine
  tune      measure every backend on this CPU and write the profile --backend auto follows

Backends (--backend): reference (scalar oracle), highway (AOT, every x86 ISA),
  llvm (ORC JIT), xbyak (hand-scheduled x86 JIT), amx (AMX tile core of the bf16
  compute mode: --compute bf16, a CPU with AMX-BF16, --isa avx3_dl or best), auto (default).
  auto (the default) takes, per kernel key, phase (prefill or decode calls) and ISA,
  the backend `g3attn tune` measured fastest on this CPU (a profile in the cache
  directory, valid for this CPU and version); without one, the static rule: highway,
  the fastest prefill core on every CPU this project has run on (on short decode
  calls another backend may be faster: tune measures it), except that prefill calls
  of the bf16 compute mode go to amx wherever it serves the key.
  Every backend of a compute mode computes the same numerics, so auto is a speed
  choice only. Stages xbyak and amx do not provide (QK-norm/RoPE, projections, norms; for
  amx also calls of fewer than 16 query rows, i.e. decode) run on highway. An
  unavailable llvm, xbyak or amx request falls back to highway and `plan` shows why.
Compute mode (--compute f32|bf16, default f32): bf16 rounds the inputs of every dot
  product to bf16 (nearest even) and accumulates in f32: the normed activations and
  weights of the projections, q and K for the logits, the softmax weights and V, the
  attention output before o_proj. RMSNorm, RoPE, softmax and residuals stay f32. It is
  part of the kernel key; README "Compute modes" gives its measured accuracy.
KV dtype (--kv-dtype f32|bf16): bf16 stores K and V rounded once to bf16 (nearest
  even); in the f32 compute mode queries and softmax weights stay f32 on every backend.
ISAs (--isa or G3ATTN_ISA; the flag wins): scalar, ssse3, sse4, avx2, avx3 (AVX-512),
  avx3_dl, best (default). The ISA selects the Highway target and caps JIT code.
Projections (--proj highway|onednn|auto on plan, run and bench; default auto): who
  runs the Q/K/V and output projections, Highway's GEMM/GEMV or oneDNN's matmul (AMX
  tiles where the CPU has them). auto follows the tune profile, else runs prefill-sized
  calls of the bf16 compute mode on oneDNN where AMX is usable and everything else on
  Highway; `g3attn plan` prints the choice per phase and where it came from.

Environment:
  G3ATTN_ISA        default for --isa
  G3ATTN_CACHE_DIR  on-disk LLVM kernel cache (default $XDG_CACHE_HOME/g3attn or ~/.cache/g3attn);
                    an unwritable directory means running without a cache, with a warning
  G3ATTN_LLVM_OPT   LLVM pipeline: O1|O2|O3 (default: a short pass list, as fast and 10x quicker to compile)
  G3ATTN_LLVM_VERBOSE=1   print the IR, optimisation and codegen times per LLVM kernel
  G3ATTN_XBYAK_DUMP=DIR   write each Xbyak kernel's bytes to DIR (objdump -D -b binary -mi386:x86-64)
  G3ATTN_AMX=off    never use AMX tiles: the amx backend then falls back to highway, saying so

Exit codes: 0 success, 2 bad input (one line on stderr), 1 internal error.
)";

// What went to stdout (a table, a --json document, a help text) may not
// have got out (a full disk, a closed pipe): then this says so on stderr and
// gives 2 instead of the command's own exit code.
int stdout_written(const std::string& cmd, int rc) {
  std::cout.flush();
  errno = 0;
  if (std::fflush(stdout) == 0 && !std::ferror(stdout) && std::cout) return rc;
  const int e = errno;
  std::cerr << "g3attn " << cmd << ": cannot write standard output" << (e ? std::string(": ") + std::strerror(e) : "")
            << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace g3::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    std::cout << kHelp;
    return stdout_written("--help", argc < 2 ? 2 : 0);
  }
  std::string cmd = argv[1];
  try {
    using Command = int (*)(int, char**, int);
    static const std::pair<const char*, Command> kCommands[] = {
        {"plan", cmd_plan},   {"apply", cmd_apply},       {"run", cmd_run},
        {"bench", cmd_bench}, {"generate", cmd_generate}, {"tune", cmd_tune}};
    Command command = nullptr;
    for (const auto& [name, fn] : kCommands)
      if (cmd == name) command = fn;
    if (!command) {
      std::cerr << "g3attn: unknown command '" << cmd << "' (valid: plan, apply, run, bench, generate, tune)\n";
      return 2;
    }
    return stdout_written(cmd, command(argc, argv, 2));
  } catch (const g3::InputError& e) {
    std::cerr << "g3attn " << cmd << ": " << e.what() << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "g3attn " << cmd << ": out of memory\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "g3attn " << cmd << ": internal error: " << e.what() << "\n";
    return 1;
  }
}
