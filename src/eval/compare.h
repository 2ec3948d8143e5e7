// The comparison harness: every method at the same byte budget on one
// workload, attention-output error on held-out queries.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "anchorkv/cache.h"
#include "eval/metrics.h"
#include "eval/workload.h"

namespace anchorkv::eval {

struct CompareRow {
  std::string method;
  double theta = 0;
  int64_t bytes = 0, full_bytes = 0, budget_bytes = 0;
  double compression_ratio = 0;
  bool over_budget = false;   // stores more than 1.02 x the budget
  bool under_budget = false;  // stores less than 0.98 x the budget (cannot spend more)
  int64_t tokens_kept = 0, tokens_total = 0;
  ErrorSummary error;
  double compress_ms = 0;  // the prefill's update_and_fetch
  double attend_ms = 0;    // one decode step's attention (every head, one query each) on what it stores, median of 5
};

// Runs every (theta, method) pair on the workload; progress(i, n, label) after each.
std::vector<CompareRow> compare(const Workload& w, const std::vector<double>& thetas,
                                const std::vector<std::string>& methods, int threads,
                                const std::function<void(int, int, const std::string&)>& progress = {});

}  // namespace anchorkv::eval
