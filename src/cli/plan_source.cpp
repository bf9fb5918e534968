#include "cli/plan_source.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "io/config.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "cli/http_client.h"
#include "models/family.h"

namespace spool::plan {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kFirstRange = 16 << 10;         // first bytes asked of each shard
constexpr uint64_t kMaxHeader = 100ull << 20;      // safetensors' own header limit
constexpr uint64_t kMaxJson = 32ull << 20;         // config / index files

// GET of a whole small file; nullopt on 404 when `optional`.
std::optional<std::string> get_file(HttpClient& http, const std::string& url, bool optional) {
  HttpResponse r = http.get(url, kMaxJson);
  if (r.status == 404 && optional) return std::nullopt;
  if (r.status == 404) fail("%s: not found (HTTP 404)", url.c_str());
  if (r.status != 200) fail("%s: HTTP %ld", url.c_str(), r.status);
  if (r.cut_short) fail("%s: larger than %llu bytes", url.c_str(), (unsigned long long)kMaxJson);
  return r.body;
}

io::Config parse_json(const std::string& text, const std::string& label) {
  try {
    return io::Config(nlohmann::json::parse(text), label);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: not valid JSON (%s)", label.c_str(), e.what());
  }
}

// Fetches and validates the safetensors header of one remote shard.
io::SafetensorsFile remote_header(HttpClient& http, const std::string& url) {
  HttpResponse r = http.get(url, kFirstRange, 0, kFirstRange - 1);
  if (r.status == 404) fail("%s: not found (HTTP 404)", url.c_str());
  if (r.status != 200 && r.status != 206) fail("%s: HTTP %ld", url.c_str(), r.status);
  if (r.status == 206 && !r.range_honored) fail("%s: the server answered a different byte range than asked for", url.c_str());
  const bool ranged = r.range_honored;
  std::string buf = std::move(r.body);
  const std::optional<uint64_t> total = r.total_size;
  if (buf.size() < 8)
    fail("%s: truncated safetensors file: %zu bytes, shorter than the 8-byte header length", url.c_str(), buf.size());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(buf[i]);
  if (n > kMaxHeader) fail("%s: safetensors header length %llu is over the 100 MB limit", url.c_str(), (unsigned long long)n);
  const uint64_t need = 8 + n;
  if (total && need > *total)
    fail("%s: truncated safetensors header: it declares %llu bytes but the file has only %llu", url.c_str(),
         (unsigned long long)n, (unsigned long long)(*total - std::min<uint64_t>(*total, 8)));
  if (buf.size() > need) buf.resize(need);
  if (buf.size() < need) {
    if (ranged) {
      HttpResponse rest = http.get(url, need - buf.size(), buf.size(), need - 1);
      if (!rest.range_honored) fail("%s: the server stopped honouring Range requests (HTTP %ld)", url.c_str(), rest.status);
      buf += rest.body;
    } else if (!r.cut_short) {
      // The whole file came back and it is shorter than its header.
    } else {
      HttpResponse again = http.get(url, need);  // no Range support: read the prefix again, stop at the header's end
      if (again.status != 200) fail("%s: HTTP %ld", url.c_str(), again.status);
      buf = std::move(again.body);
    }
    if (buf.size() < need)
      fail("%s: truncated safetensors header: it declares %llu bytes, only %zu arrived", url.c_str(), (unsigned long long)n,
           buf.size() >= 8 ? buf.size() - 8 : 0);
  }
  return io::SafetensorsFile::parse_header(std::string_view(buf).substr(8, n), need, total.value_or(0), url);
}

std::string repo_name(const std::string& base) {
  // ".../ORG/NAME/resolve/main/" -> "NAME"; else the last path segment.
  std::string s = base;
  while (!s.empty() && s.back() == '/') s.pop_back();
  const size_t res = s.find("/resolve/");
  if (res != std::string::npos) s = s.substr(0, res);
  const size_t slash = s.find_last_of('/');
  std::string name = slash == std::string::npos ? s : s.substr(slash + 1);
  return name.empty() ? "model" : name;
}

bool is_gguf_name(const std::string& s) { return s.size() > 5 && s.compare(s.size() - 5, 5, ".gguf") == 0; }

// Fetches and parses the header of one remote GGUF shard: the first 1 MiB, then (the header
// continues: tokenizer metadata runs to several MB) up to what GgufNeedMore asks for, at least
// doubling, until it parses; 256 MB at most. Without Range support each attempt is a GET of
// the file's prefix, stopped at the byte count wanted.
io::GgufHeader remote_gguf_header(HttpClient& http, const std::string& url, uint64_t first) {
  constexpr uint64_t kMaxGgufHeader = 256ull << 20;
  const uint64_t kFirst = std::max<uint64_t>(first, 64);
  HttpResponse r = http.get(url, kFirst, 0, kFirst - 1);
  if (r.status == 404) fail("%s: not found (HTTP 404)", url.c_str());
  if (r.status != 200 && r.status != 206) fail("%s: HTTP %ld", url.c_str(), r.status);
  if (r.status == 206 && !r.range_honored) fail("%s: the server answered a different byte range than asked for", url.c_str());
  const bool ranged = r.range_honored;
  if (!r.total_size) fail("%s: the server does not say how large the file is", url.c_str());
  const uint64_t total = *r.total_size;
  std::string buf = std::move(r.body);
  for (;;) {
    try {
      return io::GgufFile::parse_header(reinterpret_cast<const uint8_t*>(buf.data()), buf.size(), total, url);
    } catch (const io::GgufNeedMore& more) {
      const uint64_t want = std::min<uint64_t>(total, std::max<uint64_t>(more.needed(), 2 * buf.size()));
      if (want > kMaxGgufHeader)
        fail("%s: GGUF header of more than %llu bytes", url.c_str(), (unsigned long long)kMaxGgufHeader);
      if (want <= buf.size()) throw;  // cannot happen: parse_header asks only for bytes past n < total
      if (ranged) {
        HttpResponse rest = http.get(url, want - buf.size(), buf.size(), want - 1);
        if (!rest.range_honored) fail("%s: the server stopped honouring Range requests (HTTP %ld)", url.c_str(), rest.status);
        buf += rest.body;
      } else {
        HttpResponse again = http.get(url, want);
        if (again.status != 200) fail("%s: HTTP %ld", url.c_str(), again.status);
        buf = std::move(again.body);
      }
      if (buf.size() < want) fail("%s: truncated GGUF header: %zu of %llu bytes arrived", url.c_str(), buf.size(), (unsigned long long)want);
    }
  }
}

// A GGUF file (or split set, from any of its shards) over HTTP: each shard's header only.
ModelSource open_remote_gguf(const std::string& url, uint64_t first) {
  ModelSource m;
  m.remote = true;
  m.location = url;
  const size_t slash = url.find_last_of('/');
  m.suggested_dir = "./" + url.substr(slash + 1);
  HttpClient http;
  std::vector<io::GgufHeader> headers;
  headers.push_back(remote_gguf_header(http, url, first));
  const auto cnt = headers[0].kv.find("split.count");
  const int64_t count = cnt == headers[0].kv.end() ? 1 : cnt->second.to_int("split.count");
  if (count > 1) {
    const std::vector<std::string> urls = io::gguf_split_paths(url);
    if (static_cast<int64_t>(urls.size()) != count)
      fail("%s: split.count is %lld but the name does not follow PREFIX-%05lld-of-%05lld.gguf", url.c_str(), (long long)count, 1ll,
           (long long)count);
    io::GgufHeader given = std::move(headers[0]);
    headers.clear();
    for (const std::string& u : urls) headers.push_back(u == url ? std::move(given) : remote_gguf_header(http, u, first));
    m.suggested_dir = "./" + urls[0].substr(slash + 1);
  }
  auto g = std::make_shared<io::GgufFile>(io::GgufFile::from_headers(std::move(headers), url));
  m.tokenizer_json_bytes = gguf_tokenizer_json_bytes(*g);
  m.ckpt = io::Checkpoint::from_gguf(std::move(g), models::checkpoint_rules());
  m.bytes_fetched = http.bytes_received();
  m.requests = http.requests();
  return m;
}

ModelSource open_remote(const std::string& url) {
  ModelSource m;
  m.remote = true;
  m.location = normalize_base_url(url);
  m.suggested_dir = "./" + repo_name(m.location);
  HttpClient http;
  const std::string base = m.location;
  const io::Config config = parse_json(*get_file(http, base + "config.json", false), base + "config.json");
  std::optional<io::Config> gen;
  if (auto g = get_file(http, base + "generation_config.json", true)) gen = parse_json(*g, base + "generation_config.json");
  std::vector<std::string> files;
  if (auto idx = get_file(http, base + "model.safetensors.index.json", true)) {
    const io::Config ix = parse_json(*idx, base + "model.safetensors.index.json");
    const auto& wm = ix.json().find("weight_map");
    if (wm == ix.json().end() || !wm->is_object()) fail("%smodel.safetensors.index.json: missing object 'weight_map'", base.c_str());
    std::set<std::string> uniq;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) fail("%smodel.safetensors.index.json: weight_map['%s'] is not a string", base.c_str(), it.key().c_str());
      const std::string f = it.value().get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f.find("..") != std::string::npos || f.find_first_of("?#% ") != std::string::npos)
        fail("%smodel.safetensors.index.json: shard name '%s' must be a plain file name", base.c_str(), f.c_str());
      uniq.insert(f);
    }
    files.assign(uniq.begin(), uniq.end());
  } else {
    files.push_back("model.safetensors");
  }
  std::vector<io::SafetensorsFile> shards;
  for (const auto& f : files) shards.push_back(remote_header(http, base + f));
  // tokenizer.json: its size only (one byte asked for).
  HttpResponse tok = http.get(base + "tokenizer.json", 1, 0, 0);
  if ((tok.status == 200 || tok.status == 206) && tok.total_size) m.tokenizer_json_bytes = *tok.total_size;
  m.ckpt = io::Checkpoint::from_parts(base, config, gen ? &*gen : nullptr, std::move(shards), models::checkpoint_rules());
  m.bytes_fetched = http.bytes_received();
  m.requests = http.requests();
  return m;
}

}  // namespace

