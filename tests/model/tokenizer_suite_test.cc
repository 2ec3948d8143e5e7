// llama.cpp's tokenizer test suite (../shared/tokenizer-tests: vocab-only GGUF
// files, test strings, and the ids the Hugging Face tokenizers give with
// add_special_tokens=False): every string of every family must tokenize to
// exactly the reference ids, as llama.cpp's test-tokenizer-0 checks (no BOS,
// special-token text not parsed). Every family with a .inp file in the folder
// runs; ANCHORKV_TOKENIZER_TESTS=DIR points at another copy of the suite
// (llama.cpp's whole models/ folder, say). Skipped where there is none.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "model/tokenizer.h"

namespace anchorkv::model {
namespace {

namespace fs = std::filesystem;

fs::path suite_dir() {
  if (const char* d = std::getenv("ANCHORKV_TOKENIZER_TESTS")) return d;
  return fs::path(ANCHORKV_SOURCE_DIR) / ".." / "shared" / "tokenizer-tests";
}

// The families in the folder: ggml-vocab-NAME.gguf with its .inp and .out.
std::vector<std::string> families() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(suite_dir(), ec)) {
    const std::string n = e.path().filename().string(), pre = "ggml-vocab-", post = ".gguf.inp";
    if (n.size() > pre.size() + post.size() && n.rfind(pre, 0) == 0 && n.compare(n.size() - post.size(), post.size(), post) == 0)
      out.push_back(n.substr(pre.size(), n.size() - pre.size() - post.size()));
  }
  std::sort(out.begin(), out.end());
  if (out.empty()) out.push_back("none");
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The .inp strings, separated by "\n__ggml_vocab_test__\n" (a last string
// need not be followed by one), split as test-tokenizer-0 splits them.
std::vector<std::string> test_strings(const fs::path& p) {
  const std::string all = slurp(p), sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  for (size_t at = 0; at < all.size();) {
    const size_t end = all.find(sep, at);
    if (end == std::string::npos) {
      out.push_back(all.substr(at));
      break;
    }
    out.push_back(all.substr(at, end - at));
    at = end + sep.size();
  }
  return out;
}

std::vector<std::vector<int32_t>> reference_ids(const fs::path& p) {
  std::vector<std::vector<int32_t>> out;
  std::istringstream lines(slurp(p));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream ids(line);
    std::vector<int32_t> v;
    for (int32_t id; ids >> id;) v.push_back(id);
    out.push_back(std::move(v));
  }
  return out;
}

std::string ids_text(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t id : v) (s += ' ') += std::to_string(id);
  return s;
}

class TokenizerSuite : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerSuite, EveryStringGivesTheReferenceIds) {
  const fs::path vocab = suite_dir() / ("ggml-vocab-" + GetParam() + ".gguf");
  if (!fs::exists(vocab)) GTEST_SKIP() << "no tokenizer test suite at " << suite_dir();
  const Tokenizer tok = Tokenizer::from_gguf(io::GgufFile::open(vocab.string()));
  const auto strings = test_strings(vocab.string() + ".inp");
  const auto want = reference_ids(vocab.string() + ".out");
  ASSERT_EQ(strings.size(), want.size());
  int passed = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::vector<int32_t> got = tok.encode(strings[i], /*add_bos=*/false);
    if (got == want[i])
      ++passed;
    else
      ADD_FAILURE() << GetParam() << " string " << i << " '" << strings[i] << "'\n  want" << ids_text(want[i])
                    << "\n  got " << ids_text(got);
  }
  RecordProperty("passed", passed);
  EXPECT_EQ(passed, static_cast<int>(strings.size()));
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerSuite, ::testing::ValuesIn(families()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace
}  // namespace anchorkv::model
