#include "models/model.h"

#include "common/error.h"
#include "models/families.h"

namespace spool::models {

std::unique_ptr<Model> load_model(std::shared_ptr<const io::Checkpoint> ckpt, ops::ThreadPool* pool) {
  ModelSpec spec = build_spec(*ckpt);
  if (spec.family == "qwen3_5_moe" || spec.family == "qwen3_next") return load_qwen3_5_moe(std::move(ckpt), std::move(spec), pool);
  if (spec.family == "qwen3_moe") return load_qwen3_moe(std::move(ckpt), std::move(spec), pool);
  fail("%s: no loader for model family '%s'", ckpt->dir().c_str(), spec.family.c_str());
}

}  // namespace spool::models
