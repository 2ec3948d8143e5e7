#pragma once

#include <cstdint>

namespace anchorkv::core {

// Softmax of one row of logits in place: max-subtracted exp in float, the
// normaliser summed in double in position order (deterministic).
void softmax_inplace(float* x, int64_t n);

}  // namespace anchorkv::core
