// Tests of the tokenizer's building blocks (UTF-8 repair, byte alphabet) and of every
// pre-tokenizer / added-token option on a tiny synthetic byte-level BPE. Expected ids were
// computed with Hugging Face `tokenizers` 0.23 on the same tokenizer.json.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "tokenizer/byte_level.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace spool::tokenizer {
namespace {

using Ids = std::vector<int32_t>;
const std::string kFFFD = "\xEF\xBF\xBD";

TEST(Utf8, LossyRepairFollowsMaximalSubpartRule) {
  // Expected strings as produced by Python bytes.decode("utf-8", errors="replace").
  EXPECT_EQ(utf8::to_valid("abc"), "abc");
  EXPECT_EQ(utf8::to_valid("\xF0\x9F\x98"), kFFFD);  // truncated 4-byte
  EXPECT_EQ(utf8::to_valid("\xF0\x9F\x98"
                           "a"),
            kFFFD + "a");
  EXPECT_EQ(utf8::to_valid("\xE0\x80\x80"), kFFFD + kFFFD + kFFFD);  // overlong
  EXPECT_EQ(utf8::to_valid("\xED\xA0\x80"), kFFFD + kFFFD + kFFFD);  // surrogate
  EXPECT_EQ(utf8::to_valid("\xC0\xAF"), kFFFD + kFFFD);
  EXPECT_EQ(utf8::to_valid("\xF4\x90\x80\x80"), kFFFD + kFFFD + kFFFD + kFFFD);
  EXPECT_EQ(utf8::to_valid("\xE2\x82"), kFFFD);
  EXPECT_EQ(utf8::to_valid("\x80\xBF"), kFFFD + kFFFD);
  EXPECT_EQ(utf8::to_valid("\xFF\xFE"), kFFFD + kFFFD);
  EXPECT_EQ(utf8::to_valid("\xE2\x82\xAC\xE2"), "\xE2\x82\xAC" + kFFFD);
  EXPECT_TRUE(utf8::is_valid("héllo 😀"));
  EXPECT_FALSE(utf8::is_valid("h\xC3"));
}

TEST(Utf8, CompletePrefixHoldsBackOnlyIncompleteTail) {
  EXPECT_EQ(utf8::complete_prefix("ab"), 2u);
  EXPECT_EQ(utf8::complete_prefix("a\xF0\x9F\x98"), 1u);  // 3 of 4 bytes: wait
  EXPECT_EQ(utf8::complete_prefix("a\xF0\x9F\x98\x80"), 5u);
  EXPECT_EQ(utf8::complete_prefix("a\xFF"), 2u);      // never valid: emit now
  EXPECT_EQ(utf8::complete_prefix("a\xE0\x80"), 3u);  // E0 80 can never complete
  EXPECT_EQ(utf8::complete_prefix(""), 0u);
}

TEST(ByteLevel, AlphabetIsTheGpt2Table) {
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = byte_level::byte_to_codepoint(static_cast<uint8_t>(b));
    EXPECT_EQ(byte_level::codepoint_to_byte(cp), b);
    seen.insert(cp);
  }
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(byte_level::byte_to_utf8(' '), "Ġ");
  EXPECT_EQ(byte_level::byte_to_utf8('\n'), "Ċ");
  EXPECT_EQ(byte_level::byte_to_utf8('A'), "A");
  EXPECT_EQ(byte_level::byte_to_codepoint(0x00), 0x100u);
  EXPECT_EQ(byte_level::byte_to_codepoint(0xAD), 0x143u);
  EXPECT_EQ(byte_level::token_to_bytes("ĠHello"), " Hello");
  // A token with characters outside the alphabet decodes to its own text.
  EXPECT_EQ(byte_level::token_to_bytes("<｜tool▁sep｜>"), "<｜tool▁sep｜>");
  std::string mapped;
  byte_level::map_bytes("a b\n", mapped);
  EXPECT_EQ(mapped, "aĠbĊ");
}

