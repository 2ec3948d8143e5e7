// Files are opened and replaced only when they are what they should be: a
// FIFO, device or folder is refused at once (never waited on, never replaced),
// and a cache file replaces only a cache file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "anchorkv/status.h"
#include "core/atomic_file.h"
#include "core/mapped_file.h"

namespace anchorkv::core {
namespace {

namespace fs = std::filesystem;

struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("anchorkv_files_" + std::to_string(::getpid()));
  Scratch() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
};

std::string open_error(const fs::path& p) {
  try {
    MappedFile::open(p.string(), "test");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    return e.what();
  }
  return "";
}

std::string write_error(const fs::path& p, std::string_view magic = {}) {
  try {
    write_file_atomically(p.string(), {'A', 'K', 'V', 'C', 'A', 'C', 'H', 'E', 1}, "test", magic);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    return e.what();
  }
  return "";
}

TEST(Files, FifosAndFoldersAreRefusedAtOnce) {
  Scratch s;
  const fs::path fifo = s.dir / "f.akvc", folder = s.dir / "d.akvc";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_directories(folder);
  for (const fs::path& p : {fifo, folder}) {
    EXPECT_NE(open_error(p).find("not a regular file"), std::string::npos) << p;
    EXPECT_NE(write_error(p).find("not a regular file"), std::string::npos) << p;
  }
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_directory(folder));
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(s.dir)) ++files;
  EXPECT_EQ(files, 2u) << "no temporary file is left behind";
}

TEST(Files, ACacheFileReplacesOnlyACacheFile) {
  Scratch s;
  const fs::path notes = s.dir / "notes.txt", empty = s.dir / "empty", cache = s.dir / "c.akvc";
  std::ofstream(notes) << "my notes";
  std::ofstream(empty).flush();
  EXPECT_NE(write_error(notes, "AKVCACHE").find("not a cache file"), std::string::npos);
  std::ifstream in(notes);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "my notes");
  EXPECT_EQ(write_error(empty, "AKVCACHE"), "");  // an empty file is replaced
  EXPECT_EQ(write_error(cache, "AKVCACHE"), "");  // created
  EXPECT_EQ(write_error(cache, "AKVCACHE"), "");  // and replaced
  EXPECT_EQ(fs::file_size(cache), 9u);
  EXPECT_EQ(write_error(notes), "");  // without a magic any regular file may be replaced
  EXPECT_EQ(MappedFile::open(notes.string(), "test").size(), 9u);
}

}  // namespace
}  // namespace anchorkv::core
