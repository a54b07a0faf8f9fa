// Aligned text tables for the commands' output (plan, run, bench).
#pragma once
#include <string>
#include <vector>

namespace g3 {

// Pads every column to its widest cell, two spaces between columns; the
// first row is the header. Columns flagged in `right` are right-aligned.
std::string format_table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right = {});

}  // namespace g3
