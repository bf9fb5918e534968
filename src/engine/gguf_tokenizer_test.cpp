// The tokenizer a GGUF file's metadata describes (engine::load_tokenizer -> Tokenizer::from_gguf)
// against Hugging Face: tests/data/gguf/{qwen3,demo}_tokenizer.gguf were written by
// tests/reference/gguf_tokenizer.py as llama.cpp's converter writes a vocabulary (padded to the
// model's vocab_size, control / user-defined types, merges, special ids, chat template).
// The DeepSeek-V3 vocabulary (1.3 MB compressed) is written here at test time from its
// tokenizer.json by the same rules (deepseek_v3_gguf); the SentencePiece ("llama") cases use tiny
// hand-made vocabularies with hand-derived ids.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/gguf_writer.h"
#include "common/error.h"
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

// --- DeepSeek-V3 (tokenizer.ggml.pre "deepseek-v3") ---------------------------------------

// llama.cpp's convert_hf_to_gguf.py does_token_look_special (the rules that matter here).
bool looks_special(const std::string& t) {
  return (t.starts_with("<|") && t.ends_with("|>")) || (t.starts_with("<\xef\xbd\x9c") && t.ends_with("\xef\xbd\x9c>")) ||
         t == "<pad>";
}

// tokenizer_config.json's "bos_token" etc.: a string or an AddedToken object.
std::string config_token(const nlohmann::json& cfg, const char* key) {
  const auto& v = cfg.at(key);
  return v.is_string() ? v.get<std::string>() : v.at("content").get<std::string>();
}

// Writes tests/data/tokenizers/deepseek_v3 as a GGUF vocabulary the way convert_hf_to_gguf.py
// (get_vocab_base + gguf.SpecialVocab) writes a byte-level BPE vocabulary: one token per id in
// [0, 129280) (DeepSeek-V3's config.json vocab_size; `[PADi]` UNUSED where the tokenizer has
// none), added tokens CONTROL when special or looking special, else USER_DEFINED with "▁" as a
// space, merges, bos/eos/pad ids from tokenizer_config.json, add_bos/add_eos, chat template.
std::string deepseek_v3_gguf() {
  static const std::string path = [] {
    const std::string dir = kData + "/tokenizers/deepseek_v3";
    const auto tj = nlohmann::json::parse(read_text(dir + "/tokenizer.json"));
    const auto cfg = nlohmann::json::parse(read_text(dir + "/tokenizer_config.json"));
    const int32_t vocab_size = 129280;
    std::map<int32_t, std::string> rev;
    std::map<int32_t, const nlohmann::json*> added;
    for (const auto& [tok, id] : tj["model"]["vocab"].items()) rev[id.get<int32_t>()] = tok;
    for (const auto& a : tj["added_tokens"]) {
      rev[a["id"].get<int32_t>()] = a["content"].get<std::string>();
      added[a["id"].get<int32_t>()] = &a;
    }
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    std::map<std::string, int32_t> ids;
    for (int32_t i = 0; i < vocab_size; ++i) {
      const auto r = rev.find(i);
      if (r == rev.end()) {
        tokens.push_back("[PAD" + std::to_string(i) + "]");
        types.push_back(5);
        continue;
      }
      std::string t = r->second;
      ids[t] = i;
      if (const auto a = added.find(i); a != added.end()) {
        if ((*a->second)["special"].get<bool>() || looks_special(t)) {
          types.push_back(3);
        } else {
          for (size_t k; (k = t.find("\xe2\x96\x81")) != std::string::npos;) t.replace(k, 3, " ");
          types.push_back(4);
        }
      } else {
        types.push_back(1);
      }
      tokens.push_back(t);
    }
    std::vector<std::string> merges;
    for (const auto& m : tj["model"]["merges"])
      merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
    testing::GgufWriter w;
    w.add_string("general.architecture", "deepseek2");
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "deepseek-v3");
    w.add_strings("tokenizer.ggml.tokens", tokens);
    w.add_i32s("tokenizer.ggml.token_type", types);
    w.add_strings("tokenizer.ggml.merges", merges);
    w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(ids.at(config_token(cfg, "bos_token"))));
    w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(ids.at(config_token(cfg, "eos_token"))));
    w.add_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(ids.at(config_token(cfg, "pad_token"))));
    w.add_bool("tokenizer.ggml.add_bos_token", cfg["add_bos_token"].get<bool>());
    w.add_bool("tokenizer.ggml.add_eos_token", cfg["add_eos_token"].get<bool>());
    w.add_string("tokenizer.chat_template", cfg["chat_template"].get<std::string>());
    const std::string out = ::testing::TempDir() + "gguf_tokenizer_test_deepseek_v3.gguf";
    w.write(out);
    return out;
  }();
  return path;
}

