// A block of a prompt-prefix chain as the pool that holds it sees it
// (runtime/prefix_chain.h makes and restores them).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace anchorkv::runtime {

struct BlockInfo {
  uint64_t key = 0, parent = 0;  // parent: the block before it (the chain's root when first == 0)
  int64_t first = 0;             // its first token
  std::vector<int32_t> tokens;   // every token from position 0 to its end
};

// A block with its cache-file bytes.
struct HeldBlock {
  BlockInfo info;
  std::shared_ptr<const std::vector<uint8_t>> file;
};

}  // namespace anchorkv::runtime
