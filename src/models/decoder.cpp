#include "models/decoder.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "dist/comm.h"
#include "dist/nccl_comm.h"
#include "experts/predictor.h"
#include "experts/resident.h"
#include "experts/weight_views.h"
#include "models/bind.h"
#include "models/moe.h"
#include "ops/lora.h"
#include "ops/ggml_blocks.h"
#include "quant/hadamard.h"
#include "quant/quantize.h"

namespace spool::models {

DecoderModel::DecoderModel(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec,
                           std::shared_ptr<ops::Backend> backend)
    : ckpt_(std::move(ckpt)), spec_(std::move(spec)), be_(std::move(backend)), top_k_(spec_.moe.top_k) {}

namespace {
// Steps of at most this many token rows (decode steps) over several sequences run as two
// pipelined groups when experts stream from disk (DecoderModel::run_pipelined).
constexpr int64_t kPipelineMaxRows = 64;
}  // namespace

void DecoderModel::take_layers(ops::Workspace& m, const ModelSpec& spec, int64_t T) {
  // Unbound layers of each kind: take_scratch reads only the spec.
  for (int i = 0; i < spec.n_layers; ++i) {
    {
      ops::WorkspaceScope scope(m);
      make_token_mixer(spec, i)->take_scratch(m, spec, i, T);
    }
    ops::WorkspaceScope scope(m);
    make_ffn(spec, i)->take_scratch(m, spec, T);
  }
}

uint64_t DecoderModel::group_arena_bytes(const ModelSpec& spec) {
  ops::Workspace m;
  take_layers(m, spec, kPipelineMaxRows);
  return m.high_water();
}

namespace {
// Bytes of an MTP step of T rows (DecoderModel::mtp_forward): rows, the [T, 2H] fc input, the
// logits, the largest MTP layer scratch. 0 without MTP layers.
uint64_t mtp_arena_bytes(const ModelSpec& spec, int64_t T) {
  if (spec.mtp_layers == 0) return 0;
  const ModelSpec full = mtp_spec(spec);
  const int64_t H = spec.hidden_size;
  ops::Workspace t;
  DecoderModel::Scratch::take(t, H, T);
  t.floats(T * 2 * H);
  t.floats(spec.vocab_size);  // one row of logits (kAll runs row by row)
  for (int i = spec.n_layers; i < full.n_layers; ++i) {
    {
      ops::WorkspaceScope a(t);
      make_token_mixer(full, i)->take_scratch(t, full, i, T);
    }
    ops::WorkspaceScope b(t);
    make_ffn(full, i)->take_scratch(t, full, T);
  }
  return t.high_water();
}
}  // namespace

uint64_t DecoderModel::arena_bytes(const ModelSpec& spec, int64_t T, int max_seqs) {
  // The same take() calls, in the same nesting, as forward_batch() makes (measuring workspace);
  // an MTP step (mtp_forward) never nests in one: the larger of the two.
  ops::Workspace m;
  const int64_t H = spec.hidden_size;
  Scratch::take(m, H, T);
  if (max_seqs > 1) {
    ops::WorkspaceScope scope(m);
    HeadScratch::take(m, H, spec.vocab_size, max_seqs);
  }
  take_layers(m, spec, T);
  const uint64_t one = std::max(m.high_water(), mtp_arena_bytes(spec, T));
  if (max_seqs < 2) return one;
  // A pipelined step (run_pipelined): rows, the second group's arena, the first group's layers.
  ops::Workspace p;
  Scratch::take(p, H, std::min(T, kPipelineMaxRows));
  p.take(group_arena_bytes(spec));
  take_layers(p, spec, std::min(T, kPipelineMaxRows));
  return std::max(one, p.high_water());
}

void DecoderModel::reserve_workspace(int64_t max_tokens, int max_seqs) {
  max_tokens = std::max<int64_t>(max_tokens, 1);
  max_seqs = std::max(max_seqs, 1);
  if (max_tokens == ws_tokens_ && max_seqs == ws_seqs_) return;
  ws_ = ops::Workspace();  // the old arena goes back before the new one is mapped
  ws_tokens_ = ws_seqs_ = 0;  // if mapping fails, the next forward tries again (never runs on no arena)
  ws_ = ops::Workspace(arena_bytes(spec_, max_tokens, max_seqs), be_->device());
  ws_tokens_ = max_tokens;
  ws_seqs_ = max_seqs;
}

void DecoderModel::bind(GdnLayout gdn_layout) {
  const io::Checkpoint& ck = *ckpt_;
  const int64_t H = spec_.hidden_size, V = spec_.vocab_size;
  // The embedding: float (F32/F16/BF16), a GGUF block type, or spool-quantized
  // (embed_tokens.qweight/.scales/.codebook(/.signs): spool convert --embed-bits).
  embed_ = bind_matrix(ck, "embed_tokens.weight", V, H);
  const bool tied = spec_.tie_word_embeddings && ck.find("lm_head.weight") == nullptr && ck.find("lm_head.qweight") == nullptr;
  if (tied) {
    lm_head_ = embed_;  // (a quantized table: the output projection runs quant_matmul over it)
  } else {
    lm_head_ = bind_matrix(ck, "lm_head.weight", V, H);
  }
  final_norm_ = bind_norm(ck, "norm.weight", H, spec_.norm_one_plus);
  if (!tied && embed_.type == ops::WType::kQuant) {
    const io::TensorRef& qt = ck.tensor("embed_tokens.qweight");
    const io::TensorRef& st = ck.tensor("embed_tokens.scales");
    const int qfd = ck.shards()[qt.shard].fd(), sfd = ck.shards()[st.shard].fd();
    if (qfd >= 0 && sfd >= 0) {
      embed_fd_ = qfd;
      embed_offset_ = qt.offset;
      embed_row_.resize(static_cast<size_t>(embed_.quant.row_bytes()));
      embed_scales_fd_ = sfd;
      embed_scales_offset_ = st.offset;
      embed_scales_row_.resize(static_cast<size_t>(embed_.quant.groups_per_row()) * 2);
    }
  } else if (!tied) {
    const io::TensorRef& et = ck.tensor("embed_tokens.weight");
    const int fd = ck.shards()[et.shard].fd();
    if (fd >= 0) {
      embed_fd_ = fd;
      embed_offset_ = et.offset;
      embed_row_.resize(embed_.type == ops::WType::kGgml ? ggml_row_bytes(embed_.ggml, static_cast<uint64_t>(H))
                                                        : static_cast<size_t>(H) * ops::wtype_size(embed_.type));
    }
  }
  full_spec_ = mtp_spec(spec_);
  const int n_all = full_spec_.n_layers;  // the main stack, then the MTP layers
  layers_.resize(n_all);
  std::vector<bool> moe_layers(n_all, false);
  for (int i = 0; i < n_all; ++i) {
    Layer& L = layers_[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    L.in_norm = bind_norm(ck, p + "input_layernorm.weight", H, spec_.norm_one_plus);
    L.post_norm = bind_norm(ck, p + "post_attention_layernorm.weight", H, spec_.norm_one_plus);
    if (spec_.sandwich_norms) {
      L.pre_ffn = bind_norm(ck, p + "pre_feedforward_layernorm.weight", H, spec_.norm_one_plus);
      L.post_ffn = bind_norm(ck, p + "post_feedforward_layernorm.weight", H, spec_.norm_one_plus);
    }
    if (spec_.residual_scale) L.scalar = bind_f32(ck, p + "layer_scalar", {1})[0];
    L.mixer = make_token_mixer(full_spec_, i, gdn_layout);
    L.mixer->bind_layer(ck, full_spec_, i);
    L.ffn = make_ffn(full_spec_, i);
    L.ffn->bind_layer(ck, full_spec_, i);
    moe_layers[i] = L.ffn->routed();
  }
  if (spec_.mtp_layers > 0) bind_mtp(gdn_layout);
  // Everything dense goes where the backend reads it, once (a no-op on host backends: the CPU
  // path keeps reading the mapping and the host vectors).
  ops::Backend& be = *be_;
  // (before lm_head_ moves to the device; quantized views have no `data`: compare their codes)
  const bool mtp_shares_head = mtp_head_.data == lm_head_.data && mtp_head_.quant.qweight == lm_head_.quant.qweight;
  lm_head_ = be.upload(lm_head_);  // (embeddings stay on the host: read by row)
  final_norm_p_ = be.upload_floats(final_norm_);
  if (spec_.mtp_layers > 0) {
    mtp_fc_ = be.upload(mtp_fc_);
    mtp_head_ = mtp_shares_head ? lm_head_ : be.upload(mtp_head_);
    mtp_enorm_p_ = be.upload_floats(mtp_enorm_);
    mtp_hnorm_p_ = be.upload_floats(mtp_hnorm_);
    mtp_norm_p_ = be.upload_floats(mtp_norm_);
  }
  for (Layer& L : layers_) {
    L.in_norm_p = be.upload_floats(L.in_norm);
    L.post_norm_p = be.upload_floats(L.post_norm);
    auto up = [&](const std::vector<float>& v) { return v.empty() ? nullptr : be.upload_floats(v); };
    L.pre_ffn_p = up(L.pre_ffn);
    L.post_ffn_p = up(L.post_ffn);
    L.mixer->place(be);
    L.ffn->place(be);
  }
  resident_ = std::make_shared<experts::ResidentExperts>(ckpt_, moe_layers, spec_.moe.n_experts, static_cast<int>(H),
                                                         spec_.moe.intermediate);
  provider_ = resident_;
}

void DecoderModel::bind_mtp(GdnLayout) {
  const io::Checkpoint& ck = *ckpt_;
  const int64_t H = spec_.hidden_size, V = spec_.vocab_size;
  mtp_stacked_ = ck.find("mtp.fc.weight") != nullptr || ck.find("mtp.fc.qweight") != nullptr;
  if (mtp_stacked_) {  // Qwen3.5 / Qwen3-Next (float, or spool-quantized: mtp.fc.qweight)
    mtp_fc_ = bind_matrix(ck, "mtp.fc.weight", H, 2 * H);
    mtp_enorm_ = bind_norm(ck, "mtp.pre_fc_norm_embedding.weight", H, spec_.norm_one_plus);
    mtp_hnorm_ = bind_norm(ck, "mtp.pre_fc_norm_hidden.weight", H, spec_.norm_one_plus);
    mtp_norm_ = bind_norm(ck, "mtp.norm.weight", H, spec_.norm_one_plus);
    mtp_head_ = lm_head_;
    return;
  }
  // DeepSeek-V3 / GLM-4.5 nextn layer (the first one drafts; HF names under layers.{n_layers}.).
  const std::string p = "layers." + std::to_string(spec_.n_layers) + ".";
  mtp_fc_ = bind_matrix(ck, p + "eh_proj.weight", H, 2 * H);
  mtp_enorm_ = bind_norm(ck, p + "enorm.weight", H, spec_.norm_one_plus);
  mtp_hnorm_ = bind_norm(ck, p + "hnorm.weight", H, spec_.norm_one_plus);
  mtp_norm_ = bind_norm(ck, p + "shared_head.norm.weight", H, spec_.norm_one_plus);
  mtp_head_ = ck.find(p + "shared_head.head.weight") != nullptr || ck.find(p + "shared_head.head.qweight") != nullptr
                  ? bind_matrix(ck, p + "shared_head.head.weight", V, H)
                  : lm_head_;
  // DeepSeek-V3 stores shared_head.head as a copy of lm_head (Megatron maps both names to one
  // output layer): when 16 rows spread over the matrix are byte-identical, the head reads
  // lm_head and the copy is never touched (~1.9 GB on V3).
  if (mtp_head_.data != lm_head_.data && mtp_head_.type == lm_head_.type && mtp_head_.type != ops::WType::kQuant &&
      mtp_head_.ggml == lm_head_.ggml && mtp_head_.rows == lm_head_.rows && mtp_head_.cols == lm_head_.cols &&
      mtp_head_.data != nullptr && lm_head_.data != nullptr) {
    const uint64_t row = mtp_head_.nbytes() / static_cast<uint64_t>(mtp_head_.rows);
    bool same = true;
    for (int i = 0; i < 16 && same; ++i) {
      const uint64_t r = static_cast<uint64_t>(mtp_head_.rows - 1) * static_cast<uint64_t>(i) / 15;
      same = std::memcmp(static_cast<const uint8_t*>(mtp_head_.data) + r * row, static_cast<const uint8_t*>(lm_head_.data) + r * row,
                         row) == 0;
    }
    if (same) mtp_head_ = lm_head_;
  }
}

State DecoderModel::new_state() const {
  State st(full_spec_, kv_type_);
  if (be_->device() != ops::Device::kCpu) st.place(be_->device());
  return st;
}

void DecoderModel::observe_hidden(int index, const float* hidden, int64_t T) {
  if (be_->device() == ops::Device::kCpu) return hooks.on_hidden(index, hidden, T);
  std::vector<float> h(static_cast<size_t>(T * spec_.hidden_size));
  be_->to_host(hidden, T * spec_.hidden_size, h.data());
  hooks.on_hidden(index, h.data(), T);
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
  const SeqStep one{ids, &state, mode, logits};
  forward_batch(std::span<const SeqStep>(&one, 1));
}

void DecoderModel::read_embed_row(int fd, uint64_t offset, int32_t id, std::vector<uint8_t>& bytes) const {
  const size_t n = bytes.size();
  const off_t at = static_cast<off_t>(offset + static_cast<uint64_t>(id) * n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, bytes.data() + got, n - got, at + static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) fail("%s: reading embedding row %d failed (%s)", ckpt_->dir().c_str(), id, r < 0 ? std::strerror(errno) : "end of file");
    got += static_cast<size_t>(r);
  }
}

void DecoderModel::embed(std::span<const int32_t> ids, float* h) {
  const int64_t H = spec_.hidden_size;
  // A ggml block-typed table (GGUF) or a spool-quantized one is dequantized row by row on the
  // host, then handed to the backend as an F32 row; float tables go to the backend as stored.
  const bool blocks = embed_.type == ops::WType::kGgml, quant = embed_.type == ops::WType::kQuant;
  const uint64_t row_bytes = blocks  ? ggml_row_bytes(embed_.ggml, static_cast<uint64_t>(H))
                             : quant ? 0
                                     : static_cast<uint64_t>(H) * ops::wtype_size(embed_.type);
  std::vector<float> deq(blocks || quant ? static_cast<size_t>(H) : 0);
  for (size_t t = 0; t < ids.size(); ++t) {
    if (quant) {
      // Row id of the stored (rotated) matrix: codebook[code] * fp16 group scale, then back to
      // the original basis (the inverse Hadamard transform, signs): docs/quant-format.md.
      ops::QuantView q = embed_.quant;
      int64_t r = ids[t];
      if (embed_fd_ >= 0) {  // one row: its codes and scales read from the file
        read_embed_row(embed_fd_, embed_offset_, ids[t], embed_row_);
        read_embed_row(embed_scales_fd_, embed_scales_offset_, ids[t], embed_scales_row_);
        q.rows = 1;
        q.qweight = embed_row_.data();
        q.scales = reinterpret_cast<const uint16_t*>(embed_scales_row_.data());
        r = 0;
      }
      quant::dequantize_row(q, r, deq.data());
      if (q.signs != nullptr) quant::unrotate(q.signs, deq.data(), H, deq.data());
      be_->row_to_f32(ops::WType::kF32, deq.data(), H, h + t * H);
      continue;
    }
    const uint8_t* row = static_cast<const uint8_t*>(embed_.data) + static_cast<uint64_t>(ids[t]) * row_bytes;
    if (embed_fd_ >= 0) {
      read_embed_row(embed_fd_, embed_offset_, ids[t], embed_row_);
      row = embed_row_.data();
    }
    if (blocks) {
      ops::ggml_dequantize_row(embed_.ggml, row, H, deq.data());
      be_->row_to_f32(ops::WType::kF32, deq.data(), H, h + t * H);
    } else {
      be_->row_to_f32(embed_.type, row, H, h + t * H);
    }
  }
  if (spec_.embedding_scale != 1.0f) be_->scale(h, static_cast<int64_t>(ids.size()) * H, spec_.embedding_scale);
}

void DecoderModel::set_lora_rows(const std::vector<std::pair<int64_t, std::span<const float>>>& runs) {
  lora_n_ = 0;
  lora_rows_.clear();
  bool any = false;
  for (const auto& r : runs) any = any || !r.second.empty();
  if (!any) return;
  const size_t nA = lora ? lora->size() : 0;
  for (const auto& r : runs)
    if (!r.second.empty() && r.second.size() != nA)
      fail("forward: a sequence gives %zu LoRA adapter scales, the model has %zu adapters", r.second.size(), nA);
  const std::vector<float> defaults = lora->scales();
  lora_n_ = static_cast<int>(nA);
  for (const auto& [count, scales] : runs) {
    const std::span<const float> row = scales.empty() ? std::span<const float>(defaults) : scales;
    for (int64_t t = 0; t < count; ++t) lora_rows_.insert(lora_rows_.end(), row.begin(), row.end());
  }
}

void DecoderModel::forward_batch(std::span<const SeqStep> seqs) {
  const int64_t H = spec_.hidden_size, V = spec_.vocab_size;
  // Validate everything before any state changes.
  std::vector<Part> parts;
  int64_t N = 0;
  for (const SeqStep& q : seqs) {
    if (q.state == nullptr) fail("forward_batch: a sequence has no state");
    if (q.state->poisoned) fail("this sequence's state is incomplete after an earlier error; reset it before reuse");
    for (int32_t id : q.ids)
      if (id < 0 || id >= V) fail("token id %d is outside the vocabulary (0..%lld)", id, (long long)(V - 1));
    for (const Part& p : parts)
      if (p.state == q.state) fail("forward_batch: the same state appears twice in one step");
    if (q.ids.empty()) continue;
    parts.push_back({N, static_cast<int64_t>(q.ids.size()), q.state->pos, q.state});
    N += static_cast<int64_t>(q.ids.size());
  }
  if (N == 0) return;
  {  // per-row LoRA scales (SeqStep::lora), rows in the order of parts
    std::vector<std::pair<int64_t, std::span<const float>>> runs;
    for (const SeqStep& q : seqs)
      if (!q.ids.empty()) runs.emplace_back(static_cast<int64_t>(q.ids.size()), q.lora);
    set_lora_rows(runs);
  }
  for (const Part& p : parts) {
    p.state->reserve(p.pos0 + p.T);
    p.state->begin_step(p.pos0, p.T);
  }
  const int n_seqs = static_cast<int>(parts.size());
  if (N > ws_tokens_ || n_seqs > ws_seqs_) reserve_workspace(std::max(N, ws_tokens_), std::max(n_seqs, ws_seqs_));
  ops::WorkspaceScope scope(ws_);
  const Scratch s = Scratch::take(ws_, H, N);
  for (size_t i = 0, j = 0; i < seqs.size(); ++i) {
    if (seqs[i].ids.empty()) continue;
    embed(seqs[i].ids, s.h + parts[j++].row0 * H);
  }
  try {
    // Several sequences whose experts stream from disk: two groups, each group's expert reads
    // hidden behind the other's compute. Hooks see one row numbering: they run unpipelined
    // (but an on_route that takes any order, ForwardHooks::on_route_any_order).
    // (Not with expert parallelism: the ranks' collectives must come in one order from one thread.)
    const bool pipelined = n_seqs >= 2 && N <= kPipelineMaxRows && provider_ != resident_ && !ep_.active() &&
                           be_->device() == ops::Device::kCpu && !hooks.on_hidden && !hooks.on_ffn_input && (!hooks.on_route || hooks.on_route_any_order) &&
                           !hooks.on_margin;
    if (pipelined) {
      run_pipelined(s, parts);
    } else {
      run_layers(s, N, parts, ws_, {});
    }
  } catch (...) {
    for (const Part& p : parts) p.state->poisoned = true;  // layers before the failure have advanced their caches
    throw;
  }
  for (const Part& p : parts) p.state->pos = p.pos0 + p.T;
  finish(s, N, seqs, parts);
}

void DecoderModel::run_pipelined(const Scratch& s, std::span<const Part> parts) {
  // Group 0 = the first half of the sequences, group 1 the rest; each runs every layer over
  // its own rows (its own states, its own arena), on its own thread. One baton: only the
  // holder computes. A group hands it over where its MoE layer has started reading its
  // experts (MoeBlock::forward's `between`), so group 1's compute runs while group 0's reads
  // are in flight and vice versa. Each sequence's arithmetic is what run_layers() does for
  // it; only the order of the two groups' work interleaves.
  const int64_t H = spec_.hidden_size;
  const size_t m = parts.size() / 2;
  std::vector<Part> g[2] = {std::vector<Part>(parts.begin(), parts.begin() + m),
                            std::vector<Part>(parts.begin() + m, parts.end())};
  const int64_t r1 = g[1].front().row0;
  for (Part& p : g[1]) p.row0 -= r1;
  const int64_t rows[2] = {r1, g[1].back().row0 + g[1].back().T};
  const Scratch sg[2] = {s, Scratch{s.h + r1 * H, s.xn + r1 * H, s.tmp + r1 * H}};
  ops::WorkspaceScope scope(ws_);
  if (group_arena_ == 0) group_arena_ = group_arena_bytes(spec_);  // measured once per model
  const size_t sub = group_arena_;
  ops::Workspace ws1 = ops::Workspace::over(ws_.take(sub), sub);
  ops::Workspace* ws[2] = {&ws_, &ws1};

  std::mutex mu;
  std::condition_variable cv;
  int turn = 0;
  bool done[2] = {false, false};
  std::exception_ptr err[2];
  auto hand_over = [&](int me) {  // give the baton to the other group, wait for it back
    std::unique_lock<std::mutex> lk(mu);
    if (done[1 - me]) return;
    turn = 1 - me;
    cv.notify_all();
    cv.wait(lk, [&] { return turn == me || done[1 - me]; });
  };
  auto run = [&](int me) {
    {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return turn == me || done[1 - me]; });
    }
    try {
      run_layers(sg[me], rows[me], g[me], *ws[me], [&, me] { hand_over(me); }, me == 0 ? 0 : r1);
    } catch (...) {
      err[me] = std::current_exception();
    }
    std::lock_guard<std::mutex> lk(mu);
    done[me] = true;
    turn = 1 - me;
    cv.notify_all();
  };
  std::thread second(run, 1);
  run(0);
  second.join();
  for (const std::exception_ptr& e : err)
    if (e) std::rethrow_exception(e);
}

