#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace spool::io {

namespace {

struct DTypeEntry {
  DType t;
  const char* name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::F64, "F64", 8},  {DType::F32, "F32", 4},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2}, {DType::I64, "I64", 8},         {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},  {DType::I8, "I8", 1},           {DType::U8, "U8", 1},
    {DType::U16, "U16", 2},  {DType::U32, "U32", 4},         {DType::U64, "U64", 8},
    {DType::BOOL, "BOOL", 1}, {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
};

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit (100 MB)

}  // namespace

size_t dtype_size(DType t) {
  for (const auto& e : kDTypes)
    if (e.t == t) return e.size;
  return 0;
}

const char* dtype_name(DType t) {
  for (const auto& e : kDTypes)
    if (e.t == t) return e.name;
  return "?";
}

bool parse_dtype(std::string_view name, DType* out) {
  for (const auto& e : kDTypes) {
    if (name == e.name) {
      *out = e.t;
      return true;
    }
  }
  return false;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    this->~SafetensorsFile();
    path_ = std::move(o.path_);
    fd_ = o.fd_;
    base_ = o.base_;
    file_size_ = o.file_size_;
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
    o.fd_ = -1;
    o.base_ = nullptr;
    o.file_size_ = 0;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_ != nullptr) munmap(base_, file_size_);
  if (fd_ >= 0) close(fd_);
  base_ = nullptr;
  fd_ = -1;
}

