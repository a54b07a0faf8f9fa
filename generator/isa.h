// The ISA names g3attn accepts (--isa, G3ATTN_ISA, the JITs' caps): Highway's
// x86 targets in lower case, each with its Highway target bit, lowest first.
// The list is written once, in templates/hwy_targets.h, which the per-target
// kernel tables expand too; this is its run-time form for everything that
// validates, orders or compares ISA names.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace g3 {

struct IsaInfo {
  std::string name;  // "scalar", "ssse3", "sse4", "avx2", "avx3", "avx3_dl"
  int64_t target;    // Highway's target bit (HWY_AVX2, ...)
};

// Every ISA, lowest first, whether or not this build compiles it.
const std::vector<IsaInfo>& isa_table();
// Their names, lowest first: scalar ssse3 sse4 avx2 avx3 avx3_dl.
const std::vector<std::string>& isa_names();
// Position of a name in isa_names() (a higher rank can run every lower
// one's code), -1 for an unknown name.
int isa_rank(const std::string& name);
// The Highway target bit of a name, 0 for an unknown name.
int64_t isa_target_bit(const std::string& name);
// Whether this CPU runs code compiled for a Highway target bit. Checked
// before handing out a target's functions, so a missing instruction set is
// a clear message and never SIGILL; Highway's scalar fallback runs anywhere.
bool target_runs_here(int64_t target);
// Whether this build compiled Highway code for the ISA named (HWY_TARGETS).
bool isa_compiled(const std::string& name);

}  // namespace g3
