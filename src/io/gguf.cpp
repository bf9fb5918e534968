#include "io/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <regex>

namespace spool::io {

namespace {

constexpr uint64_t kMaxString = uint64_t{1} << 30;     // the reference reader's cap
constexpr uint64_t kMaxArray = uint64_t{1} << 30;      // elements per array
constexpr uint64_t kMaxKeyBytes = 65535;               // [G-doc]
constexpr uint64_t kMaxNameBytes = 63;                 // GGML_MAX_NAME (64) - the NUL
constexpr uint32_t kMaxDims = 4;
constexpr uint64_t kFirstRead = uint64_t{1} << 20;     // first header read by open()

/// Payload bytes of a fixed-size value type; 0 for string / array / unknown.
size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kBool: return 1;
    case GgufType::kUint16: case GgufType::kInt16: return 2;
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kFloat32: return 4;
    case GgufType::kUint64: case GgufType::kInt64: case GgufType::kFloat64: return 8;
    default: return 0;
  }
}

bool is_int_type(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kUint16: case GgufType::kInt16:
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kUint64: case GgufType::kInt64: return true;
    default: return false;
  }
}

bool is_signed_type(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 || t == GgufType::kInt64;
}

/// Little-endian bytes of a scalar of type t -> int64 (false if it does not fit).
bool bits_to_int(GgufType t, uint64_t bits, int64_t* out) {
  const size_t n = scalar_size(t);
  if (is_signed_type(t)) {
    const int sh = static_cast<int>(64 - 8 * n);
    *out = static_cast<int64_t>(bits << sh) >> sh;  // sign-extend
    return true;
  }
  if (bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  *out = static_cast<int64_t>(bits);
  return true;
}

double bits_to_float(GgufType t, uint64_t bits) {
  if (t == GgufType::kFloat32) {
    float f;
    const uint32_t u = static_cast<uint32_t>(bits);
    std::memcpy(&f, &u, 4);
    return f;
  }
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

uint64_t load_le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = n; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

/// Bounds-checked little-endian reader over the first `n` bytes of a file of `file_size` bytes.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t n, uint64_t file_size, const std::string& label)
      : p_(p), n_(n), file_size_(file_size), label_(label) {}

  size_t pos() const { return pos_; }
  /// Bytes left in the file after the cursor.
  uint64_t file_left() const { return file_size_ > pos_ ? file_size_ - pos_ : 0; }

  /// Ensures k more bytes are readable; `what` names the field for the message.
  void need(uint64_t k, const std::string& what) {
    if (k <= n_ - pos_) return;
    if (k > file_left())
      fail("%s: GGUF header truncated: %s needs %llu bytes at offset %llu, the file has %llu", label_.c_str(),
           what.c_str(), static_cast<unsigned long long>(k), static_cast<unsigned long long>(pos_),
           static_cast<unsigned long long>(file_size_));
    throw GgufNeedMore(strfmt("%s: GGUF header continues past the first %llu bytes", label_.c_str(),
                              static_cast<unsigned long long>(n_)),
                       pos_ + k);
  }
  uint64_t u(size_t bytes, const std::string& what) {
    need(bytes, what);
    const uint64_t v = load_le(p_ + pos_, bytes);
    pos_ += bytes;
    return v;
  }
  std::string str(uint64_t max_len, const std::string& what) {
    const uint64_t len = u(8, what + " length");
    if (len > max_len)
      fail("%s: %s is %llu bytes long (at most %llu)", label_.c_str(), what.c_str(), static_cast<unsigned long long>(len),
           static_cast<unsigned long long>(max_len));
    need(len, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }
  const uint8_t* bytes(uint64_t k, const std::string& what) {
    need(k, what);
    const uint8_t* q = p_ + pos_;
    pos_ += static_cast<size_t>(k);
    return q;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  uint64_t file_size_;
  const std::string& label_;
};

GgufValue read_value(Cursor& c, GgufType type, const std::string& key, const std::string& label) {
  GgufValue v;
  v.type = type;
  const std::string what = "value of key '" + key + "'";
  if (type == GgufType::kString) {
    v.str = c.str(kMaxString, what);
  } else if (type == GgufType::kArray) {
    const uint32_t et = static_cast<uint32_t>(c.u(4, what + " element type"));
    if (et > static_cast<uint32_t>(GgufType::kFloat64))
      fail("%s: key '%s': unknown array element type %u", label.c_str(), key.c_str(), et);
    v.elem = static_cast<GgufType>(et);
    if (v.elem == GgufType::kArray) fail("%s: key '%s': nested arrays are not supported", label.c_str(), key.c_str());
    v.count = c.u(8, what + " element count");
    const size_t es = scalar_size(v.elem);
    const uint64_t min_bytes = v.elem == GgufType::kString ? 8 : es;
    if (v.count > kMaxArray || v.count > c.file_left() / min_bytes)
      fail("%s: key '%s': array of %llu elements does not fit in the file", label.c_str(), key.c_str(),
           static_cast<unsigned long long>(v.count));
    if (v.elem == GgufType::kString) {
      v.strs.reserve(static_cast<size_t>(v.count));
      for (uint64_t i = 0; i < v.count; ++i) v.strs.push_back(c.str(kMaxString, what + " element"));
    } else {
      const uint8_t* p = c.bytes(v.count * es, what);
      v.raw.assign(p, p + v.count * es);
      if (v.elem == GgufType::kBool)
        for (uint8_t b : v.raw)
          if (b > 1) fail("%s: key '%s': bool array element is %u (must be 0 or 1)", label.c_str(), key.c_str(), b);
    }
  } else {
    const size_t n = scalar_size(type);
    v.bits = c.u(n, what);
    if (type == GgufType::kBool && v.bits > 1)
      fail("%s: key '%s': bool value is %llu (must be 0 or 1)", label.c_str(), key.c_str(),
           static_cast<unsigned long long>(v.bits));
  }
  return v;
}

void check_type(const GgufValue& v, bool ok, std::string_view key, const char* want) {
  if (!ok)
    fail("GGUF key '%.*s' is %s%s%s, expected %s", static_cast<int>(key.size()), key.data(), gguf_type_name(v.type),
         v.is_array() ? " of " : "", v.is_array() ? gguf_type_name(v.elem) : "", want);
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

const char* gguf_type_name(GgufType t) {
  static const char* const kNames[] = {"UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",  "FLOAT32",
                                       "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64"};
  const uint32_t i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "?";
}

int64_t GgufValue::to_int(std::string_view key) const {
  check_type(*this, is_int_type(type), key, "an integer");
  int64_t v;
  if (!bits_to_int(type, bits, &v))
    fail("GGUF key '%.*s': value %llu does not fit in int64", static_cast<int>(key.size()), key.data(),
         static_cast<unsigned long long>(bits));
  return v;
}

double GgufValue::to_float(std::string_view key) const {
  if (type == GgufType::kFloat32 || type == GgufType::kFloat64) return bits_to_float(type, bits);
  return static_cast<double>(to_int(key));
}

bool GgufValue::to_bool(std::string_view key) const {
  check_type(*this, type == GgufType::kBool, key, "a bool");
  return bits != 0;
}

const std::string& GgufValue::to_string(std::string_view key) const {
  check_type(*this, type == GgufType::kString, key, "a string");
  return str;
}

std::vector<int64_t> GgufValue::to_ints(std::string_view key) const {
  check_type(*this, is_array() && is_int_type(elem), key, "an integer array");
  const size_t es = scalar_size(elem);
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t b = load_le(raw.data() + i * es, es);
    if (!bits_to_int(elem, b, &out[i]))
      fail("GGUF key '%.*s': element %zu does not fit in int64", static_cast<int>(key.size()), key.data(), i);
  }
  return out;
}

std::vector<double> GgufValue::to_floats(std::string_view key) const {
  const bool fl = elem == GgufType::kFloat32 || elem == GgufType::kFloat64;
  check_type(*this, is_array() && (fl || is_int_type(elem)), key, "a number array");
  if (!fl) {
    std::vector<int64_t> v = to_ints(key);
    return std::vector<double>(v.begin(), v.end());
  }
  const size_t es = scalar_size(elem);
  std::vector<double> out(static_cast<size_t>(count));
  for (size_t i = 0; i < out.size(); ++i) out[i] = bits_to_float(elem, load_le(raw.data() + i * es, es));
  return out;
}

const std::vector<std::string>& GgufValue::to_strings(std::string_view key) const {
  check_type(*this, is_array() && elem == GgufType::kString, key, "a string array");
  return strs;
}

std::string GgufTensor::shape_string() const {
  std::string s = "[";
  for (uint32_t i = 0; i < std::max<uint32_t>(n_dims, 1); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

GgufHeader GgufFile::parse_header(const uint8_t* bytes, size_t n, uint64_t file_size, const std::string& label) {
  const char* L = label.c_str();
  if (n > file_size) n = static_cast<size_t>(file_size);
  Cursor c(bytes, n, file_size, label);
  GgufHeader h;
  h.label = label;
  h.file_size = file_size;
  if (file_size < 4) fail("%s: file is %llu bytes, too short for a GGUF header (truncated?)", L, static_cast<unsigned long long>(file_size));
  const uint8_t* magic = c.bytes(4, "magic");
  if (std::memcmp(magic, "GGUF", 4) != 0)
    fail("%s: not a GGUF file (magic bytes %02x %02x %02x %02x, expected 'GGUF')", L, magic[0], magic[1], magic[2], magic[3]);
  h.version = static_cast<uint32_t>(c.u(4, "version"));
  if ((h.version & 0xFFFFu) == 0 && h.version != 0)
    fail("%s: big-endian GGUF files are not supported (version word 0x%08x)", L, h.version);
  if (h.version != 2 && h.version != 3)
    fail("%s: GGUF version %u is not supported (only 2 and 3)", L, h.version);
  const uint64_t n_tensors = c.u(8, "tensor count");
  const uint64_t n_kv = c.u(8, "metadata count");
  // Each KV record takes at least 8 (key length) + 4 (type) + 1 bytes, each tensor info at
  // least 8 + 4 + 4 + 8 bytes: reject counts the file cannot hold before allocating anything.
  if (n_kv > c.file_left() / 13)
    fail("%s: metadata count %llu is larger than the %llu-byte file can hold", L, static_cast<unsigned long long>(n_kv),
         static_cast<unsigned long long>(file_size));
  if (n_tensors > c.file_left() / 24)
    fail("%s: tensor count %llu is larger than the %llu-byte file can hold", L,
         static_cast<unsigned long long>(n_tensors), static_cast<unsigned long long>(file_size));

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.str(kMaxKeyBytes, "key " + std::to_string(i));
    const uint32_t vt = static_cast<uint32_t>(c.u(4, "type of key '" + key + "'"));
    if (vt > static_cast<uint32_t>(GgufType::kFloat64)) fail("%s: key '%s': unknown value type %u", L, key.c_str(), vt);
    GgufValue v = read_value(c, static_cast<GgufType>(vt), key, label);
    if (!h.kv.emplace(key, std::move(v)).second) fail("%s: duplicate metadata key '%s'", L, key.c_str());
  }
  if (auto it = h.kv.find("general.alignment"); it != h.kv.end()) {
    const GgufValue& a = it->second;
    if (a.type != GgufType::kUint32)
      fail("%s: general.alignment is %s, expected UINT32", L, gguf_type_name(a.type));
    if (a.bits == 0 || (a.bits & (a.bits - 1)) != 0)
      fail("%s: general.alignment %llu is not a power of two", L, static_cast<unsigned long long>(a.bits));
    h.alignment = static_cast<uint32_t>(a.bits);
  }

  std::unordered_map<std::string, size_t> names;
  h.tensors.reserve(static_cast<size_t>(n_tensors));
  std::vector<uint64_t> rel(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.str(kMaxNameBytes, "name of tensor " + std::to_string(i));
    const char* tn = t.name.c_str();
    if (!names.emplace(t.name, static_cast<size_t>(i)).second) fail("%s: duplicate tensor name '%s'", L, tn);
    const std::string what = "tensor '" + t.name + "'";
    t.n_dims = static_cast<uint32_t>(c.u(4, what + " dimension count"));
    if (t.n_dims > kMaxDims) fail("%s: tensor '%s' has %u dimensions (at most 4)", L, tn, t.n_dims);
    unsigned __int128 numel = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      const uint64_t ne = c.u(8, what + " dimensions");
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail("%s: tensor '%s': dimension %u is negative", L, tn, d);
      t.ne[d] = static_cast<int64_t>(ne);
      numel *= ne;
      if (numel > static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max()))
        fail("%s: tensor '%s': element count overflows", L, tn);
    }
    const uint32_t type = static_cast<uint32_t>(c.u(4, what + " type"));
    const GgmlTypeTraits tr = ggml_type_traits(type);
    if (tr.blck == 0)
      fail("%s: tensor '%s': %s ggml type id %u", L, tn, type < kGgmlTypeCount ? "retired" : "unknown", type);
    t.type = static_cast<GgmlType>(type);
    if (t.ne[0] % tr.blck != 0)
      fail("%s: tensor '%s': row length %lld is not a multiple of the %s block size %u", L, tn,
           static_cast<long long>(t.ne[0]), tr.name, tr.blck);
    const unsigned __int128 nbytes = numel / tr.blck * tr.size;
    if (nbytes > file_size)
      fail("%s: tensor '%s' (%s %s) needs %llu bytes, more than the %llu-byte file", L, tn, tr.name,
           t.shape_string().c_str(), static_cast<unsigned long long>(std::min<unsigned __int128>(nbytes, ~0ull)),
           static_cast<unsigned long long>(file_size));
    t.nbytes = static_cast<uint64_t>(nbytes);
    rel[static_cast<size_t>(i)] = c.u(8, what + " offset");
    if (rel[static_cast<size_t>(i)] % h.alignment != 0)
      fail("%s: tensor '%s': data offset %llu is not a multiple of the alignment %u", L, tn,
           static_cast<unsigned long long>(rel[static_cast<size_t>(i)]), h.alignment);
    h.tensors.push_back(std::move(t));
  }
  uint64_t end = c.pos();
  if (n_tensors > 0) end = (end + h.alignment - 1) / h.alignment * h.alignment;  // padding only before data
  if (end > file_size)
    fail("%s: data section starts at %llu, past the end of the %llu-byte file (truncated?)", L,
         static_cast<unsigned long long>(end), static_cast<unsigned long long>(file_size));
  h.data_offset = end;
  const uint64_t data_len = file_size - end;
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    GgufTensor& t = h.tensors[i];
    if (rel[i] > data_len || t.nbytes > data_len - rel[i])
      fail("%s: tensor '%s' (%llu bytes at data offset %llu) ends past the end of the file (data section is %llu "
           "bytes; truncated?)",
           L, t.name.c_str(), static_cast<unsigned long long>(t.nbytes), static_cast<unsigned long long>(rel[i]),
           static_cast<unsigned long long>(data_len));
    t.offset = end + rel[i];
  }
  // No two non-empty tensors may share bytes.
  std::vector<const GgufTensor*> order;
  for (const GgufTensor& t : h.tensors)
    if (t.nbytes > 0) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  const GgufTensor* furthest = nullptr;
  for (const GgufTensor* t : order) {
    if (furthest != nullptr && t->offset < furthest->offset + furthest->nbytes)
      fail("%s: tensors '%s' and '%s' overlap in the data section", L, furthest->name.c_str(), t->name.c_str());
    if (furthest == nullptr || t->offset + t->nbytes > furthest->offset + furthest->nbytes) furthest = t;
  }
  return h;
}

namespace {

/// Opens and parses one shard; returns its header and fd (caller owns the fd).
GgufHeader open_shard(const std::string& path, int* fd_out) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail("%s: cannot open (%s)", path.c_str(), std::strerror(errno));
  struct stat st;
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) fail("%s: not a regular file", path.c_str());
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint64_t want = std::min(size, kFirstRead);
  std::vector<uint8_t> buf;
  for (;;) {
    const uint64_t have = buf.size();
    buf.resize(static_cast<size_t>(want));
    for (uint64_t got = have; got < want;) {
      const ssize_t r = pread(fd.get(), buf.data() + got, static_cast<size_t>(want - got), static_cast<off_t>(got));
      if (r <= 0) fail("%s: cannot read header (%s)", path.c_str(), r < 0 ? std::strerror(errno) : "unexpected end of file");
      got += static_cast<uint64_t>(r);
    }
    try {
      GgufHeader h = GgufFile::parse_header(buf.data(), buf.size(), size, path);
      *fd_out = fd.release();
      return h;
    } catch (const GgufNeedMore& e) {
      want = std::min(size, std::max(e.needed(), 2 * want));
    }
  }
}

}  // namespace

