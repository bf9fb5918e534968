// One safetensors file: validated header, read-only mmap, tensor table.
// Format (https://github.com/huggingface/safetensors): u64 little-endian header length N,
// N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the data region; offsets are relative to the start of the data region.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace spool::io {

/// Element types of the safetensors format.
enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, U16, U32, U64, BOOL, F8_E4M3, F8_E5M2 };

/// Size of one element in bytes.
size_t dtype_size(DType t);
/// The format's name for a dtype ("BF16", ...).
const char* dtype_name(DType t);
/// Parses a format dtype name; returns false if unknown.
bool parse_dtype(std::string_view name, DType* out);

/// One tensor of a file. Offsets are absolute byte offsets in the file.
struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute file offset of the first byte
  uint64_t nbytes = 0;  // = prod(shape) * dtype_size(dtype)
  int64_t numel() const;
};

/// A validated, memory-mapped safetensors file. Move-only; unmaps on destruction.
/// open() throws spool::Error naming the file for: missing/unreadable file, file shorter than
/// its header, header length past EOF, malformed JSON, unknown dtype, bad shape, offsets past
/// the data region, byte size != shape x dtype, overlapping tensors, a tensor named twice.
class SafetensorsFile {
 public:
  /// Opens and validates `path`. If `map` is false the data region is not mapped (header only).
  static SafetensorsFile open(const std::string& path, bool map = true);
  /// Parses and validates a header given as raw bytes (for fuzzing and remote headers).
  /// `file_size` is the full file size the header must fit in (0 = skip the bound check).
  static SafetensorsFile parse_header(std::string_view header_json, uint64_t data_start,
                                      uint64_t file_size, const std::string& label);
  /// Opens `path` as a plain file with no safetensors header (a GGUF shard, or the memfd that
  /// holds a GGUF checkpoint's converted tensors): path, fd, size and (if `map`) the read-only
  /// mapping only; tensors() is empty. Throws spool::Error naming the file.
  static SafetensorsFile open_raw(const std::string& path, bool map);
  /// Same as open_raw() for an already open file descriptor, which the object then owns
  /// (closed on destruction); `path` is what path() reports (e.g. /proc/self/fd/N of a memfd).
  static SafetensorsFile from_fd(int fd, const std::string& path, bool map);

  SafetensorsFile() = default;
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  /// Byte offset of the data region (8 + header length).
  uint64_t data_start() const { return data_start_; }
  /// Tensors in file order (sorted by offset).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// Finds a tensor by exact name; nullptr if absent.
  const TensorInfo* find(std::string_view name) const;
  /// Frees the tensor table and its name index (tensors() is then empty, find() returns
  /// nullptr) for an owner that has copied what it needs: io::Checkpoint keeps one table of
  /// its own (a quantized checkpoint has ~8,000 tensors, ~2 MB of table). Path, fd, mapping,
  /// sizes and metadata stay.
  void drop_tensor_table();
  /// The "__metadata__" string map (may be empty).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Pointer to a tensor's bytes inside the mapping. Throws if the file is not mapped.
  const uint8_t* data(const TensorInfo& t) const;
  /// Base of the whole-file mapping (nullptr when not mapped).
  const uint8_t* mapping() const { return base_; }
  /// File descriptor (kept open for pread by the expert reader); -1 if not open.
  int fd() const { return fd_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// One tensor for write_safetensors().
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // prod(shape) * dtype_size bytes
};
/// Writes tensors held in memory to a new safetensors file (header padded to 8 bytes, data in
/// the given order), through SafetensorsWriter: a failed write never leaves a partial file.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Writes a safetensors file tensor by tensor without holding them in memory: the header
/// (all names, dtypes, shapes) is written first, then append() must be called with each
/// tensor's bytes in the declared order. Writes to `path`.tmp; finish() renames it.
class SafetensorsWriter {
 public:
  struct Spec {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes() const;
  };
  /// Throws spool::Error if the file cannot be created.
  SafetensorsWriter(const std::string& path, std::vector<Spec> specs, const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // removes the .tmp file if finish() was not reached
  /// Appends `n` bytes of the current tensor (may be called several times per tensor).
  void append(const void* data, uint64_t n);
  /// Checks every tensor was written in full, flushes, renames to `path`.
  void finish();
  /// Bytes of tensor data declared in total.
  uint64_t data_bytes() const { return total_; }

 private:
  std::string path_, tmp_;
  FILE* fp_ = nullptr;
  uint64_t total_ = 0, written_ = 0;
};

}  // namespace spool::io