const tokenizer::Tokenizer& deepseek_gguf() {
  static const tokenizer::Tokenizer tok = *load_tokenizer(deepseek_v3_gguf());
  return tok;
}

TEST(GgufTokenizer, DeepSeekV3EncodeCasesMatchHuggingFace) {
  const auto cases = nlohmann::json::parse(read_text(kData + "/tokenizer/deepseek_v3/encode_cases.json"));
  ASSERT_GE(cases.size(), 50u);
  for (const auto& c : cases) {
    const std::string text = c["text"].get<std::string>();
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(deepseek_gguf().encode(text), ids) << text;
    EXPECT_EQ(deepseek_gguf().decode(ids), c["decoded"].get<std::string>()) << text;
  }
}

// add_bos_token true: encode(add_special) prepends <｜begin▁of▁sentence｜> (id 0) as transformers'
// add_special_tokens=True does; the ids of every token are those of tokenizer.json.
TEST(GgufTokenizer, DeepSeekV3SpecialTokensAndBos) {
  const tokenizer::Tokenizer& g = deepseek_gguf();
  const tokenizer::Tokenizer h = tokenizer::Tokenizer::load(kData + "/tokenizers/deepseek_v3");
  ASSERT_TRUE(g.bos_id().has_value());
  EXPECT_EQ(*g.bos_id(), 0);
  EXPECT_EQ(g.eos_id(), 1);
  EXPECT_EQ(g.encode("Hello world", true), h.encode("Hello world", true));
  EXPECT_EQ(g.encode("Hello world", true), (std::vector<int32_t>{0, 19923, 2058}));
  EXPECT_EQ(g.encode("", true), (std::vector<int32_t>{0}));
  for (int32_t id = 0; id < h.vocab_size(); ++id) {
    ASSERT_EQ(g.id_to_token(id), h.id_to_token(id)) << id;
    ASSERT_EQ(g.token_to_id(h.id_to_token(id)), id) << h.id_to_token(id);
  }
  EXPECT_EQ(g.vocab_size(), 129280);
  const std::string text = "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>Hi<\xef\xbd\x9c" "User\xef\xbd\x9c>x = 12345;";
  EXPECT_EQ(g.encode(text), h.encode(text));
  EXPECT_EQ(g.decode(g.encode(text)), text);
  EXPECT_EQ(g.decode(g.encode(text), true), "Hix = 12345;");
  const auto cfg = nlohmann::json::parse(read_text(kData + "/tokenizers/deepseek_v3/tokenizer_config.json"));
  EXPECT_EQ(g.chat_template(), cfg["chat_template"].get<std::string>());
}