void DecoderModel::set_comm(dist::Comm* comm) {
  dist::ExpertParallel ep;
  ep.comm = comm;
  set_expert_parallel(ep);
}

void DecoderModel::set_expert_parallel(const dist::ExpertParallel& ep) {
  if (ep.active()) {
    const int R = ep.comm->size();
    const bool gpu = be_->device() != ops::Device::kCpu;
    if (gpu && !ep.comm->device_memory())
      fail("expert parallelism over %d ranks on %s needs the NCCL communicator (%s): the %s communicator moves host memory", R,
           ops::device_name(be_->device()), dist::have_nccl() ? "--comm nccl" : "this build has none: build with CUDA and NCCL found",
           ep.comm->name());
    if (!gpu && ep.comm->device_memory())
      fail("expert parallelism over %d ranks on the CPU backend needs a host-memory communicator (--comm mpi), not %s", R, ep.comm->name());
    if (gpu && ep.lead)
      fail("serving over %d ranks (rank 0 leading, the others following) runs on the CPU backend (--device cpu); on GPUs expert "
           "parallelism runs generate, bench and perplexity in lockstep",
           R);
    if (spec_.moe.n_experts < R) fail("expert parallelism: %d routed experts cannot be split over %d ranks", spec_.moe.n_experts, R);
    if (ep.owners != nullptr && (ep.owners->n_experts() != spec_.moe.n_experts || ep.owners->ranks() != R))
      fail("expert parallelism: the expert owners map %d experts over %d ranks; the model has %d experts, the communicator %d ranks",
           ep.owners->n_experts(), ep.owners->ranks(), spec_.moe.n_experts, R);
  }
  ep_ = ep;
}

