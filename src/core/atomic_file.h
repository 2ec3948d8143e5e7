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
// Only a regular file (or a link to one) is replaced: a device, FIFO or folder
// at `path` is an error, and so is a non-empty file that does not begin with
// `magic` when one is given (a cache file replaces only a cache file).
void write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes, std::string_view op,
                           std::string_view magic = {});

}  // namespace anchorkv::core
