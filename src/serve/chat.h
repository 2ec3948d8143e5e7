// Chat templates for /v1/chat/completions: the common families, rendered to
// prompt text. Detected from a GGUF's tokenizer.chat_template (Jinja source)
// by the markers each family uses, or named with --chat-template.
//
// A rendering is a list of parts: the template's markers (`<|im_start|>`,
// `<start_of_turn>`, ...) and text. encode_chat turns each marker into the
// special token it is, and tokenizes the text between markers as plain text,
// so a marker's text typed inside a message stays text (no prompt injection).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace anchorkv::model {
class Tokenizer;
}

namespace anchorkv::serve {

enum class ChatTemplate {
  kNone,
  kChatML,          // <|im_start|>role\n...<|im_end|> (Qwen2)
  kChatMLThinking,  // ChatML whose assistant turns may open with <think>...</think> (Qwen3): dropped from history
  kLlama3,          // <|start_header_id|>role<|end_header_id|>
  kMistral,         // [INST] ... [/INST] (Mistral, Llama 2)
  kGemma,           // <start_of_turn>user / model ... <end_of_turn> (Gemma 2, 3)
  kPhi3,            // <|system|> <|user|> <|assistant|> ... <|end|>
};

struct ChatMessage {
  std::string role, content;  // system, user or assistant
};

struct ChatPart {
  std::string text;
  bool marker = false;  // the template's own special token
};

// `name` (chatml, chatml-thinking, qwen3, llama3, mistral, llama2, gemma, phi3;
// empty = detect from `gguf_template`). Throws Error(kInvalidArgument) for an
// unknown name; kNone when nothing matches.
ChatTemplate pick_chat_template(const std::string& name, const std::string& gguf_template);
const char* chat_template_name(ChatTemplate t);
// The conversation, ending where the assistant's answer begins.
std::vector<ChatPart> render_chat_parts(ChatTemplate t, const std::vector<ChatMessage>& messages);
std::string render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages);  // the parts joined
// The token ids of the rendering: markers as their special tokens (as text
// when the vocabulary has no such token), BOS when the template wants it.
// `stop` is the tokenizer's (model::Tokenizer::encode): true ends the work
// with Error(kCancelled).
std::vector<int32_t> encode_chat(ChatTemplate t, const std::vector<ChatMessage>& messages,
                                 const model::Tokenizer& tok, const std::function<bool()>& stop = {});
// Whether the tokenizer should add BOS (Llama 3's template writes its own).
bool chat_adds_bos(ChatTemplate t);
// Text that ends the assistant's turn (used as stop strings).
const std::vector<std::string>& chat_stops(ChatTemplate t);

}  // namespace anchorkv::serve
