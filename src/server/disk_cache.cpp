#include "server/disk_cache.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"

namespace fs = std::filesystem;

namespace spool::server {

namespace {

constexpr char kMagic[8] = {'S', 'P', 'O', 'O', 'L', 'P', 'C', '1'};
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

int64_t mtime_ns(const fs::path& p) {
  std::error_code ec;
  auto t = fs::last_write_time(p, ec);
  return ec ? 0 : static_cast<int64_t>(t.time_since_epoch().count());
}

// The first `n` bytes of a file (fewer if it is shorter).
std::string read_head(const std::string& path, size_t n) {
  std::ifstream f(path, std::ios::binary);
  std::string s(n, '\0');
  f.read(s.data(), static_cast<std::streamsize>(n));
  s.resize(static_cast<size_t>(std::max<std::streamsize>(f.gcount(), 0)));
  return s;
}

// Parses magic, header and tokens from the start of a snapshot. Returns the offset after the
// tokens, or 0 when malformed / more bytes are needed than `head` holds (`need` tells how many).
size_t parse_head(std::string_view head, uint64_t file_size, std::string& fp, std::vector<int32_t>& tokens, size_t& need) {
  need = 16;
  if (head.size() < 16 || std::memcmp(head.data(), kMagic, 8) != 0) return 0;
  const uint64_t hl = get_u64(head.data() + 8);
  if (hl == 0 || hl > kMaxHeader || 16 + hl > file_size) return 0;
  need = 16 + hl;
  if (head.size() < need) return 0;
  auto j = nlohmann::json::parse(head.substr(16, hl), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("fingerprint") || !j["fingerprint"].is_string() || !j.contains("tokens") ||
      !j["tokens"].is_number_unsigned())
    return 0;
  const uint64_t n = j["tokens"].get<uint64_t>();
  if (n == 0 || n > kMaxTokens || 16 + hl + 4 * n + 8 > file_size) return 0;
  need = 16 + hl + 4 * n;
  if (head.size() < need) return 0;
  fp = j["fingerprint"].get<std::string>();
  tokens.resize(n);
  std::memcpy(tokens.data(), head.data() + 16 + hl, 4 * n);
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
  id += strfmt("|kv%d|step%lld|k%d", kv_bits, (long long)prefill_step, max_active_experts);
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
  evict_locked();
}

void DiskCache::index_file(const std::string& path) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  Entry e;
  e.path = path;
  e.size = ec ? 0 : size;
  e.mtime_ns = mtime_ns(path);
  // Magic and header length, then the header, then the tokens: each read takes the bytes the
  // previous parse said it needs (a file shorter than that is malformed).
  std::string head;
  size_t need = 16, ok = 0;
  while (!ok && need > head.size()) {
    head = read_head(path, need);
    if (head.size() < need) break;
    ok = parse_head(head, e.size, e.fingerprint, e.tokens, need);
  }
  if (!ok) {
    log_warn("disk cache: %s is not a valid snapshot; deleted", path.c_str());
    fs::remove(path, ec);
    ++st_.corrupt;
    return;
  }
  entries_.push_back(std::move(e));
}

int DiskCache::best_index_locked(std::span<const int32_t> prompt, int64_t limit) const {
  int best = -1;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    const int64_t n = static_cast<int64_t>(e.tokens.size());
    if (e.fingerprint != fp_ || n > limit || n > static_cast<int64_t>(prompt.size())) continue;
    if (best >= 0 && n <= static_cast<int64_t>(entries_[best].tokens.size())) continue;
    if (std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin())) best = static_cast<int>(i);
  }
  return best;
}

