// The tokenizer a GGUF file's metadata describes (engine::load_tokenizer -> Tokenizer::from_gguf)
// against Hugging Face: tests/data/gguf/{qwen3,demo}_tokenizer.gguf were written by
// tests/reference/gguf_tokenizer.py as llama.cpp's converter writes a vocabulary (padded to the
// model's vocab_size, control / user-defined types, merges, special ids, chat template).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/loader.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace spool::engine {
namespace {

const std::string kData = SPOOL_TEST_DATA_DIR;
const std::string kDemo = SPOOL_DEFAULT_MODEL_DIR;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const tokenizer::Tokenizer& qwen3_gguf() {
  static const tokenizer::Tokenizer tok = *load_tokenizer(kData + "/gguf/qwen3_tokenizer.gguf");
  return tok;
}

TEST(GgufTokenizer, Qwen3EncodeCasesMatchHuggingFace) {
  const auto cases = nlohmann::json::parse(read_text(kData + "/tokenizer/qwen3/encode_cases.json"));
  ASSERT_GE(cases.size(), 50u);
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(qwen3_gguf().encode(text), ids) << text;
    EXPECT_EQ(qwen3_gguf().decode(ids), c["decoded"].get<std::string>()) << text;
  }
}

// Every added token keeps the id the file gives it; the special ids and the template are the
// file's; an unused padding id decodes to nothing HF has, but is in range.
TEST(GgufTokenizer, Qwen3SpecialTokensKeepTheirIds) {
  const tokenizer::Tokenizer& t = qwen3_gguf();
  const auto cfg = nlohmann::json::parse(read_text(kData + "/tokenizers/qwen3/tokenizer_config.json"));
  int checked = 0;
  for (const auto& [id, tok] : cfg["added_tokens_decoder"].items()) {
    const std::string content = tok["content"].get<std::string>();
    EXPECT_EQ(t.token_to_id(content), std::stoi(id)) << content;
    EXPECT_EQ(t.encode("a" + content + "b"), (std::vector<int32_t>{64, std::stoi(id), 65})) << content;
    EXPECT_EQ(t.is_special(std::stoi(id)), content.starts_with("<|")) << content;  // CONTROL <=> special
    ++checked;
  }
  EXPECT_EQ(checked, 26);
  EXPECT_EQ(t.eos_id(), 151645);
  EXPECT_FALSE(t.bos_id().has_value());  // add_bos_token false: nothing is prepended
  EXPECT_EQ(t.vocab_size(), 151936);
  EXPECT_EQ(t.chat_template(), cfg["chat_template"].get<std::string>());
}

// The chat goldens through the file's template and tokenizer: HF's rendering and ids.
TEST(GgufTokenizer, Qwen3ChatCasesMatchHuggingFace) {
  const tokenizer::Tokenizer& t = qwen3_gguf();
  const tmpl::Template tpl = tmpl::Template::parse(t.chat_template(), "qwen3_tokenizer.gguf");
  const nlohmann::ordered_json specials = tmpl::special_tokens_from_config(t.config());
  const auto cases = nlohmann::ordered_json::parse(read_text(kData + "/tokenizer/qwen3/chat_cases.json"));
  int with_ids = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    tmpl::ChatOptions opt;
    opt.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    if (c.contains("tools")) opt.tools = c["tools"];
    opt.extra_kwargs = nlohmann::ordered_json::object();
    if (c.contains("enable_thinking")) opt.extra_kwargs["enable_thinking"] = c["enable_thinking"];
    const std::string rendered = tmpl::apply_chat_template(tpl, c.at("messages"), opt, specials);
    EXPECT_EQ(rendered, c.at("rendered").get<std::string>()) << "case " << i;
    if (!c.contains("ids")) continue;
    EXPECT_EQ(t.encode(rendered), c["ids"].get<std::vector<int32_t>>()) << "case " << i;
    ++with_ids;
  }
  EXPECT_GE(with_ids, 4);
}

// The demo model's control tokens sit at ids 0..13 inside its BPE vocabulary: from the GGUF they
// keep those ids (they moved to 8189.. when control tokens were only added tokens), and the dev
// corpus tokenizes as with tokenizer.json.
TEST(GgufTokenizer, DemoEqualsItsTokenizerJson) {
  const tokenizer::Tokenizer g = *load_tokenizer(kData + "/gguf/demo_tokenizer.gguf");
  const tokenizer::Tokenizer h = tokenizer::Tokenizer::load(kDemo);
  for (int32_t id = 0; id < h.vocab_size(); ++id) {
    ASSERT_EQ(g.id_to_token(id), h.id_to_token(id)) << id;
    ASSERT_EQ(g.token_to_id(h.id_to_token(id)), id) << h.id_to_token(id);
  }
  EXPECT_EQ(g.token_to_id("<|vision_pad|>"), 11);
  const std::string dev = read_text(kData + "/corpus/dev.txt");
  ASSERT_GT(dev.size(), 100000u);
  const std::string text = dev.substr(0, 200000) + "<|im_start|>user\nHi<|im_end|>\n<think>\n</think>";
  EXPECT_EQ(g.encode(text), h.encode(text));
  EXPECT_EQ(g.chat_template(), h.chat_template());
  EXPECT_EQ(g.eos_id(), h.eos_id());
}

}  // namespace
}  // namespace spool::engine
