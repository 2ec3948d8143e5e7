// Error reporting for the anchorkv library.
//
// Contract: every public function that can fail on caller input (bad shapes,
// non-finite values, invalid configuration, misuse of state) throws
// anchorkv::Error. The message always starts with the operation in brackets,
// e.g. "[anchorkv::update_and_fetch] keys and values differ: ...". A call that
// throws leaves the object it was called on exactly as it was (strong
// guarantee). The library never aborts the process on bad input.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace anchorkv {

enum class ErrorCode : int {
  kInvalidArgument = 1,  // a malformed argument (shape, dtype, null data)
  kInvalidConfig = 2,    // a configuration field outside its valid range
  kShapeMismatch = 3,    // shapes disagree with each other or with earlier calls
  kNonFinite = 4,        // NaN or Inf in the input
  kOutOfRange = 5,       // a finite value that fp16 storage cannot hold
  kInvalidState = 6,     // the call is not allowed in the object's current state
  kUnsupported = 7,      // a valid request this build or layout cannot serve
  kCorruptFile = 8,      // a file violates its format (bad magic, sizes, offsets, ...)
  kIo = 9,               // the operating system refused (open, stat, map)
  kCancelled = 10,       // the caller stopped the work (its deadline passed, its client left)
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string_view operation, std::string_view message);
  ErrorCode code() const noexcept { return code_; }
  // The operation that failed, e.g. "anchorkv::update_and_fetch".
  const std::string& operation() const noexcept { return operation_; }

 private:
  ErrorCode code_;
  std::string operation_;
};

}  // namespace anchorkv
