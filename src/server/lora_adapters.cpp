#include "server/lora_adapters.h"

#include <cmath>
#include <limits>

#include "common/error.h"
#include "server/api_error.h"

namespace spool::server {

using json = nlohmann::ordered_json;

LoraAdapters::LoraAdapters(std::vector<Info> adapters, std::vector<float> defaults)
    : adapters_(std::move(adapters)), defaults_(std::move(defaults)) {
  if (defaults_.size() != adapters_.size()) fail("LoraAdapters: %zu default scales for %zu adapters", defaults_.size(), adapters_.size());
}

std::vector<float> LoraAdapters::defaults() const {
  std::lock_guard lock(mu_);
  return defaults_;
}

int LoraAdapters::find(const std::string& name) const {
  for (size_t i = 0; i < adapters_.size(); ++i)
    if (adapters_[i].name == name) return static_cast<int>(i);
  return -1;
}

json LoraAdapters::list_json() const {
  const std::vector<float> d = defaults();
  json out = json::array();
  for (size_t i = 0; i < adapters_.size(); ++i)
    out.push_back(json{{"id", i}, {"path", adapters_[i].path}, {"scale", d[i]}});
  return out;
}

std::vector<float> LoraAdapters::parse_scales(const json& v, const std::string& param) const {
  const size_t n = adapters_.size();
  if (!v.is_array()) throw bad_request("'" + param + "' must be an array of {\"id\", \"scale\"} objects", param);
  std::vector<float> out(n, 0.0f);
  for (size_t k = 0; k < v.size(); ++k) {
    const json& e = v[k];
    const std::string where = strfmt("'%s[%zu]'", param.c_str(), k);
    if (!e.is_object()) throw bad_request(where + " must be an object {\"id\", \"scale\"}", param);
    auto id = e.find("id");
    if (id == e.end() || !id->is_number_integer())
      throw bad_request(where + ".id must be an integer adapter id (GET /lora-adapters lists them)", param);
    const int64_t i = id->get<int64_t>();
    if (n == 0) throw bad_request(where + ".id: the server runs no LoRA adapters (spool serve --lora FILE)", param);
    if (i < 0 || static_cast<size_t>(i) >= n)
      throw bad_request(strfmt("%s.id %lld: no such adapter (the server has %zu: ids 0..%lld)", where.c_str(), (long long)i, n,
                               (long long)n - 1),
                        param);
    float scale = 0.0f;
    if (auto s = e.find("scale"); s != e.end()) {
      if (!s->is_number() || !std::isfinite(s->get<double>()) || std::fabs(s->get<double>()) > std::numeric_limits<float>::max())
        throw bad_request(where + ".scale must be a finite number", param);
      scale = static_cast<float>(s->get<double>());
    }
    out[static_cast<size_t>(i)] = scale;
  }
  return out;
}

void LoraAdapters::set_defaults(const json& body) {
  std::vector<float> d = parse_scales(body, "lora");
  std::lock_guard lock(mu_);
  defaults_ = std::move(d);
}

std::vector<float> LoraAdapters::for_request(const json& body) const {
  if (auto it = body.find("lora"); it != body.end() && !it->is_null()) return parse_scales(*it, "lora");
  if (auto m = body.find("model"); m != body.end() && m->is_string()) {
    const int i = find(m->get<std::string>());
    if (i >= 0) {
      std::vector<float> one(adapters_.size(), 0.0f);
      one[static_cast<size_t>(i)] = 1.0f;
      return one;
    }
  }
  return defaults();
}

std::vector<float> request_lora(const LoraAdapters* lora, const json& body) {
  if (lora != nullptr) return lora->for_request(body);
  const LoraAdapters none({}, {});
  return none.for_request(body);  // (validates the field: any id is out of range)
}

}  // namespace spool::server
