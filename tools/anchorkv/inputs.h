// What the model commands share: a text file's contents and a prompt's tokens.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/model_file.h"

namespace anchorkv::cli {

using Clock = std::chrono::steady_clock;
inline double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The model as a results file names it: its file name, never where it lay.
inline std::string model_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

// A regular file's contents (never a FIFO: MappedFile refuses it at once).
std::string read_file(const std::string& path);

// Prompt tokens from --prompt / --prompt-file (the model's tokenizer) or --tokens.
std::vector<int32_t> prompt_tokens(const runtime::ModelFile& m, const std::string& prompt,
                                   const std::string& prompt_file, const std::vector<int32_t>& ids);

}  // namespace anchorkv::cli
