// GGUF v2/v3 files (llama.cpp / ggml checkpoints): validated header, typed metadata, tensor
// table and read-only mmap; split sets NAME-0000N-of-0000M.gguf open as one tensor table.
// Format: the GGUF notes (ggml docs/gguf.md) section 1 (ggml docs/gguf.md and src/gguf.cpp): magic "GGUF",
// u32 version, u64 tensor count, u64 KV count, the KV records, the tensor-info records, zero
// padding to general.alignment (default 32), then the data blob; all little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "common/ggml_types.h"

namespace spool::io {

/// GGUF metadata value types (the i32 stored before each value).
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

/// The format's name of a value type ("UINT32", ...); "?" if unknown.
const char* gguf_type_name(GgufType t);

/// One metadata value: a scalar, a string, or a (non-nested) array of scalars or strings.
/// Integer scalars keep their type; the accessors convert between integer widths and throw
/// spool::Error naming `key` when the value has the wrong kind or does not fit.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  GgufType elem = GgufType::kUint8;  ///< element type of an array
  uint64_t bits = 0;                 ///< scalar payload, zero-extended little-endian bytes
  std::string str;                   ///< kString
  std::vector<uint8_t> raw;          ///< numeric array elements, as stored (count * element size)
  std::vector<std::string> strs;     ///< array of strings
  uint64_t count = 0;                ///< array length

  bool is_array() const { return type == GgufType::kArray; }
  /// Integer scalar (any width, signed or not) as int64; throws if not an integer or > INT64_MAX.
  int64_t to_int(std::string_view key) const;
  /// Float scalar (f32, f64) or integer scalar as double; throws for strings, bools and arrays.
  double to_float(std::string_view key) const;
  /// Bool scalar; throws otherwise.
  bool to_bool(std::string_view key) const;
  /// String scalar; throws otherwise.
  const std::string& to_string(std::string_view key) const;
  /// Integer array as int64 values; throws if not an integer array or a value > INT64_MAX.
  std::vector<int64_t> to_ints(std::string_view key) const;
  /// Float (or integer) array as doubles.
  std::vector<double> to_floats(std::string_view key) const;
  /// String array; throws otherwise.
  const std::vector<std::string>& to_strings(std::string_view key) const;
};

/// One tensor of a GGUF file or split set. Dimensions are in GGUF order: ne[0] is the
/// fastest-varying (columns of a matrix); a PyTorch Linear weight (out, in) has ne = {in, out}.
/// The bytes are the row-major bytes of the tensor in its ggml type.
struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  uint32_t n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  ///< missing dims are 1
  uint32_t shard = 0;            ///< index of the file in a split set (0 for one file)
  uint64_t offset = 0;           ///< absolute byte offset of the first byte in its shard's file
  uint64_t nbytes = 0;           ///< bytes of the whole tensor

  /// Elements in total.
  int64_t numel() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  /// Rows of ne[0] elements (ne[1] * ne[2] * ne[3]).
  int64_t rows() const { return ne[1] * ne[2] * ne[3]; }
  /// Bytes of one row of ne[0] elements.
  uint64_t row_bytes() const { return ggml_row_bytes(type, static_cast<uint64_t>(ne[0])); }
  /// Shape in GGUF order without trailing 1s beyond n_dims (e.g. "[2048, 768, 128]").
  std::string shape_string() const;
};

/// A header that continues past the bytes given to GgufFile::parse_header (the file is longer):
/// read at least `needed` bytes from the start of the file and parse again.
class GgufNeedMore : public Error {
 public:
  GgufNeedMore(const std::string& msg, uint64_t needed) : Error(msg), needed_(needed) {}
  uint64_t needed() const { return needed_; }

 private:
  uint64_t needed_;
};

/// One parsed GGUF file header (one shard): metadata, tensor infos, layout.
struct GgufHeader {
  std::string label;             ///< path (or label) for messages
  uint32_t version = 0;          ///< 2 or 3
  uint64_t file_size = 0;        ///< bytes of the file
  uint32_t alignment = 32;       ///< general.alignment
  uint64_t data_offset = 0;      ///< start of the data blob (aligned end of the tensor infos)
  std::map<std::string, GgufValue> kv;
  std::vector<GgufTensor> tensors;  ///< in file order; offsets absolute, shard = 0
};