// A tiny byte-level BPE: ids 0..255 are the bytes (in alphabet form), then
// he=256 ll=257 hell=258 hello=259 Ġw=260 or=261 Ġwor=262 12=263.
nlohmann::json tiny(const nlohmann::json& pre_tokenizer,
                    const nlohmann::json& added = nlohmann::json::array(),
                    const nlohmann::json& normalizer = nullptr) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b)
    vocab[std::string(byte_level::byte_to_utf8(static_cast<uint8_t>(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"},
      {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}, {"1", "2"}};
  nlohmann::json m = nlohmann::json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = static_cast<int>(vocab.size());
    m.push_back({a, b});
  }
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", normalizer},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", nullptr},
          {"decoder",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", false},
            {"use_regex", false}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"vocab", vocab},
            {"merges", m}}}};
}

const nlohmann::json kByteLevel = {{"type", "ByteLevel"},
                                   {"add_prefix_space", false},
                                   {"trim_offsets", false},
                                   {"use_regex", false}};

nlohmann::json seq(const nlohmann::json& first) {
  return {{"type", "Sequence"}, {"pretokenizers", {first, kByteLevel}}};
}

const nlohmann::json kByteLevelOnly = {{"type", "Sequence"}, {"pretokenizers", {kByteLevel}}};

const std::vector<std::string> kTexts = {"hello world 12 hello", "hello  world123",
                                         " hello\n\nworld 1212x"};

void expect_encodes(const nlohmann::json& j, const std::vector<std::string>& texts,
                    const std::vector<Ids>& expected, const std::string& what) {
  const Tokenizer t = Tokenizer::from_json(j.dump(), "", what);
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(t.encode(texts[i]), expected[i]) << what << " / " << texts[i];
  }
}

nlohmann::json split(const char* behavior, bool invert) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", "\\s+|\\d"}}},
          {"behavior", behavior},
          {"invert", invert}};
}

TEST(PreTokenizer, SplitBehaviours) {
  expect_encodes(
      tiny(seq(split("Removed", false))), kTexts,
      {{259, 119, 261, 108, 100, 259}, {259, 119, 261, 108, 100}, {259, 119, 261, 108, 100, 120}},
      "Removed");
  expect_encodes(tiny(seq(split("Removed", true))), kTexts,
                 {{32, 32, 49, 50, 32}, {32, 32, 49, 50, 51}, {32, 10, 10, 32, 49, 50, 49, 50}},
                 "Removed inverted");
  const std::vector<Ids> isolated = {
      {259, 32, 119, 261, 108, 100, 32, 49, 50, 32, 259},
      {259, 32, 32, 119, 261, 108, 100, 49, 50, 51},
      {32, 259, 10, 10, 119, 261, 108, 100, 32, 49, 50, 49, 50, 120}};
  const std::vector<Ids> merged = {{259, 262, 108, 100, 32, 49, 50, 32, 259},
                                   {259, 32, 262, 108, 100, 49, 50, 51},
                                   {32, 259, 10, 10, 119, 261, 108, 100, 32, 49, 50, 49, 50, 120}};
  const std::vector<Ids> contiguous = {{259, 32, 119, 261, 108, 100, 32, 263, 32, 259},
                                       {259, 32, 32, 119, 261, 108, 100, 263, 51},
                                       {32, 259, 10, 10, 119, 261, 108, 100, 32, 263, 263, 120}};
  expect_encodes(tiny(seq(split("Isolated", false))), kTexts, isolated, "Isolated");
  expect_encodes(tiny(seq(split("Isolated", true))), kTexts, isolated, "Isolated inverted");
  expect_encodes(tiny(seq(split("MergedWithPrevious", false))), kTexts, isolated,
                 "MergedWithPrevious");
  expect_encodes(tiny(seq(split("MergedWithPrevious", true))), kTexts, merged,
                 "MergedWithPrevious inverted");
  expect_encodes(tiny(seq(split("MergedWithNext", false))), kTexts, merged, "MergedWithNext");
  expect_encodes(tiny(seq(split("MergedWithNext", true))), kTexts, isolated,
                 "MergedWithNext inverted");
  expect_encodes(tiny(seq(split("Contiguous", false))), kTexts, contiguous, "Contiguous");
  expect_encodes(tiny(seq(split("Contiguous", true))), kTexts, contiguous, "Contiguous inverted");
}

