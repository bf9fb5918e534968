// Per-family loaders, dispatched by load_model() on the spec's family.
#pragma once

#include <memory>

#include "models/model.h"

namespace spool::models {

std::unique_ptr<Model> load_qwen3_5_moe(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec, ops::ThreadPool* pool);
std::unique_ptr<Model> load_qwen3_moe(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec, ops::ThreadPool* pool);

}  // namespace spool::models
