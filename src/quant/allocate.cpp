#include "quant/allocate.h"

#include <algorithm>
#include <cmath>
#include <queue>

#include "common/error.h"
#include "io/tensor_names.h"
#include "ops/weights.h"
#include "quant/codebook.h"
#include "quant/hadamard.h"

namespace spool::quant {

namespace {

constexpr int64_t kSampleRows = 128;  // rows measured per slot
constexpr int kSampleExperts = 8;     // experts sampled per expert slot

ClassSpec qs(ops::QType t, int g) { return ClassSpec{false, t, g}; }

/// Appends rows of `t` ([rows, cols] float) to `out`: n rows evenly spaced.
void sample_rows(const io::TensorRef& t, int64_t n, std::vector<float>* out) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const ops::WType wt = source_wtype(t);
  const uint64_t row_bytes = static_cast<uint64_t>(cols) * ops::wtype_size(wt);
  n = std::min(n, rows);
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>(n * cols));
  for (int64_t i = 0; i < n; ++i) ops::row_to_f32(wt, t.data + (i * rows / n) * row_bytes, cols, out->data() + at + i * cols);
}

}  // namespace

ops::WType source_wtype(const io::TensorRef& t) {
  switch (t.dtype) {
    case io::DType::F32: return ops::WType::kF32;
    case io::DType::BF16: return ops::WType::kBF16;
    case io::DType::F16: return ops::WType::kF16;
    default: fail("tensor '%s': dtype %s cannot be converted", t.name.c_str(), io::dtype_name(t.dtype));
  }
}

// Where the defaults come from: a per-class alpha (loss per unit relative squared error) was
// fitted by non-negative least squares, on relative residuals, to the KL of 25 fixed-class
// recipes of spool-wide-moe (bench/results/quality-spool-wide-moe.md; the fit predicts every one
// from 4 to 2 bits within 20%); divided by each class's read weights (routed experts: top_k /
// n_experts of theirs) the five per-weight sensitivities came out within 2.3x of each other —
// the read share explains most of it — and these factors keep the remaining class differences.
AllocWeights AllocWeights::defaults() { return AllocWeights{}; }

double AllocWeights::of(TensorClass c) const {
  switch (c) {
    case TensorClass::kDense: return dense;
    case TensorClass::kExpertGateUp: return gate_up;
    case TensorClass::kExpertDown: return down;
    case TensorClass::kLmHead: return lm_head;
    case TensorClass::kEmbed: return embed;
    default: return 0.0;
  }
}

std::vector<ClassSpec> alloc_candidates(int64_t cols) {
  using ops::QType;
  std::vector<ClassSpec> want = {qs(QType::kTernary, 64), qs(QType::kQ2, 128), qs(QType::kQ2, 64), qs(QType::kQ2, 32),
                                 qs(QType::kQ3, 128),     qs(QType::kQ3, 64),  qs(QType::kQ3, 32), qs(QType::kQ4, 128),
                                 qs(QType::kQ4, 64),      qs(QType::kQ4, 32),  qs(QType::kQ5, 64), qs(QType::kQ5, 32),
                                 qs(QType::kQ6, 64),      qs(QType::kQ6, 32),  qs(QType::kQ8, 64), qs(QType::kQ8, 32)};
  std::vector<ClassSpec> out;
  for (ClassSpec s : want) {
    s.group = effective_group(s.group, cols);
    if (std::none_of(out.begin(), out.end(), [&](const ClassSpec& o) { return o.type == s.type && o.group == s.group; }))
      out.push_back(s);
  }
  out.push_back(ClassSpec{});  // bf16
  return out;
}

std::string expert_slot_key(int layer, int expert, bool down) {
  return strfmt("layers.%d.mlp.experts.%d.%s", layer, expert, down ? "down" : "gate_up");
}

uint64_t matrix_bytes(const ClassSpec& s, int64_t rows, int64_t cols, const QuantOptions& q) {
  if (s.keep) return static_cast<uint64_t>(rows * cols) * 2;
  const int g = effective_group(s.group, cols);
  const int64_t G = cols / g;
  return static_cast<uint64_t>(rows * G * (ops::qtype_group_bytes(s.type, g) + 2) + (q.stores_codebook(s.type) ? levels(s.type) * 4 : 0));
}

