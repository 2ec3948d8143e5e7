// Chat templates for /v1/chat/completions: the common families, rendered to
// prompt text. Detected from a GGUF's tokenizer.chat_template (Jinja source)
// by the markers each family uses, or named with --chat-template.
#pragma once

#include <string>
#include <vector>

namespace anchorkv::serve {

enum class ChatTemplate { kNone, kChatML, kLlama3, kMistral };

struct ChatMessage {
  std::string role, content;  // system, user or assistant
};

// `name` ("chatml", "llama3", "mistral"; empty = detect from `gguf_template`).
// Throws Error(kInvalidArgument) for an unknown name; kNone when nothing matches.
ChatTemplate pick_chat_template(const std::string& name, const std::string& gguf_template);
const char* chat_template_name(ChatTemplate t);
// The conversation, ending where the assistant's answer begins.
std::string render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages);
// Whether the tokenizer should add BOS (Llama 3's template writes its own).
bool chat_adds_bos(ChatTemplate t);
// Text that ends the assistant's turn (used as stop strings).
const std::vector<std::string>& chat_stops(ChatTemplate t);

}  // namespace anchorkv::serve
