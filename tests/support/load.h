// Test support: the engine load options the model tests share, and the demo model converted by a
// quantization recipe.
#pragma once

#include <filesystem>
#include <string>

#include "engine/loader.h"
#include "models/family.h"
#include "quant/convert.h"
#include "quant/recipe.h"

namespace spool::testing {

/// LoadOptions of a test load: checkpoint folder `dir`, 2 threads; with `stream` the expert
/// streaming cache with a zero budget (every expert acquisition is a disk read). Other fields
/// keep their defaults for the caller to set.
inline engine::LoadOptions test_load_options(const std::string& dir, bool stream) {
  engine::LoadOptions o;
  o.model_dir = dir;
  o.threads = 2;
  if (stream) {
    o.stream = true;
    o.cache_budget = "0";
  }
  return o;
}

/// Converts the demo model (SPOOL_DEFAULT_MODEL_DIR) with quantization recipe `recipe` (as
/// `spool convert`, 2 threads) into folder `out`, removed first; `q` chooses scales and codebooks
/// (default: spool convert's, QuantOptions::legacy() for the original rules). Throws spool::Error
/// as quant::convert does.
inline void convert_demo(const std::string& out, const quant::Recipe& recipe, const quant::QuantOptions& q = {}) {
  std::filesystem::remove_all(out);
  quant::ConvertOptions o;
  o.in_dir = SPOOL_DEFAULT_MODEL_DIR;
  o.out_dir = out;
  o.rules = &models::checkpoint_rules();
  o.recipe = recipe;
  o.quant = q;
  o.threads = 2;
  quant::convert(o, nullptr);
}

/// The same with the named recipe (spool::UsageError if unknown).
inline void convert_demo(const std::string& out, const std::string& recipe, const quant::QuantOptions& q = {}) {
  convert_demo(out, quant::recipe(recipe), q);
}

}  // namespace spool::testing
