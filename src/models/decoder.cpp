#include "models/decoder.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "experts/resident.h"
#include "experts/weight_views.h"
#include "models/bind.h"

namespace spool::models {

DecoderModel::DecoderModel(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec,
                           std::shared_ptr<ops::Backend> backend)
    : ckpt_(std::move(ckpt)), spec_(std::move(spec)), be_(std::move(backend)), top_k_(spec_.moe.top_k) {}

uint64_t DecoderModel::arena_bytes(const ModelSpec& spec, int64_t T) {
  // The same take() calls, in the same nesting, as forward() makes (measuring workspace).
  ops::Workspace m;
  const int64_t H = spec.hidden_size;
  Scratch::take(m, H, T);
  for (int i = 0; i < spec.n_layers; ++i) {
    {
      ops::WorkspaceScope scope(m);
      if (spec.mixers[i] == MixerKind::kAttention) {
        AttentionLayer::Scratch::take(m, spec.attn, T);
      } else {
        GatedDeltaNetLayer::Scratch::take(m, spec.gdn, T);
      }
    }
    ops::WorkspaceScope scope(m);
    if (spec.ffns[i] == FfnKind::kMoE) {
      MoeBlock::Scratch::take(m, spec.moe, H, T, spec.moe.top_k);
    } else {
      DenseMlp::Scratch::take(m, T, spec.dense_intermediate);
    }
  }
  return m.high_water();
}

void DecoderModel::reserve_workspace(int64_t max_tokens) {
  max_tokens = std::max<int64_t>(max_tokens, 1);
  if (max_tokens == ws_tokens_) return;
  ws_ = ops::Workspace();  // the old arena goes back before the new one is mapped
  ws_ = ops::Workspace(arena_bytes(spec_, max_tokens), be_->device());
  ws_tokens_ = max_tokens;
}

void DecoderModel::bind(GdnLayout gdn_layout) {
  const io::Checkpoint& ck = *ckpt_;
  const int64_t H = spec_.hidden_size, V = spec_.vocab_size;
  embed_ = bind_float_matrix(ck, "embed_tokens.weight", V, H);
  if (spec_.tie_word_embeddings && ck.find("lm_head.weight") == nullptr && ck.find("lm_head.qweight") == nullptr) {
    lm_head_ = embed_;
  } else {
    lm_head_ = bind_matrix(ck, "lm_head.weight", V, H);
  }
  final_norm_ = bind_norm(ck, "norm.weight", H, spec_.norm_one_plus);
  if (lm_head_.data != embed_.data && embed_.type != ops::WType::kQuant) {
    const io::TensorRef& et = ck.tensor("embed_tokens.weight");
    const int fd = ck.shards()[et.shard].fd();
    if (fd >= 0) {
      embed_fd_ = fd;
      embed_offset_ = et.offset;
      embed_row_.resize(static_cast<size_t>(H) * ops::wtype_size(embed_.type));
    }
  }
  layers_.resize(spec_.n_layers);
  std::vector<bool> moe_layers(spec_.n_layers, false);
  for (int i = 0; i < spec_.n_layers; ++i) {
    Layer& L = layers_[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    L.in_norm = bind_norm(ck, p + "input_layernorm.weight", H, spec_.norm_one_plus);
    L.post_norm = bind_norm(ck, p + "post_attention_layernorm.weight", H, spec_.norm_one_plus);
    if (spec_.mixers[i] == MixerKind::kAttention) {
      L.attn = std::make_unique<AttentionLayer>();
      L.attn->bind(ck, p + "self_attn.", spec_);
    } else {
      L.gdn = std::make_unique<GatedDeltaNetLayer>();
      L.gdn->bind(ck, p + "linear_attn.", spec_, gdn_layout);
    }
    if (spec_.ffns[i] == FfnKind::kMoE) {
      L.moe = std::make_unique<MoeBlock>();
      L.moe->bind(ck, p + "mlp.", spec_);
      moe_layers[i] = true;
    } else {
      L.mlp = std::make_unique<DenseMlp>();
      L.mlp->bind(ck, p + "mlp.", static_cast<int>(H), spec_.dense_intermediate);
    }
  }
  resident_ = std::make_shared<experts::ResidentExperts>(ckpt_, moe_layers, spec_.moe.n_experts, static_cast<int>(H),
                                                         spec_.moe.intermediate);
  provider_ = resident_;
}

void DecoderModel::set_max_active_experts(int k) {
  if (k < 0 || k > spec_.moe.top_k)
    fail("--max-active-experts %d is out of range: the model routes to %d experts per token (0 = native)", k,
         spec_.moe.top_k);
  top_k_ = k == 0 ? spec_.moe.top_k : k;
}

void DecoderModel::set_expert_provider(std::shared_ptr<experts::ExpertProvider> provider) {
  provider_ = provider ? std::move(provider) : resident_;
}

void DecoderModel::forward(std::span<const int32_t> ids, State& state, LogitsMode mode, float* logits) {
  const int64_t T = static_cast<int64_t>(ids.size());
  const int64_t H = spec_.hidden_size, V = spec_.vocab_size;
  if (T == 0) return;
  if (state.poisoned) fail("this sequence's state is incomplete after an earlier error; reset it before reuse");
  for (int32_t id : ids)
    if (id < 0 || id >= V) fail("token id %d is outside the vocabulary (0..%lld)", id, (long long)(V - 1));
  const int64_t pos0 = state.pos;
  state.reserve(pos0 + T);
  if (T > ws_tokens_) reserve_workspace(T);
  ops::WorkspaceScope scope(ws_);
  const Scratch s = Scratch::take(ws_, H, T);
  const int esz = ops::wtype_size(embed_.type);
  for (int64_t t = 0; t < T; ++t) {
    const uint8_t* row = static_cast<const uint8_t*>(embed_.data) + ids[t] * H * esz;
    if (embed_fd_ >= 0) {
      const size_t n = embed_row_.size();
      const off_t at = static_cast<off_t>(embed_offset_ + static_cast<uint64_t>(ids[t]) * n);
      size_t got = 0;
      while (got < n) {
        const ssize_t r = ::pread(embed_fd_, embed_row_.data() + got, n - got, at + static_cast<off_t>(got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) fail("%s: reading embedding row %d failed (%s)", ckpt_->dir().c_str(), ids[t], r < 0 ? std::strerror(errno) : "end of file");
        got += static_cast<size_t>(r);
      }
      row = embed_row_.data();
    }
    be_->row_to_f32(embed_.type, row, H, s.h + t * H);
  }

  try {
    run_layers(s, T, pos0, state);
  } catch (...) {
    state.poisoned = true;  // layers before the failure have advanced their caches
    throw;
  }
  state.pos = pos0 + T;
  finish(s, T, mode, logits);
}

void DecoderModel::run_layers(const Scratch& s, int64_t T, int64_t pos0, State& state) {
  const int64_t H = spec_.hidden_size;
  ops::Backend& be = *be_;
  for (int i = 0; i < spec_.n_layers; ++i) {
    const Layer& L = layers_[i];
    if (hooks.on_hidden) hooks.on_hidden(i, s.h, T);
    be.rms_norm(s.h, L.in_norm.data(), T, H, spec_.rms_norm_eps, s.xn);
    if (L.attn) {
      L.attn->forward(s.xn, T, pos0, state.attn[i], s.tmp, be, ws_);
    } else {
      L.gdn->forward(s.xn, T, state.gdn[i], s.tmp, be, ws_);
    }
    be.add(s.h, s.tmp, T * H);
    be.rms_norm(s.h, L.post_norm.data(), T, H, spec_.rms_norm_eps, s.xn);
    if (L.moe) {
      L.moe->forward(s.xn, T, i, top_k_, *provider_, hooks.on_route, hooks.on_margin, s.tmp, be, ws_);
    } else {
      L.mlp->forward(s.xn, T, s.tmp, be, ws_);
    }
    be.add(s.h, s.tmp, T * H);
  }
}

void DecoderModel::finish(const Scratch& s, int64_t T, LogitsMode mode, float* logits) {
  const int64_t H = spec_.hidden_size;
  if (mode == LogitsMode::kNone && !hooks.on_hidden) return;
  // Final norm only for the rows whose logits are wanted (all rows when observed).
  const int64_t first = (mode == LogitsMode::kAll || hooks.on_hidden) ? 0 : T - 1;
  be_->rms_norm(s.h + first * H, final_norm_.data(), T - first, H, spec_.rms_norm_eps, s.xn + first * H);
  if (hooks.on_hidden) hooks.on_hidden(spec_.n_layers, s.xn, T);
  if (mode == LogitsMode::kAll) {
    be_->matmul(lm_head_, s.xn, T, logits);
  } else if (mode == LogitsMode::kLast) {
    be_->matmul(lm_head_, s.xn + (T - 1) * H, 1, logits);
  }
}

}  // namespace spool::models