int DecoderModel::serve_experts() {
  if (!ep_.active() || !ep_.lead || ep_.comm->rank() == 0) fail("serve_experts: this rank does not follow a leading rank 0");
  dist::Comm& comm = *ep_.comm;
  const int64_t H = spec_.hidden_size;
  std::vector<float> x, lora;
  std::vector<int> ids;
  for (;;) {
    std::array<int64_t, dist::ExpertStep::kWords> w{};
    comm.broadcast_idle(w.data(), sizeof(w), 0);
    const dist::ExpertStep st = dist::ExpertStep::decode(w);
    if (st.op == dist::StepOp::kExit) return static_cast<int>(st.code);
    if (st.layer >= static_cast<int64_t>(layers_.size()) || layers_[static_cast<size_t>(st.layer)].ffn->routed_block() == nullptr || st.hidden != H)
      fail("expert step: layer %lld with rows of %lld floats, but this model's layer %lld is no MoE layer of hidden size %lld (do the ranks "
           "run the same model?)",
           (long long)st.layer, (long long)st.hidden, (long long)st.layer, (long long)H);
    if (st.rows > ws_tokens_) reserve_workspace(st.rows, std::max(ws_seqs_, 1));  // (as forward_batch grows it)
    x.resize(static_cast<size_t>(st.rows * H));
    ids.resize(static_cast<size_t>(st.rows * st.top_k));
    lora.resize(static_cast<size_t>(st.rows * st.lora_n));
    comm.broadcast(x.data(), x.size() * sizeof(float), 0);
    comm.broadcast(ids.data(), ids.size() * sizeof(int), 0);
    if (st.lora_n > 0) comm.broadcast(lora.data(), lora.size() * sizeof(float), 0);
    try {
      layers_[static_cast<size_t>(st.layer)].ffn->routed_block()->serve_step(x.data(), ids.data(), st.rows, static_cast<int>(st.top_k),
                                                                    st.lora_n > 0 ? lora.data() : nullptr, static_cast<int>(st.lora_n),
                                                                    static_cast<int>(st.layer), *provider_, *be_, ws_, ep_);
    } catch (const Error& e) {  // (after the gather: the ranks are still in step)
      log_warn("expert parallelism: rank %d, MoE layer %lld: %s", comm.rank(), (long long)st.layer, e.what());
    }
  }
}