// The rendered chat goldens tokenize to HF's ids through the GGUF vocabulary.
TEST(GgufTokenizer, DeepSeekV3ChatIdsMatchHuggingFace) {
  const auto cases = nlohmann::json::parse(read_text(kData + "/tokenizer/deepseek_v3/chat_cases.json"));
  int checked = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (!cases[i].contains("ids")) continue;
    const std::string rendered = cases[i]["rendered"].get<std::string>();
    EXPECT_EQ(deepseek_gguf().encode(rendered), cases[i]["ids"].get<std::vector<int32_t>>()) << "case " << i;
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

// --- SentencePiece BPE (tokenizer.ggml.model "llama") ------------------------------------

// A tiny SentencePiece vocabulary: <unk> <s> </s>, optionally the 256 byte tokens <0x00>..<0xFF>
// (type 6), then the pieces below with their scores.
struct SpmVocab {
  std::vector<std::string> tokens{"<unk>", "<s>", "</s>"};
  std::vector<float> scores{0, 0, 0};
  std::vector<int32_t> types{2, 3, 3};
  std::map<std::string, int32_t> id;

  explicit SpmVocab(bool byte_tokens) {
    if (byte_tokens)
      for (int b = 0; b < 256; ++b) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "<0x%02X>", b);
        add(hex, 0, 6);
      }
    // "▁" is U+2581. Scores as SentencePiece writes them (higher merges first).
    for (const auto& [piece, score] : std::vector<std::pair<std::string, float>>{
             {"\xe2\x96\x81", -1}, {"h", -2}, {"e", -2}, {"l", -2}, {"o", -2}, {"w", -2}, {"r", -2}, {"d", -2},
             {"\xe2\x96\x81h", -5}, {"he", -3}, {"el", -4}, {"ll", -1}, {"lo", -2}, {"llo", -6}, {"hell", -0.5f},
             {"\xe2\x96\x81w", -3}, {"or", -1.5f}, {"wor", -1}, {"\xe2\x96\x81wor", -0.8f}, {"ld", -2.5f},
             {"\xe2\x96\x81\xe2\x96\x81", -7}, {"\xe2\x96\x81he", -8}})
      add(piece, score, 1);
    add("<tool>", 0, 4);  // user-defined
  }
  void add(const std::string& t, float score, int32_t type) {
    id[t] = static_cast<int32_t>(tokens.size());
    tokens.push_back(t);
    scores.push_back(score);
    types.push_back(type);
  }
  // Writes the vocabulary as a GGUF file; `extra` adds keys (e.g. add_space_prefix).
  std::string write(const std::string& name, const std::function<void(testing::GgufWriter&)>& extra = {}) const {
    testing::GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_string("tokenizer.ggml.model", "llama");
    w.add_strings("tokenizer.ggml.tokens", tokens);
    w.add_f32s("tokenizer.ggml.scores", scores);
    w.add_i32s("tokenizer.ggml.token_type", types);
    w.add_u32("tokenizer.ggml.bos_token_id", 1);
    w.add_u32("tokenizer.ggml.eos_token_id", 2);
    w.add_u32("tokenizer.ggml.unknown_token_id", 0);
    if (extra) extra(w);
    const std::string path = ::testing::TempDir() + "gguf_tokenizer_test_" + name + ".gguf";
    w.write(path);
    return path;
  }
  int32_t operator[](const std::string& t) const { return id.at(t); }
};

std::string byte_token(int b) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "<0x%02X>", b);
  return hex;
}

