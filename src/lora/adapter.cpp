#include "lora/adapter.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "io/safetensors.h"
#include "ops/weights.h"

namespace spool::lora {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) { return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix; }

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("%s: cannot read the file", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A field that must be absent, null, false or empty for the LoRA spool runs; `what` names the variant.
void refuse_set(const nlohmann::json& j, const char* key, const char* what, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (it->is_boolean() && !it->get<bool>()) return;
  if ((it->is_array() || it->is_object() || it->is_string()) && it->empty()) return;
  fail("%s: %s (%s = %s) is not supported: spool runs plain LoRA adapters", where.c_str(), what, key, it->dump().c_str());
}

std::vector<std::string> string_list(const nlohmann::json& j, const char* key, const std::string& where) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (it->is_string()) return {it->get<std::string>()};
  if (!it->is_array()) fail("%s: %s must be a list of names", where.c_str(), key);
  for (const auto& v : *it) {
    if (!v.is_string()) fail("%s: %s must be a list of names", where.c_str(), key);
    out.push_back(v.get<std::string>());
  }
  return out;
}

// Converts a tensor of the adapter file to f32.
std::vector<float> to_f32(const io::SafetensorsFile& f, const io::TensorInfo& t, const std::string& file) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  const uint8_t* p = f.data(t);
  switch (t.dtype) {
    case io::DType::F32: std::memcpy(v.data(), p, t.nbytes); break;
    case io::DType::BF16:
    case io::DType::F16:
      for (size_t i = 0; i < v.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        v[i] = t.dtype == io::DType::BF16 ? ops::bf16_to_f32(h) : ops::f16_to_f32(h);
      }
      break;
    default:
      fail("%s: tensor '%s' is %s; LoRA weights must be F32, F16 or BF16", file.c_str(), t.name.c_str(), io::dtype_name(t.dtype));
  }
  return v;
}

}  // namespace

std::pair<int64_t, float> PeftConfig::rank_and_scaling(const std::string& key) const {
  auto matches = [&](const std::string& pattern) {
    try {
      return std::regex_match(key, std::regex("(.*\\.)?(" + pattern + ")"));
    } catch (const std::regex_error& e) {
      fail("adapter_config.json: pattern '%s' is not a valid regular expression (%s)", pattern.c_str(), e.what());
    }
  };
  int64_t rank = r;
  double alpha = lora_alpha;
  for (const auto& [p, v] : rank_pattern)
    if (matches(p)) {
      rank = v;
      break;
    }
  for (const auto& [p, v] : alpha_pattern)
    if (matches(p)) {
      alpha = v;
      break;
    }
  const double s = use_rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
  return {rank, static_cast<float>(s)};
}

PeftConfig parse_peft_config(const std::string& json_text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: malformed JSON (%s)", where.c_str(), e.what());
  }
  if (!j.is_object()) fail("%s: expected a JSON object", where.c_str());
  const std::string type = j.value("peft_type", std::string());
  if (type.empty()) fail("%s: no peft_type (not a PEFT adapter config)", where.c_str());
  if (type != "LORA") fail("%s: peft_type %s is not supported: spool runs LoRA adapters (peft_type LORA)", where.c_str(), type.c_str());
  refuse_set(j, "use_dora", "DoRA", where);
  refuse_set(j, "use_qalora", "QA-LoRA", where);
  refuse_set(j, "use_bdlora", "BD-LoRA", where);
  refuse_set(j, "alora_invocation_tokens", "activated LoRA (aLoRA)", where);
  refuse_set(j, "lora_bias", "a LoRA bias", where);
  refuse_set(j, "fan_in_fan_out", "fan_in_fan_out (Conv1D weights)", where);
  refuse_set(j, "modules_to_save", "modules_to_save (whole modules trained beside the adapter)", where);
  refuse_set(j, "trainable_token_indices", "trainable tokens", where);
  refuse_set(j, "layer_replication", "layer replication", where);
  refuse_set(j, "velora_config", "VeLoRA", where);
  refuse_set(j, "kasa_config", "KaSA", where);
  refuse_set(j, "arrow_config", "Arrow routing", where);
  PeftConfig c;
  auto positive_number = [&](const char* key) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number() || it->get<double>() <= 0) fail("%s: %s must be a positive number", where.c_str(), key);
    return it->get<double>();
  };
  c.r = static_cast<int64_t>(positive_number("r"));
  c.lora_alpha = positive_number("lora_alpha");
  c.use_rslora = j.value("use_rslora", false);
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_object()) fail("%s: %s must be an object of pattern: value", where.c_str(), key);
    for (const auto& [p, v] : it->items()) {
      if (!v.is_number() || v.get<double>() <= 0) fail("%s: %s['%s'] must be a positive number", where.c_str(), key, p.c_str());
      if (std::string(key) == "rank_pattern")
        c.rank_pattern.emplace_back(p, v.get<int64_t>());
      else
        c.alpha_pattern.emplace_back(p, v.get<double>());
    }
  }
  c.target_modules = string_list(j, "target_modules", where);
  c.target_parameters = string_list(j, "target_parameters", where);
  return c;
}