void DecoderModel::run_layers(const Scratch& s, int64_t N, std::span<const Part> parts, ops::Workspace& ws,
                              const std::function<void()>& between, int64_t row0) {
  // This thread's rows of the step's LoRA scales (ops/lora.h): rows [row0, row0 + N).
  const ops::LoraRowScales lrows{lora_rows_.data() + row0 * lora_n_, N, lora_n_};
  const ops::LoraRowsScope lora_scope(lora_n_ > 0 ? &lrows : nullptr);
  FfnStep step;
  step.route_override = &hooks.route_override;
  step.row0 = row0;
  step.top_k = top_k_;
  step.provider = provider_.get();
  step.on_route = &hooks.on_route;
  step.on_margin = &hooks.on_margin;
  step.between = &between;
  step.ep = &ep_;
  bool pending = false;
  for (int i = 0; i < spec_.n_layers; ++i) {
    if (hooks.on_hidden) {  // (observers see the whole residual stream)
      if (pending) be_->add(s.h, s.tmp, N * spec_.hidden_size);
      pending = false;
      observe_hidden(i, s.h, N);
    }
    pending = run_layer(i, s, N, parts, ws, step, pending);
  }
  if (pending) be_->add(s.h, s.tmp, N * spec_.hidden_size);
}

const float* DecoderModel::ffn_norm(int j) const { return spec_.sandwich_norms ? layers_[j].pre_ffn_p : layers_[j].post_norm_p; }

