// Test helper: writes GGUF v3 files the way gguf-py's GGUFWriter (llama.cpp's converter) lays
// them out, for tests that build models, vocabularies or variants of stored fixtures at test
// time. Format: the GGUF notes (ggml docs/gguf.md) section 1: magic "GGUF", u32 version 3,
// u64 tensor count, u64 KV count; each KV as (u64-length key, u32 value type, value), arrays as
// (u32 element type, u64 count, elements), strings as (u64 length, bytes); each tensor info as
// (name, u32 n_dims, u64 ne[n_dims] with ne[0] fastest, u32 ggml type, u64 offset into the data
// blob); zero padding to general.alignment (default 32); the data blob, every tensor starting on
// the alignment and (as gguf-py writes it) padded with zeros to the alignment after it, the last
// one too. All little-endian. With the keys and tensors added in gguf-py's order the bytes equal
// gguf-py's (tests/reference/gguf_models.py writes the gpt_oss F32 file src/models/gguf_model_test.cpp
// writes with this class: `cmp` the two). Split sets: no test writes one (the stored split
// fixtures come from tests/reference/gguf_fixtures.py).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/ggml_types.h"
#include "io/gguf.h"

namespace spool::testing {

static_assert(std::endian::native == std::endian::little, "GGUF is little-endian; the writers copy host bytes");

/// Little-endian byte builder for GGUF records: the encoding GgufWriter uses, public so that a
/// test can hand-build what a valid writer never makes (corrupt headers, odd versions, offsets).
struct GgufBytes {
  std::string b;  ///< the bytes so far

  GgufBytes& u8(uint8_t v) {
    b.push_back(static_cast<char>(v));
    return *this;
  }
  GgufBytes& u32(uint32_t v) { return raw(&v, 4); }
  GgufBytes& u64(uint64_t v) { return raw(&v, 8); }
  /// `n` bytes at `p`, as they are.
  GgufBytes& raw(const void* p, size_t n) {
    b.append(static_cast<const char*>(p), n);
    return *this;
  }
  /// A GGUF string: u64 byte length, then the bytes (no terminator).
  GgufBytes& str(const std::string& s) {
    u64(s.size());
    b += s;
    return *this;
  }
  /// Zero bytes up to the next multiple of `align` (none if already there).
  GgufBytes& pad(size_t align) {
    b.resize((b.size() + align - 1) / align * align, '\0');
    return *this;
  }
};

/// Builds one GGUF v3 file: metadata of every value type and tensors of any ggml type, kept in
/// the order they are added; bytes() lays the file out, write() saves it. A u32
/// "general.alignment" key sets the data alignment (as in the format; default 32). Errors
/// (std::invalid_argument): a tensor whose byte count does not match its type and shape, more
/// than 4 or no dimensions, an alignment that is not a power of two.
class GgufWriter {
 public:
  /// Alignment of the data blob and of each tensor when no general.alignment key is added.
  static constexpr uint32_t kDefaultAlignment = 32;

  // Scalars, one per GGUF value type.
  void add_u8(const std::string& key, uint8_t v) { scalar(key, io::GgufType::kUint8, &v, 1); }
  void add_i8(const std::string& key, int8_t v) { scalar(key, io::GgufType::kInt8, &v, 1); }
  void add_u16(const std::string& key, uint16_t v) { scalar(key, io::GgufType::kUint16, &v, 2); }
  void add_i16(const std::string& key, int16_t v) { scalar(key, io::GgufType::kInt16, &v, 2); }
  void add_u32(const std::string& key, uint32_t v) { scalar(key, io::GgufType::kUint32, &v, 4); }
  void add_i32(const std::string& key, int32_t v) { scalar(key, io::GgufType::kInt32, &v, 4); }
  void add_u64(const std::string& key, uint64_t v) { scalar(key, io::GgufType::kUint64, &v, 8); }
  void add_i64(const std::string& key, int64_t v) { scalar(key, io::GgufType::kInt64, &v, 8); }
  void add_f32(const std::string& key, float v) { scalar(key, io::GgufType::kFloat32, &v, 4); }
  void add_f64(const std::string& key, double v) { scalar(key, io::GgufType::kFloat64, &v, 8); }
  /// A bool is one byte, 0 or 1.
  void add_bool(const std::string& key, bool v) {
    const uint8_t b = v ? 1 : 0;
    scalar(key, io::GgufType::kBool, &b, 1);
  }
  void add_string(const std::string& key, const std::string& v) {
    begin(key, io::GgufType::kString);
    kv_.str(v);
  }

  // Arrays (not nested).
  void add_strings(const std::string& key, const std::vector<std::string>& v) {
    array_head(key, io::GgufType::kString, v.size());
    for (const std::string& s : v) kv_.str(s);
  }
  void add_i32s(const std::string& key, const std::vector<int32_t>& v) {
    add_array(key, io::GgufType::kInt32, v.size(), v.data(), v.size() * 4);
  }
  void add_u32s(const std::string& key, const std::vector<uint32_t>& v) {
    add_array(key, io::GgufType::kUint32, v.size(), v.data(), v.size() * 4);
  }
  void add_f32s(const std::string& key, const std::vector<float>& v) {
    add_array(key, io::GgufType::kFloat32, v.size(), v.data(), v.size() * 4);
  }
  /// Bools as one byte each, 0 or 1.
  void add_bools(const std::string& key, const std::vector<bool>& v) {
    std::vector<uint8_t> b(v.begin(), v.end());
    add_array(key, io::GgufType::kBool, b.size(), b.data(), b.size());
  }
  /// A numeric array of `count` elements of type `elem`, given as their `nbytes` stored bytes.
  void add_array(const std::string& key, io::GgufType elem, uint64_t count, const void* data, size_t nbytes) {
    array_head(key, elem, count);
    kv_.raw(data, nbytes);
  }

