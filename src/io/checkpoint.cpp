#include "io/checkpoint.h"

#include <charconv>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "common/error.h"
#include "common/log.h"
#include "common/sysinfo.h"

namespace spool::io {

namespace fs = std::filesystem;

namespace {

uint64_t expert_key(int layer, int expert, ExpertProj proj, ExpertPart part) {
  return (static_cast<uint64_t>(layer) << 32) | (static_cast<uint64_t>(expert) << 5) | (static_cast<uint64_t>(proj) << 3) |
         static_cast<uint64_t>(part);
}

// The dtype a tensor must have: quantized parts have fixed types, other tensors are floats.
bool dtype_allowed(std::string_view name, DType t) {
  // MXFP4 (ExpertPart kMxBlocks / kMxScales): fused as released, or per expert as spool convert writes them.
  if (name.ends_with("_proj_blocks") || name.ends_with("_proj_scales") || name.ends_with(".blocks") || name.ends_with(".e8m0_scales"))
    return t == DType::U8;
  if (name.ends_with(".qweight")) return t == DType::U8;
  if (name.ends_with(".scales")) return t == DType::F16;
  if (name.ends_with(".codebook")) return t == DType::F32;
  if (name.ends_with(".signs")) return t == DType::I8;
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

}  // namespace

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorRef::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {
// "mtp.X" of a stored name ("mtp." or "model.mtp." prefix), else nullopt.
std::optional<std::string_view> mtp_part(std::string_view stored) {
  for (std::string_view p : {"mtp.", "model.mtp."})
    if (stored.starts_with(p)) return stored.substr(p.size());
  return std::nullopt;
}
// The layer index of a normalised "layers.{L}." name, else -1.
int layer_of(std::string_view n) {
  if (!n.starts_with("layers.")) return -1;
  n.remove_prefix(7);
  int L = 0;
  auto [p, ec] = std::from_chars(n.data(), n.data() + n.size(), L);
  return ec == std::errc() && p != n.data() && p < n.data() + n.size() && *p == '.' ? L : -1;
}
}  // namespace

std::string normalize_tensor_name(std::string_view name) {
  if (name.starts_with("model.visual.") || name.starts_with("visual.") || name.starts_with("mtp.") ||
      name.starts_with("model.mtp.")) {
    return "";
  }
  for (std::string_view p : {"model.language_model.", "language_model.model.", "model.", "language_model."}) {
    if (name.starts_with(p)) return std::string(name.substr(p.size()));
  }
  return std::string(name);
}

Config text_config_of(const Config& raw_cfg, const std::string& label) {
  const auto& raw = raw_cfg.json();
  auto tc = raw.find("text_config");
  if (tc == raw.end() || !tc->is_object()) return raw_cfg;
  nlohmann::json merged = *tc;
  for (auto it = raw.begin(); it != raw.end(); ++it) {
    if (it.key() == "text_config" || it.key() == "vision_config") continue;
    if (!merged.contains(it.key())) merged[it.key()] = it.value();
  }
  return Config(merged, label + ":text_config");
}

// Splits a fused expert tensor [E, rows, cols] into per-expert views of the same bytes
// (gate_up_proj: gate rows first, then up rows, per expert).
void Checkpoint::add_fused(const TensorRef& t, const ExpertName& n, const std::string& file, const std::string& original) {
  if (t.shape.size() != 3)
    fail("%s: fused expert tensor '%s' must be 3-D [E, out, in], got %zu-D", file.c_str(), original.c_str(), t.shape.size());
  const bool gate_up = n.proj == ExpertProj::kGate;
  const int64_t E = t.shape[0], R = t.shape[1], C = t.shape[2];
  if (gate_up && R % 2 != 0) fail("%s: '%s' has an odd row count %lld (gate and up stacked)", file.c_str(), original.c_str(), (long long)R);
  const uint64_t es = dtype_size(t.dtype);
  const uint64_t per_expert = static_cast<uint64_t>(R * C) * es;
  for (int64_t e = 0; e < E; ++e) {
    for (int p = 0; p < (gate_up ? 2 : 1); ++p) {
      TensorRef x = t;
      const int64_t rows = gate_up ? R / 2 : R;
      x.shape = {rows, C};
      x.nbytes = static_cast<uint64_t>(rows * C) * es;
      x.offset = t.offset + e * per_expert + p * x.nbytes;
      x.data = t.data ? t.data + e * per_expert + p * x.nbytes : nullptr;
      x.expert_layer = n.layer;
      x.expert_id = static_cast<int>(e);
      x.expert_proj = gate_up ? (p == 0 ? ExpertProj::kGate : ExpertProj::kUp) : ExpertProj::kDown;
      x.name = expert_tensor_name(n.layer, static_cast<int>(e), x.expert_proj);
      add(std::move(x));
    }
  }
  expert_layout_ = ExpertLayout::kFused;
}

// The matrices a family's reader stored [in, out] (TensorSink::add_transposed): one anonymous
// in-memory file, mapped like a shard (streaming reads it with pread like any shard).
void Checkpoint::write_transposed(const std::vector<Transposed>& items) {
  uint64_t total = 0;
  for (const Transposed& it : items) total += static_cast<uint64_t>(it.in * it.out) * it.elem;
  log_info("%s: float experts are stored [in, out]: %s transposed into memory", dir_.c_str(), format_bytes(total).c_str());
  const int fd = memfd_create("spool-transposed-experts", MFD_CLOEXEC);
  if (fd < 0) fail("%s: memfd_create failed (%s)", dir_.c_str(), std::strerror(errno));
  uint64_t at = 0;
  std::vector<uint8_t> buf;
  for (const Transposed& it : items) {
    at = (at + 63) / 64 * 64;
    const uint64_t es = it.elem;
    buf.resize(static_cast<size_t>(it.in * it.out * es));
    for (int64_t i = 0; i < it.in; ++i)
      for (int64_t o = 0; o < it.out; ++o) std::memcpy(buf.data() + (o * it.in + i) * es, it.src + (i * it.out + o) * es, es);
    uint64_t done = 0;
    while (done < buf.size()) {
      const ssize_t w = ::pwrite(fd, buf.data() + done, buf.size() - done, static_cast<off_t>(at + done));
      if (w <= 0) {
        ::close(fd);
        fail("%s: writing transposed expert tensors to memory failed (%s)", dir_.c_str(), std::strerror(errno));
      }
      done += static_cast<uint64_t>(w);
    }
    tensors_[it.index].offset = at;
    at += buf.size();
  }
  SafetensorsFile mem = SafetensorsFile::from_fd(fd, "/proc/self/fd/" + std::to_string(fd), true);
  const int shard = static_cast<int>(shards_.size());
  for (const Transposed& it : items) {
    TensorRef& t = tensors_[it.index];
    t.shard = shard;
    t.data = mem.mapping() + t.offset;
  }
  shards_.push_back(std::move(mem));
}

void Checkpoint::add(TensorRef t) {
  if (index_.count(t.name)) fail("%s: tensor '%s' appears twice (after name normalisation)", dir_.c_str(), t.name.c_str());
  if (keep_mtp_ && n_main_layers_ > 0)
    if (const int L = layer_of(t.name); L >= n_main_layers_) mtp_layers_ = std::max(mtp_layers_, L - n_main_layers_ + 1);
  if (t.expert_layer >= 0) expert_index_[expert_key(t.expert_layer, t.expert_id, t.expert_proj, t.expert_part)] = tensors_.size();
  // index_ views the names inside tensors_: a reallocation moves them (short names live in
  // the TensorRef itself), so the index is rebuilt then (amortised O(1); index_shards reserves).
  const bool moves = tensors_.size() == tensors_.capacity();
  tensors_.push_back(std::move(t));
  if (moves) {
    index_.clear();
    for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  } else {
    index_.emplace(tensors_.back().name, tensors_.size() - 1);
  }
}

namespace {
// config.json's quantization: spool's own block (quant_method "spool", format_version 1,
// rotation "hadamard" or "none") is fine and says whether sign vectors are required; another
// engine's `quantization_config` (FP8, GPTQ, AWQ, ...) is named, not half-loaded.
// `native` is the quant_method the family reads natively (TensorNameRules::native_quant_method).
std::optional<bool> check_quantization(const Config& raw, const std::string& label, const std::string& native) {
  const nlohmann::json& j = raw.json();
  auto str = [](const nlohmann::json& o, const char* k) {
    return o.is_object() && o.contains(k) && o[k].is_string() ? o[k].get<std::string>() : std::string();
  };
  if (j.contains("quantization_config")) {
    const std::string m = str(j["quantization_config"], "quant_method");
    // A family's native format (gpt-oss's released MXFP4 experts, read by its TensorReader); a
    // spool quantization block may follow (spool convert keeps MXFP4 experts as they are).
    if (native.empty() || m != native)
      fail("%s: quantization_config (quant_method '%s') is not supported; use the F32/F16/BF16 checkpoint (spool convert "
           "quantizes it)", label.c_str(), m.empty() ? "unknown" : m.c_str());
  }
  if (!j.contains("quantization")) return std::nullopt;
  const nlohmann::json& q = j["quantization"];
  if (str(q, "quant_method") != "spool")
    fail("%s: 'quantization' is not a spool quantization block (quant_method \"spool\")", label.c_str());
  if (!q.contains("format_version") || !q["format_version"].is_number_integer() || q["format_version"].get<int64_t>() != 1)
    fail("%s: spool quantization format_version %s is not supported (this build reads version 1)", label.c_str(),
         q.contains("format_version") ? q["format_version"].dump().c_str() : "(missing)");
  const std::string rot = str(q, "rotation");
  if (rot != "hadamard" && rot != "none")
    fail("%s: quantization.rotation must be \"hadamard\" or \"none\" (got %s)", label.c_str(),
         q.contains("rotation") ? q["rotation"].dump().c_str() : "nothing");
  return rot == "hadamard";
}
}  // namespace

namespace {
// The family rules of a checkpoint's model_type (text model_type first, then the top level).
const TensorNameRules* rules_of(const RulesResolver& rules, const std::string& model_type, const std::string& top) {
  if (rules.by_model_type == nullptr) return nullptr;
  const TensorNameRules* r = rules.by_model_type(model_type);
  return r != nullptr ? r : rules.by_model_type(top);
}
}  // namespace

Checkpoint Checkpoint::open(const std::string& dir, const RulesResolver& rules, Options opt) {
  if (dir.size() > 5 && dir.compare(dir.size() - 5, 5, ".gguf") == 0 && !fs::is_directory(dir)) return open_gguf(dir, rules, opt);
  Checkpoint c;
  c.dir_ = dir;
  if (!fs::is_directory(dir)) fail("%s: model directory does not exist", dir.c_str());
  c.raw_config_ = Config::load_file(dir + "/config.json");
  c.top_model_type_ = c.raw_config_.get_string("model_type", "");
  c.config_ = text_config_of(c.raw_config_, dir + "/config.json");
  c.model_type_ = c.config_.get_string("model_type", c.top_model_type_);
  const TensorNameRules* fr = rules_of(rules, c.model_type_, c.top_model_type_);
  c.quant_rotated_ = check_quantization(c.raw_config_, dir + "/config.json", fr ? fr->native_quant_method : std::string());
  if (fs::exists(dir + "/generation_config.json"))
    c.generation_ = parse_generation_config(Config::load_file(dir + "/generation_config.json"));

  // Shards.
  std::vector<std::string> files;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(index_path)) {
    Config idx = Config::load_file(index_path);
    if (!idx.json().contains("weight_map") || !idx.json()["weight_map"].is_object())
      fail("%s: missing object 'weight_map'", index_path.c_str());
    std::set<std::string> uniq;
    for (auto it = idx.json()["weight_map"].begin(); it != idx.json()["weight_map"].end(); ++it) {
      if (!it.value().is_string()) fail("%s: weight_map['%s'] is not a string", index_path.c_str(), it.key().c_str());
      std::string f = it.value().get<std::string>();
      if (f.find('/') != std::string::npos || f.find("..") != std::string::npos)
        fail("%s: shard name '%s' must be a plain file name", index_path.c_str(), f.c_str());
      uniq.insert(f);
    }
    for (const auto& f : uniq) {
      if (!fs::exists(dir + "/" + f)) fail("%s: missing shard '%s' (listed in model.safetensors.index.json)", dir.c_str(), f.c_str());
      files.push_back(dir + "/" + f);
    }
  } else if (fs::exists(dir + "/model.safetensors")) {
    files.push_back(dir + "/model.safetensors");
  } else {
    for (const auto& e : fs::directory_iterator(dir)) {
      std::string n = e.path().filename().string();
      if (n.starts_with("model-") && n.size() > 12 && n.substr(n.size() - 12) == ".safetensors") files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
  }
  if (files.empty()) fail("%s: no model weights (model.safetensors or model.safetensors.index.json) found", dir.c_str());

  std::vector<SafetensorsFile> shards;
  for (const auto& path : files) shards.push_back(SafetensorsFile::open(path, opt.map));
  c.n_main_layers_ = static_cast<int>(std::clamp<int64_t>(c.config_.get_int("num_hidden_layers", 0), 0, 1 << 20));
  c.keep_mtp_ = opt.mtp;
  c.index_shards(std::move(shards), fr);
  return c;
}

Checkpoint Checkpoint::from_parts(const std::string& label, const Config& raw_config, const Config* generation_config,
                                  std::vector<SafetensorsFile> shards, const RulesResolver& rules) {
  Checkpoint c;
  c.dir_ = label;
  c.raw_config_ = raw_config;
  c.top_model_type_ = c.raw_config_.get_string("model_type", "");
  c.config_ = text_config_of(c.raw_config_, raw_config.source());
  c.model_type_ = c.config_.get_string("model_type", c.top_model_type_);
  const TensorNameRules* fr = rules_of(rules, c.model_type_, c.top_model_type_);
  c.quant_rotated_ = check_quantization(c.raw_config_, raw_config.source(), fr ? fr->native_quant_method : std::string());
  if (generation_config != nullptr) c.generation_ = parse_generation_config(*generation_config);
  if (shards.empty()) fail("%s: no safetensors shards given", label.c_str());
  c.index_shards(std::move(shards), fr);
  return c;
}

// The TensorSink of index_shards: a family reader's tensors go into the table, its transposed
// matrices into the list written to memory at the end.
class Checkpoint::Sink final : public TensorSink {
 public:
  Sink(Checkpoint& c, std::vector<Transposed>& transposed) : c_(c), transposed_(transposed) {}
  void add(TensorRef t) override { c_.add(std::move(t)); }
  void add_transposed(TensorRef t, const uint8_t* src, int64_t in, int64_t out) override {
    const uint64_t elem = dtype_size(t.dtype);
    if (src != nullptr) transposed_.push_back({c_.tensors_.size(), src, in, out, elem});
    c_.add(std::move(t));
  }
  void set_fused_experts() override { c_.expert_layout_ = ExpertLayout::kFused; }