bool is_url(const std::string& s) { return s.rfind("http://", 0) == 0 || s.rfind("https://", 0) == 0; }

std::string normalize_base_url(const std::string& url) {
  std::string u = url;
  while (!u.empty() && u.back() == '/') u.pop_back();
  const std::string hf = "://huggingface.co/";
  const size_t at = u.find(hf);
  if (at != std::string::npos && u.find("/resolve/") == std::string::npos) {
    const std::string path = u.substr(at + hf.size());
    if (std::count(path.begin(), path.end(), '/') == 1) u += "/resolve/main";
  }
  return u + "/";
}

ModelSource open_source(const std::string& where, uint64_t gguf_first_range, bool mtp) {
  if (is_url(where)) {
    if (mtp) throw UsageError("--spec mtp: plans of the multi-token-prediction head read local checkpoints (a directory or .gguf file), not URLs");
    return is_gguf_name(where) ? open_remote_gguf(where, gguf_first_range) : open_remote(where);
  }
  if (is_gguf_name(where) && fs::is_regular_file(where)) {  // headers only, nothing mapped
    ModelSource m{models::open_checkpoint(where, {.map = false, .mtp = mtp}), where, false, where, 0, 0, 0};
    m.tokenizer_json_bytes = gguf_tokenizer_json_bytes(*m.ckpt.gguf());
    return m;
  }
  if (!fs::is_directory(where)) fail("%s: model directory does not exist", where.c_str());
  ModelSource m{models::open_checkpoint(where, {.map = false, .mtp = mtp}), where, false, where, 0, 0, 0};
  const std::string tok = where + "/tokenizer.json";
  std::error_code ec;
  if (fs::exists(tok, ec)) m.tokenizer_json_bytes = fs::file_size(tok, ec);
  return m;
}

}  // namespace spool::plan