std::vector<std::string> gguf_split_paths(const std::string& path) {
  static const std::regex kPat(R"(^(.*)-(\d{5})-of-(\d{5})\.gguf$)");
  std::smatch m;
  if (!std::regex_match(path, m, kPat)) return {};
  const int count = std::stoi(m[3].str());
  if (count < 1) return {};
  std::vector<std::string> out;
  for (int i = 1; i <= count; ++i) out.push_back(strfmt("%s-%05d-of-%05d.gguf", m[1].str().c_str(), i, count));
  return out;
}

GgufFile GgufFile::open(const std::string& path, bool map) {
  GgufFile f;
  f.path_ = path;
  auto add_shard = [&](const std::string& p) {
    Shard s;
    s.h = open_shard(p, &s.fd);
    f.shards_.push_back(std::move(s));  // f owns the fd from here (closed by ~GgufFile on error)
  };
  add_shard(path);
  const GgufValue* cnt = f.shards_[0].h.kv.count("split.count") ? &f.shards_[0].h.kv.at("split.count") : nullptr;
  const int64_t count = cnt ? cnt->to_int("split.count") : 1;
  if (count < 1 || count > 99999) fail("%s: split.count %lld is out of range", path.c_str(), static_cast<long long>(count));
  if (count > 1) {
    const std::vector<std::string> paths = gguf_split_paths(path);
    if (paths.empty())
      fail("%s: split.count is %lld but the name does not follow PREFIX-NNNNN-of-MMMMM.gguf", path.c_str(),
           static_cast<long long>(count));
    if (static_cast<int64_t>(paths.size()) != count)
      fail("%s: split.count is %lld but the name says %zu shards", path.c_str(), static_cast<long long>(count), paths.size());
    const size_t given = static_cast<size_t>(std::find(paths.begin(), paths.end(), path) - paths.begin());
    // Reorder: shard `given` is loaded; load the others around it in shard order.
    Shard first = std::move(f.shards_[0]);
    f.shards_.clear();
    try {
      for (size_t i = 0; i < paths.size(); ++i) {
        if (i == given) {
          f.shards_.push_back(std::move(first));
          first.fd = -1;
        } else {
          add_shard(paths[i]);
        }
      }
    } catch (...) {
      if (first.fd >= 0) close(first.fd);
      throw;
    }
  }
  f.index_shards(count);
  if (map) {
    for (Shard& s : f.shards_) {
      if (s.h.file_size == 0) continue;
      void* p = mmap(nullptr, s.h.file_size, PROT_READ, MAP_SHARED, s.fd, 0);
      if (p == MAP_FAILED) fail("%s: mmap failed (%s)", s.h.label.c_str(), std::strerror(errno));
      s.base = static_cast<uint8_t*>(p);
    }
  }
  return f;
}