  /// Any value as io::GgufFile read it (copying a file's metadata), in its own type.
  void add_value(const std::string& key, const io::GgufValue& v) {
    if (v.type == io::GgufType::kString) {
      add_string(key, v.str);
    } else if (!v.is_array()) {
      scalar(key, v.type, &v.bits, scalar_size(v.type));
    } else if (v.elem == io::GgufType::kString) {
      add_strings(key, v.strs);
    } else {
      add_array(key, v.elem, v.count, v.raw.data(), v.raw.size());
    }
  }

  /// A tensor of ggml type `type` with dimensions `ne` in GGUF order (ne[0] fastest: a PyTorch
  /// [out, in] matrix has ne = {in, out}) and its `nbytes` bytes at `data` (copied), which must
  /// be ggml_row_bytes(type, ne[0]) * (ne[1] * ...) bytes.
  void add_tensor(const std::string& name, const std::vector<int64_t>& ne, GgmlType type, const void* data, size_t nbytes) {
    if (ne.empty() || ne.size() > 4) throw std::invalid_argument("tensor " + name + ": 1 to 4 dimensions");
    uint64_t rows = 1;
    for (size_t d = 1; d < ne.size(); ++d) rows *= static_cast<uint64_t>(ne[d]);
    const uint64_t want = ggml_row_bytes(type, static_cast<uint64_t>(ne[0])) * rows;
    if (want == 0 || want != nbytes)
      throw std::invalid_argument("tensor " + name + ": " + std::to_string(nbytes) + " bytes, its " +
                                  ggml_type_name(type) + " shape needs " + std::to_string(want));
    const auto* p = static_cast<const uint8_t*>(data);
    tensors_.push_back(Tensor{name, ne, type, std::vector<uint8_t>(p, p + nbytes)});
  }
  /// An F32 tensor (dimensions in GGUF order, as add_tensor).
  void add_tensor_f32(const std::string& name, const std::vector<int64_t>& ne, const std::vector<float>& v) {
    add_tensor(name, ne, GgmlType::F32, v.data(), v.size() * 4);
  }

  /// The data alignment: general.alignment if added, else 32.
  uint32_t alignment() const { return alignment_; }

  /// The whole file.
  std::string bytes() const {
    GgufBytes f;
    f.b = "GGUF";
    f.u32(3).u64(tensors_.size()).u64(n_kv_);
    f.b += kv_.b;
    uint64_t at = 0;
    for (const Tensor& t : tensors_) {
      f.str(t.name).u32(static_cast<uint32_t>(t.ne.size()));
      for (int64_t n : t.ne) f.u64(static_cast<uint64_t>(n));
      f.u32(static_cast<uint32_t>(t.type)).u64(at);
      at = (at + t.data.size() + alignment_ - 1) / alignment_ * alignment_;
    }
    f.pad(alignment_);
    for (const Tensor& t : tensors_) f.raw(t.data.data(), t.data.size()).pad(alignment_);
    return f.b;
  }

  /// Writes bytes() to `path` (replacing it); throws std::runtime_error if it cannot.
  void write(const std::string& path) const {
    const std::string b = bytes();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(b.data(), static_cast<std::streamsize>(b.size()));
    if (!f) throw std::runtime_error("cannot write " + path);
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> ne;
    GgmlType type;
    std::vector<uint8_t> data;
  };

  static size_t scalar_size(io::GgufType t) {
    switch (t) {
      case io::GgufType::kUint8: case io::GgufType::kInt8: case io::GgufType::kBool: return 1;
      case io::GgufType::kUint16: case io::GgufType::kInt16: return 2;
      case io::GgufType::kUint32: case io::GgufType::kInt32: case io::GgufType::kFloat32: return 4;
      default: return 8;
    }
  }
  void begin(const std::string& key, io::GgufType type) {
    kv_.str(key).u32(static_cast<uint32_t>(type));
    ++n_kv_;
  }
  void scalar(const std::string& key, io::GgufType type, const void* v, size_t n) {
    if (key == "general.alignment" && type == io::GgufType::kUint32) {
      uint32_t a;
      std::memcpy(&a, v, 4);
      if (a == 0 || (a & (a - 1)) != 0)
        throw std::invalid_argument("general.alignment " + std::to_string(a) + " is not a power of two");
      alignment_ = a;
    }
    begin(key, type);
    kv_.raw(v, n);
  }
  void array_head(const std::string& key, io::GgufType elem, uint64_t count) {
    begin(key, io::GgufType::kArray);
    kv_.u32(static_cast<uint32_t>(elem)).u64(count);
  }

  GgufBytes kv_;  // the KV records so far
  uint64_t n_kv_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  std::vector<Tensor> tensors_;
};

}  // namespace spool::testing
