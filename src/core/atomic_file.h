// Replacing a file so that a crash at any moment leaves either the old file or
// the new one: the bytes go to a temporary file in the same folder, which is
// fsynced and renamed over the target, then the folder is fsynced.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace anchorkv::core {

// Throws Error(kIo) naming `op`; the temporary file is removed on failure.
void write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes, std::string_view op);

}  // namespace anchorkv::core
