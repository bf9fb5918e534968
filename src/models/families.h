// Per-family loaders, dispatched by load_model() on the spec's family.
#pragma once

#include <memory>

#include "models/model.h"

namespace spool::models {

/// qwen3_5_moe / qwen3_5_moe_text / qwen3_next (see qwen3_5_moe.cpp). Throws spool::Error
/// for missing or mis-shaped tensors.
std::unique_ptr<Model> load_qwen3_5_moe(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec,
                                         std::shared_ptr<ops::Backend> backend);
/// qwen3_moe (see qwen3_moe.cpp). Throws spool::Error for missing or mis-shaped tensors.
std::unique_ptr<Model> load_qwen3_moe(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec,
                                         std::shared_ptr<ops::Backend> backend);

}  // namespace spool::models
