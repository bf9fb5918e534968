// DecoderModel: the pre-norm decoder stack every family runs on (models/family.h).
//   h = embed(ids)
//   per layer: h += mixer(norm1(h)); h += ffn(norm2(h))   mixer: a TokenMixer (layer.h)
//   logits = lm_head(norm(h))                               ffn: an Ffn (ffn.h)
// One loop over the layers: each layer's mixer and FFN are the classes make_token_mixer() /
// make_ffn() pick from ModelSpec::mixers / ffns, called through their interfaces.
// Options from ModelSpec: sandwich norms (the branch outputs normed before the add), a dense
// MLP in parallel with the MoE block, a per-layer residual scale, embedding scale and final
// logit soft-capping (HF Gemma 4's Gemma4TextDecoderLayer / Gemma4TextModel).
// Family files (models/family.h) choose the family's layout options and call
// bind(), which binds every tensor by its HF name.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/layer.h"
#include "models/model.h"

namespace spool::models {

class DecoderModel : public Model {
 public:
  /// Scratch of the decoder stack over T tokens: residual stream h, normed input xn and layer
  /// output tmp, [T, H] each (kept across layers; each layer's own scratch comes after).
  struct Scratch {
    float *h, *xn, *tmp;
    static Scratch take(ops::Workspace& ws, int64_t H, int64_t T) { return {ws.floats(T * H), ws.floats(T * H), ws.floats(T * H)}; }
  };
  /// Rows of the last token of each sequence gathered for one lm_head product when a step has
  /// several sequences: normed input [S, H] and logits [S, vocab].
  struct HeadScratch {
    float *xn, *logits;
    static HeadScratch take(ops::Workspace& ws, int64_t H, int64_t V, int64_t S) { return {ws.floats(S * H), ws.floats(S * V)}; }
  };
  /// workspace_arena_bytes() of this stack: Scratch plus the largest layer scratch, plus
  /// HeadScratch for more than one sequence.
  static uint64_t arena_bytes(const ModelSpec& spec, int64_t T, int max_seqs = 1);

  DecoderModel(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec, std::shared_ptr<ops::Backend> backend);

  /// Binds embeddings, final norm, lm_head and every layer with the default HF names
  /// (layers.{i}.{input_layernorm,post_attention_layernorm,self_attn,linear_attn,mlp});
  /// `gdn_layout` is how Gated DeltaNet layers store their input projections.
  void bind(GdnLayout gdn_layout);

  const ModelSpec& spec() const override { return spec_; }
  /// A fresh state; with a GPU backend its Gated DeltaNet states live on the device (State::place).
  State new_state() const override;
  void set_kv_type(ops::KvType type) override { kv_type_ = type; }
  void forward(std::span<const int32_t> ids, State& state, LogitsMode mode, float* logits) override;
  void forward_batch(std::span<const SeqStep> seqs) override;
  void set_max_active_experts(int k) override;
  void set_next_layer_prefetch(int m) override { next_prefetch_ = m > 0 ? m : 0; }
  void set_comm(dist::Comm* comm) override;
  void set_expert_parallel(const dist::ExpertParallel& ep) override;
  int serve_experts() override;
  void set_expert_predictor(std::shared_ptr<const experts::ExpertPredictor> p, bool route_by) override;
  int predictor_source(int layer) const override;
  void router_as_linear(int layer, std::vector<float>* w, std::vector<float>* b) override;
  void set_expert_provider(std::shared_ptr<experts::ExpertProvider> provider) override;
  experts::ExpertProvider& expert_provider() override { return *provider_; }
  std::shared_ptr<experts::ExpertProvider> shared_expert_provider() override { return provider_; }
  void reserve_workspace(int64_t max_tokens, int max_seqs = 1) override;
  uint64_t workspace_capacity() const override { return ws_.capacity(); }
  ops::Backend& backend() override { return *be_; }
  int mtp_layers() const override { return spec_.mtp_layers; }
  void mtp_forward(const MtpStep& step) override;

 private:
  struct Layer {
    std::vector<float> in_norm, post_norm;  // effective RMSNorm weights [H]
    const float *in_norm_p = nullptr, *post_norm_p = nullptr;  // where the backend reads them
    // ModelSpec::sandwich_norms: pre/post_feedforward_layernorm (the FFN's input and output).
    std::vector<float> pre_ffn, post_ffn;
    const float *pre_ffn_p = nullptr, *post_ffn_p = nullptr;
    float scalar = 1.0f;  // layer_scalar (ModelSpec::residual_scale)
    std::unique_ptr<TokenMixer> mixer;
    std::unique_ptr<Ffn> ffn;
  };
  using Part = SeqRows;  // one sequence's rows within a step
  // forward_batch() steps: embeddings, every layer over s.h (updates the states), then final
  // norm + lm_head for the rows whose logits are wanted.
  void embed(std::span<const int32_t> ids, float* h);
  // `between` runs inside each MoE layer once its expert reads are started (may be empty);
  // `row0`: the step row of s's row 0 (hooks.route_override numbers the step's rows).
  void run_layers(const Scratch& s, int64_t N, std::span<const Part> parts, ops::Workspace& ws,
                  const std::function<void()>& between, int64_t row0 = 0);
  // ExpertProvider::hint(layer, ids) for the experts of ids this rank runs (all without set_comm).
  void hint_owned(int layer, std::vector<int> ids);
  // One layer over s.h. `pending`: s.h still lacks the previous layer's output s.tmp (its residual
  // add is fused into this layer's input norm, Backend::add_rms_norm). Returns whether this layer
  // left its own output in s.tmp, to be added (by the next layer, or by the caller after the last).
  bool run_layer(int i, const Scratch& s, int64_t N, std::span<const Part> parts, ops::Workspace& ws, FfnStep& step, bool pending);
  // The multi-token-prediction head's tensors (bind() when spec_.mtp_layers > 0).
  void bind_mtp(GdnLayout gdn_layout);
  // A decode step of >= 2 sequences with streamed experts: two groups of sequences on two
  // threads, taking turns so that one group's expert reads overlap the other's compute.
  void run_pipelined(const Scratch& s, std::span<const Part> parts);
  // The layers' take() calls over T rows (measuring or real), one scope per layer.
  static void take_layers(ops::Workspace& ws, const ModelSpec& spec, int64_t T);
  // Bytes of the second group's arena in a pipelined step.
  static uint64_t group_arena_bytes(const ModelSpec& spec);
  void finish(const Scratch& s, int64_t N, std::span<const SeqStep> seqs, std::span<const Part> parts);