// Ids derived by hand from the scores:
//  "hello" -> ▁ h e l l o: pairs ▁h -5, he -3, el -4, ll -1, lo -2; the best, ll, merges
//  (▁ h e ll o; new pair llo -6); then he -3 (▁ he ll o; new pairs ▁he -8, hell -0.5); then hell
//  (▁ hell o; ▁hell and hello are no tokens); the rest are stale or lower: ▁he -8 is stale.
//  Result ▁ hell o. (Lowest score first would merge ▁h first: ▁h e ll o ...; leftmost-first
//  would start with ▁h too.)
//  " world" -> ▁ ▁ w o r l d: ▁▁ -7, ▁w -3, wo -, or -1.5, rl -, ld -2.5: or merges (▁ ▁ w or l d;
//  new wor -1), then wor (▁ ▁ wor l d; ▁wor -0.8), then ▁wor (▁ ▁wor l d; ▁▁wor is none), then
//  ld -2.5 (▁ ▁wor ld), then ▁▁ is stale (its right side merged). Result ▁ ▁wor ld.
TEST(GgufTokenizerSpm, MergesByHighestScore) {
  const SpmVocab v(true);
  const tokenizer::Tokenizer t = *load_tokenizer(v.write("spm"));
  const std::string sp = "\xe2\x96\x81";
  EXPECT_EQ(t.encode("hello"), (std::vector<int32_t>{v[sp], v["hell"], v["o"]}));
  EXPECT_EQ(t.encode("hello  world"),
            (std::vector<int32_t>{v[sp], v["hell"], v["o"], v[sp], v[sp + "wor"], v["ld"]}));
  EXPECT_EQ(t.decode(t.encode("hello  world")), "hello  world");
  EXPECT_EQ(t.encode(""), std::vector<int32_t>{});
  EXPECT_EQ(t.encode(" "), (std::vector<int32_t>{v[sp + sp]}));
}

// Characters without a token are written as their UTF-8 bytes' <0xXX> tokens and decode back.
TEST(GgufTokenizerSpm, ByteFallback) {
  const SpmVocab v(true);
  const tokenizer::Tokenizer t = *load_tokenizer(v.write("spm"));
  const std::string sp = "\xe2\x96\x81";
  // "hi€": ▁ h i €; only ▁h (-5) is a pair token: ▁h, then i and € (E2 82 AC) as bytes.
  EXPECT_EQ(t.encode("hi\xe2\x82\xac"), (std::vector<int32_t>{v[sp + "h"], v[byte_token('i')], v[byte_token(0xE2)],
                                                              v[byte_token(0x82)], v[byte_token(0xAC)]}));
  EXPECT_EQ(t.decode(t.encode("hi\xe2\x82\xac")), "hi\xe2\x82\xac");
  EXPECT_EQ(t.decode(t.encode("\n\thello")), "\n\thello");
  // One token's bytes (the logprobs' "bytes"/"token"): the space for ▁, the byte of <0xXX>.
  EXPECT_EQ(t.id_to_bytes(v[sp + "h"]), " h");
  EXPECT_EQ(t.id_to_bytes(v[byte_token('\n')]), "\n");
  EXPECT_EQ(t.id_to_bytes(-1), "");
}

// Without byte tokens, a character that is no token is the unknown token (one per character).
TEST(GgufTokenizerSpm, UnknownTokenWithoutByteFallback) {
  const SpmVocab v(false);
  const tokenizer::Tokenizer t = *load_tokenizer(v.write("spm_nobytes"));
  const std::string sp = "\xe2\x96\x81";
  EXPECT_EQ(t.encode("hq\xe2\x82\xac"), (std::vector<int32_t>{v[sp + "h"], 0, 0}));
  EXPECT_EQ(t.decode(t.encode("hq"), true), "h");
}

// BOS: added by encode(add_special) (llama.cpp's default for SentencePiece, also when the file
// has no add_bos_token); added tokens are matched in the text and the text after them gets the
// prefix space again, as llama.cpp does; add_space_prefix false drops the prefix.
TEST(GgufTokenizerSpm, SpecialTokensBosAndSpacePrefix) {
  const SpmVocab v(true);
  const std::string sp = "\xe2\x96\x81";
  const tokenizer::Tokenizer t = *load_tokenizer(v.write("spm"));
  EXPECT_EQ(t.encode("hello", true), (std::vector<int32_t>{1, v[sp], v["hell"], v["o"]}));
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.encode("<s>hello<tool>world</s>"),
            (std::vector<int32_t>{1, v[sp], v["hell"], v["o"], v["<tool>"], v[sp + "wor"], v["ld"], 2}));
  EXPECT_TRUE(t.is_special(1));
  EXPECT_FALSE(t.is_special(v["<tool>"]));
  EXPECT_EQ(t.decode(t.encode("hello world", true)), "<s> hello world");
  EXPECT_EQ(t.decode(t.encode("hello world", true), true), "hello world");

  const tokenizer::Tokenizer np = *load_tokenizer(v.write("spm_noprefix", [](testing::GgufWriter& w) {
    w.add_bool("tokenizer.ggml.add_space_prefix", false);
    w.add_bool("tokenizer.ggml.add_bos_token", false);
  }));
  EXPECT_EQ(np.encode("hello", true), (std::vector<int32_t>{v["hell"], v["o"]}));
  EXPECT_EQ(np.decode(np.encode(" hello")), " hello");
  EXPECT_FALSE(np.bos_id().has_value());
}