int64_t DiskCache::best_match(std::span<const int32_t> prompt, int64_t limit) const {
  std::lock_guard lock(mu_);
  const int i = best_index_locked(prompt, limit);
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

int64_t DiskCache::load(std::span<const int32_t> prompt, int64_t limit, models::State& state) {
  std::lock_guard lock(mu_);
  const int i = best_index_locked(prompt, limit);
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
  size_t need = 0;
  size_t off = data.size() >= 8 ? parse_head(data, data.size(), fp, tokens, need) : 0;
  if (!off || fp != fp_ || tokens != e.tokens ||
      get_u64(data.data() + data.size() - 8) != checksum64(std::string_view(data).substr(0, data.size() - 8))) {
    drop_locked(i, true);
    return 0;
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  const size_t end = data.size() - 8;
  // Every layer's size is checked before `state` is touched: a bad file leaves it as it was.
  std::vector<std::string_view> layers;
  for (size_t l = 0; l < state.attn.size(); ++l) {
    if (off + 8 > end) return drop_locked(i, true), 0;
    const uint64_t len = get_u64(data.data() + off);
    off += 8;
    if (len > end - off) return drop_locked(i, true), 0;
    const models::GdnState& g = state.gdn[l];
    const uint64_t want = g.recurrent.empty() ? static_cast<uint64_t>(n) * state.attn[l].bytes_per_position()
                                              : (g.conv.size() + g.recurrent.size()) * sizeof(float);
    if (len != want) return drop_locked(i, true), 0;
    layers.emplace_back(data.data() + off, len);
    off += len;
  }
  if (off != end) return drop_locked(i, true), 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    models::GdnState& g = state.gdn[l];
    if (g.recurrent.empty()) {
      state.attn[l].load_prefix(layers[l], n);
    } else {
      std::memcpy(g.conv.data(), layers[l].data(), g.conv.size() * sizeof(float));
      std::memcpy(g.recurrent.data(), layers[l].data() + g.conv.size() * sizeof(float), g.recurrent.size() * sizeof(float));
    }
  }
  state.pos = n;
  state.poisoned = false;
  std::error_code ec;
  fs::last_write_time(e.path, fs::file_time_type::clock::now(), ec);  // LRU: most recently used
  entries_[i].mtime_ns = mtime_ns(e.path);
  ++st_.hits;
  return n;
}

void DiskCache::save(std::span<const int32_t> tokens, const models::State& state, const std::vector<models::GdnState>& gdn) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n <= 0 || gdn.size() != state.attn.size()) return;
  std::string name = hex64(checksum64(fp_ + std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4))) + kExt;
  const std::string path = (fs::path(dir_) / name).string();
  {
    std::lock_guard lock(mu_);
    for (const Entry& e : entries_)
      if (e.path == path) return;
  }
  std::string out(kMagic, 8);
  const std::string header = nlohmann::json{{"fingerprint", fp_}, {"tokens", static_cast<uint64_t>(n)}}.dump();
  put_u64(out, header.size());
  out += header;
  out.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
  for (size_t l = 0; l < state.attn.size(); ++l) {
    if (gdn[l].recurrent.empty()) {
      put_u64(out, static_cast<uint64_t>(n) * state.attn[l].bytes_per_position());
      state.attn[l].save_prefix(n, out);
    } else {
      put_u64(out, (gdn[l].conv.size() + gdn[l].recurrent.size()) * sizeof(float));
      out.append(reinterpret_cast<const char*>(gdn[l].conv.data()), gdn[l].conv.size() * sizeof(float));
      out.append(reinterpret_cast<const char*>(gdn[l].recurrent.data()), gdn[l].recurrent.size() * sizeof(float));
    }
  }
  put_u64(out, checksum64(out));
  if (out.size() > budget_) return;
  try {
    write_file_atomic(path, out);
  } catch (const Error& e) {
    log_warn("disk cache: %s", e.what());
    return;
  }
  std::lock_guard lock(mu_);
  Entry e;
  e.path = path;
  e.fingerprint = fp_;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.size = out.size();
  e.mtime_ns = mtime_ns(path);
  entries_.push_back(std::move(e));
  ++st_.saves;
  evict_locked();
}

void DiskCache::evict_locked() {
  uint64_t total = 0;
  for (const Entry& e : entries_) total += e.size;
  while (total > budget_ && !entries_.empty()) {
    size_t oldest = 0;
    for (size_t i = 1; i < entries_.size(); ++i)
      if (entries_[i].mtime_ns < entries_[oldest].mtime_ns) oldest = i;
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
