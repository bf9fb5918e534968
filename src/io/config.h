// Typed access to a model's config.json (text part) and generation_config.json, with errors
// that name the file and field. Handles `text_config` nesting and transformers' aliases.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace spool::io {

/// A JSON object with typed getters. Missing or mistyped fields raise spool::Error naming
/// `source` (e.g. "models/x/config.json") and the field.
class Config {
 public:
  Config() = default;
  Config(nlohmann::json j, std::string source) : j_(std::move(j)), source_(std::move(source)) {}

  bool has(const std::string& key) const;  // present and not null
  const nlohmann::json& json() const { return j_; }
  const std::string& source() const { return source_; }

  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_double(const std::string& key) const;
  double get_double(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& def) const;
  /// An int or a list of ints (e.g. eos_token_id); empty if absent or null.
  std::vector<int64_t> get_int_list(const std::string& key) const;
  std::vector<std::string> get_string_list(const std::string& key) const;
  /// A nested object (e.g. rope_parameters); empty Config if absent.
  Config get_object(const std::string& key) const;

  /// Reads and parses a JSON file; throws spool::Error naming the file on any failure.
  static Config load_file(const std::string& path);

 private:
  [[noreturn]] void bad(const std::string& key, const char* want) const;
  nlohmann::json j_ = nlohmann::json::object();
  std::string source_;
};

/// Sampling defaults and stop ids from generation_config.json (all optional).
struct GenerationDefaults {
  std::vector<int64_t> eos_token_ids;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<bool> do_sample;
};

/// Parses generation_config.json content.
GenerationDefaults parse_generation_config(const Config& c);

}  // namespace spool::io
