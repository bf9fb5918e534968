// ERNIE-4.5 MoE (model_type ernie4_5_moe, HF Ernie4_5_MoeForCausalLM: ERNIE-4.5-21B-A3B, the text
// part of the 300B-A47B): Llama blocks (GQA, head_dim = hidden / heads when absent) with RoPE on
// adjacent pairs over the whole head (HF rotate_half on even/odd dims), a dense SwiGLU MLP
// (intermediate_size) where a layer is not MoE, and MoE layers i with (i + 1) % moe_layer_interval
// == 0 and moe_layer_start_index <= i <= moe_layer_end_index (-1 = the last layer). Router: p =
// softmax(x . W_gate) over all experts (f32), the top-k of p + e_score_correction_bias chosen (the
// bias for the choice only), weights p of the chosen renormalised (HF divides by max(sum, moe_norm_min);
// spool by sum + 1e-20: the same in f32 for any sum above 1e-12), no scaling, no groups; plus an ungated
// shared MLP mlp.shared_experts of moe_intermediate_size * moe_num_shared_experts. The router bias
// mlp.moe_statics.e_score_correction_bias [1, E] is read as mlp.gate.e_score_correction_bias [E]
// (io::Checkpoint). Output head tied to the embeddings by default. use_bias=true (biases on every
// linear) is rejected: the released checkpoints have none.
// Source: HF transformers 5.17 models/ernie4_5_moe/{configuration,modeling}_ernie4_5_moe.py.
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/config_read.h"
#include "models/family.h"

namespace spool::models {

namespace {

using J = nlohmann::ordered_json;
using namespace cfg;

void configure(const io::Config& c, ModelSpec* sp) {
  ModelSpec& s = *sp;
  check_act(c);
  if (c.get_bool("use_bias", false))
    fail("%s: use_bias=true (biases on every linear layer) is not supported for ernie4_5_moe", c.source().c_str());
  read_attention(c, &s.attn, s.hidden_size);
  read_rope(c, 1.0, &s.attn);
  s.attn.rope_layout = RopeLayout::kInterleavedPairs;
  MoeSpec& mo = s.moe;
  mo.n_experts = c.has("moe_num_experts") ? positive(c, "moe_num_experts") : positive(c, "num_experts");
  mo.top_k = c.has("moe_k") ? positive(c, "moe_k") : positive(c, "num_experts_per_tok");
  if (mo.top_k > mo.n_experts)
    fail("%s: moe_k (%d) exceeds moe_num_experts (%d)", c.source().c_str(), mo.top_k, mo.n_experts);
  mo.intermediate = positive(c, "moe_intermediate_size");
  mo.shared_intermediate = non_negative(c, "moe_num_shared_experts", 0) * mo.intermediate;
  mo.shared_name = "shared_experts";
  mo.norm_topk_prob = true;
  mo.score = RouterScore::kSoftmax;
  mo.selection = RouterSelection::kTopK;  // top-k of p + bias (the bias for the choice only), no groups
  mo.score_bias = true;
  const int interval = c.has("moe_layer_interval") ? positive(c, "moe_layer_interval") : 1;
  const int start = non_negative(c, "moe_layer_start_index", 0);
  const int64_t end_raw = c.get_int("moe_layer_end_index", -1);
  const int64_t end = end_raw < 0 ? s.n_layers - 1 : end_raw;
  s.mixers.assign(s.n_layers, MixerKind::kAttention);

  for (int i = 0; i < s.n_layers; ++i) {
    const bool moe = (i + 1) % interval == 0 && i >= start && i <= end;
    s.ffns.push_back(moe ? FfnKind::kMoE : FfnKind::kDense);

  }
}

}  // namespace

const Family& ernie4_5_moe_family() {
  static const Family f{.name = "ernie4_5_moe",
                        .model_types = {"ernie4_5_moe"},
                        .chat_formats = {"ernie4_5"},
                        .configure = configure,
                        .load = load_decoder,
                        .describe = describe_gqa_moe,
                        // ERNIE-4.5 keeps its router correction bias as [1, E] in mlp.moe_statics (HF
                        // renames it to gate.moe_statics.* on load).
                        .tensors = {.renames = {{"layers.{L}.mlp.moe_statics.e_score_correction_bias",
                                                 "layers.{L}.mlp.gate.e_score_correction_bias", /*squeeze_leading_one=*/true}}}};
  return f;
}

}  // namespace spool::models
