// How far ahead, and into which cache level, the decode cores ask for K and
// V rows: the hint g3_core_args::prefetch_bytes and prefetch_level carry
// (templates/kernel_contract.h; the cores' default, and why it is only a
// default, in templates/decode_prefetch.h). One setting per process, for
// every core call the runtime makes (each backend's decode core honours
// it): which is fastest is a property of the CPU (its L1 and the misses a
// thread keeps in flight), not of a kernel key.
// `g3attn tune` measures the candidates on the CPU at hand and its profile
// (profile.h) sets the winner when loaded; without one, calls pass zero and
// the cores use their default.
#pragma once
#include <string>
#include <vector>

namespace g3 {

struct DecodePrefetch {
  int level = 0;  // G3_PREFETCH_DEFAULT, G3_PREFETCH_L1 or G3_PREFETCH_L2
  int bytes = 0;  // K and V bytes ahead; 0 with level 0
  // "default", or the level and distance: "l1:8192", "l2:16384".
  std::string str() const;
  bool operator==(const DecodePrefetch&) const = default;
};

// Parses str()'s form (l1 or l2, 64 bytes to 1 MiB); an InputError naming
// `what` otherwise.
DecodePrefetch parse_decode_prefetch(const std::string& s, const std::string& what);

// What tune compares: the default (8 KiB into L1), and 16 and 32 KiB into
// L2, the settings that measured fastest on the CPUs this ran on.
const std::vector<DecodePrefetch>& decode_prefetch_candidates();

// The process's setting (loading this CPU's profile first, if there is
// one), and where it came from: "default", "profile: 1.31x the default", ...
DecodePrefetch decode_prefetch();
std::string decode_prefetch_source();
// Sets it for the core calls made afterwards. Thread-safe. It does not load
// the profile: a caller that must not have its setting replaced by the
// profile's calls active_profile() first (tune does).
void set_decode_prefetch(const DecodePrefetch& p, const std::string& source);

}  // namespace g3
