#pragma once

#include <string_view>

#include "anchorkv/status.h"

namespace anchorkv::core {
[[noreturn]] void fail(ErrorCode code, std::string_view operation, std::string_view message);
}  // namespace anchorkv::core