  std::shared_ptr<const io::Checkpoint> ckpt_;
  ModelSpec spec_;
  std::shared_ptr<ops::Backend> be_;
  ops::Workspace ws_;       // one arena for every layer's activations (workspace_arena_bytes)
  int64_t ws_tokens_ = 0;   // token rows per step ws_ is sized for
  int ws_seqs_ = 0;         // sequences per step ws_ is sized for
  // This step's per-row LoRA user scales [rows, lora_n_] (SeqStep::lora; ops::LoraRowScales);
  // lora_n_ == 0: none given, the adapters' defaults apply.
  std::vector<float> lora_rows_;
  int lora_n_ = 0;
  // Builds lora_rows_ for `rows` rows in runs of (count, scales) (empty scales: the defaults).
  void set_lora_rows(const std::vector<std::pair<int64_t, std::span<const float>>>& runs);
  uint64_t group_arena_ = 0;  // group_arena_bytes(spec_), once measured
  ops::WeightView embed_, lm_head_;
  // When the embedding table is not lm_head, its rows are read with pread (one row per
  // token) instead of through the mapping: the table never becomes resident memory.
  // A spool-quantized table (embed_.type == kQuant) reads two rows per token: the packed codes
  // (embed_fd_ / embed_offset_ / embed_row_, the .qweight tensor) and the fp16 group scales
  // (the .scales tensor, below); codebook and signs are read from the mapping.
  int embed_fd_ = -1;
  uint64_t embed_offset_ = 0;     // file offset of row 0
  std::vector<uint8_t> embed_row_;  // one row's bytes
  int embed_scales_fd_ = -1;          // kQuant only: the .scales tensor's shard
  uint64_t embed_scales_offset_ = 0;  // kQuant only: file offset of scale row 0
  std::vector<uint8_t> embed_scales_row_;  // kQuant only: one row of fp16 scales
  // Reads `bytes.size()` bytes of row `id` of a table at `offset` in `fd` into `bytes`; throws
  // naming the checkpoint and row on a failed or short read.
  void read_embed_row(int fd, uint64_t offset, int32_t id, std::vector<uint8_t>& bytes) const;
  std::vector<float> final_norm_;
  const float* final_norm_p_ = nullptr;  // final_norm_ where the backend reads it
  // hooks.on_hidden with a GPU backend: hidden rows copied to the host first.
  void observe_hidden(int index, const float* hidden, int64_t T);
  std::vector<Layer> layers_;  // the main stack, then spec_.mtp_layers MTP layers
  // Multi-token prediction: full_spec_ = mtp_spec(spec_) (the geometry of States and the MTP
  // layers); fc [H, 2H]; the embedding, hidden and output norms; the head (lm_head unless the
  // checkpoint has its own: DeepSeek shared_head.head).
  ModelSpec full_spec_;
  bool mtp_stacked_ = false;  // Qwen3.5 mtp.* (its layers run in sequence) rather than DeepSeek nextn (the first drafts)
  ops::WeightView mtp_fc_, mtp_head_;
  std::vector<float> mtp_enorm_, mtp_hnorm_, mtp_norm_;
  const float *mtp_enorm_p_ = nullptr, *mtp_hnorm_p_ = nullptr, *mtp_norm_p_ = nullptr;
  std::shared_ptr<experts::ExpertProvider> resident_, provider_;
  int top_k_ = 0;
  int next_prefetch_ = 0;  // set_next_layer_prefetch
  dist::ExpertParallel ep_;  // set_expert_parallel: expert parallelism over its ranks (no comm: none)
  std::shared_ptr<const experts::ExpertPredictor> predictor_;  // set_expert_predictor (null: none)
  bool route_by_predictor_ = false;
  // The next MoE layer's guess inside layer i's FFN (next-layer prefetch and --route-by-predictor):
  // the hint to run once layer i's reads are started (empty: none). With --route-by-predictor it
  // fills step.within_next (the next MoE layer's restriction) now.
  std::function<void()> next_layer_hint(int i, const Scratch& s, int64_t N, FfnStep& step);
  // The FFN norm (effective weights where the backend reads them) of layer j's router input.
  const float* ffn_norm(int j) const;
  ops::KvType kv_type_ = ops::KvType::kF32;
};

}  // namespace spool::models
