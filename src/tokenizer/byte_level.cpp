#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace spool::tokenizer::byte_level {
namespace {

constexpr uint32_t kAlphabetEnd = 0x144;  // every alphabet code point is below this

struct Tables {
  std::array<uint16_t, 256> to_cp{};            // byte -> code point
  std::array<int16_t, kAlphabetEnd> to_byte{};  // code point -> byte or -1
  std::array<std::array<char, 2>, 256> utf8{};  // byte -> UTF-8 of its code point
  std::array<uint8_t, 256> utf8_len{};
};

constexpr bool printable(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

constexpr Tables make_tables() {
  Tables t{};
  for (auto& v : t.to_byte) v = -1;
  uint32_t extra = 0;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : 0x100 + extra++;
    t.to_cp[b] = static_cast<uint16_t>(cp);
    t.to_byte[cp] = static_cast<int16_t>(b);
    if (cp < 0x80) {
      t.utf8[b] = {static_cast<char>(cp), 0};
      t.utf8_len[b] = 1;
    } else {
      t.utf8[b] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      t.utf8_len[b] = 2;
    }
  }
  return t;
}

constexpr Tables kTables = make_tables();

}  // namespace

uint32_t byte_to_codepoint(uint8_t b) { return kTables.to_cp[b]; }

int codepoint_to_byte(uint32_t cp) { return cp < kAlphabetEnd ? kTables.to_byte[cp] : -1; }

std::string_view byte_to_utf8(uint8_t b) {
  return std::string_view(kTables.utf8[b].data(), kTables.utf8_len[b]);
}

void map_bytes(std::string_view raw, std::string& out) {
  for (const char c : raw) out.append(byte_to_utf8(static_cast<uint8_t>(c)));
}

std::string token_to_bytes(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    const utf8::Seq q = utf8::examine(token, i);
    const int b = q.status == utf8::SeqStatus::kValid ? codepoint_to_byte(q.cp) : -1;
    if (b < 0) return std::string(token);
    bytes.push_back(static_cast<char>(b));
    i += q.len;
  }
  return bytes;
}

}  // namespace spool::tokenizer::byte_level
