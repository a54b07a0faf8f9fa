#include "generator/isa.h"

#include <hwy/highway.h>
#include <hwy/targets.h>

#include <algorithm>

#include "templates/hwy_targets.h"

namespace g3 {

const std::vector<IsaInfo>& isa_table() {
  // hwy_targets.h lists the targets best first, the order the per-target
  // tables search; names and ranks here run lowest first.
  static const std::vector<IsaInfo> table = [] {
#define G3_ISA_INFO(bit, name, ns) IsaInfo{name, int64_t(bit)},
    std::vector<IsaInfo> t = {G3_HWY_FOR_EVERY_TARGET(G3_ISA_INFO)};
#undef G3_ISA_INFO
    std::reverse(t.begin(), t.end());
    return t;
  }();
  return table;
}

const std::vector<std::string>& isa_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const IsaInfo& i : isa_table()) v.push_back(i.name);
    return v;
  }();
  return names;
}

int isa_rank(const std::string& name) {
  const auto& t = isa_table();
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i].name == name) return int(i);
  return -1;
}

int64_t isa_target_bit(const std::string& name) {
  const int r = isa_rank(name);
  return r < 0 ? 0 : isa_table()[size_t(r)].target;
}

bool target_runs_here(int64_t target) {
  return target == HWY_SCALAR || (hwy::SupportedTargets() & target) != 0;
}

bool isa_compiled(const std::string& n) { return (HWY_TARGETS & isa_target_bit(n)) != 0; }

}  // namespace g3