SafetensorsFile SafetensorsFile::parse_header(std::string_view header_json, uint64_t data_start,
                                              uint64_t file_size, const std::string& label) {
  using nlohmann::json;
  SafetensorsFile f;
  f.path_ = label;
  f.data_start_ = data_start;
  f.file_size_ = file_size;
  const uint64_t data_len = file_size >= data_start ? file_size - data_start : 0;
  // One top-level entry (a tensor or __metadata__), validated into the tables.
  auto entry = [&](const std::string& name, const json& v) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail("%s: __metadata__ is not an object", label.c_str());
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail("%s: __metadata__ value '%s' is not a string", label.c_str(), m.key().c_str());
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      return;
    }
    const char* n = name.c_str();
    if (!v.is_object()) fail("%s: tensor '%s': entry is not an object", label.c_str(), n);
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) fail("%s: tensor '%s': missing or non-string dtype", label.c_str(), n);
    if (sh == v.end() || !sh->is_array()) fail("%s: tensor '%s': missing or non-array shape", label.c_str(), n);
    if (off == v.end() || !off->is_array() || off->size() != 2)
      fail("%s: tensor '%s': data_offsets must be [begin, end]", label.c_str(), n);
    TensorInfo t;
    t.name = name;
    std::string dts = dt->get<std::string>();
    if (!parse_dtype(dts, &t.dtype)) fail("%s: tensor '%s': unknown dtype '%s'", label.c_str(), n, dts.c_str());
    if (sh->size() > 8) fail("%s: tensor '%s': shape has %zu dimensions (max 8)", label.c_str(), n, sh->size());
    unsigned __int128 numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        fail("%s: tensor '%s': shape entries must be non-negative integers", label.c_str(), n);
      uint64_t dv = d.get<uint64_t>();
      if (dv > (1ull << 48)) fail("%s: tensor '%s': dimension %llu is too large", label.c_str(), n, (unsigned long long)dv);
      numel *= dv;
      if (numel > ((unsigned __int128)1 << 62)) fail("%s: tensor '%s': shape is too large", label.c_str(), n);
      t.shape.push_back(static_cast<int64_t>(dv));
    }
    for (const auto& o : *off)
      if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0))
        fail("%s: tensor '%s': data_offsets must be non-negative integers", label.c_str(), n);
    uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
    if (b > e) fail("%s: tensor '%s': data_offsets begin %llu > end %llu", label.c_str(), n, (unsigned long long)b, (unsigned long long)e);
    if (file_size != 0 && e > data_len)
      fail("%s: tensor '%s': data_offsets end %llu is past the end of the file (data region is %llu bytes; file truncated?)",
           label.c_str(), n, (unsigned long long)e, (unsigned long long)data_len);
    unsigned __int128 want = numel * dtype_size(t.dtype);
    if (want != (unsigned __int128)(e - b))
      fail("%s: tensor '%s': byte size %llu does not match shape x dtype (%llu bytes)", label.c_str(), n,
           (unsigned long long)(e - b), (unsigned long long)want);
    t.offset = data_start + b;
    t.nbytes = e - b;
    f.tensors_.push_back(std::move(t));
  };
  // Entries are validated as the parser completes them and then discarded from the document:
  // a header of thousands of tensors never exists as a whole JSON tree (which took ~0.6 KB of
  // heap per tensor, several MB for a quantized checkpoint, on top of the tables).
  bool top_object = false;
  std::string key;
  json h;
  try {
    h = json::parse(header_json.begin(), header_json.end(), [&](int depth, json::parse_event_t ev, json& parsed) {
      if (depth == 0 && ev == json::parse_event_t::object_start) top_object = true;
      if (depth != 1 || !top_object) return true;
      if (ev == json::parse_event_t::key) {
        key = parsed.get<std::string>();
        return true;
      }
      if (ev == json::parse_event_t::object_end || ev == json::parse_event_t::array_end || ev == json::parse_event_t::value) {
        entry(key, parsed);
        return false;  // drop the entry from the document
      }
      return true;
    });
  } catch (const json::exception& e) {
    fail("%s: safetensors header is not valid JSON (%s)", label.c_str(), e.what());
  }
  if (!h.is_object()) fail("%s: safetensors header is not a JSON object", label.c_str());
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  // Sorted by offset: a non-empty tensor must start at or after the end of every earlier
  // non-empty one (empty tensors occupy no bytes and cannot hide an overlap).
  const TensorInfo* furthest = nullptr;
  for (const TensorInfo& b : f.tensors_) {
    if (b.nbytes == 0) continue;
    if (furthest != nullptr && b.offset < furthest->offset + furthest->nbytes)
      fail("%s: tensors '%s' and '%s' overlap in the data region", label.c_str(), furthest->name.c_str(), b.name.c_str());
    if (furthest == nullptr || b.offset + b.nbytes > furthest->offset + furthest->nbytes) furthest = &b;
  }
  f.index_.reserve(f.tensors_.size());
  for (size_t i = 0; i < f.tensors_.size(); ++i)
    if (!f.index_.emplace(f.tensors_[i].name, i).second)
      fail("%s: tensor '%s' appears twice in the header", label.c_str(), f.tensors_[i].name.c_str());
  return f;
}

SafetensorsFile SafetensorsFile::open_raw(const std::string& path, bool map) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("%s: cannot open (%s)", path.c_str(), std::strerror(errno));
  return from_fd(fd, path, map);
}

SafetensorsFile SafetensorsFile::from_fd(int fd, const std::string& path, bool map) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    fail("%s: not a regular file", path.c_str());
  }
  SafetensorsFile f;
  f.path_ = path;
  f.fd_ = fd;
  f.file_size_ = static_cast<uint64_t>(st.st_size);
  if (map && f.file_size_ > 0) {
    void* p = mmap(nullptr, f.file_size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) fail("%s: mmap failed (%s)", path.c_str(), std::strerror(errno));
    f.base_ = static_cast<uint8_t*>(p);
  }
  return f;
}

