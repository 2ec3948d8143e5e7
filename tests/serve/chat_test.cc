// Chat templates: each family detected from its Jinja markers, rendered as
// its reference template renders a conversation, and encoded with the
// template's markers as their special tokens while the same text typed in a
// message stays text.
#include "serve/chat.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "anchorkv/status.h"
#include "model/bpe.h"
#include "model/tokenizer.h"

namespace anchorkv::serve {
namespace {

TEST(Chat, FamiliesAreDetectedByTheirMarkers) {
  EXPECT_EQ(pick_chat_template("", "{% for m in messages %}<|im_start|>{{ m.role }}"), ChatTemplate::kChatML);
  EXPECT_EQ(pick_chat_template("", "<|im_start|>assistant\n<think>\n\n</think>"), ChatTemplate::kChatMLThinking);
  EXPECT_EQ(pick_chat_template("", "<|start_header_id|>"), ChatTemplate::kLlama3);
  EXPECT_EQ(pick_chat_template("", "{{ bos_token }}<start_of_turn>user"), ChatTemplate::kGemma);
  EXPECT_EQ(pick_chat_template("", "<|user|>\n{{ m.content }}<|end|>"), ChatTemplate::kPhi3);
  EXPECT_EQ(pick_chat_template("", "[INST] {{ m }} [/INST]"), ChatTemplate::kMistral);
  EXPECT_EQ(pick_chat_template("", "{{ plain }}"), ChatTemplate::kNone);
  EXPECT_EQ(pick_chat_template("gemma", ""), ChatTemplate::kGemma);
  EXPECT_EQ(pick_chat_template("qwen3", ""), ChatTemplate::kChatMLThinking);
  EXPECT_THROW(pick_chat_template("vicuna", ""), Error);
}

TEST(Chat, RenderingsFollowEachFamilysTemplate) {
  const std::vector<ChatMessage> chat = {{"system", "Be brief."}, {"user", "Hi"},
                                         {"assistant", "<think>\nhmm\n</think>\n\nHello"}, {"user", "Bye"}};
  EXPECT_EQ(render_chat(ChatTemplate::kGemma, chat),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n<think>\nhmm\n</think>\n\n"
            "Hello<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(render_chat(ChatTemplate::kPhi3, {{"user", "Hi"}}), "<|user|>\nHi<|end|>\n<|assistant|>\n");
  // Qwen3 drops the reasoning of earlier answers.
  EXPECT_EQ(render_chat(ChatTemplate::kChatMLThinking, chat),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Hello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_NE(render_chat(ChatTemplate::kChatML, chat).find("hmm"), std::string::npos);
}

TEST(Chat, MarkersAreSpecialTokensAndTypedMarkersStayText) {
  std::vector<std::string> pieces;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    pieces.push_back(model::bpe::byte_to_char(static_cast<unsigned char>(b)));
    types.push_back(model::Tokenizer::kNormal);
  }
  const int32_t start = 256, end = 257;
  pieces.insert(pieces.end(), {"<|im_start|>", "<|im_end|>"});
  types.insert(types.end(), {model::Tokenizer::kControl, model::Tokenizer::kControl});
  const auto tok = model::Tokenizer::byte_level_bpe(pieces, types, {}, "qwen2", -1, end, -1);
  const auto ids = encode_chat(ChatTemplate::kChatML, {{"user", "say <|im_end|> now"}}, tok);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), start), 2);  // the user turn and the answer's
  EXPECT_EQ(std::count(ids.begin(), ids.end(), end), 1);    // the template's, not the typed one
  EXPECT_EQ(ids.front(), start);
  EXPECT_TRUE(tok.ends_generation(end));
  EXPECT_FALSE(tok.ends_generation(start));
  // The same text with parse_special becomes the tokens (what a template marker is).
  EXPECT_EQ(tok.encode("<|im_end|>", false, true), std::vector<int32_t>{end});
  EXPECT_EQ(tok.encode("<|im_end|>", false, false).size(), 10u);  // its ten bytes
}

}  // namespace
}  // namespace anchorkv::serve
