// What attend() refuses before it plans a call (kernels/attend.cc): a query
// that does not fit the cache, options out of range, and RoPE inside
// attention where the cache cannot take it.
#pragma once

#include <string>

#include "anchorkv/attention.h"
#include "anchorkv/tensor.h"
#include "cache/attention_source.h"

namespace anchorkv::kernels {

// Throws Error (operation "anchorkv::attend") naming the first problem.
// evicts: some cache drops tokens (`evicting` names it): RoPE inside
// attention needs every token's position.
void check_attend_call(const TensorView& query, const cache::AttentionSource& src, const AttentionOptions& opt,
                       bool evicts, const std::string& evicting);

}  // namespace anchorkv::kernels
