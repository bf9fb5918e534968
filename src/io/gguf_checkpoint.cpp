// Checkpoint::open_gguf: a GGUF file (or split set) as a checkpoint with HF tensor names and
// an HF-style config (the GGUF notes (ggml docs/gguf.md) sections 2, 3 and 5).
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "io/checkpoint.h"
#include "io/gguf_config.h"
#include "io/gguf_names.h"
#include "ops/ggml_blocks.h"

namespace spool::io {

namespace {

// HF shape of a GGUF tensor (see GgufShape).
std::vector<int64_t> hf_shape(const GgufTensor& t, GgufShape s, const std::string& label) {
  std::vector<int64_t> shape;
  for (int d = static_cast<int>(t.n_dims) - 1; d >= 0; --d) shape.push_back(t.ne[d]);
  while (shape.size() > 1 && shape.front() == 1) shape.erase(shape.begin());
  switch (s) {
    case GgufShape::kReversed: return shape;
    case GgufShape::kConv1d:
      if (t.n_dims != 2) fail("%s: '%s' must be 2-D {kernel, channels}, got %s", label.c_str(), t.name.c_str(), t.shape_string().c_str());
      return {t.ne[1], 1, t.ne[0]};
    case GgufShape::kRowVector:
      if (t.numel() != t.ne[0]) fail("%s: '%s' must be a vector, got %s", label.c_str(), t.name.c_str(), t.shape_string().c_str());
      return {1, t.ne[0]};
  }
  return shape;
}

struct Pending {  // a tensor whose bytes the loader produces
  size_t index;   // into tensors_
  std::vector<uint8_t> bytes;
};

}  // namespace

Checkpoint Checkpoint::open_gguf(const std::string& path, const RulesResolver& rules, Options opt) {
  return gguf_checkpoint(std::make_shared<GgufFile>(GgufFile::open(path, /*map=*/false)), path, rules, opt.map, true, opt.mtp);
}

Checkpoint Checkpoint::from_gguf(std::shared_ptr<GgufFile> g, const RulesResolver& rules) {
  const std::string label = g->path();
  return gguf_checkpoint(std::move(g), label, rules, false, false, false);
}

Checkpoint Checkpoint::gguf_checkpoint(std::shared_ptr<GgufFile> file, const std::string& path, const RulesResolver& rules, bool map,
                                       bool local, bool keep_mtp) {
  Checkpoint c;
  c.dir_ = path;
  c.gguf_ = std::move(file);
  const GgufFile& g = *c.gguf_;
  const std::string arch_name = g.architecture();
  const GgufArch* arch = rules.by_gguf_arch ? rules.by_gguf_arch(arch_name) : nullptr;
  if (arch == nullptr)
    fail("%s: GGUF architecture '%s' is not supported (supported: %s)", path.c_str(), arch_name.c_str(),
         rules.gguf_arch_list ? rules.gguf_arch_list().c_str() : "none");
  const GgufArch& a = *arch;
  c.raw_config_ = Config(gguf_config_json(g, a), path + ":metadata");
  c.config_ = c.raw_config_;
  c.model_type_ = c.top_model_type_ = c.raw_config_.get_string("model_type");  // deepseek2: v2 or v3 by its router
  if (auto eos = g.get_int("tokenizer.ggml.eos_token_id")) c.generation_.eos_token_ids.push_back(*eos);
  if (auto eot = g.get_int("tokenizer.ggml.eot_token_id"))
    if (c.generation_.eos_token_ids.empty() || c.generation_.eos_token_ids[0] != *eot) c.generation_.eos_token_ids.push_back(*eot);

  const Config& cfg = c.config_;
  const int64_t L = cfg.get_int("num_hidden_layers");  // block_count - nextn_predict_layers
  c.n_main_layers_ = static_cast<int>(L);
  c.keep_mtp_ = keep_mtp;
  const int64_t n_k = a.hybrid ? cfg.get_int("linear_num_key_heads") : 0, n_v = a.hybrid ? cfg.get_int("linear_num_value_heads") : 0;
  const int64_t d_k = a.hybrid ? cfg.get_int("linear_key_head_dim") : 0, d_v = a.hybrid ? cfg.get_int("linear_value_head_dim") : 0;
  if (a.hybrid && (n_k <= 0 || n_v % n_k != 0)) fail("%s: ssm.time_step_rank must be a multiple of ssm.group_count", path.c_str());

  for (size_t s = 0; s < g.shard_count(); ++s)  // remote: a header-only stand-in with the shard's size
    c.shards_.push_back(local ? SafetensorsFile::open_raw(g.shard(s).label, map)
                              : SafetensorsFile::parse_header("{}", g.shard(s).data_offset, g.shard(s).file_size, g.shard(s).label));
  std::vector<Pending> pending;
  const std::vector<int64_t> v_map = a.v_tiled ? gguf_tiled_of_grouped(n_k, n_v) : std::vector<int64_t>{};

  for (const GgufTensor& t : g.tensors()) {
    const std::string& gname = t.name;
    std::optional<GgufTensorMap> m = map_gguf_tensor(a, gname);
    if (!m) {
      if (gname.find(".nextn.") != std::string::npos) {  // a part of an MTP head spool does not bind
        c.mtp_bytes_ += t.nbytes;
        ++c.dropped_;
        continue;
      }
      fail("%s: tensor '%s' is not part of the %s layout spool knows", path.c_str(), gname.c_str(), a.name.c_str());
    }
    if (m->nextn && m->layer < L && !keep_mtp) {  // (as before the head was read: dropped)
      c.mtp_bytes_ += t.nbytes;
      ++c.dropped_;
      continue;
    }
    if (m->nextn && m->layer < L)
      fail("%s: '%s' is a multi-token-prediction tensor, but block %d is one of the %lld main layers (%s.block_count minus "
           "%s.nextn_predict_layers)", path.c_str(), gname.c_str(), m->layer, (long long)L, arch_name.c_str(), arch_name.c_str());
    if (m->layer >= L) {  // the MTP blocks after the main stack: kept when asked for
      c.mtp_bytes_ += t.nbytes;
      // (a nextn block's copy of the embedding table is never read: the head reads embed_tokens)
      if (!keep_mtp || gname.ends_with(".nextn.embed_tokens.weight")) {
        ++c.dropped_;
        continue;
      }
    }
    const GgmlTypeTraits tr = ggml_type_traits(t.type);
    const bool is_float = t.type == GgmlType::F32 || t.type == GgmlType::F16 || t.type == GgmlType::BF16;
    if (!is_float && !ops::ggml_supported(t.type))
      fail("%s: tensor '%s' has type %s, which spool cannot run (supported: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K "
           "Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4 IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S TQ1_0 TQ2_0)", path.c_str(), gname.c_str(), tr.name ? tr.name : "unknown");
    TensorRef r;
    r.shard = static_cast<int>(t.shard);
    r.dtype = t.type == GgmlType::F32 ? DType::F32 : t.type == GgmlType::F16 ? DType::F16 : t.type == GgmlType::BF16 ? DType::BF16 : DType::U8;
    r.ggml = !is_float;
    r.ggml_type = t.type;
    r.offset = t.offset;
    r.nbytes = t.nbytes;
    r.data = c.shards_[t.shard].mapping() ? c.shards_[t.shard].mapping() + t.offset : nullptr;
    r.shape = hf_shape(t, m->shape, path);

    // split_gate_up archs (gpt-oss): ffn_up_exps (weight and bias) is read with its ffn_gate_exps sibling.
    if (m->transform == GgufTransform::kWithGate) {
      const std::string gate = "blk." + std::to_string(m->layer) + ".ffn_gate_exps." + (gname.ends_with(".bias") ? "bias" : "weight");
      if (g.find(gate) == nullptr) fail("%s: '%s' has no '%s' beside it (%s gate_up is split into gate and up)", path.c_str(), gname.c_str(), gate.c_str(),
             a.name.c_str());
      continue;
    }
    const GgufTensor* up = nullptr;  // split_gate_up: the ffn_up_exps sibling of an ffn_gate_exps tensor
    if (m->transform == GgufTransform::kInterleaveUp) {
      const std::string uname = "blk." + std::to_string(m->layer) + ".ffn_up_exps." + (gname.ends_with(".bias") ? "bias" : "weight");
      up = g.find(uname);
      if (up == nullptr) fail("%s: '%s' has no '%s' beside it (%s gate_up is split into gate and up)", path.c_str(), gname.c_str(), uname.c_str(),
                             a.name.c_str());
      bool same = up->type == t.type && up->n_dims == t.n_dims;
      for (uint32_t d = 0; same && d < t.n_dims; ++d) same = up->ne[d] == t.ne[d];
      if (!same)
        fail("%s: '%s' (%s, %s) and '%s' (%s, %s) differ in type or shape; %s interleaves their rows", path.c_str(), gname.c_str(),
             tr.name ? tr.name : "?", t.shape_string().c_str(), uname.c_str(), ggml_type_traits(up->type).name ? ggml_type_traits(up->type).name : "?",
             up->shape_string().c_str(), a.name.c_str());
    }

    if (m->merged_experts && up != nullptr) {  // split_gate_up (gpt-oss) gate {H, I, E} + up: gate_up [2I, H] per expert, row 2i gate i, 2i + 1 up i
      if (t.n_dims != 3) fail("%s: '%s' must be 3-D {in, out, experts}, got %s", path.c_str(), gname.c_str(), t.shape_string().c_str());
      const int64_t E = t.ne[2], I = t.ne[1], C = t.ne[0];
      const uint64_t row_bytes = t.row_bytes(), slab = static_cast<uint64_t>(I) * row_bytes;
      const uint8_t* gd = r.data;
      const uint8_t* ud = c.shards_[up->shard].mapping() ? c.shards_[up->shard].mapping() + up->offset : nullptr;
      for (int64_t e = 0; e < E; ++e) {
        TensorRef x = r;
        x.shape = {2 * I, C};
        x.nbytes = 2 * slab;
        x.offset = 0;
        x.data = nullptr;
        x.expert_layer = m->layer;
        x.expert_id = static_cast<int>(e);
        x.expert_proj = ExpertProj::kGate;
        x.name = expert_tensor_name(m->layer, static_cast<int>(e), ExpertProj::kGate);
        c.add(std::move(x));
        if (gd == nullptr || ud == nullptr) continue;  // header-only: shapes are enough
        std::vector<uint8_t> bytes(2 * slab);
        for (int64_t i = 0; i < I; ++i) {
          std::memcpy(bytes.data() + (2 * i) * row_bytes, gd + e * slab + i * row_bytes, row_bytes);
          std::memcpy(bytes.data() + (2 * i + 1) * row_bytes, ud + e * slab + i * row_bytes, row_bytes);
        }
        pending.push_back({c.tensors_.size() - 1, std::move(bytes)});
      }
      c.expert_layout_ = ExpertLayout::kFused;
      continue;
    }
    if (up != nullptr) {  // split_gate_up (gpt-oss) expert biases gate {I, E} + up {I, E}: gate_up_proj_bias [E, 2I] F32, interleaved
      if (t.n_dims != 2) fail("%s: '%s' must be 2-D {rows, experts}, got %s", path.c_str(), gname.c_str(), t.shape_string().c_str());
      const int64_t E = t.ne[1], I = t.ne[0];
      r.name = m->hf_name;
      r.shape = {E, 2 * I};
      r.ggml = false;
      r.dtype = DType::F32;
      r.ggml_type = GgmlType::F32;
      r.nbytes = static_cast<uint64_t>(E * 2 * I) * 4;
      const uint8_t* ud = c.shards_[up->shard].mapping() ? c.shards_[up->shard].mapping() + up->offset : nullptr;
      if (r.data == nullptr || ud == nullptr) {  // header-only: shapes are enough
        c.add(std::move(r));
        continue;
      }
      std::vector<float> gf(static_cast<size_t>(E * I)), uf(static_cast<size_t>(E * I)), out(static_cast<size_t>(E * 2 * I));
      ops::ggml_dequantize_row(t.type, r.data, E * I, gf.data());
      ops::ggml_dequantize_row(up->type, ud, E * I, uf.data());
      for (int64_t e = 0; e < E; ++e)
        for (int64_t i = 0; i < I; ++i) {
          out[e * 2 * I + 2 * i] = gf[e * I + i];
          out[e * 2 * I + 2 * i + 1] = uf[e * I + i];
        }
      std::vector<uint8_t> bytes(out.size() * 4);
      std::memcpy(bytes.data(), out.data(), bytes.size());
      c.add(std::move(r));
      pending.push_back({c.tensors_.size() - 1, std::move(bytes)});
      continue;
    }

    if (m->merged_experts) {  // ne {in, out, E}: one contiguous slab per expert
      if (t.n_dims != 3) fail("%s: '%s' must be 3-D {in, out, experts}, got %s", path.c_str(), gname.c_str(), t.shape_string().c_str());
      const int64_t E = t.ne[2], R = t.ne[1], C = t.ne[0];
      if (m->gate_up && R % 2 != 0) fail("%s: '%s' has an odd row count %lld (gate and up stacked)", path.c_str(), gname.c_str(), (long long)R);
      const uint64_t row_bytes = t.row_bytes(), slab = static_cast<uint64_t>(R) * row_bytes;
      for (int64_t e = 0; e < E; ++e)
        for (int part = 0; part < (m->gate_up ? 2 : 1); ++part) {
          TensorRef x = r;
          const int64_t rows = m->gate_up ? R / 2 : R;
          x.shape = {rows, C};
          x.nbytes = static_cast<uint64_t>(rows) * row_bytes;
          x.offset = t.offset + e * slab + part * x.nbytes;
          x.data = r.data ? r.data + e * slab + part * x.nbytes : nullptr;
          x.expert_layer = m->layer;
          x.expert_id = static_cast<int>(e);
          x.expert_proj = m->gate_up ? (part == 0 ? ExpertProj::kGate : ExpertProj::kUp) : m->proj;
          x.name = expert_tensor_name(m->layer, static_cast<int>(e), x.expert_proj);
          c.add(std::move(x));
        }
      c.expert_layout_ = ExpertLayout::kFused;
      continue;
    }

    GgufTransform tf = m->transform;
    std::string hf = m->hf_name;
    if (tf == GgufTransform::kWithKb) {  // attn_v_b: read with its attn_k_b
      if (g.find("blk." + std::to_string(m->layer) + ".attn_k_b.weight") == nullptr)
        fail("%s: '%s' has no attn_k_b beside it (kv_b_proj is split into attn_k_b and attn_v_b)", path.c_str(), gname.c_str());
      continue;
    }
    if (tf == GgufTransform::kKvbFromKb) {
      const std::string vname = "blk." + std::to_string(m->layer) + ".attn_v_b.weight";
      const GgufTensor* vb = g.find(vname);
      if (vb == nullptr) fail("%s: '%s' has no '%s' beside it", path.c_str(), gname.c_str(), vname.c_str());
      // k_b ne {nope, R, H}: head h's K rows of kv_b, transposed; v_b ne {R, V, H}: its V rows.
      if (t.n_dims != 3 || vb->n_dims != 3 || t.ne[1] != vb->ne[0] || t.ne[2] != vb->ne[2])
        fail("%s: '%s' %s and '%s' %s are not {nope, kv_lora, heads} and {kv_lora, v, heads}", path.c_str(), gname.c_str(),
             t.shape_string().c_str(), vname.c_str(), vb->shape_string().c_str());
      const int64_t nope = t.ne[0], R = t.ne[1], nh = t.ne[2], V = vb->ne[1];
      r.shape = {nh * (nope + V), R};
      r.name = hf;
      r.ggml = false;
      r.dtype = DType::F32;
      r.ggml_type = GgmlType::F32;
      r.nbytes = static_cast<uint64_t>(nh * (nope + V) * R) * 4;
      if (r.data == nullptr) {  // header-only: shapes are enough
        c.add(std::move(r));
        continue;
      }
      std::vector<float> kf(static_cast<size_t>(t.numel())), vf(static_cast<size_t>(vb->numel()));
      ops::ggml_dequantize_row(t.type, r.data, t.numel(), kf.data());
      ops::ggml_dequantize_row(vb->type, c.shards_[vb->shard].mapping() + vb->offset, vb->numel(), vf.data());
      std::vector<float> out(static_cast<size_t>(nh * (nope + V) * R));
      for (int64_t h = 0; h < nh; ++h) {
        float* rows = out.data() + h * (nope + V) * R;
        for (int64_t col = 0; col < R; ++col)
          for (int64_t i = 0; i < nope; ++i) rows[i * R + col] = kf[(h * R + col) * nope + i];
        std::memcpy(rows + nope * R, vf.data() + h * V * R, static_cast<size_t>(V * R) * 4);
      }
      std::vector<uint8_t> bytes(out.size() * 4);
      std::memcpy(bytes.data(), out.data(), bytes.size());
      c.add(std::move(r));
      pending.push_back({c.tensors_.size() - 1, std::move(bytes)});
      continue;
    }
    if (tf == GgufTransform::kBaSplitB && g.find("blk." + std::to_string(m->layer) + ".ssm_in.weight") != nullptr) {
      tf = GgufTransform::kNone;  // legacy qwen3next layout: in_proj_qkvz + in_proj_ba as HF stores them
      hf = "layers." + std::to_string(m->layer) + ".linear_attn.in_proj_ba.weight";
    }
    r.name = hf;
    // A block-typed token embedding stays in its type: the decoder reads and dequantizes it by
    // row (DecoderModel::embed), so a 248k x 2048 vocabulary is not inflated to 2 GB of F32.
    // Rows marked as_float (routers, MLA's kv_b_proj read per head, bias tables) become F32 too.
    const bool vector_like = r.shape.size() == 1 || m->shape != GgufShape::kReversed || m->as_float;
    const bool dequant = r.ggml && (vector_like || tf == GgufTransform::kNormMinus1 || tf == GgufTransform::kALog);
    const bool f32_out = dequant || tf == GgufTransform::kNormMinus1 || tf == GgufTransform::kALog;
    if (tf == GgufTransform::kNone && !dequant) {
      c.add(std::move(r));
      continue;
    }
    if (tf == GgufTransform::kVCols && r.ggml) {  // keep the blocks, permute the activations
      if (r.shape.size() != 2 || r.shape[1] != n_v * d_v)
        fail("%s: '%s' has shape %s, expected [*, %lld]", path.c_str(), gname.c_str(), r.shape_str().c_str(), (long long)(n_v * d_v));
      std::vector<int32_t> perm(static_cast<size_t>(n_v * d_v));
      std::vector<int64_t> grouped_of_tiled(n_v);
      for (int64_t j = 0; j < n_v; ++j) grouped_of_tiled[v_map[j]] = j;
      for (int64_t col = 0; col < n_v * d_v; ++col) perm[col] = static_cast<int32_t>(grouped_of_tiled[col / d_v] * d_v + col % d_v);
      c.perms_.push_back(std::move(perm));
      r.col_perm = c.perms_.back().data();
      c.add(std::move(r));
      continue;
    }
    if (r.data == nullptr) {  // header-only: shapes are enough
      if (tf == GgufTransform::kBaSplitB) {
        TensorRef b = r, an = r;
        b.shape[0] = an.shape[0] = r.shape[0] / 2;
        an.name = "layers." + std::to_string(m->layer) + ".linear_attn.in_proj_a.weight";
        c.add(std::move(b));
        c.add(std::move(an));
      } else {
        c.add(std::move(r));
      }
      continue;
    }
    // Rows of the source, as bytes (or floats after dequantization).
    const int64_t cols = r.shape.back();
    const int64_t rows = r.numel() / cols;
    const uint64_t src_row = t.nbytes / static_cast<uint64_t>(rows);
    std::vector<uint8_t> src;
    uint64_t row_bytes = src_row;
    if (f32_out) {
      std::vector<float> f(static_cast<size_t>(r.numel()));
      ops::ggml_dequantize_row(t.type, r.data, r.numel(), f.data());  // F32 / F16 / BF16 / blocks
      if (tf == GgufTransform::kNormMinus1)
        for (float& x : f) x -= 1.0f;
      if (tf == GgufTransform::kALog)
        for (float& x : f) {
          if (!(x < 0)) fail("%s: '%s' holds %g; llama.cpp stores A = -exp(A_log) < 0", path.c_str(), gname.c_str(), x);
          x = std::log(-x);
        }
      src.resize(f.size() * 4);
      std::memcpy(src.data(), f.data(), src.size());
      row_bytes = static_cast<uint64_t>(cols) * 4;
      r.ggml = false;
      r.dtype = DType::F32;
      r.ggml_type = GgmlType::F32;
    } else {
      src.assign(r.data, r.data + t.nbytes);
    }
    if (tf == GgufTransform::kUnpermuteQ || tf == GgufTransform::kUnpermuteK) {
      // llama.cpp stored head h's row s * hd/2 + k (s = 0, 1) at h * hd + 2k + s: whole rows move,
      // so block-typed rows stay in their type.
      const bool q = tf == GgufTransform::kUnpermuteQ;
      const int64_t nh = cfg.get_int(q ? "num_attention_heads" : "num_key_value_heads");
      if (nh <= 0 || rows % nh != 0 || (rows / nh) % 2 != 0)
        fail("%s: '%s' has %lld rows, not %lld heads of an even head size", path.c_str(), gname.c_str(), (long long)rows,
             (long long)nh);
      const std::vector<int64_t> order = gguf_unpermute_order(rows, nh);
      std::vector<uint8_t> out(src.size());
      for (int64_t i = 0; i < rows; ++i) std::memcpy(out.data() + i * row_bytes, src.data() + order[i] * row_bytes, row_bytes);
      src = std::move(out);
    }
    const bool v_axis = a.v_tiled && (tf == GgufTransform::kVRows || tf == GgufTransform::kVCols || tf == GgufTransform::kALog);
    const int64_t vb = m->v_block < 0 ? d_v : m->v_block;
    if (v_axis && tf != GgufTransform::kVCols) {
      // Rows (or, for 1-D tensors, elements) [off, off + n_v * vb): stored tiled, wanted grouped.
      const int64_t off = m->v_after_qk ? 2 * n_k * d_k : 0;
      const bool one_d = r.shape.size() == 1;
      const int64_t n_units = one_d ? r.numel() : rows;
      const uint64_t unit = one_d ? (f32_out ? 4 : src.size() / r.numel()) : row_bytes;
      if (off + n_v * vb != n_units)
        fail("%s: '%s' has %lld %s, expected %lld (V heads %lld x %lld after %lld)", path.c_str(), gname.c_str(), (long long)n_units,
             one_d ? "elements" : "rows", (long long)(off + n_v * vb), (long long)n_v, (long long)vb, (long long)off);
      std::vector<uint8_t> out = src;
      for (int64_t j = 0; j < n_v; ++j)
        std::memcpy(out.data() + (off + j * vb) * unit, src.data() + (off + v_map[j] * vb) * unit, vb * unit);
      src = std::move(out);
    } else if (v_axis && tf == GgufTransform::kVCols) {  // float matrix: permute whole column blocks
      if (cols != n_v * d_v) fail("%s: '%s' has %lld columns, expected %lld", path.c_str(), gname.c_str(), (long long)cols, (long long)(n_v * d_v));
      const uint64_t es = src.size() / static_cast<uint64_t>(r.numel());
      std::vector<uint8_t> out(src.size());
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t j = 0; j < n_v; ++j)
          std::memcpy(out.data() + (row * cols + j * d_v) * es, src.data() + (row * cols + v_map[j] * d_v) * es, d_v * es);
      src = std::move(out);
    }
    if (tf == GgufTransform::kBaSplitB) {  // rows grouped per k-head [b_g (R) | a_g (R)] -> b rows, a rows
      if (rows != 2 * n_v) fail("%s: '%s' has %lld rows, expected %lld", path.c_str(), gname.c_str(), (long long)rows, (long long)(2 * n_v));
      std::vector<uint8_t> b(src.size() / 2), an(src.size() / 2);
      const auto [b_rows, a_rows] = gguf_ba_split_rows(n_k, n_v);
      for (int64_t i = 0; i < n_v; ++i) {
        std::memcpy(b.data() + i * row_bytes, src.data() + b_rows[i] * row_bytes, row_bytes);
        std::memcpy(an.data() + i * row_bytes, src.data() + a_rows[i] * row_bytes, row_bytes);
      }
      TensorRef tb = r, ta = r;
      tb.shape[0] = ta.shape[0] = n_v;
      tb.nbytes = ta.nbytes = b.size();
      ta.name = "layers." + std::to_string(m->layer) + ".linear_attn.in_proj_a.weight";
      c.add(std::move(tb));
      pending.push_back({c.tensors_.size() - 1, std::move(b)});
      c.add(std::move(ta));
      pending.push_back({c.tensors_.size() - 1, std::move(an)});
      continue;
    }
    r.nbytes = src.size();
    c.add(std::move(r));
    pending.push_back({c.tensors_.size() - 1, std::move(src)});
  }

