#include "lora/lora_set.h"

#include "common/error.h"

namespace spool::lora {

namespace {

uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

constexpr uint64_t kFnvBasis = 1469598103934665603ull;  // FNV-1a 64

uint64_t content_hash(const Adapter& ad) {
  uint64_t h = kFnvBasis;
  auto mix = [&](const void* p, size_t n) { h = fnv(h, p, n); };
  auto mix_str = [&](const std::string& s) { mix(s.data(), s.size() + 1); };
  auto mix_floats = [&](const std::vector<float>& v) { mix(v.data(), v.size() * sizeof(float)); };
  for (const DenseLora& d : ad.dense) {
    mix_str(d.name);
    mix(&d.rank, sizeof d.rank);
    mix(&d.scale, sizeof d.scale);
    mix_floats(d.a);
    mix_floats(d.b);
  }
  for (const ExpertLora& e : ad.experts) {  // (PEFT's scalings come from the config below; GGUF's with the wrapper)
    mix_str(e.name);
    for (const ExpertWrapper& w : e.wrappers) {
      mix_str(w.module);
      const int target = static_cast<int>(w.target);
      mix(&target, sizeof target);
      mix(&w.rank, sizeof w.rank);
      mix(&w.scale, sizeof w.scale);
      mix_floats(w.a);
      mix_floats(w.b);
    }
  }
  const PeftConfig& c = ad.config;
  mix(&c.r, sizeof c.r);
  mix(&c.lora_alpha, sizeof c.lora_alpha);
  mix(&c.use_rslora, sizeof c.use_rslora);
  for (const auto& [p, v] : c.rank_pattern) mix_str(p + "=" + std::to_string(v));
  for (const auto& [p, v] : c.alpha_pattern) mix_str(p + "=" + std::to_string(v));
  return h;
}

}  // namespace

void LoraSet::add(Adapter adapter, float scale) {
  const std::string base = adapter.name;
  for (int k = 2;; ++k) {  // unique names
    bool taken = false;
    for (const Adapter& a : adapters_) taken = taken || a.name == adapter.name;
    if (!taken) break;
    adapter.name = base + "-" + std::to_string(k);
  }
  dense_used_.emplace_back(adapter.dense.size(), 0);
  experts_used_.emplace_back(adapter.experts.size(), 0);
  content_hash_.push_back(content_hash(adapter));
  adapters_.push_back(std::move(adapter));
  scales_.push_back(scale);
}

uint64_t LoraSet::bytes() const {
  uint64_t n = 0;
  for (const Adapter& a : adapters_) n += a.bytes();
  for (const std::vector<float>& v : relaid_) n += v.size() * sizeof(float);
  return n;
}

std::string LoraSet::fingerprint(const std::vector<float>& scales) const {
  if (scales.size() != adapters_.size())
    fail("LoRA: %zu scales given for %zu adapters", scales.size(), adapters_.size());
  uint64_t h = kFnvBasis;
  bool any = false;
  for (size_t ai = 0; ai < adapters_.size(); ++ai) {
    if (scales[ai] == 0.0f) continue;
    any = true;
    h = fnv(h, &ai, sizeof ai);
    h = fnv(h, &content_hash_[ai], sizeof(uint64_t));
    h = fnv(h, &scales[ai], sizeof(float));
  }
  return any ? strfmt("%016llx", static_cast<unsigned long long>(h)) : std::string();
}

const ops::LoraDelta* LoraSet::dense(const std::string& name, int64_t rows, int64_t cols) {
  ops::LoraDelta d;
  for (size_t ai = 0; ai < adapters_.size(); ++ai) {
    const Adapter& ad = adapters_[ai];
    for (size_t i = 0; i < ad.dense.size(); ++i) {
      const DenseLora& m = ad.dense[i];
      if (m.name != name) continue;
      if (m.in != cols || m.out != rows)
        fail("LoRA adapter %s: '%s': shape mismatch: lora_A [%lld, %lld] and lora_B [%lld, %lld] do not fit the model's "
             "[%lld, %lld] weight",
             ad.path.c_str(), m.module.c_str(), (long long)m.rank, (long long)m.in, (long long)m.out, (long long)m.rank,
             (long long)rows, (long long)cols);
      dense_used_[ai][i] = 1;
      std::vector<float>& bt = relaid_.emplace_back(static_cast<size_t>(m.rank * rows));  // B^T [rank, rows]
      for (int64_t o = 0; o < rows; ++o)
        for (int64_t k = 0; k < m.rank; ++k) bt[k * rows + o] = m.b[o * m.rank + k];
      d.terms.push_back({m.a.data(), bt.data(), m.rank, m.scale, rows, static_cast<int>(ai), &scales_[ai]});
    }
  }
  if (d.terms.empty()) return nullptr;
  d.rows = rows;
  d.cols = cols;
  dense_.push_back(std::move(d));
  return &dense_.back();
}

const ExpertDeltas* LoraSet::experts(const std::string& name, int n_experts, int64_t hidden, int64_t inter) {
  const int64_t E = n_experts;
  ExpertDeltas out;
  out.gate.resize(E);
  out.up.resize(E);
  out.down.resize(E);
  bool any = false;
  for (size_t ai = 0; ai < adapters_.size(); ++ai) {
    const Adapter& ad = adapters_[ai];
    for (size_t i = 0; i < ad.experts.size(); ++i) {
      const ExpertLora& x = ad.experts[i];
      if (x.name != name) continue;
      experts_used_[ai][i] = 1;
      // Slots: PEFT's fused gate_up_proj (or a GGUF ffn_gate_up_exps), separate gate / up (GGUF
      // ffn_gate_exps / ffn_up_exps), down. PEFT wrappers are told apart by their shapes.
      enum Slot { kGateUp, kGate, kUp, kDown };
      const ExpertWrapper* slots[4] = {};
      static const char* slot_names[4] = {"gate_up_proj", "gate_proj", "up_proj", "down_proj"};
      const int64_t want_in[4] = {hidden, hidden, hidden, inter}, want_out[4] = {2 * inter, inter, inter, hidden};
      for (const ExpertWrapper& w : x.wrappers) {
        int slot;
        if (w.target != ExpertWrapper::Target::kByShape) {
          slot = w.target == ExpertWrapper::Target::kGate ? kGate : w.target == ExpertWrapper::Target::kUp ? kUp
                 : w.target == ExpertWrapper::Target::kDown ? kDown : kGateUp;
          if (w.in != want_in[slot] || w.out != want_out[slot])
            fail("LoRA adapter %s: '%s': shape mismatch: in %lld, out %lld; the experts' %s is in %lld, out %lld", ad.path.c_str(),
                 w.module.c_str(), (long long)w.in, (long long)w.out, slot_names[slot], (long long)want_in[slot], (long long)want_out[slot]);
        } else {
          // gate_up_proj [E, 2I, H]: in H, out 2I; down_proj [E, H, I]: in I, out H (PEFT swaps
          // a non-transposed 3D parameter's last two dims into in / out).
          const bool fits_gate_up = w.in == hidden && w.out == 2 * inter, fits_down = w.in == inter && w.out == hidden;
          if (!fits_gate_up && !fits_down)
            fail("LoRA adapter %s: '%s': shape mismatch: lora_A [%lld, %lld], lora_B [%lld, %lld] fit neither experts.gate_up_proj "
                 "(in %lld, out %lld) nor experts.down_proj (in %lld, out %lld) of %d experts",
                 ad.path.c_str(), w.module.c_str(), (long long)w.rows_a, (long long)w.in, (long long)w.out, (long long)w.rows_a,
                 (long long)hidden, (long long)(2 * inter), (long long)inter, (long long)hidden, n_experts);
          slot = fits_gate_up ? kGateUp : kDown;
        }
        if (slots[slot] != nullptr)
          fail("LoRA adapter %s: '%s' and '%s' both target experts.%s", ad.path.c_str(), slots[slot]->module.c_str(), w.module.c_str(),
               slot_names[slot]);
        slots[slot] = &w;
      }
      if (slots[kGateUp] != nullptr && (slots[kGate] != nullptr || slots[kUp] != nullptr))
        fail("LoRA adapter %s: '%s' targets the fused gate_up projection and '%s' a part of it", ad.path.c_str(),
             slots[kGateUp]->module.c_str(), (slots[kGate] != nullptr ? slots[kGate] : slots[kUp])->module.c_str());
      for (int slot = 0; slot < 4; ++slot) {
        const ExpertWrapper* w = slots[slot];
        if (w == nullptr) continue;
        if (w->rows_a % E != 0)
          fail("LoRA adapter %s: '%s': shape mismatch: lora_A has %lld rows, not a multiple of the %d experts", ad.path.c_str(),
               w->module.c_str(), (long long)w->rows_a, n_experts);
        const int64_t r = w->rows_a / E;
        float s = w->scale;
        if (w->rank == 0) {  // PEFT: rank and scaling from adapter_config.json
          const std::string key = x.module + (slot == kGateUp ? ".gate_up_proj" : ".down_proj");
          const auto [rank, scale] = ad.config.rank_and_scaling(key);
          if (rank != r)
            fail("LoRA adapter %s: '%s': shape mismatch: rank %lld per expert (lora_A %lld rows / %d experts), adapter_config.json "
                 "gives r = %lld for %s",
                 ad.path.c_str(), w->module.c_str(), (long long)r, (long long)w->rows_a, n_experts, (long long)rank, key.c_str());
          s = scale;
        } else if (w->rank != r) {
          fail("LoRA adapter %s: '%s': rank %lld per expert, but lora_A has %lld rows for %d experts", ad.path.c_str(), w->module.c_str(),
               (long long)w->rank, (long long)w->rows_a, n_experts);
        }
        // B [out, r*E] with column k*E + e (ParamWrapper.get_delta_weight) -> per expert B_e^T
        // [r, O] for each projection it covers (the fused gate_up's rows [0, I) are gate's, [I, 2I)
        // up's: two arrays, so each projection's B^T is contiguous).
        const int64_t parts = slot == kGateUp ? 2 : 1, O = w->out / parts;
        std::vector<float>* bts[2] = {};
        for (int64_t part = 0; part < parts; ++part) {
          std::vector<float>& bt = relaid_.emplace_back(static_cast<size_t>(E * r * O));
          for (int64_t e = 0; e < E; ++e)
            for (int64_t k = 0; k < r; ++k)
              for (int64_t o = 0; o < O; ++o) bt[(e * r + k) * O + o] = w->b[(part * O + o) * (r * E) + k * E + e];
          bts[part] = &bt;
        }
        // (the user's scale: per row, ops::lora_add)
        const int id = static_cast<int>(ai);
        const float* user = &scales_[ai];
        for (int64_t e = 0; e < E; ++e) {
          const float* a = w->a.data() + e * r * w->in;  // A rows e*r .. e*r + r - 1
          const float* be = bts[0]->data() + e * r * O;
          switch (slot) {
            case kGateUp:  // one A for both halves
              out.gate[e].terms.push_back({a, be, r, s, O, id, user});
              out.up[e].terms.push_back({a, bts[1]->data() + e * r * O, r, s, O, id, user});
              break;
            case kGate: out.gate[e].terms.push_back({a, be, r, s, O, id, user}); break;
            case kUp: out.up[e].terms.push_back({a, be, r, s, O, id, user}); break;
            default: out.down[e].terms.push_back({a, be, r, s, O, id, user});
          }
        }
        any = true;
      }
    }
  }
  if (!any) return nullptr;
  for (int64_t e = 0; e < E; ++e) {  // the weights' shapes: gate / up [inter, hidden], down [hidden, inter]
    out.gate[e].rows = out.up[e].rows = out.down[e].cols = inter;
    out.gate[e].cols = out.up[e].cols = out.down[e].rows = hidden;
  }
  experts_.push_back(std::move(out));
  return &experts_.back();
}

void LoraSet::for_each_delta(const std::function<void(const ops::LoraDelta&)>& fn) const {
  for (const ops::LoraDelta& d : dense_) fn(d);
  for (const ExpertDeltas& x : experts_)
    for (const auto* v : {&x.gate, &x.up, &x.down})
      for (const ops::LoraDelta& d : *v)
        if (!d.terms.empty()) fn(d);
}

void LoraSet::check_all_bound() const {
  std::string missing;
  int n = 0;
  for (size_t ai = 0; ai < adapters_.size(); ++ai) {
    const Adapter& ad = adapters_[ai];
    auto note = [&](const std::string& module) {
      if (n++ < 4) missing += (missing.empty() ? "" : ", ") + module;
    };
    for (size_t i = 0; i < ad.dense.size(); ++i)
      if (!dense_used_[ai][i]) note(ad.dense[i].module);
    for (size_t i = 0; i < ad.experts.size(); ++i)
      if (!experts_used_[ai][i]) note(ad.experts[i].module);
    if (n > 0)
      fail("LoRA adapter %s targets %d module(s) this model does not run as a plain linear layer or routed experts: %s%s",
           ad.path.c_str(), n, missing.c_str(), n > 4 ? ", ..." : "");
  }
}

}  // namespace spool::lora
