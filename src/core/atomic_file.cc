#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace anchorkv::core {

namespace {
// Refuses to replace anything but a regular file that begins with `magic`.
void check_replaceable(const std::string& path, std::string_view op, std::string_view magic) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // nothing there (or a dangling link): created anew
  if (!S_ISREG(st.st_mode))
    fail(ErrorCode::kIo, op, "'" + path + "' exists and is not a regular file; refusing to replace it");
  if (magic.empty() || st.st_size == 0) return;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  std::string head(magic.size(), '\0');
  const ssize_t n = fd >= 0 ? ::read(fd, head.data(), head.size()) : -1;
  if (fd >= 0) ::close(fd);
  if (n != static_cast<ssize_t>(magic.size()) || head != magic)
    fail(ErrorCode::kIo, op, "'" + path + "' exists and is not a cache file; refusing to replace it");
}
}  // namespace

void write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes, std::string_view op,
                           std::string_view magic) {
  check_replaceable(path, op, magic);
  const std::filesystem::path target(path);
  std::string tmp = (target.has_parent_path() ? target.parent_path() / "" : std::filesystem::path()).string() + "." +
                    target.filename().string() + ".tmp.XXXXXX";
  const int fd = mkstemp(tmp.data());
  if (fd < 0) fail(ErrorCode::kIo, op, "cannot create a temporary file beside '" + path + "': " + std::strerror(errno));
  auto fail_io = [&](const char* what) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(ErrorCode::kIo, op, std::string(what) + " '" + tmp + "': " + std::strerror(e));
  };
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_io("cannot write");
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail_io("cannot sync");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail(ErrorCode::kIo, op, "cannot close '" + tmp + "'");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail(ErrorCode::kIo, op, "cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(e));
  }
  // The rename itself is durable once the folder is synced.
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace anchorkv::core
