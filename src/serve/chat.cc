#include "serve/chat.h"

#include "anchorkv/status.h"
#include "model/tokenizer.h"

namespace anchorkv::serve {
namespace {

// Builds a rendering: markers and text, adjacent text merged.
struct Parts {
  std::vector<ChatPart> out;
  Parts& mark(const std::string& m) {
    out.push_back({m, true});
    return *this;
  }
  Parts& text(const std::string& t) {
    if (t.empty()) return *this;
    if (!out.empty() && !out.back().marker)
      out.back().text += t;
    else
      out.push_back({t, false});
    return *this;
  }
};

// Qwen3's template keeps only what follows </think> of earlier answers.
std::string without_thinking(const std::string& content) {
  const size_t end = content.rfind("</think>");
  if (end == std::string::npos) return content;
  std::string rest = content.substr(end + 8);
  while (!rest.empty() && rest.front() == '\n') rest.erase(0, 1);
  return rest;
}

void chatml(Parts& p, const std::vector<ChatMessage>& messages, bool thinking) {
  for (const auto& m : messages) {
    const bool answer = m.role == "assistant";
    p.mark("<|im_start|>").text(m.role + "\n" + (thinking && answer ? without_thinking(m.content) : m.content));
    p.mark("<|im_end|>").text("\n");
  }
  p.mark("<|im_start|>").text("assistant\n");
}

void mistral(Parts& p, const std::vector<ChatMessage>& messages) {
  std::string system;
  for (const auto& m : messages) {
    if (m.role == "system") {
      system += m.content + "\n\n";
    } else if (m.role == "user") {
      p.mark("[INST]").text(" " + system + m.content + " ").mark("[/INST]");
      system.clear();
    } else {
      p.text(" " + m.content).mark("</s>");
    }
  }
}

// Gemma has no system role: the system text opens the first user turn.
void gemma(Parts& p, const std::vector<ChatMessage>& messages) {
  std::string system;
  for (const auto& m : messages) {
    if (m.role == "system") {
      system += m.content + "\n\n";
      continue;
    }
    p.mark("<start_of_turn>").text((m.role == "assistant" ? "model" : m.role) + "\n" + system + m.content);
    p.mark("<end_of_turn>").text("\n");
    system.clear();
  }
  p.mark("<start_of_turn>").text("model\n");
}

void phi3(Parts& p, const std::vector<ChatMessage>& messages) {
  for (const auto& m : messages) p.mark("<|" + m.role + "|>").text("\n" + m.content).mark("<|end|>").text("\n");
  p.mark("<|assistant|>").text("\n");
}

}  // namespace

ChatTemplate pick_chat_template(const std::string& name, const std::string& gguf_template) {
  if (name == "chatml") return ChatTemplate::kChatML;
  if (name == "chatml-thinking" || name == "qwen3") return ChatTemplate::kChatMLThinking;
  if (name == "llama3") return ChatTemplate::kLlama3;
  if (name == "mistral" || name == "llama2") return ChatTemplate::kMistral;
  if (name == "gemma") return ChatTemplate::kGemma;
  if (name == "phi3") return ChatTemplate::kPhi3;
  if (!name.empty())
    throw Error(ErrorCode::kInvalidArgument, "anchorkv serve",
                "unknown --chat-template '" + name + "' (chatml, qwen3, llama3, mistral, gemma, phi3)");
  auto has = [&](const char* marker) { return gguf_template.find(marker) != std::string::npos; };
  if (has("<|im_start|>")) return has("<think>") ? ChatTemplate::kChatMLThinking : ChatTemplate::kChatML;
  if (has("<|start_header_id|>")) return ChatTemplate::kLlama3;
  if (has("<start_of_turn>")) return ChatTemplate::kGemma;
  if (has("<|user|>") && has("<|end|>")) return ChatTemplate::kPhi3;
  if (has("[INST]")) return ChatTemplate::kMistral;
  return ChatTemplate::kNone;
}

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kChatML: return "chatml";
    case ChatTemplate::kChatMLThinking: return "qwen3";
    case ChatTemplate::kLlama3: return "llama3";
    case ChatTemplate::kMistral: return "mistral";
    case ChatTemplate::kGemma: return "gemma";
    case ChatTemplate::kPhi3: return "phi3";
    case ChatTemplate::kNone: break;
  }
  return "none";
}

std::vector<ChatPart> render_chat_parts(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  Parts p;
  switch (t) {
    case ChatTemplate::kChatML: chatml(p, messages, false); break;
    case ChatTemplate::kChatMLThinking: chatml(p, messages, true); break;
    case ChatTemplate::kLlama3:
      p.mark("<|begin_of_text|>");
      for (const auto& m : messages)
        p.mark("<|start_header_id|>").text(m.role).mark("<|end_header_id|>").text("\n\n" + m.content).mark("<|eot_id|>");
      p.mark("<|start_header_id|>").text("assistant").mark("<|end_header_id|>").text("\n\n");
      break;
    case ChatTemplate::kMistral: mistral(p, messages); break;
    case ChatTemplate::kGemma: gemma(p, messages); break;
    case ChatTemplate::kPhi3: phi3(p, messages); break;
    case ChatTemplate::kNone: break;
  }
  return p.out;
}

std::string render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const ChatPart& part : render_chat_parts(t, messages)) out += part.text;
  return out;
}

std::vector<int32_t> encode_chat(ChatTemplate t, const std::vector<ChatMessage>& messages,
                                 const model::Tokenizer& tok, const std::function<bool()>& stop) {
  std::vector<int32_t> ids;
  if (chat_adds_bos(t) && tok.adds_bos()) ids.push_back(tok.bos());
  for (const ChatPart& part : render_chat_parts(t, messages)) {
    const int32_t special = part.marker ? tok.special_token(part.text) : -1;
    if (special >= 0) {
      ids.push_back(special);
      continue;
    }
    // Text, and a marker the vocabulary lacks (Llama 2's [INST]): plain text.
    const std::vector<int32_t> piece = tok.encode(part.text, /*add_bos=*/false, /*parse_special=*/false, stop);
    ids.insert(ids.end(), piece.begin(), piece.end());
  }
  return ids;
}

bool chat_adds_bos(ChatTemplate t) { return t != ChatTemplate::kLlama3; }

const std::vector<std::string>& chat_stops(ChatTemplate t) {
  static const std::vector<std::string> chatml = {"<|im_end|>"}, llama3 = {"<|eot_id|>"}, mistral = {"</s>"},
                                        gemma = {"<end_of_turn>"}, phi3 = {"<|end|>", "<|endoftext|>"}, none = {};
  switch (t) {
    case ChatTemplate::kChatML:
    case ChatTemplate::kChatMLThinking: return chatml;
    case ChatTemplate::kLlama3: return llama3;
    case ChatTemplate::kMistral: return mistral;
    case ChatTemplate::kGemma: return gemma;
    case ChatTemplate::kPhi3: return phi3;
    case ChatTemplate::kNone: break;
  }
  return none;
}

}  // namespace anchorkv::serve