TEST(PreTokenizer, StringPatternDigitsAndGpt2ByteLevel) {
  expect_encodes(tiny(seq({{"type", "Split"},
                           {"pattern", {{"String", "l"}}},
                           {"behavior", "Removed"},
                           {"invert", false}})),
                 kTexts,
                 {{256, 111, 262, 100, 32, 263, 32, 256, 111},
                  {256, 111, 32, 262, 100, 263, 51},
                  {32, 256, 111, 10, 10, 119, 261, 100, 32, 263, 263, 120}},
                 "String");
  expect_encodes(tiny(seq({{"type", "Digits"}, {"individual_digits", true}})), kTexts,
                 {{259, 262, 108, 100, 32, 49, 50, 32, 259},
                  {259, 32, 262, 108, 100, 49, 50, 51},
                  {32, 259, 10, 10, 119, 261, 108, 100, 32, 49, 50, 49, 50, 120}},
                 "Digits individual");
  expect_encodes(tiny(seq({{"type", "Digits"}, {"individual_digits", false}})), kTexts,
                 {{259, 262, 108, 100, 32, 263, 32, 259},
                  {259, 32, 262, 108, 100, 263, 51},
                  {32, 259, 10, 10, 119, 261, 108, 100, 32, 263, 263, 120}},
                 "Digits");
  expect_encodes(tiny({{"type", "ByteLevel"},
                       {"add_prefix_space", true},
                       {"trim_offsets", false},
                       {"use_regex", true}}),
                 kTexts,
                 {{32, 259, 262, 108, 100, 32, 263, 32, 259},
                  {32, 259, 32, 262, 108, 100, 263, 51},
                  {32, 259, 10, 10, 119, 261, 108, 100, 32, 263, 263, 120}},
                 "GPT-2 ByteLevel");
}

nlohmann::json added_tokens(const nlohmann::json& flags) {
  nlohmann::json s = {{"id", 264},       {"content", "<s>"}, {"single_word", false},
                      {"lstrip", false}, {"rstrip", false},  {"normalized", false},
                      {"special", true}};
  nlohmann::json m = s;
  m["id"] = 265;
  m["content"] = "<mask>";
  m["special"] = false;
  s.update(flags);
  m.update(flags);
  return {s, m};
}

const std::vector<std::string> kAddedTexts = {
    "x<s>  y", "x <s> y", "hello<s>world", "<s>", " <s> ", "a<mask>b a <mask> b", "<mask>"};

TEST(AddedTokens, FlagsFollowHuggingFace) {
  expect_encodes(tiny(kByteLevelOnly, added_tokens(nlohmann::json::object())), kAddedTexts,
                 {{120, 264, 32, 32, 121},
                  {120, 32, 264, 32, 121},
                  {259, 264, 119, 261, 108, 100},
                  {264},
                  {32, 264, 32},
                  {97, 265, 98, 32, 97, 32, 265, 32, 98},
                  {265}},
                 "plain");
  expect_encodes(tiny(kByteLevelOnly, added_tokens({{"lstrip", true}})), kAddedTexts,
                 {{120, 264, 32, 32, 121},
                  {120, 264, 32, 121},
                  {259, 264, 119, 261, 108, 100},
                  {264},
                  {264, 32},
                  {97, 265, 98, 32, 97, 265, 32, 98},
                  {265}},
                 "lstrip");
  expect_encodes(tiny(kByteLevelOnly, added_tokens({{"rstrip", true}})), kAddedTexts,
                 {{120, 264, 121},
                  {120, 32, 264, 121},
                  {259, 264, 119, 261, 108, 100},
                  {264},
                  {32, 264},
                  {97, 265, 98, 32, 97, 32, 265, 98},
                  {265}},
                 "rstrip");
  expect_encodes(tiny(kByteLevelOnly, added_tokens({{"single_word", true}})), kAddedTexts,
                 {{120, 60, 115, 62, 32, 32, 121},
                  {120, 32, 264, 32, 121},
                  {259, 60, 115, 62, 119, 261, 108, 100},
                  {264},
                  {32, 264, 32},
                  {97, 60, 109, 97, 115, 107, 62, 98, 32, 97, 32, 265, 32, 98},
                  {265}},
                 "single_word");
}

