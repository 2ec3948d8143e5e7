// anchorkv::Runtime: the public face of the model runtime (include/anchorkv/runtime.h).
#include "anchorkv/runtime.h"

#include <optional>

#include "core/error.h"
#include "runtime/model_file.h"
#include "runtime/session.h"
#include "io/gguf.h"
#include "model/llama.h"
#include "model/tokenizer.h"

namespace anchorkv {

struct Runtime::Impl {
  runtime::ModelFile file;
  std::unique_ptr<model::LlamaModel> model;  // holds a reference to file.weights: Impl never moves
};

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Runtime::~Runtime() = default;
Runtime::Runtime(Runtime&&) noexcept = default;
Runtime& Runtime::operator=(Runtime&&) noexcept = default;

Runtime Runtime::load(const std::string& model_path, const std::string& cache, double theta, int threads) {
  auto impl = std::make_unique<Impl>();
  impl->file = runtime::ModelFile::open(model_path);
  impl->model = std::make_unique<model::LlamaModel>(runtime::make_model(impl->file.weights, cache, theta, threads));
  return Runtime(std::move(impl));
}

std::vector<int32_t> Runtime::tokenize(const std::string& text, bool add_bos) const {
  if (!impl_->file.tokenizer)
    core::fail(ErrorCode::kUnsupported, "anchorkv::Runtime::tokenize", "this model carries no tokenizer");
  return impl_->file.tokenizer->encode(text, add_bos);
}

std::string Runtime::detokenize(const std::vector<int32_t>& tokens) const {
  if (!impl_->file.tokenizer)
    core::fail(ErrorCode::kUnsupported, "anchorkv::Runtime::detokenize", "this model carries no tokenizer");
  return impl_->file.tokenizer->decode(tokens);
}

std::vector<float> Runtime::forward(const std::vector<int32_t>& tokens) { return impl_->model->forward(tokens); }
std::vector<float> Runtime::prefill(const std::vector<int32_t>& prompt) {
  return runtime::prefill_prompt(*impl_->model, prompt);
}
int64_t Runtime::position() const { return impl_->model->position(); }
int64_t Runtime::vocab() const { return impl_->file.weights.config.vocab; }
int64_t Runtime::cache_bytes() const { return runtime::cache_totals(*impl_->model).bytes; }
int64_t Runtime::cache_full_bytes() const { return runtime::cache_totals(*impl_->model).full; }

}  // namespace anchorkv