double sample_error(const std::vector<float>& sample, int64_t cols, const ClassSpec& s, const int8_t* signs, const QuantOptions& q) {
  const int64_t n = static_cast<int64_t>(sample.size()) / cols;
  double norm = 0;
  for (float w : sample) norm += static_cast<double>(w) * w;
  if (norm == 0 || n == 0) return 0.0;
  if (s.keep) {
    double e = 0;
    for (float w : sample) {
      const double d = static_cast<double>(w) - ops::bf16_to_f32(ops::f32_to_bf16(w));
      e += d * d;
    }
    return e / norm;
  }
  const int g = effective_group(s.group, cols);
  std::vector<float> rot(sample);
  if (signs != nullptr)
    for (int64_t r = 0; r < n; ++r) rotate_input(signs, rot.data() + r * cols, cols, rot.data() + r * cols);
  std::vector<float> cb;
  if (q.codebook == CodebookSource::kFit) {
    cb = fit_codebook(s.type, g, n, cols, [&](int64_t r, float* out) { std::copy_n(rot.data() + r * cols, cols, out); },
                      q.scale_search);
  } else {
    const std::span<const float> t = codebook(s.type);
    cb.assign(t.begin(), t.end());
  }
  const Coder coder(cb);
  std::vector<uint8_t> codes(static_cast<size_t>(g));
  double e = 0;
  for (int64_t i = 0; i < n * cols; i += g) e += search_scale(rot.data() + i, g, coder, q.scale_search, codes.data()).sse;
  return e / norm;
}

uint64_t choose(std::vector<AllocSlot>* slots, uint64_t budget_bytes) {
  // Per slot: the lower convex hull of (bytes, weight * rel_err), cheapest first.
  std::vector<std::vector<int>> hull(slots->size());
  uint64_t used = 0;
  for (size_t s = 0; s < slots->size(); ++s) {
    AllocSlot& sl = (*slots)[s];
    std::vector<int> idx(sl.candidates.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int>(i);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
      return sl.bytes[a] != sl.bytes[b] ? sl.bytes[a] < sl.bytes[b] : sl.rel_err[a] < sl.rel_err[b];
    });
    auto cost = [&](int i) { return sl.weight * sl.rel_err[i]; };
    std::vector<int>& h = hull[s];
    for (int i : idx) {
      if (!h.empty() && (sl.bytes[i] == sl.bytes[h.back()] || cost(i) >= cost(h.back()))) continue;  // dominated
      // Pop points that lie on or above the segment from the one before them to i.
      while (h.size() >= 2) {
        const int a = h[h.size() - 2], b = h.back();
        const double s_ab = (cost(a) - cost(b)) / static_cast<double>(sl.bytes[b] - sl.bytes[a]);
        const double s_ai = (cost(a) - cost(i)) / static_cast<double>(sl.bytes[i] - sl.bytes[a]);
        if (s_ai >= s_ab) h.pop_back();
        else break;
      }
      h.push_back(i);
    }
    sl.chosen = h.front();
    used += sl.bytes[sl.chosen];
  }
  if (used > budget_bytes) fail("the smallest formats need %llu bytes, over the budget of %llu", (unsigned long long)used,
                                (unsigned long long)budget_bytes);
  // Greedy: the step with the largest loss decrease per byte first.
  struct Step {
    double gain;  // loss decrease per byte
    size_t slot;
    size_t pos;   // hull position the step moves to
    bool operator<(const Step& o) const { return gain != o.gain ? gain < o.gain : slot > o.slot; }
  };
  std::priority_queue<Step> q;
  auto push = [&](size_t s, size_t pos) {
    const AllocSlot& sl = (*slots)[s];
    if (pos >= hull[s].size()) return;
    const int a = hull[s][pos - 1], b = hull[s][pos];
    q.push({sl.weight * (sl.rel_err[a] - sl.rel_err[b]) / static_cast<double>(sl.bytes[b] - sl.bytes[a]), s, pos});
  };
  for (size_t s = 0; s < slots->size(); ++s) push(s, 1);
  while (!q.empty()) {
    const Step st = q.top();
    q.pop();
    AllocSlot& sl = (*slots)[st.slot];
    const int next = hull[st.slot][st.pos];
    const uint64_t extra = sl.bytes[next] - sl.bytes[sl.chosen];
    if (used + extra > budget_bytes) continue;  // this slot stops here; smaller steps elsewhere may still fit
    used += extra;
    sl.chosen = next;
    push(st.slot, st.pos + 1);
  }
  // The remaining bytes: any candidate (on the hull or not) that lowers a slot's loss and fits.
  for (;;) {
    double best = 0;
    size_t bs = 0;
    int bi = -1;
    for (size_t s = 0; s < slots->size(); ++s) {
      const AllocSlot& sl = (*slots)[s];
      for (size_t i = 0; i < sl.candidates.size(); ++i) {
        const double gain = sl.weight * (sl.rel_err[sl.chosen] - sl.rel_err[i]);
        if (gain > best && used - sl.bytes[sl.chosen] + sl.bytes[i] <= budget_bytes) best = gain, bs = s, bi = static_cast<int>(i);
      }
    }
    if (bi < 0) break;
    AllocSlot& sl = (*slots)[bs];
    used = used - sl.bytes[sl.chosen] + sl.bytes[bi];
    sl.chosen = bi;
  }
  return used;
}

