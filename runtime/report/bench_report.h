// What `g3attn bench` prints and writes: the aligned table, JSON, CSV, an
// SVG bar chart, and the comparison with an earlier JSON run.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/bench/bench.h"

namespace g3::bench {

// One row of an earlier run matched to this run's row of the same
// (backend, isa, model, kind, phase, kv_dtype, weight_dtype, batch,
// new_tokens, context).
struct CompareLine {
  Row now;
  double old_ms = 0;
  double ratio = 0;        // new ms_median / old ms_median
  bool regression = false;  // ratio > 1 + threshold / 100
};

struct Comparison {
  std::string file;
  double threshold_pct = 10;
  std::vector<CompareLine> lines;
  std::vector<Row> only_old, only_new;
  int regressions = 0;
};

// The FLOP and ratio rules, printed under the table and stored in the JSON.
std::string flop_rule();

// The rows of an earlier `g3attn bench --json` file; InputError (one line,
// naming the file) when it is unreadable or not such a file.
std::vector<Row> load_rows(const std::string& path);
Comparison compare(const std::vector<Row>& old_rows, const std::vector<Row>& now, double threshold_pct,
                   const std::string& file);

std::string table_text(const Result& r);     // peaks, table, FLOP rule, notes
std::string compare_text(const Comparison& c);
nlohmann::json to_json(const Result& r, const Comparison* c);
std::string csv_text(const Result& r);
std::string svg_text(const Result& r);

}  // namespace g3::bench