 private:
  Checkpoint& c_;
  std::vector<Transposed>& transposed_;
};

void Checkpoint::index_shards(std::vector<SafetensorsFile> shards, const TensorNameRules* rules) {
  Checkpoint& c = *this;
  c.shards_ = std::move(shards);
  c.name_rules_ = rules;
  const TensorReader reader = rules ? rules->reader : TensorReader{};
  auto family_name = [&](std::string_view stored, bool* squeeze) { return c.normalized_name(stored, squeeze); };
  std::vector<Transposed> transposed;  // a family reader's [in, out] matrices, written to memory below
  Sink sink(c, transposed);
  // One TensorRef per tensor (a fused expert tensor [E, ...] becomes 2E or E): reserved up
  // front, so the table has no growth slack and index_ is built once.
  size_t n = 0;
  for (const SafetensorsFile& sf : c.shards_)
    for (const TensorInfo& ti : sf.tensors()) {
      bool squeeze = false;
      const std::string name = family_name(ti.name, &squeeze);
      if (name.empty()) continue;  // dropped
      if (reader.count != nullptr)
        if (const size_t k = reader.count(name, ti.shape); k > 0) {
          n += k;
          continue;
        }
      const std::optional<ExpertName> en = ti.shape.size() == 3 ? parse_expert_name(name) : std::nullopt;
      n += en && en->fused ? static_cast<size_t>(ti.shape[0]) * (en->proj == ExpertProj::kGate ? 2 : 1) : 1;
    }
  n = std::min<size_t>(n, size_t{1} << 24);  // a hint: an absurd shape fails below with its own error
  c.tensors_.reserve(n);
  c.index_.reserve(n);
  for (int s = 0; s < static_cast<int>(c.shards_.size()); ++s) {
    SafetensorsFile& sf = c.shards_[s];
    for (const TensorInfo& ti : sf.tensors()) {
      bool squeeze = false;
      if (c.is_mtp_tensor(ti.name)) c.mtp_bytes_ += ti.nbytes;
      std::string name = family_name(ti.name, &squeeze);
      if (name.empty()) {
        ++c.dropped_;
        continue;
      }
      if (!dtype_allowed(name, ti.dtype))
        fail("%s: tensor '%s' has dtype %s; spool reads F32, F16 and BF16 weights (and its own quantized format)",
             sf.path().c_str(), ti.name.c_str(), dtype_name(ti.dtype));
      TensorRef t;
      t.shard = s;
      t.dtype = ti.dtype;
      t.shape = ti.shape;
      t.offset = ti.offset;
      t.nbytes = ti.nbytes;
      t.data = sf.mapping() ? sf.mapping() + ti.offset : nullptr;
      if (squeeze && t.shape.size() == 2 && t.shape[0] == 1) t.shape.erase(t.shape.begin());
      if (reader.read != nullptr) {
        t.name = name;
        if (reader.read(t, sf.path(), ti.name, sink)) continue;
      }
      if (std::optional<ExpertName> en = parse_expert_name(name)) {
        if (en->fused) {
          c.add_fused(t, *en, sf.path(), ti.name);
          continue;
        }
        t.expert_layer = en->layer;
        t.expert_id = en->expert;
        t.expert_proj = en->proj;
        t.expert_part = en->part;
        if (t.expert_part != ExpertPart::kWeight && t.expert_part != ExpertPart::kMxBlocks && t.expert_part != ExpertPart::kMxScales)
          c.experts_quantized_ = true;
        const size_t want_dims = t.expert_part == ExpertPart::kCodebook ? 1 : t.expert_part == ExpertPart::kMxBlocks ? 3 : 2;
        if (t.shape.size() != want_dims)
          fail("%s: expert tensor '%s' must be %zu-D, got %s", sf.path().c_str(), ti.name.c_str(), want_dims, t.shape_str().c_str());
        if (c.expert_layout_ == ExpertLayout::kNone) c.expert_layout_ = ExpertLayout::kPerExpert;
        name = expert_tensor_name(en->layer, en->expert, en->proj, en->part);
      }
      t.name = std::move(name);
      c.add(std::move(t));
    }
    sf.drop_tensor_table();  // tensors_ holds all of it now
  }
  if (!transposed.empty()) c.write_transposed(transposed);
}

bool Checkpoint::is_mtp_tensor(std::string_view stored) const {
  if (mtp_part(stored)) return true;
  const int L = layer_of(normalize_tensor_name(stored));
  return n_main_layers_ > 0 && L >= n_main_layers_;
}

std::string Checkpoint::normalized_name(std::string_view stored, bool* squeeze) const {
  if (!keep_mtp_ && n_main_layers_ > 0 && !mtp_part(stored) && layer_of(normalize_tensor_name(stored)) >= n_main_layers_) {
    if (squeeze != nullptr) *squeeze = false;
    return "";  // a DeepSeek-style nextn layer, not asked for
  }
  if (keep_mtp_) {
    if (const std::optional<std::string_view> rest = mtp_part(stored)) {
      // mtp.layers.{k}.X -> layers.{base + k}.X; the head's own tensors keep "mtp.".
      std::string_view r = *rest;
      if (r.starts_with("layers.")) {
        r.remove_prefix(7);
        int k = 0;
        auto [p, ec] = std::from_chars(r.data(), r.data() + r.size(), k);
        if (ec == std::errc() && p != r.data() && p < r.data() + r.size() && *p == '.' && k >= 0 && k < 64) {
          std::string stored_as = "layers." + std::to_string(n_main_layers_ + k) + std::string(p);
          return normalized_name(stored_as, squeeze);
        }
      }
      if (squeeze != nullptr) *squeeze = false;
      return "mtp." + std::string(r);
    }
  }
  std::string name = normalize_tensor_name(stored);
  if (keep_mtp_ && n_main_layers_ > 0 && layer_of(name) >= n_main_layers_ && name.ends_with(".embed_tokens.weight")) {
    // DeepSeek-V3's nextn layer stores the embedding table again (a copy of the shared one: the
    // head reads embed_tokens.weight); kept, it would be counted as resident weights it never reads.
    if (squeeze != nullptr) *squeeze = false;
    return "";
  }
  bool sq = false;
  if (!name.empty() && name_rules_ != nullptr && !name_rules_->renames.empty()) {
    std::string renamed = apply_renames(name_rules_->renames, name, &sq);
    if (!renamed.empty()) name = std::move(renamed);
  }
  if (squeeze != nullptr) *squeeze = sq;
  return name;
}

const TensorRef* Checkpoint::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorRef& Checkpoint::tensor(std::string_view name) const {
  const TensorRef* t = find(name);
  if (t == nullptr) fail("%s: missing tensor '%s'", dir_.c_str(), std::string(name).c_str());
  return *t;
}

const TensorRef* Checkpoint::expert_part(int layer, int expert, ExpertProj proj, ExpertPart part) const {
  auto it = expert_index_.find(expert_key(layer, expert, proj, part));
  return it == expert_index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<const TensorRef*> Checkpoint::expert_tensors(int layer, int expert) const {
  std::vector<const TensorRef*> out;
  for (int p = 0; p < 3; ++p)
    for (int q = 0; q < kExpertParts; ++q)
      if (const TensorRef* t = expert_part(layer, expert, static_cast<ExpertProj>(p), static_cast<ExpertPart>(q))) out.push_back(t);
  return out;
}

bool Checkpoint::has_expert(int layer, int expert, ExpertProj proj) const {
  return expert_part(layer, expert, proj, ExpertPart::kWeight) != nullptr ||
         expert_part(layer, expert, proj, ExpertPart::kQWeight) != nullptr ||
         expert_part(layer, expert, proj, ExpertPart::kMxBlocks) != nullptr;
}

const TensorRef& Checkpoint::expert(int layer, int expert, ExpertProj proj) const {
  const TensorRef* t = expert_part(layer, expert, proj, ExpertPart::kWeight);
  if (t == nullptr) t = expert_part(layer, expert, proj, ExpertPart::kQWeight);
  if (t == nullptr) t = expert_part(layer, expert, proj, ExpertPart::kMxBlocks);
  if (t == nullptr) {
    fail("%s: missing expert tensor %s", dir_.c_str(), expert_tensor_name(layer, expert, proj).c_str());
  }
  return *t;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.nbytes;
  return n;
}

uint64_t Checkpoint::file_bytes() const {
  uint64_t n = 0;
  for (const auto& s : shards_) n += s.file_size();
  return n;
}

uint64_t Checkpoint::expert_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_)
    if (t.expert_layer >= 0) n += t.nbytes;
  return n;
}

uint64_t Checkpoint::table_bytes() const {
  // One malloc block of n requested bytes (glibc, 64-bit): n + 8 rounded up to 16, >= 32.
  auto block = [](uint64_t n) { return std::max<uint64_t>(32, (n + 8 + 15) / 16 * 16); };
  constexpr uint64_t kSso = 15;  // libstdc++ keeps names up to 15 chars inside the string
  uint64_t n = tensors_.capacity() ? block(tensors_.capacity() * sizeof(TensorRef)) : 0;
  for (const TensorRef& t : tensors_) {
    if (t.name.capacity() > kSso) n += block(t.name.capacity() + 1);
    if (t.shape.capacity() > 0) n += block(t.shape.capacity() * sizeof(int64_t));
  }
  // unordered_map nodes: next pointer + value (+ the cached hash for string_view keys).
  n += index_.size() * block(sizeof(void*) + sizeof(std::pair<const std::string_view, size_t>) + sizeof(size_t)) +
       block(index_.bucket_count() * sizeof(void*));
  n += expert_index_.size() * block(sizeof(void*) + sizeof(std::pair<const uint64_t, size_t>)) +
       block(expert_index_.bucket_count() * sizeof(void*));
  for (const auto& p : perms_) n += block(p.capacity() * sizeof(int32_t));
  return n;
}

}  // namespace spool::io
