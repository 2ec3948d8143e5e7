// A read-only memory mapping of a whole file (RAII). Empty files map to
// size 0 with a null data pointer. Only regular files open: a FIFO, device
// or folder is an error at once (opened non-blocking, never waited on).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace anchorkv::core {

class MappedFile {
 public:
  // Throws Error(kIo) naming `op` and the path.
  static MappedFile open(const std::string& path, std::string_view op);
  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  std::string_view text() const { return {reinterpret_cast<const char*>(data_), size_}; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace anchorkv::core