SafetensorsFile SafetensorsFile::open(const std::string& path, bool map) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("%s: cannot open (%s)", path.c_str(), std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    fail("%s: not a regular file", path.c_str());
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  auto bail = [&](const std::string& msg) {
    close(fd);
    throw Error(msg);
  };
  if (size < 8) bail(strfmt("%s: file is %llu bytes, too short for a safetensors header (truncated?)", path.c_str(), (unsigned long long)size));
  uint8_t lenbuf[8];
  if (pread(fd, lenbuf, 8, 0) != 8) bail(strfmt("%s: cannot read header length", path.c_str()));
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | lenbuf[i];
  if (hlen > kMaxHeaderBytes) bail(strfmt("%s: header length %llu exceeds the 100 MB limit (not a safetensors file?)", path.c_str(), (unsigned long long)hlen));
  if (hlen > size - 8) bail(strfmt("%s: header length %llu is past the end of the %llu-byte file (truncated?)", path.c_str(), (unsigned long long)hlen, (unsigned long long)size));
  std::string header(hlen, '\0');
  uint64_t got = 0;
  while (got < hlen) {
    ssize_t r = pread(fd, header.data() + got, hlen - got, 8 + got);
    if (r <= 0) bail(strfmt("%s: cannot read header (%s)", path.c_str(), r < 0 ? std::strerror(errno) : "unexpected end of file"));
    got += static_cast<uint64_t>(r);
  }
  SafetensorsFile f;
  try {
    f = parse_header(header, 8 + hlen, size, path);
  } catch (...) {
    close(fd);
    throw;
  }
  f.fd_ = fd;
  if (map && size > 0) {
    void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) fail("%s: mmap failed (%s)", path.c_str(), std::strerror(errno));
    f.base_ = static_cast<uint8_t*>(p);
  }
  return f;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::drop_tensor_table() {
  std::vector<TensorInfo>().swap(tensors_);
  std::unordered_map<std::string, size_t>().swap(index_);
}

const uint8_t* SafetensorsFile::data(const TensorInfo& t) const {
  if (base_ == nullptr) fail("%s: file is not memory-mapped", path_.c_str());
  return base_ + t.offset;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Spec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  SafetensorsWriter w(path, specs, metadata);
  for (size_t i = 0; i < tensors.size(); ++i) w.append(tensors[i].data, specs[i].nbytes());
  w.finish();
}

uint64_t SafetensorsWriter::Spec::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<Spec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tmp_(path + ".tmp") {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  for (const auto& t : specs) {
    const uint64_t n = t.nbytes();
    h[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {total_, total_ + n}}};
    total_ += n;
  }
  std::string hs = h.dump();
  while ((hs.size() + 8) % 8 != 0) hs.push_back(' ');
  fp_ = std::fopen(tmp_.c_str(), "wb");
  if (fp_ == nullptr) fail("%s: cannot create (%s)", tmp_.c_str(), std::strerror(errno));
  uint8_t lenbuf[8];
  const uint64_t hl = hs.size();
  for (int i = 0; i < 8; ++i) lenbuf[i] = static_cast<uint8_t>(hl >> (8 * i));
  if (std::fwrite(lenbuf, 1, 8, fp_) != 8 || std::fwrite(hs.data(), 1, hs.size(), fp_) != hs.size()) {
    std::fclose(fp_);
    fp_ = nullptr;
    std::remove(tmp_.c_str());
    fail("%s: write failed (disk full?)", tmp_.c_str());
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fp_ != nullptr) {
    std::fclose(fp_);
    std::remove(tmp_.c_str());
  }
}

void SafetensorsWriter::append(const void* data, uint64_t n) {
  if (fp_ == nullptr) fail("%s: append after finish", tmp_.c_str());
  if (written_ + n > total_) fail("%s: more tensor bytes than declared", tmp_.c_str());
  if (n > 0 && std::fwrite(data, 1, n, fp_) != n) fail("%s: write failed (disk full?)", tmp_.c_str());
  written_ += n;
}

void SafetensorsWriter::finish() {
  if (written_ != total_) fail("%s: %llu of %llu tensor bytes written", tmp_.c_str(), (unsigned long long)written_, (unsigned long long)total_);
  const bool ok = std::fflush(fp_) == 0 && fsync(fileno(fp_)) == 0;
  const bool closed = std::fclose(fp_) == 0;
  fp_ = nullptr;
  if (!ok || !closed) {
    std::remove(tmp_.c_str());
    fail("%s: write failed (disk full?)", tmp_.c_str());
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) fail("%s: rename failed (%s)", path_.c_str(), std::strerror(errno));
}

}  // namespace spool::io
