// The stored state of a FullKVCache: exact fp16 rows.
#pragma once

#include "cache/input.h"

namespace anchorkv::internal {

struct FullState {
  bool has_shape = false;
  int64_t B = 0, H = 0, D = 0;
  cache::ExactRows rows;  // [B * H] x [n, D] fp16
};

}  // namespace anchorkv::internal
