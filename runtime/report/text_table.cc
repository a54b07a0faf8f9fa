#include "runtime/report/text_table.h"

#include <algorithm>

namespace g3 {

std::string format_table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right) {
  std::vector<size_t> w;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (w.size() <= i) w.push_back(0);
      w[i] = std::max(w[i], r[i].size());
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      std::string cell = r[i];
      const size_t fill = w[i] - cell.size();
      if (i < right.size() && right[i]) cell = std::string(fill, ' ') + cell;
      else if (i + 1 < r.size()) cell += std::string(fill, ' ');
      line += cell;
      if (i + 1 < r.size()) line += "  ";
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace g3