/// A validated GGUF file or split set, memory-mapped read-only. Move-only; unmaps on
/// destruction. open() throws spool::Error naming the file (and the key or tensor) for:
/// missing / unreadable file, bad magic, version other than 2 or 3 (or big-endian), truncated
/// header, counts larger than the file can hold, strings or arrays past the end, unknown value
/// types, nested arrays, duplicate keys or tensor names, bad general.alignment, names of 64
/// bytes or more, more than 4 dims, negative or overflowing dims, unknown or retired tensor
/// types, ne[0] not a multiple of the block size, misaligned offsets, tensors past the end of
/// the file or overlapping, and inconsistent split sets (missing shard, wrong split.no /
/// split.count / split.tensors.count).
class GgufFile {
 public:
  /// Opens `path`. A split set is opened whole from any of its shards: the name must follow
  /// PREFIX-NNNNN-of-MMMMM.gguf and split.count must equal MMMMM. If `map` is false no data is
  /// mapped (headers only; data() throws).
  static GgufFile open(const std::string& path, bool map = true);
  /// Parses the header in the first `n` bytes of a file of `file_size` bytes (one shard; for
  /// fuzzing and headers fetched over HTTP). Throws GgufNeedMore when the header continues past
  /// `n` < file_size, spool::Error when it is invalid or past the end of the file.
  static GgufHeader parse_header(const uint8_t* bytes, size_t n, uint64_t file_size, const std::string& label);
  /// A file or split set from headers read elsewhere (parse_header; e.g. fetched over HTTP), in
  /// shard order: the split-set checks of open() (split.no, split.count = number of headers,
  /// split.tensors.count, no name in two shards); nothing is open or mapped (data() throws,
  /// shard_fd() is -1). `label` names the set in messages.
  static GgufFile from_headers(std::vector<GgufHeader> headers, const std::string& label);

  GgufFile() = default;
  GgufFile(GgufFile&& o) noexcept;
  GgufFile& operator=(GgufFile&& o) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  /// Path given to open().
  const std::string& path() const { return path_; }
  /// Number of files (1 unless a split set).
  size_t shard_count() const { return shards_.size(); }
  /// Header of shard i (path, version, alignment, data offset, its own KVs and tensors).
  const GgufHeader& shard(size_t i) const { return shards_[i].h; }
  /// File descriptor of shard i (kept open for pread).
  int shard_fd(size_t i) const { return shards_[i].fd; }
  /// Metadata of the model (shard 0's KVs, which include split.* in a split set).
  const std::map<std::string, GgufValue>& metadata() const { return shards_.front().h.kv; }
  /// A metadata value, or nullptr if absent.
  const GgufValue* find_key(std::string_view key) const;
  /// general.architecture (throws if absent or not a string).
  std::string architecture() const;
  /// Integer metadata (any integer type), or nullopt if absent.
  std::optional<int64_t> get_int(std::string_view key) const;
  /// Float metadata (f32 / f64 / integer), or nullopt if absent.
  std::optional<double> get_float(std::string_view key) const;
  /// String metadata, or nullopt if absent.
  std::optional<std::string> get_string(std::string_view key) const;
  /// All tensors of all shards (shard order, then file order).
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  /// Finds a tensor by exact name; nullptr if absent.
  const GgufTensor* find(std::string_view name) const;
  /// Pointer to a tensor's bytes inside its shard's mapping. Throws if not mapped.
  const uint8_t* data(const GgufTensor& t) const;

 private:
  struct Shard {
    GgufHeader h;
    int fd = -1;
    uint8_t* base = nullptr;
  };
  // Validates a split set of `count` shards (count 1: one file) and builds tensors_ / index_.
  void index_shards(int64_t count);

  std::string path_;
  std::vector<Shard> shards_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

/// The shard paths of a split set named like `path` (PREFIX-NNNNN-of-MMMMM.gguf, 5 digits,
/// 1-based): all M paths in order, or an empty vector if `path` does not follow the pattern.
std::vector<std::string> gguf_split_paths(const std::string& path);

}  // namespace spool::io