TEST(AddedTokens, SkipSpecialAndStreaming) {
  const Tokenizer t = Tokenizer::from_json(
      tiny(kByteLevelOnly, added_tokens(nlohmann::json::object())).dump(), "", "tiny");
  const std::vector<std::string> skipped = {
      "x  y", "x  y", "helloworld", "", "  ", "a<mask>b a <mask> b", "<mask>"};
  for (size_t i = 0; i < kAddedTexts.size(); ++i) {
    const Ids ids = t.encode(kAddedTexts[i]);
    EXPECT_EQ(t.decode(ids, true), skipped[i]);
    StreamDecoder d(t, true);
    std::string s;
    for (const int32_t id : ids) s += d.push(id);
    s += d.flush();
    EXPECT_EQ(s, skipped[i]);
  }
  EXPECT_TRUE(t.is_special(264));
  EXPECT_FALSE(t.is_special(265));
  EXPECT_EQ(t.vocab_size(), 266);
}

TEST(Normalizer, NfcComposesBeforeBpe) {
  const Tokenizer t = Tokenizer::from_json(
      tiny(kByteLevelOnly, nlohmann::json::array(), {{"type", "NFC"}}).dump(), "", "tiny");
  EXPECT_EQ(t.encode("he\xCC\x81llo"), (Ids{104, 195, 169, 257, 111}));
  EXPECT_EQ(t.encode("h\xC3\xA9llo"), (Ids{104, 195, 169, 257, 111}));
}

TEST(PostProcessor, TemplateAndConfigBos) {
  nlohmann::json j = tiny(kByteLevelOnly, added_tokens(nlohmann::json::object()));
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        {{"SpecialToken", {{"id", "<mask>"}, {"type_id", 0}}}}}},
      {"special_tokens",
       {{"<s>", {{"id", "<s>"}, {"ids", {264}}, {"tokens", {"<s>"}}}},
        {"<mask>", {{"id", "<mask>"}, {"ids", {265}}, {"tokens", {"<mask>"}}}}}}};
  const Tokenizer t = Tokenizer::from_json(j.dump(), "", "tiny");
  EXPECT_EQ(t.encode("hello", true), (Ids{264, 259, 265}));
  EXPECT_EQ(t.encode("hello", false), (Ids{259}));
  // A config with add_bos_token takes over, as transformers' Llama tokenizers do.
  const Tokenizer c = Tokenizer::from_json(
      j.dump(),
      R"({"add_bos_token": true, "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "<mask>"})",
      "tiny");
  EXPECT_EQ(c.encode("hello", true), (Ids{264, 259}));
  EXPECT_EQ(c.bos_id(), 264);
  EXPECT_EQ(c.eos_id(), 265);
}

TEST(Bpe, IgnoreMergesAndLegacyMergeStrings) {
  nlohmann::json j = tiny(kByteLevelOnly);
  nlohmann::json legacy = nlohmann::json::array();
  for (const auto& m : j["model"]["merges"])
    legacy.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  j["model"]["merges"] = legacy;
  j["model"]["vocab"]["hellowor"] = 300;  // reachable only as a whole word
  const Tokenizer t = Tokenizer::from_json(j.dump(), "", "tiny");
  EXPECT_EQ(t.encode("hello"), (Ids{259}));
  EXPECT_EQ(t.encode("hellowor"), (Ids{259, 119, 261}));
  j["model"]["ignore_merges"] = true;
  const Tokenizer im = Tokenizer::from_json(j.dump(), "", "tiny");
  EXPECT_EQ(im.encode("hellowor"), (Ids{300}));
}

}  // namespace
}  // namespace spool::tokenizer
