#include "compress/budget.h"

#include <algorithm>
#include <cmath>

namespace anchorkv::compress {

int64_t residual_budget(double theta, int64_t full, int64_t base, int64_t b_res) {
  const double n = std::floor((theta * static_cast<double>(full) - static_cast<double>(base)) /
                              static_cast<double>(b_res));
  return n > 0 ? static_cast<int64_t>(n) : 0;
}

std::vector<std::vector<int32_t>> allocate_top(std::span<const std::span<const float>> utilities,
                                               int64_t count) {
  struct Item {
    float u;
    int32_t row;
    int32_t pos;
  };
  std::vector<Item> items;
  for (size_t r = 0; r < utilities.size(); ++r) {
    const auto& u = utilities[r];
    for (size_t t = 0; t < u.size(); ++t) {
      if (std::isnan(u[t]) || u[t] == -INFINITY) continue;
      items.push_back({u[t], static_cast<int32_t>(r), static_cast<int32_t>(t)});
    }
  }
  std::vector<std::vector<int32_t>> chosen(utilities.size());
  const int64_t n = std::min<int64_t>(count, static_cast<int64_t>(items.size()));
  if (n <= 0) return chosen;
  auto better = [](const Item& a, const Item& b) {
    if (a.u != b.u) return a.u > b.u;
    if (a.row != b.row) return a.row < b.row;
    return a.pos < b.pos;
  };
  if (n < static_cast<int64_t>(items.size())) std::nth_element(items.begin(), items.begin() + n, items.end(), better);
  items.resize(static_cast<size_t>(n));
  for (const Item& it : items) chosen[it.row].push_back(it.pos);
  for (auto& c : chosen) std::sort(c.begin(), c.end());
  return chosen;
}

}  // namespace anchorkv::compress
