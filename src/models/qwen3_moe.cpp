// Qwen3-MoE (model_type qwen3_moe, e.g. Qwen3-30B-A3B): all-attention decoder with
// plain-weight RMSNorms (also per-head q/k norms), full RoPE, softmax top-k router with
// norm_topk_prob, no shared expert; `mlp_only_layers` / `decoder_sparse_step` select dense
// SwiGLU layers. Source: HF transformers models/qwen3_moe/modeling_qwen3_moe.py.
#include "models/families.h"

#include "models/decoder.h"

namespace spool::models {

std::unique_ptr<Model> load_qwen3_moe(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec,
                                         std::shared_ptr<ops::Backend> backend) {
  auto m = std::make_unique<DecoderModel>(std::move(ckpt), std::move(spec), std::move(backend));
  m->bind(GdnLayout::kQwen3_5);  // no GDN layers in this family
  return m;
}

}  // namespace spool::models
