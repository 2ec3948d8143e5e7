#include "inputs.h"

#include "core/mapped_file.h"

namespace anchorkv::cli {

std::string read_file(const std::string& path) { return std::string(core::MappedFile::open(path, "anchorkv").text()); }

std::vector<int32_t> prompt_tokens(const runtime::ModelFile& m, const std::string& prompt,
                                   const std::string& prompt_file, const std::vector<int32_t>& ids) {
  if (!ids.empty()) return ids;
  const std::string text = !prompt_file.empty() ? read_file(prompt_file) : prompt;
  return m.tok("anchorkv").encode(text, true);
}

}  // namespace anchorkv::cli