int DecoderModel::predictor_source(int layer) const {
  if (layer <= 0 || layer >= spec_.n_layers || !layers_[layer].ffn->routed()) return -1;
  const MoeBlock* moe = layers_[layer].ffn->moe();
  if (moe == nullptr || !moe->routes_normed_input()) return -1;
  int i = layer - 1;
  while (i >= 0 && !layers_[i].ffn->routed()) --i;
  return i;
}

void DecoderModel::router_as_linear(int layer, std::vector<float>* w, std::vector<float>* b) {
  if (predictor_source(layer) < 0) fail("layer %d has no router a predictor can start from", layer);
  if (be_->device() != ops::Device::kCpu) fail("router_as_linear: CPU backends only");
  // The router of the normed input is linear in u = h / rms(h): logits = W_r (g . u) + b_r.
  // Its columns come out of the model's own ops: row i = sqrt(H) e_i has unit RMS (up to eps),
  // so rms_norm gives g_i sqrt(H) / sqrt(1 + eps) e_i.
  const int64_t H = spec_.hidden_size, E = spec_.moe.n_experts;
  const float eps = spec_.rms_norm_eps;
  const MoeBlock* moe = layers_[layer].ffn->moe();
  // The bias: the logits of a zero row (no norm: a zero row stays zero).
  std::vector<float> zero(static_cast<size_t>(H), 0.0f);
  b->assign(static_cast<size_t>(E), 0.0f);
  moe->router_logits(zero.data(), 1, *be_, b->data());
  w->assign(static_cast<size_t>(E * H), 0.0f);
  const double f = std::sqrt(1.0 + eps) / std::sqrt(static_cast<double>(H));
  const int64_t C = std::min<int64_t>(H, 256);  // columns per pass (bounded memory at any hidden size)
  std::vector<float> x(static_cast<size_t>(C * H)), xn(x.size()), logits(static_cast<size_t>(C * E));
  for (int64_t c0 = 0; c0 < H; c0 += C) {
    const int64_t n = std::min(C, H - c0);
    std::fill(x.begin(), x.end(), 0.0f);
    for (int64_t c = 0; c < n; ++c) x[static_cast<size_t>(c * H + c0 + c)] = std::sqrt(static_cast<float>(H));
    be_->rms_norm(x.data(), ffn_norm(layer), n, H, eps, xn.data());
    moe->router_logits(xn.data(), n, *be_, logits.data());
    for (int64_t c = 0; c < n; ++c)
      for (int64_t e = 0; e < E; ++e)
        (*w)[static_cast<size_t>(e * H + c0 + c)] = static_cast<float>((logits[static_cast<size_t>(c * E + e)] - (*b)[e]) * f);
  }
}