  // Converted tensors: one anonymous in-memory file, mapped like a shard (so that row readers
  // that pread from a shard's fd, e.g. the embedding, work unchanged).
  if (!pending.empty()) {
    const int fd = memfd_create("spool-gguf-converted", MFD_CLOEXEC);
    if (fd < 0) fail("%s: memfd_create failed (%s)", path.c_str(), std::strerror(errno));
    uint64_t at = 0;
    for (Pending& p : pending) {
      at = (at + 63) / 64 * 64;
      TensorRef& t = c.tensors_[p.index];
      t.offset = at;
      uint64_t done = 0;
      while (done < p.bytes.size()) {
        const ssize_t w = ::pwrite(fd, p.bytes.data() + done, p.bytes.size() - done, static_cast<off_t>(at + done));
        if (w <= 0) {
          ::close(fd);
          fail("%s: writing converted tensors to memory failed (%s)", path.c_str(), std::strerror(errno));
        }
        done += static_cast<uint64_t>(w);
      }
      at += p.bytes.size();
    }
    SafetensorsFile mem = SafetensorsFile::from_fd(fd, "/proc/self/fd/" + std::to_string(fd), true);
    const int shard = static_cast<int>(c.shards_.size());
    for (Pending& p : pending) {
      TensorRef& t = c.tensors_[p.index];
      t.shard = shard;
      t.data = mem.mapping() + t.offset;
    }
    c.shards_.push_back(std::move(mem));
  }
  return c;
}

}  // namespace spool::io
