#include "models/decoder.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "experts/resident.h"
#include "experts/weight_views.h"
#include "models/bind.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace spool::models {

DecoderModel::DecoderModel(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec, ops::ThreadPool* pool)
    : ckpt_(std::move(ckpt)), spec_(std::move(spec)), pool_(pool), top_k_(spec_.moe.top_k) {}

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
  h_.resize(T * H);
  xn_.resize(T * H);
  tmp_.resize(T * H);
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
    ops::row_to_f32(embed_.type, row, H, h_.data() + t * H);
  }

  try {
    run_layers(T, pos0, state);
  } catch (...) {
    state.poisoned = true;  // layers before the failure have advanced their caches
    throw;
  }
  state.pos = pos0 + T;
  finish(T, mode, logits);
}

void DecoderModel::run_layers(int64_t T, int64_t pos0, State& state) {
  const int64_t H = spec_.hidden_size;
  for (int i = 0; i < spec_.n_layers; ++i) {
    Layer& L = layers_[i];
    if (hooks.on_hidden) hooks.on_hidden(i, h_.data(), T);
    ops::rms_norm_rows(h_.data(), L.in_norm.data(), T, H, spec_.rms_norm_eps, xn_.data());
    if (L.attn) {
      L.attn->forward(xn_.data(), T, pos0, state.attn[i], tmp_.data(), pool_);
    } else {
      L.gdn->forward(xn_.data(), T, state.gdn[i], tmp_.data(), pool_);
    }
    for (int64_t j = 0; j < T * H; ++j) h_[j] += tmp_[j];
    ops::rms_norm_rows(h_.data(), L.post_norm.data(), T, H, spec_.rms_norm_eps, xn_.data());
    if (L.moe) {
      L.moe->forward(xn_.data(), T, i, top_k_, *provider_, hooks.on_route, hooks.on_margin, tmp_.data(), pool_);
    } else {
      L.mlp->forward(xn_.data(), T, tmp_.data(), pool_);
    }
    for (int64_t j = 0; j < T * H; ++j) h_[j] += tmp_[j];
  }
}

void DecoderModel::finish(int64_t T, LogitsMode mode, float* logits) {
  const int64_t H = spec_.hidden_size;
  if (mode == LogitsMode::kNone && !hooks.on_hidden) return;
  // Final norm only for the rows whose logits are wanted (all rows when observed).
  const int64_t first = (mode == LogitsMode::kAll || hooks.on_hidden) ? 0 : T - 1;
  ops::rms_norm_rows(h_.data() + first * H, final_norm_.data(), T - first, H, spec_.rms_norm_eps, xn_.data() + first * H);
  if (hooks.on_hidden) hooks.on_hidden(spec_.n_layers, xn_.data(), T);
  if (mode == LogitsMode::kAll) {
    ops::matmul(lm_head_, xn_.data(), T, logits, pool_);
  } else if (mode == LogitsMode::kLast) {
    ops::matmul(lm_head_, xn_.data() + (T - 1) * H, 1, logits, pool_);
  }
}

}  // namespace spool::models