void DecoderModel::set_expert_predictor(std::shared_ptr<const experts::ExpertPredictor> p, bool route_by) {
  if (p == nullptr) {
    if (route_by) fail("--route-by-predictor needs a predictor (--predictor FILE)");
    predictor_.reset();
    route_by_predictor_ = false;
    return;
  }
  p->check_matches("the expert predictor", spec_.model_type, spec_.n_layers, static_cast<int>(spec_.hidden_size), spec_.moe.n_experts);
  if (be_->device() != ops::Device::kCpu) fail("an expert predictor runs on CPU backends only (this model runs on the GPU)");
  for (const experts::PredictorHead& h : p->heads()) {
    if (predictor_source(h.target_layer) != h.source_layer)
      fail("the expert predictor's head for layer %d reads layer %d; this model's MoE layer before it is %d", h.target_layer,
           h.source_layer, predictor_source(h.target_layer));
    if (route_by && !layers_[h.target_layer].ffn->moe()->can_route_within())
      fail("--route-by-predictor: layer %d's router cannot be restricted to predicted experts (a selection bias, as DeepSeek-V3's "
           "e_score_correction_bias, or group-limited selection)",
           h.target_layer);
  }
  predictor_ = std::move(p);
  route_by_predictor_ = route_by;
}

void DecoderModel::hint_owned(int layer, std::vector<int> ids) {
  if (ep_.active())  // (this rank reads its own experts only)
    std::erase_if(ids, [&](int e) { return ep_.owner(layer, e, spec_.moe.n_experts) != ep_.comm->rank(); });
  if (!ids.empty()) provider_->hint(layer, ids);
}

std::function<void()> DecoderModel::next_layer_hint(int i, const Scratch& s, int64_t N, FfnStep& step) {
  // Next-layer prefetch: the next MoE layer's guess from this residual stream, run once this
  // layer's own reads are in flight (host memory: CPU backends only). The guess is the trained
  // head's where the predictor has one, else the next router on its FFN norm.
  ops::Backend& be = *be_;
  const Layer& L = layers_[i];
  if (be.device() != ops::Device::kCpu || !L.ffn->routed() || i + 1 >= spec_.n_layers) return {};
  int j = i + 1;
  while (j < spec_.n_layers && !layers_[j].ffn->routed()) ++j;
  if (j >= spec_.n_layers) return {};
  const experts::PredictorHead* head = predictor_ != nullptr ? predictor_->head(j) : nullptr;
  if (head != nullptr && head->source_layer != i) head = nullptr;
  const bool route_by = route_by_predictor_ && head != nullptr;
  if (next_prefetch_ <= 0 && !route_by) return {};
  if (hooks.guess_override && !route_by) {  // the guesses that go with a forced routing
    const int m = next_prefetch_, E = spec_.moe.n_experts;
    const int64_t row0 = step.row0;
    return [this, j, N, m, E, row0] {
      std::vector<int> ranked(static_cast<size_t>(N * m), -1);
      for (int64_t t = 0; t < N; ++t) hooks.guess_override(j, row0 + t, std::span<int>(ranked.data() + t * m, static_cast<size_t>(m)));
      const std::vector<int> ids = best_first_union(ranked, N, m, E);
      hint_owned(j, ids);
    };
  }
  const int K = top_k_;
  // Routing by the head: its top-k are the only experts the layer can take, so they are the guesses.
  const int m = route_by ? K : next_prefetch_;
  const int64_t H = spec_.hidden_size;
  if (route_by) {  // the next layer routes among the head's top-k: known now, exactly what it will read
    RouteWithin& w = step.within_next;
    w.layer = j;
    w.k = K;
    w.ids.resize(static_cast<size_t>(N * K));
    predictor_->top_m(*head, s.h, N, K, w.ids.data());
  }
  const MoeBlock* next = layers_[j].ffn->moe();
  if (next == nullptr && head == nullptr) return {};
  const float* norm = ffn_norm(j);
  const float eps = spec_.rms_norm_eps;
  return [this, head, next, norm, j, N, H, eps, m, route_by, &s, &be, &step] {
    std::vector<int> ids;  // best first
    if (route_by) {
      ids = best_first_union(step.within_next.ids, N, m, spec_.moe.n_experts);
    } else if (head != nullptr) {
      std::vector<int> ranked(static_cast<size_t>(N * m));
      predictor_->top_m(*head, s.h, N, m, ranked.data());
      ids = best_first_union(ranked, N, m, spec_.moe.n_experts);
    } else {
      std::vector<float> xn(static_cast<size_t>(N * H));
      be.rms_norm(s.h, norm, N, H, eps, xn.data());
      ids = next->predict(xn.data(), N, m, be);
    }
    hint_owned(j, std::move(ids));
  };
}