// A tiny byte-level BPE vocabulary (GPT-2 byte alphabet: 0xC3 'Ã', 0xA9 '©', 0xCC 'Ì', 0x81 'ģ')
// under tokenizer.ggml.pre `pre`.
std::string tiny_bpe_gguf(const std::string& pre) {
  testing::GgufWriter w;
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", pre);
  w.add_strings("tokenizer.ggml.tokens", {"e", "\xc3\x83", "\xc2\xa9", "\xc3\x83\xc2\xa9", "\xc3\x8c", "\xc4\xa3",
                                          "\xc3\x8c\xc4\xa3", "a", "b", "c", "ab", "abc"});
  w.add_strings("tokenizer.ggml.merges", {"\xc3\x83 \xc2\xa9", "\xc3\x8c \xc4\xa3", "a b"});
  const std::string path = ::testing::TempDir() + "gguf_tokenizer_test_tiny_" + pre + ".gguf";
  w.write(path);
  return path;
}

// What a `pre` brings besides its regex, as llama.cpp's HF reference cases show: qwen2 normalizes
// with NFC (decomposed "e\u0301" becomes "é", id 3), qwen35 does not (e + U+0301: ids 0, 6);
// llama-bpe ignores merges for a word that is a token ("abc" is id 11, not ab c).
TEST(GgufTokenizer, PreNormalizerAndIgnoreMerges) {
  const std::string decomposed = "e\xcc\x81";
  EXPECT_EQ(load_tokenizer(tiny_bpe_gguf("qwen2"))->encode(decomposed), (std::vector<int32_t>{3}));
  EXPECT_EQ(load_tokenizer(tiny_bpe_gguf("qwen35"))->encode(decomposed), (std::vector<int32_t>{0, 6}));
  EXPECT_EQ(load_tokenizer(tiny_bpe_gguf("llama-bpe"))->encode("abc"), (std::vector<int32_t>{11}));
  EXPECT_EQ(load_tokenizer(tiny_bpe_gguf("gpt-2"))->encode("abc"), (std::vector<int32_t>{10, 9}));
}

