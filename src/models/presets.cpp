#include "models/presets.h"

#include <algorithm>

#include "common/error.h"
#include "models/family.h"

namespace spool::models {

std::vector<Preset> parse_presets(const std::string& text, const std::string& label) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: not valid JSON (%s)", label.c_str(), e.what());
  }
  if (!j.is_array()) fail("%s: a presets file is a JSON array of presets", label.c_str());
  std::vector<Preset> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::ordered_json& e = j[i];
    auto str = [&](const char* k, const char* def) -> std::string {
      if (!e.contains(k)) {
        if (def != nullptr) return def;
        fail("%s: preset %zu has no '%s'", label.c_str(), i, k);
      }
      if (!e[k].is_string()) fail("%s: preset %zu: '%s' must be a string", label.c_str(), i, k);
      return e[k].get<std::string>();
    };
    if (!e.is_object()) fail("%s: preset %zu is not an object", label.c_str(), i);
    Preset p;
    p.name = str("name", nullptr);
    p.description = str("description", nullptr);
    p.prefix = str("prefix", "model.");
    p.source = str("source", "");
    if (e.contains("aliases")) {
      if (!e["aliases"].is_array()) fail("%s: preset '%s': 'aliases' must be a list of names", label.c_str(), p.name.c_str());
      for (const auto& a : e["aliases"]) {
        if (!a.is_string()) fail("%s: preset '%s': 'aliases' must be a list of names", label.c_str(), p.name.c_str());
        p.aliases.push_back(a.get<std::string>());
      }
    }
    if (e.contains("fused_experts")) {
      if (!e["fused_experts"].is_boolean()) fail("%s: preset '%s': 'fused_experts' must be true or false", label.c_str(), p.name.c_str());
      p.fused_experts = e["fused_experts"].get<bool>();
    }
    if (!e.contains("config") || !e["config"].is_object()) fail("%s: preset '%s' has no 'config' object", label.c_str(), p.name.c_str());
    p.config = e["config"];
    out.push_back(std::move(p));
  }
  return out;
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> v = [] {
    for (const PresetFile& pf : preset_files())
      if (family_named(pf.family) == nullptr)
        fail("src/models/presets/%s.json: '%s' is no registered family (models/families.cpp)", pf.family, pf.family);
    std::vector<Preset> out;
    for (const Family* f : families())
      for (const PresetFile& pf : preset_files())
        if (f->name == pf.family)
          for (Preset& p : parse_presets(pf.json, strfmt("src/models/presets/%s.json", pf.family))) out.push_back(std::move(p));
    return out;
  }();
  return v;
}

const Preset& preset(const std::string& name) {
  std::string names;
  for (const auto& p : presets()) {
    if (p.name == name || std::find(p.aliases.begin(), p.aliases.end(), name) != p.aliases.end()) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw UsageError(strfmt("unknown preset '%s' (known: %s)", name.c_str(), names.c_str()));
}

}  // namespace spool::models