void GgufFile::index_shards(int64_t count) {
  GgufFile& f = *this;
  if (count > 1) {
    int64_t total = 0;
    for (size_t i = 0; i < f.shards_.size(); ++i) {
      const GgufHeader& h = f.shards_[i].h;
      auto no = h.kv.find("split.no"), sc = h.kv.find("split.count");
      if (no == h.kv.end() || sc == h.kv.end()) fail("%s: shard of a split set without split.no / split.count", h.label.c_str());
      if (no->second.to_int("split.no") != static_cast<int64_t>(i))
        fail("%s: split.no is %lld, expected %zu from the file name", h.label.c_str(),
             static_cast<long long>(no->second.to_int("split.no")), i);
      if (sc->second.to_int("split.count") != count)
        fail("%s: split.count is %lld, shard 1 says %lld", h.label.c_str(),
             static_cast<long long>(sc->second.to_int("split.count")), static_cast<long long>(count));
      total += static_cast<int64_t>(h.tensors.size());
    }
    const GgufValue* tc = f.find_key("split.tensors.count");
    if (tc == nullptr) fail("%s: split set without split.tensors.count", f.shards_[0].h.label.c_str());
    if (tc->to_int("split.tensors.count") != total)
      fail("%s: split.tensors.count is %lld but the %lld shards hold %lld tensors", f.shards_[0].h.label.c_str(),
           static_cast<long long>(tc->to_int("split.tensors.count")), static_cast<long long>(count),
           static_cast<long long>(total));
  }
  for (size_t i = 0; i < f.shards_.size(); ++i) {
    for (const GgufTensor& t : f.shards_[i].h.tensors) {
      GgufTensor g = t;
      g.shard = static_cast<uint32_t>(i);
      if (!f.index_.emplace(g.name, f.tensors_.size()).second)
        fail("%s: tensor '%s' appears in two shards", f.shards_[i].h.label.c_str(), g.name.c_str());
      f.tensors_.push_back(std::move(g));
    }
  }
}