bool DecoderModel::run_layer(int i, const Scratch& s, int64_t N, std::span<const Part> parts, ops::Workspace& ws,
                             FfnStep& step, bool pending) {
  const int64_t H = spec_.hidden_size;
  ops::Backend& be = *be_;
  const Layer& L = layers_[i];
  if (pending) {
    be.add_rms_norm(s.h, s.tmp, L.in_norm_p, N, H, spec_.rms_norm_eps, s.xn);
  } else {
    be.rms_norm(s.h, L.in_norm_p, N, H, spec_.rms_norm_eps, s.xn);
  }
  // Token mixer: projections over every row of the step, RoPE / cache / attention / conv /
  // recurrence per sequence on its own state.
  L.mixer->forward_rows(s.xn, parts, N, s.tmp, be, ws);
  const float eps = spec_.rms_norm_eps;
  if (spec_.sandwich_norms) be.rms_norm(s.tmp, L.post_norm_p, N, H, eps, s.tmp);  // on the branch
  be.add_rms_norm(s.h, s.tmp, spec_.sandwich_norms ? L.pre_ffn_p : L.post_norm_p, N, H, eps, s.xn);
  step.layer = i;
  if (hooks.on_ffn_input) {
    if (be.device() == ops::Device::kCpu) {
      hooks.on_ffn_input(i, s.h, N);
    } else {
      std::vector<float> h(static_cast<size_t>(N * H));
      be.to_host(s.h, N * H, h.data());
      hooks.on_ffn_input(i, h.data(), N);
    }
  }
  if (step.within_next.layer == i) std::swap(step.within, step.within_next);
  const std::function<void()> hint = next_layer_hint(i, s, N, step);
  step.after_prepare = &hint;
  L.ffn->forward(s.xn, s.h, N, step, s.tmp, be, ws);
  step.after_prepare = nullptr;
  if (spec_.sandwich_norms) be.rms_norm(s.tmp, L.post_ffn_p, N, H, eps, s.tmp);
  if (!spec_.residual_scale) return true;  // s.h += s.tmp: in the next norm
  be.add(s.h, s.tmp, N * H);
  be.scale(s.h, N * H, L.scalar);  // the whole residual stream
  return false;
}

void DecoderModel::mtp_forward(const MtpStep& q) {
  const int64_t H = spec_.hidden_size, V = spec_.vocab_size;
  if (spec_.mtp_layers == 0) Model::mtp_forward(q);
  if (q.state == nullptr) fail("mtp_forward: no state");
  if (q.state->poisoned) fail("this sequence's state is incomplete after an earlier error; reset it before reuse");
  const int64_t T = static_cast<int64_t>(q.ids.size());
  if (T == 0) return;
  if (q.hidden == nullptr) fail("mtp_forward: no hidden states given");
  if (q.pos0 < 0) fail("mtp_forward: negative position %lld", (long long)q.pos0);
  for (int32_t id : q.ids)
    if (id < 0 || id >= V) fail("token id %d is outside the vocabulary (0..%lld)", id, (long long)(V - 1));
  q.state->reserve(q.pos0 + T);
  if (T > ws_tokens_) reserve_workspace(T, std::max(ws_seqs_, 1));
  set_lora_rows({{T, q.lora}});  // (every row the sequence's; the head's rows are a prefix of them)
  const ops::LoraRowScales lrows{lora_rows_.data(), T, lora_n_};
  const ops::LoraRowsScope lora_scope(lora_n_ > 0 ? &lrows : nullptr);
  ops::Backend& be = *be_;
  const float eps = spec_.rms_norm_eps;
  ops::WorkspaceScope scope(ws_);
  const Scratch s = Scratch::take(ws_, H, T);
  float* cat = ws_.floats(T * 2 * H);  // [T, 2H]: normed embedding | normed hidden
  float* logits = ws_.floats(V);  // one row at a time
  embed(q.ids, s.tmp);
  be.rms_norm(s.tmp, mtp_enorm_p_, T, H, eps, s.xn);
  be.copy_2d(cat, 2 * H, s.xn, H, T, H);
  be.row_to_f32(ops::WType::kF32, q.hidden, T * H, s.tmp);
  be.rms_norm(s.tmp, mtp_hnorm_p_, T, H, eps, s.xn);
  be.copy_2d(cat + H, 2 * H, s.xn, H, T, H);
  be.matmul(mtp_fc_, cat, T, s.h);
  const Part part{0, T, q.pos0, q.state};
  const RouteObserver no_route;
  const MarginObserver no_margin;
  const std::function<void()> no_between;
  FfnStep step;
  step.top_k = top_k_;
  step.provider = provider_.get();
  step.on_route = &no_route;
  step.on_margin = &no_margin;
  step.between = &no_between;
  step.ep = &ep_;
  try {
    // Qwen3.5 stacks its MTP layers; DeepSeek's nextn layers are one module each (the first drafts).
    const int n = mtp_stacked_ ? spec_.mtp_layers : 1;
    bool pending = false;
    for (int i = spec_.n_layers; i < spec_.n_layers + n; ++i) pending = run_layer(i, s, T, std::span<const Part>(&part, 1), ws_, step, pending);
    if (pending) be.add(s.h, s.tmp, T * H);
  } catch (...) {
    q.state->poisoned = true;
    throw;
  }
  be.rms_norm(s.h, mtp_norm_p_, T, H, eps, s.xn);
  if (q.hidden_out != nullptr) be.to_host(s.xn, T * H, q.hidden_out);
  if (q.mode == LogitsMode::kNone || q.logits == nullptr) return;
  const bool all = q.mode == LogitsMode::kAll;
  const int64_t rows = all ? T : 1;
  // A draft vocabulary: the head's first vocab_limit rows (a prefix view; spool's own quantized
  // layout is read whole).
  ops::WeightView head = mtp_head_;
  if (q.vocab_limit > 0 && q.vocab_limit < V && head.type != ops::WType::kQuant) head.rows = q.vocab_limit;
  const int64_t Vd = head.rows;
  for (int64_t r = 0; r < rows; ++r) {  // (kAll: tests and tools; drafting wants the last row only)
    const ops::LoraRowScales one{lora_rows_.data(), 1, lora_n_};  // (every row has the sequence's scales)
    const ops::LoraRowsScope one_scope(lora_n_ > 0 ? &one : nullptr);
    be.matmul(head, s.xn + (all ? r : T - 1) * H, 1, logits);
    if (spec_.final_logit_softcap > 0) be.softcap(logits, Vd, spec_.final_logit_softcap);
    be.to_host(logits, Vd, q.logits + r * V);
    std::fill(q.logits + r * V + Vd, q.logits + (r + 1) * V, MtpStep::kNoLogit);
  }
}

