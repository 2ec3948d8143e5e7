#include "serve/chat.h"

#include "anchorkv/status.h"

namespace anchorkv::serve {

ChatTemplate pick_chat_template(const std::string& name, const std::string& gguf_template) {
  if (name == "chatml") return ChatTemplate::kChatML;
  if (name == "llama3") return ChatTemplate::kLlama3;
  if (name == "mistral" || name == "llama2") return ChatTemplate::kMistral;
  if (!name.empty())
    throw Error(ErrorCode::kInvalidArgument, "anchorkv serve",
                "unknown --chat-template '" + name + "' (chatml, llama3, mistral)");
  if (gguf_template.find("<|im_start|>") != std::string::npos) return ChatTemplate::kChatML;
  if (gguf_template.find("<|start_header_id|>") != std::string::npos) return ChatTemplate::kLlama3;
  if (gguf_template.find("[INST]") != std::string::npos) return ChatTemplate::kMistral;
  return ChatTemplate::kNone;
}

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kChatML: return "chatml";
    case ChatTemplate::kLlama3: return "llama3";
    case ChatTemplate::kMistral: return "mistral";
    case ChatTemplate::kNone: break;
  }
  return "none";
}

std::string render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  std::string out;
  switch (t) {
    case ChatTemplate::kChatML:
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      return out + "<|im_start|>assistant\n";
    case ChatTemplate::kLlama3:
      out = "<|begin_of_text|>";
      for (const auto& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatTemplate::kMistral: {
      std::string system;
      for (const auto& m : messages) {
        if (m.role == "system") {
          system += m.content + "\n\n";
        } else if (m.role == "user") {
          out += "[INST] " + system + m.content + " [/INST]";
          system.clear();
        } else {
          out += " " + m.content + "</s>";
        }
      }
      return out;
    }
    case ChatTemplate::kNone: break;
  }
  return out;
}

bool chat_adds_bos(ChatTemplate t) { return t != ChatTemplate::kLlama3; }

const std::vector<std::string>& chat_stops(ChatTemplate t) {
  static const std::vector<std::string> chatml = {"<|im_end|>"}, llama3 = {"<|eot_id|>"}, mistral = {"</s>"},
                                        none = {};
  switch (t) {
    case ChatTemplate::kChatML: return chatml;
    case ChatTemplate::kLlama3: return llama3;
    case ChatTemplate::kMistral: return mistral;
    case ChatTemplate::kNone: break;
  }
  return none;
}

}  // namespace anchorkv::serve
