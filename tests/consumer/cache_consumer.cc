// The README's C++ example, built against the installed package.
#include <anchorkv/anchorkv.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const int64_t B = 1, H = 8, S = 8192, D = 128;
  std::vector<float> k(B * H * S * D), v(k.size()), q(B * 32 * D), step(B * H * D);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = std::sin(0.001f * static_cast<float>(i));
    v[i] = std::cos(0.002f * static_cast<float>(i));
  }
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.01f * static_cast<float>(i));
  for (size_t i = 0; i < step.size(); ++i) step[i] = 0.5f;

  anchorkv::AnchorKVConfig cfg;        // seed defaults: theta 0.05, window 32, rho 0.7, ...
  anchorkv::AnchorKVCache cache(cfg);  // one cache per layer
  auto kv = cache.update_and_fetch(anchorkv::TensorView::f32(k.data(), {B, H, S, D}),
                                   anchorkv::TensorView::f32(v.data(), {B, H, S, D}));
  cache.update(anchorkv::TensorView::f32(step.data(), {B, H, 1, D}),
               anchorkv::TensorView::f32(step.data(), {B, H, 1, D}));
  anchorkv::Tensor y = anchorkv::attend(anchorkv::TensorView::f32(q.data(), {1, 32, 1, 128}), cache);
  const double ratio = cache.compression_ratio();
  std::printf("dense %lld tokens, %.1fx smaller, attend -> [%lld, %lld, %lld, %lld]\n",
              static_cast<long long>(kv.keys.shape()[2]), ratio, static_cast<long long>(y.shape()[0]),
              static_cast<long long>(y.shape()[1]), static_cast<long long>(y.shape()[2]),
              static_cast<long long>(y.shape()[3]));
  return kv.keys.shape()[2] == S && ratio > 10 && y.shape()[1] == 32 ? 0 : 1;
}
