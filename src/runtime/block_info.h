// A block of a prompt-prefix chain as the pool that holds it sees it
// (runtime/prefix_chain.h makes and restores them).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

namespace anchorkv::runtime {

struct BlockInfo {
  uint64_t key = 0, parent = 0;  // parent: the block before it (the chain's root when first == 0)
  int64_t first = 0;             // its first position
  std::vector<int32_t> tokens;   // its own tokens, positions [first, end())
  int64_t end() const { return first + static_cast<int64_t>(tokens.size()); }
  // Whether its tokens are `prompt`'s at its positions.
  bool matches(const std::vector<int32_t>& prompt) const {
    return end() <= static_cast<int64_t>(prompt.size()) &&
           std::equal(tokens.begin(), tokens.end(), prompt.begin() + first);
  }
};

// A block with its cache-file bytes.
struct HeldBlock {
  BlockInfo info;
  std::shared_ptr<const std::vector<uint8_t>> file;
};

}  // namespace anchorkv::runtime
