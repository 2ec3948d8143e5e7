// anchorkv::runtime from the installed package: greedy decode of a few tokens
// with a compressed cache (argv[1]: a GGUF model; without one it only links).
#include <anchorkv/anchorkv.h>
#include <anchorkv/runtime.h>

#include <algorithm>
#include <cstdio>

int main(int argc, char** argv) {
  if (argc < 2) return 0;
  anchorkv::Runtime rt = anchorkv::Runtime::load(argv[1], "anchorkv_compact:pre", 0.1, 2);
  std::vector<int32_t> tokens = rt.tokenize("In the beginning God created the heaven and the earth.");
  std::vector<float> logits = rt.prefill(tokens);
  std::vector<int32_t> out;
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    logits = rt.forward({out.back()});
  }
  std::printf("%s| position %lld, cache %lld of %lld fp16 bytes\n", rt.detokenize(out).c_str(),
              static_cast<long long>(rt.position()), static_cast<long long>(rt.cache_bytes()),
              static_cast<long long>(rt.cache_full_bytes()));
  return rt.position() == static_cast<int64_t>(tokens.size()) + 8 && rt.cache_bytes() < rt.cache_full_bytes() ? 0 : 1;
}
