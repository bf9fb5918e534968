// Test helper: writes a tokenizer-only GGUF v3 file (metadata, no tensors) with the key/value
// types llama.cpp's converter (gguf-py GGUFWriter) uses for tokenizer.ggml.*: strings, string
// arrays, int32 / float32 arrays, uint32 ids and bools. Format: the GGUF notes (ggml
// docs/gguf.md) section 1: "GGUF", u32 version, u64 tensor count, u64 KV count, then each KV as
// (u64-length key, u32 type, value); arrays as (u32 element type, u64 count, elements).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace spool::testing {

/// Builds the metadata of one GGUF file; write() saves it. All values little-endian.
class GgufVocabWriter {
 public:
  void add_string(const std::string& key, const std::string& v) {
    begin(key, 8);
    str(v);
  }
  void add_u32(const std::string& key, uint32_t v) {
    begin(key, 4);
    u32(v);
  }
  void add_bool(const std::string& key, bool v) {
    begin(key, 7);
    body_.push_back(v ? 1 : 0);
  }
  void add_strings(const std::string& key, const std::vector<std::string>& v) {
    begin(key, 9);
    u32(8);
    u64(v.size());
    for (const auto& s : v) str(s);
  }
  void add_i32s(const std::string& key, const std::vector<int32_t>& v) {
    begin(key, 9);
    u32(5);
    u64(v.size());
    for (int32_t x : v) u32(static_cast<uint32_t>(x));
  }
  void add_f32s(const std::string& key, const std::vector<float>& v) {
    begin(key, 9);
    u32(6);
    u64(v.size());
    for (float x : v) {
      uint32_t b;
      std::memcpy(&b, &x, 4);
      u32(b);
    }
  }
  /// Writes the file (GGUF v3, no tensors); throws std::runtime_error if it cannot.
  void write(const std::string& path) const {
    std::string head = "GGUF";
    auto put = [&head](uint64_t v, int n) {
      for (int i = 0; i < n; ++i) head.push_back(static_cast<char>(v >> (8 * i)));
    };
    put(3, 4);
    put(0, 8);
    put(n_kv_, 8);
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(head.data(), static_cast<std::streamsize>(head.size()));
    f.write(body_.data(), static_cast<std::streamsize>(body_.size()));
    if (!f) throw std::runtime_error("cannot write " + path);
  }

 private:
  void begin(const std::string& key, uint32_t type) {
    str(key);
    u32(type);
    ++n_kv_;
  }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) body_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) body_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void str(const std::string& s) {
    u64(s.size());
    body_ += s;
  }
  std::string body_;
  uint64_t n_kv_ = 0;
};

}  // namespace spool::testing
