// Whether this process may execute AMX tile instructions, and why not.
//
// Three things must hold before the first tile instruction: the CPU has the
// tiles and their bf16 dot product (CPUID amx_tile and amx_bf16; the AMX
// core also converts with AVX512_BF16), the user did not switch AMX off
// (G3ATTN_AMX=off), and Linux granted this process the tile data state.
// Linux enables the 8 KB XTILEDATA register file per process on request only
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), kernel 5.16 and
// later); without the grant the first tileloadd raises SIGILL. The request is
// made once per process, whichever thread asks first, and its answer is
// kept: a refusal is a reason the backend table prints (`g3attn plan`) and
// the next backend serves the call, never a crash.
#pragma once
#include <string>

namespace g3::amx {

// "" when AMX tiles may run here, else why not. Reads G3ATTN_AMX on every
// call (so a test can force the refusal path in-process) and makes the
// permission request on the first call that gets that far.
std::string unavailable_reason();

// The decision itself, with every input passed in, so a test can take the
// refusal paths on any machine: `request` stands for the arch_prctl call
// and returns 0 when granted, else an errno value.
struct Probe {
  const char* env = nullptr;  // the value of G3ATTN_AMX (null: unset)
  bool amx_tile = false, amx_bf16 = false, avx512_bf16 = false;
  int (*request)() = nullptr;
};
std::string decide(const Probe& p);

}  // namespace g3::amx
