#include <string>

#include "anchorkv/status.h"
#include "core/error.h"

namespace anchorkv {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kInvalidConfig: return "invalid_config";
    case ErrorCode::kShapeMismatch: return "shape_mismatch";
    case ErrorCode::kNonFinite: return "non_finite";
    case ErrorCode::kOutOfRange: return "out_of_range";
    case ErrorCode::kInvalidState: return "invalid_state";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kCorruptFile: return "corrupt_file";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kCancelled: return "cancelled";
  }
  return "unknown";
}

static std::string format_message(std::string_view op, std::string_view msg) {
  std::string s;
  s.reserve(op.size() + msg.size() + 3);
  s.push_back('[');
  s.append(op.data(), op.size());
  s.push_back(']');
  s.push_back(' ');
  s.append(msg.data(), msg.size());
  return s;
}

Error::Error(ErrorCode code, std::string_view operation, std::string_view message)
    : std::runtime_error(format_message(operation, message)), code_(code), operation_(operation) {}

namespace core {
void fail(ErrorCode code, std::string_view operation, std::string_view message) {
  throw Error(code, operation, message);
}
}  // namespace core

}  // namespace anchorkv