GgufFile GgufFile::from_headers(std::vector<GgufHeader> headers, const std::string& label) {
  if (headers.empty()) fail("%s: no GGUF headers given", label.c_str());
  GgufFile f;
  f.path_ = label;
  for (GgufHeader& h : headers) {
    Shard s;
    s.h = std::move(h);
    f.shards_.push_back(std::move(s));
  }
  const GgufValue* cnt = f.find_key("split.count");
  const int64_t count = cnt ? cnt->to_int("split.count") : 1;
  if (count < 1 || count > 99999) fail("%s: split.count %lld is out of range", label.c_str(), static_cast<long long>(count));
  if (count != static_cast<int64_t>(f.shards_.size()))
    fail("%s: split.count is %lld but %zu shard headers were given", label.c_str(), static_cast<long long>(count), f.shards_.size());
  f.index_shards(count);
  return f;
}

GgufFile::GgufFile(GgufFile&& o) noexcept { *this = std::move(o); }

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
  if (this != &o) {
    this->~GgufFile();
    path_ = std::move(o.path_);
    shards_ = std::move(o.shards_);
    tensors_ = std::move(o.tensors_);
    index_ = std::move(o.index_);
    o.shards_.clear();
  }
  return *this;
}

GgufFile::~GgufFile() {
  for (Shard& s : shards_) {
    if (s.base != nullptr) munmap(s.base, s.h.file_size);
    if (s.fd >= 0) close(s.fd);
    s.base = nullptr;
    s.fd = -1;
  }
}

const GgufValue* GgufFile::find_key(std::string_view key) const {
  if (shards_.empty()) return nullptr;
  auto it = metadata().find(std::string(key));
  return it == metadata().end() ? nullptr : &it->second;
}

std::string GgufFile::architecture() const {
  const GgufValue* v = find_key("general.architecture");
  if (v == nullptr) fail("%s: GGUF metadata has no general.architecture", path_.c_str());
  return v->to_string("general.architecture");
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find_key(key);
  if (v == nullptr) return std::nullopt;
  return v->to_int(key);
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find_key(key);
  if (v == nullptr) return std::nullopt;
  return v->to_float(key);
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find_key(key);
  if (v == nullptr) return std::nullopt;
  return v->to_string(key);
}

const GgufTensor* GgufFile::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* GgufFile::data(const GgufTensor& t) const {
  if (t.shard >= shards_.size() || shards_[t.shard].base == nullptr)
    fail("%s: tensor '%s': file is not memory-mapped", path_.c_str(), t.name.c_str());
  return shards_[t.shard].base + t.offset;
}

}  // namespace spool::io
