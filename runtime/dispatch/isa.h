// ISA selection: the names of generator/isa.h (Highway's targets in lower
// case, lowest first) plus "best". `--isa` wins over G3ATTN_ISA, which wins
// over the default "best".
#pragma once
#include <string>
#include <vector>

#include "generator/isa.h"

namespace g3 {

// The ISA name asked for: flag if non-empty, else $G3ATTN_ISA, else "best".
// Validates the name (InputError listing the valid ones, naming the flag or
// the variable) but not that the machine can run it.
std::string requested_isa(const std::string& flag_value);
// Turns a valid name into a runnable one: "best" becomes the best target
// compiled and supported here; others are checked (InputError when this CPU
// or build cannot run them).
std::string resolve_isa(const std::string& name);
// requested_isa then resolve_isa.
std::string isa_from_flag(const std::string& flag_value);

bool isa_supported_by_cpu(const std::string& name);
// Why an ISA cannot run here ("" when it can).
std::string isa_unavailable_reason(const std::string& name);
std::string best_isa();
// Compiled and runnable here, lowest first.
std::vector<std::string> runnable_isas();

}  // namespace g3
