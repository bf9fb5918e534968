// LoraAdapters: the LoRA adapters a server runs with (`spool serve --lora FILE[:SCALE]`, ids
// 0, 1, ... in flag order, names from their directories) and their default scales, as
// llama-server exposes them:
//   GET  /lora-adapters            -> [{"id", "path", "scale"}]  (the default scales)
//   POST /lora-adapters [{"id", "scale"}] sets the defaults (adapters not listed: 0)
//   a request's `lora: [{"id", "scale"}]` (every API) runs that request with those scales
//   (adapters not listed: 0); without it, a `model` naming an adapter runs that adapter at 1
//   (the others 0); otherwise the defaults at the time the request was parsed.
// The scales a request resolves to travel with it (GenRequest::lora) to the batch engine,
// which runs each sequence's rows with its own (models::SeqStep::lora): no global swap.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace spool::server {

/// The adapters and their default scales. Thread-safe.
class LoraAdapters {
 public:
  /// One adapter: its name (unique; lora::LoraSet::add) and the path it was loaded from.
  struct Info {
    std::string name, path;
  };
  /// `defaults`: one scale per adapter (the --lora scales, or 0 with --lora-init-without-apply).
  LoraAdapters(std::vector<Info> adapters, std::vector<float> defaults);

  size_t size() const { return adapters_.size(); }
  const std::vector<Info>& adapters() const { return adapters_; }
  /// The default scales now.
  std::vector<float> defaults() const;
  /// Index of the adapter named `name`, or -1.
  int find(const std::string& name) const;
  /// GET /lora-adapters: [{"id", "path", "scale"}] with the default scales.
  nlohmann::ordered_json list_json() const;
  /// POST /lora-adapters: `body` an array of {"id", "scale"} (adapters not listed get 0).
  /// Throws ApiError 400 (see parse_scales) and changes nothing then.
  void set_defaults(const nlohmann::ordered_json& body);
  /// The scales of one request (`body` of any API): its `lora` field when present (non-null),
  /// else the adapter its `model` names at 1, else the defaults. Throws ApiError 400 for a bad
  /// `lora` field.
  std::vector<float> for_request(const nlohmann::ordered_json& body) const;
  /// Parses an array of {"id": integer, "scale": number (absent: 0)} into one scale per
  /// adapter (those not listed: 0; a repeated id: the last). ApiError 400 naming `param` when
  /// `v` is not an array, an entry not an object, an id not an integer in [0, size()), or a
  /// scale not a finite number.
  std::vector<float> parse_scales(const nlohmann::ordered_json& v, const std::string& param) const;

 private:
  std::vector<Info> adapters_;
  mutable std::mutex mu_;
  std::vector<float> defaults_;
};

/// A request's scales when the server may have no adapters (`lora` null): an empty vector, or
/// ApiError 400 for a `lora` field naming an adapter; else lora->for_request(body).
std::vector<float> request_lora(const LoraAdapters* lora, const nlohmann::ordered_json& body);

}  // namespace spool::server