void DecoderModel::finish(const Scratch& s, int64_t N, std::span<const SeqStep> seqs, std::span<const Part> parts) {
  const int64_t H = spec_.hidden_size, V = spec_.vocab_size;
  const float eps = spec_.rms_norm_eps;
  if (hooks.on_hidden) {  // observed: every row normed
    be_->rms_norm(s.h, final_norm_p_, N, H, eps, s.xn);
    observe_hidden(spec_.n_layers, s.xn, N);
  }
  for (size_t i = 0, j = 0; i < seqs.size(); ++i) {  // the MTP head's input: every row normed
    if (seqs[i].ids.empty()) continue;
    const Part& p = parts[j++];
    if (seqs[i].hidden == nullptr) continue;
    if (!hooks.on_hidden) be_->rms_norm(s.h + p.row0 * H, final_norm_p_, p.T, H, eps, s.xn + p.row0 * H);
    be_->to_host(s.xn + p.row0 * H, p.T * H, seqs[i].hidden);
  }
  // Sequences wanting all rows: their own lm_head product.
  std::vector<size_t> last;  // indices into parts of sequences wanting the last row
  for (size_t i = 0, j = 0; i < seqs.size(); ++i) {
    if (seqs[i].ids.empty()) continue;
    const Part& p = parts[j++];
    if (seqs[i].mode == LogitsMode::kAll) {
      if (!hooks.on_hidden && seqs[i].hidden == nullptr)  // (normed above for the MTP head otherwise)
        be_->rms_norm(s.h + p.row0 * H, final_norm_p_, p.T, H, eps, s.xn + p.row0 * H);
      const ops::LoraRowScales lrows{lora_rows_.data() + p.row0 * lora_n_, p.T, lora_n_};
      const ops::LoraRowsScope lora_scope(lora_n_ > 0 ? &lrows : nullptr);
      be_->matmul(lm_head_, s.xn + p.row0 * H, p.T, seqs[i].logits);
      if (spec_.final_logit_softcap > 0) be_->softcap(seqs[i].logits, p.T * V, spec_.final_logit_softcap);
    } else if (seqs[i].mode == LogitsMode::kLast) {
      last.push_back(i);
    }
  }
  if (last.empty()) return;
  if (last.size() == 1) {  // one sequence: straight into its buffer
    const SeqStep& q = seqs[last[0]];
    const Part* p = nullptr;
    for (const Part& c : parts)
      if (c.state == q.state) p = &c;
    const int64_t r = p->row0 + p->T - 1;
    if (!hooks.on_hidden) be_->rms_norm(s.h + r * H, final_norm_p_, 1, H, eps, s.xn + r * H);
    const ops::LoraRowScales lrows{lora_rows_.data() + r * lora_n_, 1, lora_n_};
    const ops::LoraRowsScope lora_scope(lora_n_ > 0 ? &lrows : nullptr);
    be_->matmul(lm_head_, s.xn + r * H, 1, q.logits);
    if (spec_.final_logit_softcap > 0) be_->softcap(q.logits, V, spec_.final_logit_softcap);
    return;
  }
  // Several: gather the last rows, one lm_head product (its weights read once), scatter.
  ops::WorkspaceScope scope(ws_);
  const int64_t S = static_cast<int64_t>(last.size());
  const HeadScratch hs = HeadScratch::take(ws_, H, V, S);
  std::vector<float> last_scales(static_cast<size_t>(S * lora_n_));  // the gathered rows' LoRA scales
  for (int64_t k = 0; k < S; ++k) {
    const SeqStep& q = seqs[last[k]];
    for (const Part& c : parts)
      if (c.state == q.state) {
        be_->copy_2d(hs.xn + k * H, H, s.h + (c.row0 + c.T - 1) * H, H, 1, H);
        std::copy_n(lora_rows_.data() + (c.row0 + c.T - 1) * lora_n_, lora_n_, last_scales.data() + k * lora_n_);
      }
  }
  be_->rms_norm(hs.xn, final_norm_p_, S, H, eps, hs.xn);
  const ops::LoraRowScales lrows{last_scales.data(), S, lora_n_};
  const ops::LoraRowsScope lora_scope(lora_n_ > 0 ? &lrows : nullptr);
  be_->matmul(lm_head_, hs.xn, S, hs.logits);
  if (spec_.final_logit_softcap > 0) be_->softcap(hs.logits, S * V, spec_.final_logit_softcap);
  for (int64_t k = 0; k < S; ++k) be_->to_host(hs.logits + k * V, V, seqs[last[k]].logits);
}

}  // namespace spool::models
