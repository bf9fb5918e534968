// Qwen3.5 / Qwen3.6 MoE (model_type qwen3_5_moe, qwen3_5_moe_text) and Qwen3-Next
// (qwen3_next): hybrid Gated DeltaNet + gated attention decoders with (1+w) RMSNorms, a
// softmax top-k router and a sigmoid-gated shared expert. Qwen3-Next differs only in its
// grouped GDN input projections (regrouped at load) and its norm_topk_prob / dense layers.
// Source: HF transformers models/qwen3_5_moe/modeling_qwen3_5_moe.py, models/qwen3_next/.
#include "models/families.h"

#include "models/decoder.h"

namespace spool::models {

std::unique_ptr<Model> load_qwen3_5_moe(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec,
                                         std::shared_ptr<ops::Backend> backend) {
  // Qwen3-Next stores in_proj_qkvz / in_proj_ba grouped per key head; a qwen3next GGUF written
  // by current llama.cpp carries them split into in_proj_qkv / in_proj_z (and the loader splits
  // ssm_ba into in_proj_b / in_proj_a), which is the Qwen3.5 layout.
  GdnLayout layout = spec.family == "qwen3_next" ? GdnLayout::kQwen3Next : GdnLayout::kQwen3_5;
  for (int i = 0; i < spec.n_layers && layout == GdnLayout::kQwen3Next; ++i)
    if (spec.mixers[i] == MixerKind::kGatedDeltaNet) {
      if (ckpt->find("layers." + std::to_string(i) + ".linear_attn.in_proj_qkv.weight") != nullptr) layout = GdnLayout::kQwen3_5;
      break;
    }
  auto m = std::make_unique<DecoderModel>(std::move(ckpt), std::move(spec), std::move(backend));
  m->bind(layout);
  return m;
}

}  // namespace spool::models