// The word boundaries each `pre` draws, seen through merges that only apply inside one word:
// "o W" (the case change in "HelloWorld"), "3 4" (a digit run cut after 3 digits), "W o". Tokens:
// single characters (ids 0-11), "oW" (12), "34" (13), "Wo" (14) (ASCII is its own byte-level form).
// o200k (gpt-4o, minimax-m2, llama4) cuts at the case change and after "123"; Llama 3's regex
// (llama-bpe, glm4) keeps "HelloWorld" whole and cuts the digits; GPT-2's (gpt-2, olmo) keeps both.
// GLM-4 has Llama 3's regex but not its ignore_merges: "abc" (a token) is a b c merged as ab c, and
// never a BOS (llama.cpp); OLMo's tokenizer (allenai/gpt-neox-olmo-dolma-v1_5) normalizes with NFC.
TEST(GgufTokenizer, PreWordBoundaries) {
  auto tokenizer = [](const std::string& pre) {
    testing::GgufWriter w;
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", pre);
    w.add_strings("tokenizer.ggml.tokens",
                  {"H", "e", "l", "o", "W", "r", "d", "1", "2", "3", "4", "5", "oW", "34", "Wo"});
    w.add_strings("tokenizer.ggml.merges", {"o W", "3 4", "W o"});
    const std::string path = ::testing::TempDir() + "gguf_tokenizer_test_words_" + pre + ".gguf";
    w.write(path);
    return load_tokenizer(path);
  };
  const std::string text = "HelloWorld12345";
  const std::vector<int32_t> o200k = {0, 1, 2, 2, 3, 14, 5, 2, 6, 7, 8, 9, 10, 11};      // Hello World 123 45
  const std::vector<int32_t> llama3 = {0, 1, 2, 2, 12, 3, 5, 2, 6, 7, 8, 9, 10, 11};     // HelloWorld 123 45
  const std::vector<int32_t> gpt2 = {0, 1, 2, 2, 12, 3, 5, 2, 6, 7, 8, 13, 11};          // HelloWorld 12345
  for (const char* pre : {"gpt-4o", "minimax-m2", "llama4"}) EXPECT_EQ(tokenizer(pre)->encode(text), o200k) << pre;
  for (const char* pre : {"llama-bpe", "glm4", "chatglm-bpe"}) EXPECT_EQ(tokenizer(pre)->encode(text), llama3) << pre;
  for (const char* pre : {"gpt-2", "olmo"}) EXPECT_EQ(tokenizer(pre)->encode(text), gpt2) << pre;
  EXPECT_EQ(load_tokenizer(tiny_bpe_gguf("glm4"))->encode("abc"), (std::vector<int32_t>{10, 9}));
  EXPECT_EQ(load_tokenizer(tiny_bpe_gguf("llama-bpe"))->encode("abc"), (std::vector<int32_t>{11}));
  EXPECT_EQ(load_tokenizer(tiny_bpe_gguf("olmo"))->encode("e\xcc\x81"), (std::vector<int32_t>{3}));
  testing::GgufWriter w;
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "glm4");
  w.add_strings("tokenizer.ggml.tokens", {"[gMASK]", "a", "b", "ab"});
  w.add_i32s("tokenizer.ggml.token_type", {3, 1, 1, 1});
  w.add_strings("tokenizer.ggml.merges", {"a b"});
  w.add_u32("tokenizer.ggml.bos_token_id", 0);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  const std::string path = ::testing::TempDir() + "gguf_tokenizer_test_glm_bos.gguf";
  w.write(path);
  const auto glm = load_tokenizer(path);
  EXPECT_EQ(glm->encode("ab"), (std::vector<int32_t>{3}));
  EXPECT_EQ(glm->encode("ab", /*add_special=*/true), (std::vector<int32_t>{3}));
  EXPECT_FALSE(glm->bos_id().has_value());
}

// An unknown tokenizer.ggml.model or tokenizer.ggml.pre is an error naming it and the file.
TEST(GgufTokenizer, UnknownModelOrPreIsAClearError) {
  auto expect_error = [](const std::string& model, const std::string& pre, const std::string& name,
                         const std::string& want) {
    testing::GgufWriter w;
    w.add_string("tokenizer.ggml.model", model);
    w.add_string("tokenizer.ggml.pre", pre);
    w.add_strings("tokenizer.ggml.tokens", {"a", "b", "ab"});
    w.add_strings("tokenizer.ggml.merges", {"a b"});
    const std::string path = ::testing::TempDir() + "gguf_tokenizer_test_" + name + ".gguf";
    w.write(path);
    try {
      (void)load_tokenizer(path);
      ADD_FAILURE() << "no error for " << want;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(want), std::string::npos) << msg;
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
    }
  };
  expect_error("bert", "default", "bad_model", "tokenizer.ggml.model 'bert' is not supported");
  expect_error("gpt2", "my-new-pre", "bad_pre", "tokenizer.ggml.pre 'my-new-pre' is not supported");
}

}  // namespace
}  // namespace spool::engine
