#include "server/disk_cache.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"

namespace fs = std::filesystem;

namespace spool::server {

namespace {

// Version 3: the state image is models::State's version 2 (sliding-window layers store their
// window's rows only); version 2 files hold version 1 images and are deleted at start.
constexpr char kMagic[8] = {'S', 'P', 'O', 'O', 'L', 'P', 'C', '3'};
constexpr size_t kFamily = 7;      // "SPOOLPC": any version of the format
constexpr size_t kAccessAt = 8;    // offset of the access counter
constexpr size_t kHeaderAt = 16;   // offset of the header length; the checksum starts here
constexpr const char* kExt = ".spc";
constexpr uint64_t kMaxHeader = 1 << 20;
constexpr uint64_t kMaxTokens = 1ull << 28;

void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
uint64_t get_u64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
  return buf;
}

// The first `n` bytes of a file (fewer if it is shorter).
std::string read_head(const std::string& path, size_t n) {
  std::ifstream f(path, std::ios::binary);
  std::string s(n, '\0');
  f.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(std::max<std::streamsize>(f.gcount(), 0)));
  return s;
}

// Whether `head` starts like a snapshot of another format version.
bool other_version(std::string_view head) {
  return head.size() >= 8 && std::memcmp(head.data(), kMagic, kFamily) == 0 && head[kFamily] != kMagic[kFamily];
}

// Parses magic, access counter, header and tokens from the start of a snapshot. Returns the
// offset after the tokens, or 0 when malformed / more bytes are needed than `head` holds
// (`need` tells how many).
size_t parse_head(std::string_view head, uint64_t file_size, std::string& fp, std::vector<int32_t>& tokens, uint64_t& access,
                  size_t& need) {
  need = kHeaderAt + 8;
  if (head.size() < need || std::memcmp(head.data(), kMagic, 8) != 0) return 0;
  access = get_u64(head.data() + kAccessAt);
  const uint64_t hl = get_u64(head.data() + kHeaderAt);
  const uint64_t h0 = kHeaderAt + 8;  // header start
  if (hl == 0 || hl > kMaxHeader || h0 + hl > file_size) return 0;
  need = h0 + hl;
  if (head.size() < need) return 0;
  auto j = nlohmann::json::parse(head.substr(h0, hl), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("fingerprint") || !j["fingerprint"].is_string() || !j.contains("tokens") ||
      !j["tokens"].is_number_unsigned())
    return 0;
  const uint64_t n = j["tokens"].get<uint64_t>();
  if (n == 0 || n > kMaxTokens || h0 + hl + 4 * n + 8 > file_size) return 0;
  need = h0 + hl + 4 * n;
  if (head.size() < need) return 0;
  fp = j["fingerprint"].get<std::string>();
  tokens.resize(n);
  std::memcpy(tokens.data(), head.data() + h0 + hl, 4 * n);
  return need;
}

}  // namespace

