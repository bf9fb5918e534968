#include "models/state.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/error.h"

namespace spool::models {

namespace {

constexpr char kImageMagic[4] = {'S', 'P', 'S', 'T'};
// Version 2: attention layers record their sliding window and a windowed layer stores only the
// rows its window still needs (version 1 stored every position of every layer).
constexpr uint32_t kImageVersion = 2;
constexpr uint32_t kLayerAttention = 1, kLayerGdn = 2;

uint32_t kv_code(ops::KvType t) { return t == ops::KvType::kF32 ? 0 : t == ops::KvType::kF16 ? 1 : 2; }
const char* kv_name(uint32_t code) { return code == 0 ? "f32" : code == 1 ? "f16" : code == 2 ? "int8" : "unknown"; }

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Bounds-checked little-endian reads from a state image.
struct Reader {
  std::string_view d;
  size_t off = 0;
  template <class T>
  T get(const char* what) {
    if (d.size() - off < sizeof(T)) fail("state image is truncated (%s at byte %zu of %zu)", what, off, d.size());
    T v;
    std::memcpy(&v, d.data() + off, sizeof v);
    off += sizeof v;
    return v;
  }
  std::string_view bytes(uint64_t n, const char* what) {
    if (d.size() - off < n) fail("state image is truncated (%s: %llu bytes at byte %zu of %zu)", what, (unsigned long long)n, off, d.size());
    std::string_view v = d.substr(off, static_cast<size_t>(n));
    off += static_cast<size_t>(n);
    return v;
  }
};

}  // namespace

uint64_t StateSnapshot::bytes() const {
  uint64_t n = 0;
  for (const auto& g : gdn_) n += (g.conv.size() + g.recurrent.size()) * sizeof(float);
  for (const auto& c : kv_) n += c.bytes();
  return n;
}

State::Identity::Identity() {
  static std::atomic<uint64_t> next{1};
  v = next.fetch_add(1, std::memory_order_relaxed);
}

int64_t State::kv_window(const ModelSpec& spec, int layer) {
  const bool mla = layer >= 0 && layer < static_cast<int>(spec.mixers.size()) && spec.mixers[layer] == MixerKind::kMLA;
  return !mla && spec.attn.window_bounds_kv && spec.attn.windowed(layer) ? spec.attn.sliding_window : 0;
}

State::State(const ModelSpec& spec, ops::KvType kv) {
  attn.resize(spec.n_layers);
  gdn.resize(spec.n_layers);
  is_attn_.resize(spec.n_layers);
  const GdnSpec& g = spec.gdn;
  for (int i = 0; i < spec.n_layers; ++i) {
    is_attn_[i] = spec.mixers[i] == MixerKind::kAttention || spec.mixers[i] == MixerKind::kMLA;
    if (spec.mixers[i] == MixerKind::kMLA) {  // latent cache: [c | k_pe] per position, keys only
      attn[i].configure(kv, 1, spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim, true);
    } else if (is_attn_[i]) {
      attn[i].configure(kv, spec.attn_of(i).n_kv_heads, spec.attn_of(i).head_dim, false, kv_window(spec, i));
    } else {
      gdn[i].conv.assign(static_cast<size_t>(g.conv_dim() * (g.conv_kernel - 1)), 0.0f);
      gdn[i].recurrent.assign(static_cast<size_t>(g.n_v) * g.d_k * g.d_v, 0.0f);
    }
  }
}

void State::place(ops::Device device) {
  if (device == ops::Device::kCpu) {
    if (!gdn_dev_.empty()) pull_gdn(gdn);
    gdn_dev_.clear();
    device_ = device;
    alloc_trail();
    return;
  }
  if (!gdn_dev_.empty()) return;
  device_ = device;
  alloc_trail();
  std::vector<ops::DeviceFloats> d(gdn.size());
  for (size_t l = 0; l < gdn.size(); ++l)
    if (!gdn[l].recurrent.empty()) d[l] = ops::DeviceFloats(device, gdn[l].conv.size() + gdn[l].recurrent.size());
  gdn_dev_ = std::move(d);
  push_gdn();
}

void State::push_gdn() {
  if (gdn_dev_.empty()) return;
  std::vector<float> buf;
  for (size_t l = 0; l < gdn.size(); ++l) {
    if (gdn_dev_[l].empty()) continue;
    buf.assign(gdn[l].conv.begin(), gdn[l].conv.end());
    buf.insert(buf.end(), gdn[l].recurrent.begin(), gdn[l].recurrent.end());
    gdn_dev_[l].upload(buf.data());
  }
}

void State::pull_gdn(std::vector<GdnState>& dst) const {
  if (gdn_dev_.empty()) return;
  std::vector<float> buf;
  for (size_t l = 0; l < gdn.size(); ++l) {
    if (gdn_dev_[l].empty()) continue;
    buf.resize(gdn_dev_[l].size());
    gdn_dev_[l].download(buf.data());
    const size_t nc = dst[l].conv.size();
    std::copy(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(nc), dst[l].conv.begin());
    std::copy(buf.begin() + static_cast<std::ptrdiff_t>(nc), buf.end(), dst[l].recurrent.begin());
  }
}

void State::reserve(int64_t n_positions) {
  for (size_t l = 0; l < attn.size(); ++l)
    if (is_attn_[l]) attn[l].reserve(n_positions, pos);
}

void State::reset() {
  pos = 0;
  poisoned = false;
  for (auto& c : attn)
    if (c.window() > 0) c.clear();
  for (auto& g : gdn) {
    std::fill(g.conv.begin(), g.conv.end(), 0.0f);
    std::fill(g.recurrent.begin(), g.recurrent.end(), 0.0f);
  }
  push_gdn();
  record_rewind(0);
}

uint64_t State::bytes() const {
  uint64_t n = 0;
  for (const auto& c : attn) n += c.bytes();
  for (const auto& g : gdn) n += (g.conv.size() + g.recurrent.size()) * sizeof(float);
  return n;
}

bool State::has_recurrent() const {
  return std::any_of(gdn.begin(), gdn.end(), [](const GdnState& g) { return !g.recurrent.empty(); });
}

bool State::has_windowed_kv() const {
  return std::any_of(attn.begin(), attn.end(), [](const AttnCache& c) { return c.window() > 0; });
}

void State::keep_step_trail(int n) {
  if (n < 0) fail("keep_step_trail: %d tokens", n);
  trail_cap_ = n;
  step_pos0_ = -1;
  step_kept_ = 0;
  alloc_trail();
}

void State::alloc_trail() {
  trail_.clear();
  trail_dev_.clear();
  if (trail_cap_ == 0 || !has_recurrent()) return;
  if (device_ == ops::Device::kCpu) trail_.resize(gdn.size());
  else trail_dev_.resize(gdn.size());
  for (size_t l = 0; l < gdn.size(); ++l) {
    if (gdn[l].recurrent.empty()) continue;
    const size_t n = static_cast<size_t>(trail_cap_) * (gdn[l].conv.size() + gdn[l].recurrent.size());
    if (device_ == ops::Device::kCpu) trail_[l].assign(n, 0.0f);
    else trail_dev_[l] = ops::DeviceFloats(device_, n);
  }
}

void State::rewind_in_step(int64_t p) {
  if (poisoned) fail("rewind_in_step: the state is incomplete after an earlier error");
  if (p == pos) return;
  if (step_pos0_ < 0 || p <= step_pos0_ || p > step_pos0_ + step_kept_ || p > pos)
    fail("rewind_in_step: position %lld is not inside the last step's kept tokens (%lld..%lld, now at %lld)", (long long)p,
         (long long)step_pos0_ + 1, (long long)(step_pos0_ + step_kept_), (long long)pos);
  if (has_windowed_kv()) fail("rewind_in_step: sliding-window layers cannot be cut back inside a step");
  const size_t j = static_cast<size_t>(p - step_pos0_ - 1);
  for (size_t l = 0; l < gdn.size(); ++l) {
    if (gdn[l].recurrent.empty()) continue;
    const size_t nc = gdn[l].conv.size(), nr = gdn[l].recurrent.size(), slot = j * (nc + nr);
    if (device_ == ops::Device::kCpu) {
      std::copy_n(trail_[l].begin() + static_cast<std::ptrdiff_t>(slot), nc, gdn[l].conv.begin());
      std::copy_n(trail_[l].begin() + static_cast<std::ptrdiff_t>(slot + nc), nr, gdn[l].recurrent.begin());
    } else {
      ops::device_copy(device_, gdn_dev_[l].data(), trail_dev_[l].data() + slot, (nc + nr) * sizeof(float));
    }
  }
  pos = p;
  step_kept_ = p - step_pos0_;  // the kept slots up to p stay valid
  record_rewind(p);
}

void State::record_rewind(int64_t to) {
  mtp_pos = std::min(mtp_pos, to);
  ++epoch_;
  while (!rewinds_.empty() && rewinds_.back().second >= to) rewinds_.pop_back();
  rewinds_.emplace_back(epoch_, to);
}

void State::check_kv_less(const StateSnapshot& s, const char* what) const {
  if (s.owner_ != id_.v) fail("%s: the snapshot holds no KV rows and was taken from another state", what);
  auto it = std::upper_bound(rewinds_.begin(), rewinds_.end(), s.epoch_,
                             [](uint64_t e, const std::pair<uint64_t, int64_t>& r) { return e < r.first; });
  if (it != rewinds_.end() && it->second < s.pos_)
    fail("%s: the snapshot at position %lld is stale (the state was rewound to %lld since, overwriting its KV rows)", what,
         (long long)s.pos_, (long long)it->second);
  if (pos < s.pos_) fail("%s: the snapshot at position %lld is ahead of the state (position %lld)", what, (long long)s.pos_, (long long)pos);
}

namespace {

// Throws unless `s` (not default-constructed) fits a state with these layers.
void check_fits(const StateSnapshot& s, const std::vector<GdnState>& gdn_live, const std::vector<AttnCache>& attn_live,
                const std::vector<GdnState>& gdn_snap, const std::vector<ops::KvCache>& kv_snap, const char* what) {
  if (s.pos() < 0) fail("%s: the snapshot is empty (default-constructed)", what);
  if (gdn_snap.size() != gdn_live.size()) fail("%s: the snapshot has %zu layers, the state %zu", what, gdn_snap.size(), gdn_live.size());
  for (size_t l = 0; l < gdn_live.size(); ++l) {
    if (gdn_snap[l].conv.size() != gdn_live[l].conv.size() || gdn_snap[l].recurrent.size() != gdn_live[l].recurrent.size())
      fail("%s: layer %zu's recurrent state has another size in the snapshot", what, l);
    const ops::KvCache& b = attn_live[l];
    const bool snap_window = l < kv_snap.size() && kv_snap[l].window() > 0;
    if (b.head_dim() == 0 || (!s.has_kv() && b.window() == 0 && !snap_window)) continue;  // no KV rows in the snapshot
    if (l >= kv_snap.size()) fail("%s: layer %zu keeps a sliding window of %lld positions, the snapshot has no rows for it", what, l,
                                  (long long)b.window());
    const ops::KvCache& a = kv_snap[l];
    if (a.type() != b.type() || a.n_kv_heads() != b.n_kv_heads() || a.head_dim() != b.head_dim())
      fail("%s: layer %zu's KV cache has another type or geometry in the snapshot (%s %d x %d, state %s %d x %d)", what, l,
           kv_name(kv_code(a.type())), a.n_kv_heads(), a.head_dim(), kv_name(kv_code(b.type())), b.n_kv_heads(), b.head_dim());
    if (a.window() != b.window())
      fail("%s: layer %zu's KV cache keeps a window of %lld positions in the snapshot, %lld in the state (0: all)", what, l,
           (long long)a.window(), (long long)b.window());
  }
}

}  // namespace

StateSnapshot State::snapshot(bool with_kv) const {
  if (poisoned) fail("cannot snapshot a state left incomplete by an earlier error");
  StateSnapshot s;
  s.pos_ = pos;
  s.owner_ = id_.v;
  s.epoch_ = epoch_;
  s.has_kv_ = with_kv;
  s.gdn_ = gdn;
  pull_gdn(s.gdn_);
  // Windowed layers' rows always (the live ones are overwritten as the window moves on): at
  // most window - 1 rows each; every attention layer's with_kv.
  if (with_kv || has_windowed_kv()) {
    s.kv_.resize(attn.size());
    for (size_t l = 0; l < attn.size(); ++l) {
      if (!is_attn_[l] || (!with_kv && attn[l].window() == 0)) continue;
      s.kv_[l].configure(attn[l].type(), attn[l].n_kv_heads(), attn[l].head_dim(), attn[l].keys_only(), attn[l].window());
      if (pos > 0) s.kv_[l].copy_prefix(attn[l], pos);
    }
  }
  return s;
}

void State::restore(const StateSnapshot& s) {
  check_fits(s, gdn, attn, s.gdn_, s.kv_, "restore");
  // KV rows [0, s.pos_) of a snapshot with KV replace the live ones: KV-less snapshots of this
  // state up to s.pos_ stay valid only when it is this state's own, still-valid snapshot.
  int64_t rewind_to = s.pos_;
  if (s.has_kv_) {
    bool own_and_valid = s.owner_ == id_.v;
    if (own_and_valid) {
      try {
        check_kv_less(s, "restore");
      } catch (const Error&) {
        own_and_valid = false;
      }
    }
    if (!own_and_valid) rewind_to = 0;
    for (size_t l = 0; l < attn.size(); ++l)
      if (is_attn_[l] && (s.pos_ > 0 || attn[l].window() > 0)) attn[l].copy_prefix(s.kv_[l], s.pos_);
  } else {
    check_kv_less(s, "restore");
    for (size_t l = 0; l < attn.size(); ++l)  // windowed layers: the snapshot's rows
      if (is_attn_[l] && attn[l].window() > 0) attn[l].copy_prefix(s.kv_[l], s.pos_);
  }
  for (size_t l = 0; l < gdn.size(); ++l) {
    std::copy(s.gdn_[l].conv.begin(), s.gdn_[l].conv.end(), gdn[l].conv.begin());
    std::copy(s.gdn_[l].recurrent.begin(), s.gdn_[l].recurrent.end(), gdn[l].recurrent.begin());
  }
  push_gdn();
  pos = s.pos_;
  poisoned = false;
  record_rewind(rewind_to);
}

void State::truncate(int64_t n) {
  if (n < 0 || n > pos) fail("truncate: position %lld is outside [0, %lld]", (long long)n, (long long)pos);
  if (n == 0) return reset();
  if (poisoned) fail("truncate: the state is incomplete after an earlier error; reset() or restore() it");
  if (n == pos) return;
  if (has_recurrent())
    fail("truncate: this model has recurrent (Gated DeltaNet) layers, which cannot be cut back to position %lld; "
         "restore() a snapshot taken there",
         (long long)n);
  for (size_t l = 0; l < attn.size(); ++l)
    if (attn[l].window() > 0 && !attn[l].holds(n))
      fail("truncate: layer %zu keeps a sliding window of %lld positions and no longer holds the rows position %lld needs "
           "(it holds positions from %lld); restore() a snapshot taken there",
           l, (long long)attn[l].window(), (long long)n, (long long)attn[l].base());
  pos = n;
  record_rewind(n);
}

void State::serialize(std::string& out) const {
  if (poisoned) fail("cannot serialize a state left incomplete by an earlier error");
  serialize(snapshot(false), out);
}

void State::serialize(const StateSnapshot& at, std::string& out) const {
  check_fits(at, gdn, attn, at.gdn_, at.kv_, "serialize");
  if (!at.has_kv_) check_kv_less(at, "serialize");
  const int64_t n = at.pos_;
  out.append(kImageMagic, 4);
  put<uint32_t>(out, kImageVersion);
  put<int64_t>(out, n);
  put<uint32_t>(out, static_cast<uint32_t>(attn.size()));
  for (size_t l = 0; l < attn.size(); ++l) {
    if (is_attn_[l]) {
      const ops::KvCache& c = at.has_kv_ || attn[l].window() > 0 ? at.kv_[l] : attn[l];
      put<uint32_t>(out, kLayerAttention);
      put<uint32_t>(out, kv_code(c.type()));
      put<uint32_t>(out, static_cast<uint32_t>(c.n_kv_heads()));
      put<uint32_t>(out, static_cast<uint32_t>(c.head_dim()));
      put<uint64_t>(out, static_cast<uint64_t>(c.window()));
      put<uint64_t>(out, c.saved_bytes(n));
      c.save_prefix(n, out);
    } else {
      const GdnState& g = at.gdn_[l];
      put<uint32_t>(out, kLayerGdn);
      put<uint64_t>(out, g.conv.size());
      put<uint64_t>(out, g.recurrent.size());
      out.append(reinterpret_cast<const char*>(g.conv.data()), g.conv.size() * sizeof(float));
      out.append(reinterpret_cast<const char*>(g.recurrent.data()), g.recurrent.size() * sizeof(float));
    }
  }
}

void State::deserialize(std::string_view data, int64_t n) {
  Reader r{data};
  // Check everything first; only then touch the state.
  if (data.size() < 4 || std::memcmp(data.data(), kImageMagic, 4) != 0) fail("not a state image (bad magic)");
  r.off = 4;
  const uint32_t version = r.get<uint32_t>("version");
  if (version != kImageVersion)
    fail("state image version %u is not supported (this build reads version %u%s)", version, kImageVersion,
         version < kImageVersion ? "; the image was written by an older spool and must be recomputed" : "");
  const int64_t got_n = r.get<int64_t>("position count");
  if (got_n != n) fail("state image holds %lld positions, expected %lld", (long long)got_n, (long long)n);
  if (n < 0) fail("state image holds a negative position count (%lld)", (long long)n);
  const uint32_t layers = r.get<uint32_t>("layer count");
  if (layers != attn.size()) fail("state image has %u layers, this model %zu", layers, attn.size());
  std::vector<std::string_view> payload(layers), conv(layers);
  for (uint32_t l = 0; l < layers; ++l) {
    const uint32_t kind = r.get<uint32_t>("layer kind");
    if (kind != kLayerAttention && kind != kLayerGdn) fail("state image: layer %u has unknown kind %u", l, kind);
    if ((kind == kLayerAttention) != static_cast<bool>(is_attn_[l]))
      fail("state image: layer %u is %s, in this model %s", l, kind == kLayerAttention ? "attention" : "Gated DeltaNet",
           is_attn_[l] ? "attention" : "Gated DeltaNet");
    if (kind == kLayerAttention) {
      const ops::KvCache& c = attn[l];
      const uint32_t type = r.get<uint32_t>("KV type");
      const uint32_t heads = r.get<uint32_t>("KV heads");
      const uint32_t hd = r.get<uint32_t>("head dim");
      if (type != kv_code(c.type()))
        fail("state image: layer %u holds %s KV entries, this state %s (another --kv-bits)", l, kv_name(type), kv_name(kv_code(c.type())));
      if (heads != static_cast<uint32_t>(c.n_kv_heads()) || hd != static_cast<uint32_t>(c.head_dim()))
        fail("state image: layer %u has %u KV heads x %u dims, this model %d x %d", l, heads, hd, c.n_kv_heads(), c.head_dim());
      const uint64_t window = r.get<uint64_t>("KV window");
      if (window != static_cast<uint64_t>(c.window()))
        fail("state image: layer %u keeps a sliding window of %llu positions, this state %lld (0: every position)", l,
             (unsigned long long)window, (long long)c.window());
      const uint64_t len = r.get<uint64_t>("KV byte count");
      const uint64_t want = c.saved_bytes(n);
      if (len != want) fail("state image: layer %u has %llu KV bytes, expected %llu for positions [%lld, %lld)", l, (unsigned long long)len,
                            (unsigned long long)want, (long long)c.first_kept(n), (long long)n);
      payload[l] = r.bytes(len, "KV rows");
    } else {
      const GdnState& g = gdn[l];
      const uint64_t nc = r.get<uint64_t>("conv size"), nr = r.get<uint64_t>("recurrent size");
      if (nc != g.conv.size() || nr != g.recurrent.size())
        fail("state image: layer %u has a %llu + %llu float recurrent state, this model %zu + %zu", l, (unsigned long long)nc,
             (unsigned long long)nr, g.conv.size(), g.recurrent.size());
      conv[l] = r.bytes(nc * sizeof(float), "conv state");
      payload[l] = r.bytes(nr * sizeof(float), "recurrent state");
    }
  }
  if (r.off != data.size()) fail("state image has %zu bytes after its last layer", data.size() - r.off);
  for (uint32_t l = 0; l < layers; ++l) {
    if (is_attn_[l]) {
      attn[l].load_prefix(payload[l], n);
    } else {
      std::memcpy(gdn[l].conv.data(), conv[l].data(), conv[l].size());
      std::memcpy(gdn[l].recurrent.data(), payload[l].data(), payload[l].size());
    }
  }
  push_gdn();
  pos = n;
  poisoned = false;
  record_rewind(n);
}

}  // namespace spool::models
