// Bad input must raise spool::Error with a message that names the problem, never crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace spool::tokenizer {
namespace {

// A minimal valid tokenizer.json: byte-level alphabet as the vocab, one merge.
nlohmann::json minimal() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b)
    vocab[std::string(byte_level::byte_to_utf8(static_cast<uint8_t>(b)))] = b;
  vocab["ab"] = 256;
  return {{"version", "1.0"},
          {"added_tokens", {{{"id", 257}, {"content", "<eos>"}, {"special", true}}}},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"},
               {"pattern", {{"Regex", "\\s+|\\w+"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b"}}}}};
}

// Expects from_json to throw spool::Error whose message contains every word in `words`.
void expect_error(const std::string& json, const std::vector<std::string>& words,
                  const std::string& config = "") {
  try {
    (void)Tokenizer::from_json(json, config, "test.json");
    ADD_FAILURE() << "no error for: " << json.substr(0, 200);
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << msg;
  }
}

TEST(TokenizerErrors, MinimalTokenizerLoads) {
  const Tokenizer t = Tokenizer::from_json(minimal().dump(), "", "minimal");
  EXPECT_EQ(t.encode("ab ab<eos>"),
            (std::vector<int32_t>{256, byte_level::codepoint_to_byte(0x120), 256, 257}));
  EXPECT_EQ(t.decode(t.encode("ab ab<eos>")), "ab ab<eos>");
}

TEST(TokenizerErrors, MissingFilesNameThePath) {
  try {
    (void)Tokenizer::load("/nonexistent/spool-tokenizer-dir");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/spool-tokenizer-dir/tokenizer.json"),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find("not found"), std::string::npos);
  }
}

TEST(TokenizerErrors, MalformedConfigInDirectoryNamesConfigFile) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("spool-tok-test-" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << minimal().dump();
  std::ofstream(dir / "tokenizer_config.json") << "{\"bos_token\": ";
  try {
    (void)Tokenizer::load(dir.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("malformed JSON"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"eos_token": "<eos>", "chat_template": "cfg"})";
  std::ofstream(dir / "chat_template.jinja") << "jinja";
  const Tokenizer t = Tokenizer::load(dir.string());
  EXPECT_EQ(t.eos_id(), 257);
  EXPECT_EQ(t.chat_template(), "jinja");  // the .jinja file wins, as in transformers
  std::filesystem::remove_all(dir);
}

TEST(TokenizerErrors, MalformedJson) {
  expect_error("{not json", {"test.json", "malformed JSON"});
  expect_error("", {"malformed JSON"});
  expect_error("[]", {"object"});
  const std::string full = minimal().dump();
  expect_error(full.substr(0, full.size() / 2), {"malformed JSON"});
  expect_error(minimal().dump(), {"tokenizer_config", "malformed JSON"}, "{,}");
}

TEST(TokenizerErrors, UnsupportedComponents) {
  nlohmann::json j = minimal();
  j["model"]["type"] = "Unigram";
  expect_error(j.dump(), {"unsupported model type", "Unigram"});
  j = minimal();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  expect_error(j.dump(), {"unsupported normalizer", "BertNormalizer"});
  j = minimal();
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  expect_error(j.dump(), {"unsupported normalizer", "Lowercase"});
  j = minimal();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_error(j.dump(), {"unsupported pre_tokenizer", "Metaspace"});
  j = minimal();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j.dump(), {"unsupported decoder", "WordPiece"});
  j = minimal();
  j["post_processor"] = {{"type", "Fancy"}};
  expect_error(j.dump(), {"unsupported post_processor", "Fancy"});
  j = minimal();
  j["version"] = "2.0";
  expect_error(j.dump(), {"version"});
}

TEST(TokenizerErrors, BadModel) {
  nlohmann::json j = minimal();
  j["model"]["merges"] = {"a zz"};
  expect_error(j.dump(), {"merge", "not in the vocab", "zz"});
  j["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"q", "r"})});
  expect_error(j.dump(), {"merge", "'qr'", "not in the vocab"});
  j["model"]["merges"] = {"a b c"};
  expect_error(j.dump(), {"merge #1", "two tokens"});
  j["model"]["merges"] = {42};
  expect_error(j.dump(), {"merge #1"});
  j = minimal();
  j["model"].erase("merges");
  expect_error(j.dump(), {"vocab", "merges"});
  j = minimal();
  j["model"]["vocab"]["x"] = -3;
  expect_error(j.dump(), {"model.vocab", "integer id"});
  j = minimal();
  j["model"]["vocab"]["x"] = "seven";
  expect_error(j.dump(), {"model.vocab"});
  j = minimal();
  j["model"]["vocab"] = nlohmann::json::array();
  expect_error(j.dump(), {"model.vocab must be an object"});
  j = minimal();
  j.erase("model");
  expect_error(j.dump(), {"model"});
}

TEST(TokenizerErrors, BadPreTokenizerAndAddedTokens) {
  nlohmann::json j = minimal();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed[";
  expect_error(j.dump(), {"invalid regex", "Split"});
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", 5}};
  expect_error(j.dump(), {"pattern"});
  j = minimal();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  expect_error(j.dump(), {"behavior", "Sideways"});
  j = minimal();
  nlohmann::json deep = {{"type", "ByteLevel"}};
  for (int i = 0; i < 100; ++i) deep = {{"type", "Sequence"}, {"pretokenizers", {deep}}};
  j["pre_tokenizer"] = deep;
  expect_error(j.dump(), {"nested too deeply"});
  j = minimal();
  j["added_tokens"] = {{{"id", 3}, {"content", 12}}};
  expect_error(j.dump(), {"added_tokens[0]", "content"});
  j = minimal();
  j["added_tokens"] = {{{"id", 3}, {"content", "x"}, {"special", "yes"}}};
  expect_error(j.dump(), {"added_tokens[0].special"});
  j = minimal();
  j["normalizer"] = 5;
  expect_error(j.dump(), {"normalizer"});
  expect_error(minimal().dump(), {"bos_token"}, R"({"bos_token": 7})");
}

TEST(TokenizerErrors, InvalidIdsOnDecode) {
  const Tokenizer t = Tokenizer::from_json(minimal().dump(), "", "minimal");
  for (const int32_t bad : {-1, 258, 1 << 30}) {
    const std::vector<int32_t> ids = {97, bad};
    try {
      (void)t.decode(ids);
      ADD_FAILURE() << "no error for id " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not in the vocabulary"), std::string::npos);
    }
    StreamDecoder d(t);
    EXPECT_THROW(d.push(bad), Error);
  }
}

// Random corruptions of a valid file: each must load or throw spool::Error, never crash.
TEST(TokenizerErrors, CorruptedFilesNeverCrash) {
  const std::string good = minimal().dump();
  std::mt19937 rng(12345);
  int loaded = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % s.size();
      switch (rng() % 3) {
        case 0:
          s[pos] = static_cast<char>(rng() % 256);
          break;
        case 1:
          s.erase(pos, 1 + rng() % 8);
          break;
        default:
          s.insert(s.begin() + static_cast<std::ptrdiff_t>(pos), "{}[]\",:0a\\"[rng() % 10]);
          break;
      }
      if (s.empty()) s.push_back('{');
    }
    try {
      const Tokenizer t = Tokenizer::from_json(s, "", "corrupt");
      const auto ids = t.encode("ab a\xFF b<eos> 12");
      (void)t.decode(ids);
      ++loaded;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(loaded, 0);
}

}  // namespace
}  // namespace spool::tokenizer
