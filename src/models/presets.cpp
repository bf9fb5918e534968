#include "models/presets.h"

#include "common/error.h"
#include "models/family.h"

namespace spool::models {

const std::vector<Preset>& presets() {
  static const std::vector<Preset> v = [] {
    std::vector<Preset> out;
    for (const Family* f : families())
      if (f->presets != nullptr)
        for (Preset& p : f->presets()) out.push_back(std::move(p));
    return out;
  }();
  return v;
}

const Preset& preset(const std::string& name) {
  std::string names;
  for (const auto& p : presets()) {
    if (p.name == name || (name == "qwen3.5-35b-a3b" && p.name == "qwen3.6-35b-a3b")) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw UsageError(strfmt("unknown preset '%s' (known: %s)", name.c_str(), names.c_str()));
}

}  // namespace spool::models
