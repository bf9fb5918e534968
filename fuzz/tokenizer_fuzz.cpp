// libFuzzer target for spool::tokenizer.
//
// Input layout: if the first byte has its high bit clear, the whole input is treated as
// tokenizer.json text and loaded with Tokenizer::from_json (spool::Error is the expected
// way to reject it); a tokenizer that loads is then exercised on a fixed string and on the
// input itself. If the high bit is set, the remaining bytes are text encoded with a real
// tokenizer: $SPOOL_FUZZ_TOKENIZER_DIR, else SPOOL_TEST_DATA_DIR/tokenizers/qwen3 when
// compiled with that definition, else a small built-in byte-level tokenizer.
//
// Invariants checked (any violation aborts): decode output is well-formed UTF-8, streaming
// decode equals whole decode, every encoded id is < vocab_size(), and for the text mode
// decode(encode(t)) == NFC(t) (t repaired to valid UTF-8) when the tokenizer normalizes
// with NFC, else == t (real tokenizers with other normalizers are not supported here).
//
// Build by hand, e.g.:
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Isrc \
//     fuzz/tokenizer_fuzz.cpp src/tokenizer/{added_tokens,bpe,byte_level,decoder,normalizer,\
//     pretokenizer,regex,special_tokens,stream_decoder,tokenizer,unicode,utf8}.cpp \
//     src/common/log.cpp -lpcre2-8 -lutf8proc -o tokenizer_fuzz
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using spool::tokenizer::StreamDecoder;
using spool::tokenizer::Tokenizer;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "tokenizer_fuzz: invariant violated: %s\n", what);
    std::abort();
  }
}

// Decodes `ids` whole and streamed; both must agree and be well-formed UTF-8.
std::string checked_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  for (const int32_t id : ids) check(id >= 0 && id < tok.vocab_size(), "id out of range");
  const std::string whole = tok.decode(ids, skip);
  check(spool::tokenizer::utf8::is_valid(whole), "decode produced invalid UTF-8");
  StreamDecoder stream(tok, skip);
  std::string streamed;
  for (const int32_t id : ids) {
    const std::string chunk = stream.push(id);
    check(spool::tokenizer::utf8::is_valid(chunk), "stream chunk is invalid UTF-8");
    streamed += chunk;
  }
  streamed += stream.flush();
  check(streamed == whole, "streamed decode differs from whole decode");
  return whole;
}

// Small byte-level tokenizer used when no real tokenizer directory is available.
std::string builtin_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    vocab[std::string(spool::tokenizer::byte_level::byte_to_utf8(static_cast<uint8_t>(b)))] = b;
  }
  vocab["Ġt"] = 256;
  vocab["he"] = 257;
  vocab["Ġthe"] = 258;
  const nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 259}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}}}},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex",
              "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
              "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"Ġ t", "h e", "Ġt he"}}}}};
  return j.dump();
}

// The tokenizer for text mode, loaded once per process.
struct TextTarget {
  Tokenizer tok;
  bool nfc;  // true if the tokenizer normalizes with NFC (else assumed identity)
};

const TextTarget& text_target() {
  static const TextTarget target = [] {
    spool::set_log_level(spool::LogLevel::kError);
    std::string dir;
    if (const char* env = std::getenv("SPOOL_FUZZ_TOKENIZER_DIR")) dir = env;
#ifdef SPOOL_TEST_DATA_DIR
    if (dir.empty()) dir = std::string(SPOOL_TEST_DATA_DIR) + "/tokenizers/qwen3";
#endif
    std::error_code ec;
    if (!dir.empty() &&
        std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json", ec)) {
      std::fprintf(stderr, "tokenizer_fuzz: text mode uses %s\n", dir.c_str());
      Tokenizer t = Tokenizer::load(dir);
      // Probe whether the tokenizer composes "e" + U+0301 (NFC normalizer).
      const bool nfc = t.decode(t.encode("e\xCC\x81")) == "\xC3\xA9";
      return TextTarget{std::move(t), nfc};
    }
    std::fprintf(stderr, "tokenizer_fuzz: text mode uses the built-in tokenizer\n");
    return TextTarget{Tokenizer::from_json(builtin_tokenizer_json(), "", "builtin"), true};
  }();
  return target;
}

void fuzz_json(std::string_view data) {
  spool::set_log_level(spool::LogLevel::kError);
  std::optional<Tokenizer> tok;
  try {
    tok.emplace(Tokenizer::from_json(std::string(data), "", "fuzz"));
  } catch (const spool::Error&) {
    return;  // rejected with a proper error: fine
  }
  for (const std::string_view text :
       {std::string_view("Hello world! 123 <|im_end|> héllo\xF0\x9F\x98\x80 \xFF"),
        data.substr(0, 256)}) {
    for (const bool special : {false, true}) {
      try {
        const std::vector<int32_t> ids = tok->encode(text, special);
        checked_decode(*tok, ids, false);
        checked_decode(*tok, ids, true);
      } catch (const spool::Error&) {
        // e.g. a pathological regex hitting PCRE2's match limit, or a missing unk token.
      }
    }
  }
  (void)tok->id_to_token(0);
  (void)tok->token_to_id("a");
  (void)tok->bos_id();
}

void fuzz_text(std::string_view text) {
  const TextTarget& target = text_target();
  const std::vector<int32_t> ids = target.tok.encode(text);
  const std::string decoded = checked_decode(target.tok, ids, false);
  checked_decode(target.tok, ids, true);
  const std::string valid = spool::tokenizer::utf8::to_valid(text);
  if (target.nfc) {
    static const spool::tokenizer::Normalizer nfc =
        spool::tokenizer::Normalizer::from_json(nlohmann::json{{"type", "NFC"}}, "nfc");
    check(decoded == nfc.normalize(valid), "decode(encode(text)) != NFC(text)");
  } else {
    check(decoded == valid, "decode(encode(text)) != text");
  }
  const std::vector<int32_t> with_special = target.tok.encode(text, true);
  check(with_special.size() >= ids.size(), "add_special dropped tokens");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  if ((data[0] & 0x80) == 0) {
    fuzz_json(input);
  } else {
    fuzz_text(input.substr(1));
  }
  return 0;
}