uint64_t Adapter::bytes() const {
  uint64_t n = 0;
  for (const DenseLora& d : dense) n += (d.a.size() + d.b.size()) * sizeof(float);
  for (const ExpertLora& e : experts)
    for (const ExpertWrapper& w : e.wrappers) n += (w.a.size() + w.b.size()) * sizeof(float);
  return n;
}

uint64_t Adapter::run_bytes() const {
  uint64_t n = bytes();
  for (const DenseLora& d : dense) n += d.b.size() * sizeof(float);
  for (const ExpertLora& e : experts)
    for (const ExpertWrapper& w : e.wrappers) n += w.b.size() * sizeof(float);
  return n;
}

Adapter load_adapter(const std::string& path, const io::Checkpoint& base, const io::RulesResolver& rules) {
  namespace fs = std::filesystem;
  if (ends_with(path, ".gguf")) return load_gguf_adapter(path, base, rules);
  if (!fs::exists(path)) fail("%s: no such LoRA adapter (give a PEFT adapter directory or its adapter_model.safetensors)", path.c_str());
  std::string dir, file;
  if (fs::is_directory(path)) {
    dir = path;
    file = (fs::path(path) / "adapter_model.safetensors").string();
  } else {
    file = path;
    dir = fs::path(path).parent_path().string();
    if (dir.empty()) dir = ".";
  }
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  if (!fs::exists(cfg_path)) fail("%s: no adapter_config.json (a PEFT LoRA adapter directory has one)", dir.c_str());
  if (!fs::exists(file)) fail("%s: no adapter_model.safetensors", dir.c_str());
  Adapter ad;
  ad.path = path;
  // The directory's last component ("dir/", "." and ".." resolved first).
  fs::path d = fs::absolute(dir).lexically_normal();
  if (d.filename().empty()) d = d.parent_path();
  ad.name = d.filename().string();
  ad.config = parse_peft_config(read_text(cfg_path), cfg_path);

  const io::SafetensorsFile st = io::SafetensorsFile::open(file);
  // Pair A and B per key path (the "base_model.model." prefix stripped).
  struct Pair {
    const io::TensorInfo* a = nullptr;
    const io::TensorInfo* b = nullptr;
  };
  std::map<std::string, Pair> pairs;
  for (const io::TensorInfo& t : st.tensors()) {
    std::string key = t.name;
    if (key.starts_with("base_model.model.")) key = key.substr(17);
    if (key.find("lora_magnitude_vector") != std::string::npos)
      fail("%s: tensor '%s' is a DoRA magnitude vector; DoRA adapters are not supported", file.c_str(), t.name.c_str());
    if (key.find("lora_embedding_") != std::string::npos)
      fail("%s: tensor '%s' is a LoRA on an embedding; only linear layers and routed experts are supported", file.c_str(), t.name.c_str());
    if (ends_with(key, ".lora_A.weight")) {
      pairs[key.substr(0, key.size() - 14)].a = &t;
    } else if (ends_with(key, ".lora_B.weight")) {
      pairs[key.substr(0, key.size() - 14)].b = &t;
    } else if (ends_with(key, ".lora_B.bias")) {
      fail("%s: tensor '%s' is a LoRA bias (lora_bias); not supported", file.c_str(), t.name.c_str());
    } else {
      fail("%s: tensor '%s' is not a LoRA A or B weight (*.lora_A.weight / *.lora_B.weight); modules_to_save and other "
           "extra tensors are not supported",
           file.c_str(), t.name.c_str());
    }
  }
  if (pairs.empty()) fail("%s: no LoRA weights (*.lora_A.weight / *.lora_B.weight)", file.c_str());
  std::map<std::string, size_t> expert_index;  // normalised module -> ad.experts
  for (const auto& [key, p] : pairs) {
    if (p.a == nullptr) fail("%s: missing tensor 'base_model.model.%s.lora_A.weight' (its lora_B is present)", file.c_str(), key.c_str());
    if (p.b == nullptr) fail("%s: missing tensor 'base_model.model.%s.lora_B.weight' (its lora_A is present)", file.c_str(), key.c_str());
    if (p.a->shape.size() != 2 || p.b->shape.size() != 2)
      fail("%s: '%s': lora_A and lora_B must be matrices (got %zu and %zu dimensions)", file.c_str(), key.c_str(), p.a->shape.size(),
           p.b->shape.size());
    const int64_t rows_a = p.a->shape[0], in = p.a->shape[1], out = p.b->shape[0];
    if (p.b->shape[1] != rows_a)
      fail("%s: '%s': shape mismatch: lora_A is [%lld, %lld] and lora_B [%lld, %lld] (B's columns must be A's rows)", file.c_str(),
           key.c_str(), (long long)rows_a, (long long)in, (long long)out, (long long)p.b->shape[1]);
    // ".base_layer" segments: nested ParamWrappers (several parameters of one module).
    std::string module = key;
    int depth = 0;
    for (size_t at; (at = module.find(".base_layer")) != std::string::npos; ++depth) module.erase(at, 11);
    const bool experts = module == "experts" || ends_with(module, ".experts");
    if (experts) {
      const std::string probe = base.normalized_name(module + ".gate_up_proj");
      if (probe.empty()) fail("%s: '%s' targets '%s', which spool does not load", file.c_str(), key.c_str(), module.c_str());
      const std::string name = probe.substr(0, probe.size() - 13);  // without ".gate_up_proj"
      auto [it, fresh] = expert_index.emplace(name, ad.experts.size());
      if (fresh) ad.experts.push_back(ExpertLora{name, module, {}});
      ExpertWrapper w{key, depth, rows_a, in, out, to_f32(st, *p.a, file), to_f32(st, *p.b, file)};
      ad.experts[it->second].wrappers.push_back(std::move(w));
      continue;
    }
    if (depth > 0) fail("%s: '%s': nested parameter wrappers are supported on routed experts only", file.c_str(), key.c_str());
    const std::string name = base.normalized_name(module + ".weight");
    if (name.empty()) fail("%s: '%s' targets '%s', which spool does not load (vision tower or MTP head)", file.c_str(), key.c_str(), module.c_str());
    const auto [rank, scale] = ad.config.rank_and_scaling(module);
    if (rank != rows_a)
      fail("%s: '%s': shape mismatch: lora_A has rank %lld, adapter_config.json gives r = %lld for it", file.c_str(), key.c_str(),
           (long long)rows_a, (long long)rank);
    ad.dense.push_back(DenseLora{name, module, rows_a, in, out, scale, to_f32(st, *p.a, file), to_f32(st, *p.b, file)});
  }
  return ad;
}

}  // namespace spool::lora
