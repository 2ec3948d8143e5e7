// libFuzzer target for the cache-file reader: whatever loads must then be
// usable — fetched, attended and appended to — without reading out of bounds.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "anchorkv/anchorkv.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    anchorkv::LoadedCaches l = anchorkv::load_caches_from_memory(data, size, "fuzz.akvc");
    for (auto& c : l.caches) {
      const anchorkv::KVPair kv = c->fetch();
      const anchorkv::Shape4 s = kv.keys.shape();
      if (s[0] * s[1] * s[3] == 0 || s[0] * s[1] * s[3] > 4096) continue;
      std::vector<float> step(static_cast<size_t>(s[0] * s[1] * s[3]), 0.25f);
      const auto view = anchorkv::TensorView::f32(step.data(), {s[0], s[1], 1, s[3]});
      if (s[2] > 0) anchorkv::attend(view, *c);
      c->update(view, view);
      anchorkv::attend(view, *c);
    }
  } catch (const anchorkv::Error&) {
  }
  return 0;
}