uint64_t checksum64(std::string_view d) {
  // FNV-1a over 64-bit words with a final avalanche (splitmix64 finalizer).
  uint64_t h = 0xcbf29ce484222325ull ^ d.size();
  size_t i = 0;
  for (; i + 8 <= d.size(); i += 8) h = (h ^ get_u64(d.data() + i)) * 0x100000001b3ull;
  for (; i < d.size(); ++i) h = (h ^ static_cast<unsigned char>(d[i])) * 0x100000001b3ull;
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

std::string model_fingerprint(const io::Checkpoint& ckpt, int kv_bits, int64_t prefill_step, int max_active_experts) {
  std::string id = read_whole_file(ckpt.dir() + "/config.json");
  for (const auto& shard : ckpt.shards()) {
    // The safetensors header (u64 length + JSON) names every tensor's dtype, shape and offsets.
    const std::string head = read_head(shard.path(), 8);
    uint64_t hl = head.size() == 8 ? get_u64(head.data()) : 0;
    id += "|" + fs::path(shard.path()).filename().string() + ":" + std::to_string(fs::file_size(shard.path())) + ":";
    id += read_head(shard.path(), 8 + static_cast<size_t>(std::min<uint64_t>(hl, 64u << 20)));
  }
  // (a state image has the MTP layers' caches when the head is kept: --spec mtp)
  id += strfmt("|kv%d|step%lld|k%d|mtp%d", kv_bits, (long long)prefill_step, max_active_experts, ckpt.mtp_layers());
  return hex64(checksum64(id)) + hex64(checksum64(id + "#2"));
}

DiskCache::DiskCache(std::string dir, uint64_t budget_bytes, std::string fingerprint)
    : dir_(std::move(dir)), budget_(budget_bytes), fp_(std::move(fingerprint)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) fail("--disk-cache %s: cannot create the directory (%s)", dir_.c_str(), ec.message().c_str());
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string path = it->path().string();
    const std::string name = it->path().filename().string();
    if (name.size() > 8 && name.ends_with(std::string(kExt) + ".tmp")) {
      fs::remove(path, ec);  // an interrupted write
      continue;
    }
    if (name.ends_with(kExt) && it->is_regular_file()) index_file(path);
  }
  if (ec) fail("--disk-cache %s: cannot read the directory (%s)", dir_.c_str(), ec.message().c_str());
  std::lock_guard lock(mu_);
  for (const Entry& e : entries_) clock_ = std::max(clock_, e.access);
  evict_locked();
}

void DiskCache::index_file(const std::string& path) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  Entry e;
  e.path = path;
  e.size = ec ? 0 : size;
  // Magic, access counter and header length, then the header, then the tokens: each read takes
  // the bytes the previous parse said it needs (a file shorter than that is malformed).
  std::string head;
  size_t need = kHeaderAt + 8, ok = 0;
  while (!ok && need > head.size()) {
    head = read_head(path, need);
    if (head.size() < need) break;
    ok = parse_head(head, e.size, e.fingerprint, e.tokens, e.access, need);
  }
  if (!ok && other_version(head)) {
    log_info("disk cache: %s is a snapshot of another format version; deleted", path.c_str());
    fs::remove(path, ec);
    return;
  }
  if (!ok) {
    log_warn("disk cache: %s is not a valid snapshot; deleted", path.c_str());
    fs::remove(path, ec);
    ++st_.corrupt;
    return;
  }
  entries_.push_back(std::move(e));
}

std::string DiskCache::fingerprint_of(const std::string& variant) const { return variant.empty() ? fp_ : fp_ + "+lora:" + variant; }

int DiskCache::best_index_locked(std::span<const int32_t> prompt, int64_t limit, const std::string& fp) const {
  int best = -1;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    const int64_t n = static_cast<int64_t>(e.tokens.size());
    if (e.fingerprint != fp || n > limit || n > static_cast<int64_t>(prompt.size())) continue;
    if (best >= 0 && n <= static_cast<int64_t>(entries_[best].tokens.size())) continue;
    if (std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin())) best = static_cast<int>(i);
  }
  return best;
}

int64_t DiskCache::best_match(std::span<const int32_t> prompt, int64_t limit, const std::string& variant) const {
  std::lock_guard lock(mu_);
  const int i = best_index_locked(prompt, limit, fingerprint_of(variant));
  return i < 0 ? 0 : static_cast<int64_t>(entries_[i].tokens.size());
}

void DiskCache::drop_locked(size_t i, bool corrupt) {
  std::error_code ec;
  fs::remove(entries_[i].path, ec);
  if (corrupt) {
    log_warn("disk cache: %s failed its check; deleted", entries_[i].path.c_str());
    ++st_.corrupt;
  } else {
    ++st_.evictions;
  }
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
}

void DiskCache::touch_locked(size_t i) {
  Entry& e = entries_[i];
  e.access = ++clock_;
  // In place, outside the checksum: a failed or torn write only changes the eviction order.
  std::fstream f(e.path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(kAccessAt));
  f.write(reinterpret_cast<const char*>(&e.access), 8);
  if (!f) log_warn("disk cache: cannot update the access counter of %s", e.path.c_str());
}

