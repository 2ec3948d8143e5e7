// Golden logits for the shared models: values pinned from the independent
// float64 numpy forward pass (python/tests/test_runtime_reference.py), so a
// change in loading, RoPE, attention or the MLP shows up here even without
// Python. Skipped where ../shared/models is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "anchorkv/anchorkv.h"
#include "model/llama.h"

namespace anchorkv::model {
namespace {

struct Golden {
  int64_t position;
  int32_t argmax;
  std::vector<std::pair<int32_t, double>> logits;
};

void check(const char* name, const std::vector<int32_t>& tokens, const std::vector<Golden>& golden) {
  const auto path = std::filesystem::path(ANCHORKV_SOURCE_DIR) / ".." / "shared" / "models" / name;
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared model not present: " << path;
  const LlamaWeights w = load_model(path.string());
  LlamaModel m(w, [](int64_t) { return std::make_unique<FullKVCache>(); });
  const auto logits = m.forward(tokens, true);
  const int64_t V = w.config.vocab;
  for (const Golden& g : golden) {
    const float* row = &logits[g.position * V];
    EXPECT_EQ(std::max_element(row, row + V) - row, g.argmax) << name << " position " << g.position;
    // fp16 K/V and float32 arithmetic against float64: 2e-3 of the row's largest logit
    // (the tolerance of the numpy comparison in python/tests).
    const double tol = 2e-3 * std::max(1.0f, std::fabs(row[g.argmax]));
    for (const auto& [id, value] : g.logits)
      EXPECT_NEAR(row[id], value, tol) << name << " position " << g.position << " id " << id;
  }
}

TEST(GoldenLogits, AnchorkvTiny) {
  check("anchorkv-tiny.gguf", {1, 87, 105, 108, 108, 35, 119, 111, 114, 108, 100},
        {{0, 52, {{52, 3.49862}, {3, -5.76226}, {100, -0.28647}, {200, -5.13133}}},
         {5, 119, {{119, 3.65645}, {3, -12.32577}, {100, 3.47900}, {200, -11.36748}}},
         {10, 113, {{113, 6.81178}, {3, -10.46291}, {100, 0.74276}, {200, -10.15288}}}});
}

TEST(GoldenLogits, Stories260K) {
  check("stories260K.bin", {1, 300, 301, 302, 17, 99, 256, 4, 480},
        {{0, 461, {{461, 9.48929}, {3, 1.97421}, {100, 1.97471}, {200, 1.93127}}},
         {4, 341, {{341, 7.16493}, {3, 6.43354}, {100, 6.43358}, {200, 6.35060}}},
         {8, 477, {{477, 10.90262}, {3, 7.37004}, {100, 7.36853}, {200, 7.20067}}}});
}

}  // namespace
}  // namespace anchorkv::model