Allocation allocate(const io::Checkpoint& ck, const AllocOptions& o, ops::ThreadPool* pool) {
  if (!(o.target_bpw > 0 && o.target_bpw <= 16.5))
    throw UsageError(strfmt("--target-bpw must be in (0, 16.5] bits per weight (got %g)", o.target_bpw));
  Allocation a;
  std::vector<std::vector<float>> samples;      // per slot, original basis
  std::vector<std::string> sign_names;          // per slot: the name its sign vector is drawn from
  std::vector<int64_t> slot_cols;
  struct ExpertSlot {
    int layer, n;
    bool down;
  };
  std::map<size_t, ExpertSlot> expert_slot;     // slot index -> its layer's experts
  auto add_slot = [&](std::string key, TensorClass c, int64_t params, int64_t cols, std::vector<float> sample,
                      std::string sign_name, const std::function<uint64_t(const ClassSpec&)>& bytes) {
    AllocSlot s;
    s.key = std::move(key);
    s.cls = c;
    s.params = params;
    s.weight = o.weights.of(c) * static_cast<double>(params) *
               (c == TensorClass::kExpertGateUp || c == TensorClass::kExpertDown ? o.expert_usage : 1.0);
    s.candidates = alloc_candidates(cols);
    for (const ClassSpec& cs : s.candidates) s.bytes.push_back(bytes(cs) + (cs.keep || !o.rotate ? 0 : static_cast<uint64_t>(cols)));
    a.slots.push_back(std::move(s));
    samples.push_back(std::move(sample));
    sign_names.push_back(std::move(sign_name));
    slot_cols.push_back(cols);
  };
  const bool tied = std::none_of(ck.tensors().begin(), ck.tensors().end(), [](const io::TensorRef& t) { return t.name == "lm_head.weight"; });
  std::map<int, int> expert_layers;
  for (const io::TensorRef& t : ck.tensors()) {
    if (t.expert_layer >= 0) {
      int& n = expert_layers[t.expert_layer];
      n = std::max(n, t.expert_id + 1);
      continue;
    }
    const TensorClass c = o.keep_float != nullptr && o.keep_float(t.name) ? TensorClass::kKeep : classify(t.name, t.shape);
    a.params += t.numel();
    if (c == TensorClass::kKeep || t.numel() == 0) {
      a.fixed_bytes += static_cast<uint64_t>(t.numel()) * 2;
      continue;
    }
    std::vector<float> smp;
    sample_rows(t, kSampleRows, &smp);
    const int64_t rows = t.shape[0], cols = t.shape[1];
    add_slot(t.name, c, t.numel(), cols, std::move(smp), t.name, [rows, cols, q = o.quant](const ClassSpec& s) { return matrix_bytes(s, rows, cols, q); });
    // Tied embeddings: the table is also the output projection.
    if (c == TensorClass::kEmbed && tied) a.slots.back().weight += o.weights.lm_head * static_cast<double>(t.numel());
  }
  for (auto [layer, n] : expert_layers) {
    const io::TensorRef& d0 = ck.expert(layer, 0, io::ExpertProj::kDown);
    if (d0.expert_part == io::ExpertPart::kMxBlocks) {  // MXFP4: kept as stored
      for (int e = 0; e < n; ++e)
        for (const io::TensorRef* t : ck.expert_tensors(layer, e)) {
          a.fixed_bytes += t->nbytes;
          if (t->expert_part == io::ExpertPart::kMxBlocks) a.params += t->shape[0] * t->shape[1] * 32;
        }
      continue;
    }
    const bool fused = !ck.has_expert(layer, 0, io::ExpertProj::kUp);
    const int64_t H = d0.shape[0], I = d0.shape[1];
    for (bool down : {false, true}) {
      std::vector<float> smp;
      const int ne = std::min(n, kSampleExperts);
      std::vector<io::ExpertProj> projs = down ? std::vector{io::ExpertProj::kDown}
                                               : fused ? std::vector{io::ExpertProj::kGate}
                                                       : std::vector{io::ExpertProj::kGate, io::ExpertProj::kUp};
      for (int k = 0; k < ne; ++k)
        for (io::ExpertProj p : projs)
          sample_rows(ck.expert(layer, k * n / ne, p), kSampleRows / (ne * static_cast<int64_t>(projs.size())) + 1, &smp);
      const int64_t rows = down ? H : fused ? 2 * I : I, cols = down ? I : H;
      const int64_t mats = down || fused ? n : 2 * static_cast<int64_t>(n);
      const std::string sname = io::expert_signs_name(layer, down ? io::ExpertProj::kDown : io::ExpertProj::kGate);
      expert_slot[a.slots.size()] = {layer, n, down};
      add_slot(sname.substr(0, sname.size() - 6), down ? TensorClass::kExpertDown : TensorClass::kExpertGateUp, mats * rows * cols, cols,
               std::move(smp), sname.substr(0, sname.size() - 6),
               [rows, cols, mats, q = o.quant](const ClassSpec& s) { return static_cast<uint64_t>(mats) * matrix_bytes(s, rows, cols, q); });
      a.params += mats * rows * cols;
    }
  }
  // alpha: the slots' read shares scaled to total_loss.
  double share = 0;
  for (const AllocSlot& s : a.slots) share += s.weight;
  for (AllocSlot& s : a.slots) s.weight = share > 0 ? o.weights.total_loss * s.weight / share : 0.0;
  // Measure every candidate of every slot (slots in parallel; each measurement is deterministic).
  auto measure = [&](int64_t s) {
    AllocSlot& sl = a.slots[static_cast<size_t>(s)];
    const int64_t cols = slot_cols[static_cast<size_t>(s)];
    const std::vector<int8_t> sg = o.rotate ? rotation_signs(o.rotation_seed, sign_names[static_cast<size_t>(s)], cols) : std::vector<int8_t>();
    sl.rel_err.resize(sl.candidates.size());
    for (size_t i = 0; i < sl.candidates.size(); ++i)
      sl.rel_err[i] = sample_error(samples[static_cast<size_t>(s)], cols, sl.candidates[i], o.rotate ? sg.data() : nullptr, o.quant);
  };
  if (pool != nullptr) pool->run(static_cast<int64_t>(a.slots.size()), [&](int64_t s, int) { measure(s); });
  else
    for (int64_t s = 0; s < static_cast<int64_t>(a.slots.size()); ++s) measure(s);

  // Calibrated layers: one slot per expert, the layer's alpha split by the experts' shares, the
  // layer's measured errors for each; quantized formats only (a layer's experts share one sign
  // vector, so none may stay bf16); its sign vector becomes a fixed cost.
  if (o.expert_shares != nullptr) {
    std::vector<AllocSlot> out;
    for (size_t i = 0; i < a.slots.size(); ++i) {
      auto es = expert_slot.find(i);
      const auto sh = es == expert_slot.end() ? o.expert_shares->end() : o.expert_shares->find(es->second.layer);
      if (sh == o.expert_shares->end()) {
        out.push_back(std::move(a.slots[i]));
        continue;
      }
      const AllocSlot& l = a.slots[i];
      const int n = es->second.n;
      if (static_cast<int>(sh->second.size()) != n)
        fail("calibration: layer %d has %zu expert shares for %d experts", es->second.layer, sh->second.size(), n);
      if (o.rotate) a.fixed_bytes += static_cast<uint64_t>(slot_cols[i]);
      for (int e = 0; e < n; ++e) {
        AllocSlot x;
        x.key = expert_slot_key(es->second.layer, e, es->second.down);
        x.cls = l.cls;
        x.params = l.params / n;
        x.weight = l.weight * sh->second[static_cast<size_t>(e)];
        for (size_t c = 0; c < l.candidates.size(); ++c) {
          if (l.candidates[c].keep) continue;
          x.candidates.push_back(l.candidates[c]);
          x.bytes.push_back((l.bytes[c] - (o.rotate ? static_cast<uint64_t>(slot_cols[i]) : 0)) / static_cast<uint64_t>(n));
          x.rel_err.push_back(l.rel_err[c]);
        }
        out.push_back(std::move(x));
      }
    }
    a.slots = std::move(out);
  }
  const double budget = o.target_bpw * static_cast<double>(a.params) / 8.0 - static_cast<double>(a.fixed_bytes);
  uint64_t min_bytes = a.fixed_bytes;
  for (const AllocSlot& s : a.slots) min_bytes += *std::min_element(s.bytes.begin(), s.bytes.end());
  if (budget <= 0 || min_bytes > o.target_bpw * static_cast<double>(a.params) / 8.0)
    fail("--target-bpw %.3f is below what this checkpoint can reach: %.3f bits per weight (the smallest formats, with its "
         "bf16 tensors)", o.target_bpw, 8.0 * static_cast<double>(min_bytes) / static_cast<double>(a.params));
  a.bytes = a.fixed_bytes + choose(&a.slots, static_cast<uint64_t>(budget));
  for (const AllocSlot& s : a.slots) {
    a.specs[s.key] = s.candidates[static_cast<size_t>(s.chosen)];
    a.estimated_loss += s.weight * s.rel_err[static_cast<size_t>(s.chosen)];
  }
  return a;
}

}  // namespace spool::quant