int64_t DiskCache::load(std::span<const int32_t> prompt, int64_t limit, models::State& state, const std::string& variant) {
  std::lock_guard lock(mu_);
  const std::string want = fingerprint_of(variant);
  const int i = best_index_locked(prompt, limit, want);
  if (i < 0) return 0;
  const Entry& e = entries_[i];
  std::string data;
  try {
    data = read_whole_file(e.path);
  } catch (const Error&) {
    drop_locked(i, true);
    return 0;
  }
  std::string fp;
  std::vector<int32_t> tokens;
  uint64_t access = 0;
  size_t need = 0;
  const size_t off = parse_head(data, data.size(), fp, tokens, access, need);
  // parse_head guarantees the checksum's 8 bytes after the tokens.
  if (!off || fp != want || tokens != e.tokens ||
      get_u64(data.data() + data.size() - 8) != checksum64(std::string_view(data).substr(kHeaderAt, data.size() - 8 - kHeaderAt))) {
    drop_locked(i, true);
    return 0;
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  try {
    // Checks the whole image before it touches `state`: a bad file leaves it as it was.
    state.deserialize(std::string_view(data).substr(off, data.size() - 8 - off), n);
  } catch (const Error& err) {
    log_warn("disk cache: %s: %s", e.path.c_str(), err.what());
    drop_locked(i, true);
    return 0;
  }
  touch_locked(i);
  ++st_.hits;
  return n;
}

void DiskCache::save(std::span<const int32_t> tokens, const models::State& state, const models::StateSnapshot& at,
                     const std::string& variant) {
  const std::string fp = fingerprint_of(variant);
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n <= 0) return;
  if (at.pos() != n) {
    log_warn("disk cache: not saved: the snapshot is at position %lld, not after the %lld tokens given", (long long)at.pos(), (long long)n);
    return;
  }
  std::string name = hex64(checksum64(fp + std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4))) + kExt;
  const std::string path = (fs::path(dir_) / name).string();
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].path == path) return touch_locked(i);
  }
  std::string out(kMagic, 8);
  put_u64(out, 0);  // access counter, set below
  const std::string header = nlohmann::json{{"fingerprint", fp}, {"tokens", static_cast<uint64_t>(n)}}.dump();
  put_u64(out, header.size());
  out += header;
  out.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
  try {
    state.serialize(at, out);
  } catch (const Error& e) {
    log_warn("disk cache: not saved: %s", e.what());
    return;
  }
  put_u64(out, checksum64(std::string_view(out).substr(kHeaderAt)));
  if (out.size() > budget_) return;
  uint64_t access;
  {
    std::lock_guard lock(mu_);
    access = ++clock_;
  }
  std::memcpy(out.data() + kAccessAt, &access, 8);
  try {
    write_file_atomic(path, out);
  } catch (const Error& e) {
    log_warn("disk cache: %s", e.what());
    return;
  }
  std::lock_guard lock(mu_);
  Entry e;
  e.path = path;
  e.fingerprint = fp;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.size = out.size();
  e.access = access;
  entries_.push_back(std::move(e));
  ++st_.saves;
  evict_locked();
}

uint64_t DiskCache::last_use(std::span<const int32_t> tokens, const std::string& variant) const {
  std::lock_guard lock(mu_);
  const std::string fp = fingerprint_of(variant);
  for (const Entry& e : entries_)
    if (e.fingerprint == fp && std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end())) return e.access;
  return 0;
}

void DiskCache::evict_locked() {
  uint64_t total = 0;
  for (const Entry& e : entries_) total += e.size;
  while (total > budget_ && !entries_.empty()) {
    size_t oldest = 0;  // smallest access counter; ties by file name (deterministic)
    for (size_t i = 1; i < entries_.size(); ++i)
      if (std::tie(entries_[i].access, entries_[i].path) < std::tie(entries_[oldest].access, entries_[oldest].path)) oldest = i;
    total -= entries_[oldest].size;
    drop_locked(oldest, false);
  }
}

DiskCacheStats DiskCache::stats() const {
  std::lock_guard lock(mu_);
  DiskCacheStats s = st_;
  s.files = entries_.size();
  s.bytes = 0;
  for (const Entry& e : entries_) s.bytes += e.size;
  return s;
}

}  // namespace spool::server
