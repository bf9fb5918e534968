#include "io/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace spool::io {

using Json = nlohmann::json;

bool Config::has(const std::string& key) const {
  auto it = j_.find(key);
  return it != j_.end() && !it->is_null();
}

void Config::bad(const std::string& key, const char* want) const {
  if (!has(key)) fail("%s: missing field '%s'", source_.c_str(), key.c_str());
  fail("%s: field '%s' must be %s (got %s)", source_.c_str(), key.c_str(), want, j_.at(key).dump().c_str());
}

int64_t Config::get_int(const std::string& key) const {
  if (!has(key)) bad(key, "an integer");
  const Json& v = j_.at(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {  // 64.0 is accepted as 64; range-checked before the cast
    const double d = v.get<double>();
    if (d >= -9.2e18 && d <= 9.2e18 && d == std::trunc(d)) return static_cast<int64_t>(d);
  }
  bad(key, "an integer");
}

int64_t Config::get_int(const std::string& key, int64_t def) const { return has(key) ? get_int(key) : def; }

double Config::get_double(const std::string& key) const {
  if (!has(key) || !j_.at(key).is_number()) bad(key, "a number");
  return j_.at(key).get<double>();
}

double Config::get_double(const std::string& key, double def) const { return has(key) ? get_double(key) : def; }

bool Config::get_bool(const std::string& key, bool def) const {
  if (!has(key)) return def;
  if (!j_.at(key).is_boolean()) bad(key, "a boolean");
  return j_.at(key).get<bool>();
}

std::string Config::get_string(const std::string& key) const {
  if (!has(key) || !j_.at(key).is_string()) bad(key, "a string");
  return j_.at(key).get<std::string>();
}

std::string Config::get_string(const std::string& key, const std::string& def) const {
  return has(key) ? get_string(key) : def;
}

std::vector<int64_t> Config::get_int_list(const std::string& key) const {
  std::vector<int64_t> out;
  if (!has(key)) return out;
  const Json& v = j_.at(key);
  if (v.is_number_integer()) {
    out.push_back(v.get<int64_t>());
    return out;
  }
  if (!v.is_array()) bad(key, "an integer or a list of integers");
  for (const auto& e : v) {
    if (!e.is_number_integer()) bad(key, "an integer or a list of integers");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

std::vector<std::string> Config::get_string_list(const std::string& key) const {
  std::vector<std::string> out;
  if (!has(key)) return out;
  const Json& v = j_.at(key);
  if (!v.is_array()) bad(key, "a list of strings");
  for (const auto& e : v) {
    if (!e.is_string()) bad(key, "a list of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

Config Config::get_object(const std::string& key) const {
  if (!has(key)) return Config(Json::object(), source_ + ":" + key);
  if (!j_.at(key).is_object()) bad(key, "an object");
  return Config(j_.at(key), source_ + ":" + key);
}

Config Config::load_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("%s: cannot open (missing file?)", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  Json j;
  try {
    j = Json::parse(ss.str());
  } catch (const Json::exception& e) {
    fail("%s: not valid JSON (%s)", path.c_str(), e.what());
  }
  if (!j.is_object()) fail("%s: top level is not a JSON object", path.c_str());
  return Config(std::move(j), path);
}

GenerationDefaults parse_generation_config(const Config& c) {
  GenerationDefaults g;
  g.eos_token_ids = c.get_int_list("eos_token_id");
  if (c.has("temperature")) g.temperature = c.get_double("temperature");
  if (c.has("top_p")) g.top_p = c.get_double("top_p");
  if (c.has("top_k")) g.top_k = c.get_int("top_k");
  if (c.has("min_p")) g.min_p = c.get_double("min_p");
  if (c.has("repetition_penalty")) g.repetition_penalty = c.get_double("repetition_penalty");
  if (c.has("do_sample")) g.do_sample = c.get_bool("do_sample", true);
  return g;
}

}  // namespace spool::io
