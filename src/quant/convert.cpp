#include "quant/convert.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/tensor_names.h"
#include "ops/thread_pool.h"
#include "ops/weights.h"
#include "quant/allocate.h"
#include "quant/codebook.h"
#include "quant/hadamard.h"
#include "quant/quantize.h"

namespace spool::quant {

namespace fs = std::filesystem;
using io::SafetensorsWriter;
using Sink = std::function<void(const void*, uint64_t)>;

namespace {



/// Drops the source pages of `t` from this process's mapping (they stay in the page cache):
/// keeps RSS bounded while converting a checkpoint larger than RAM.
void release(const io::TensorRef& t) {
  if (t.data == nullptr || t.nbytes == 0) return;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(t.data), b = a + t.nbytes;
  const uintptr_t lo = (a + page - 1) & ~(page - 1), hi = b & ~(page - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

/// Layer of a normalised name "layers.N.…"; -1 before the layers (embeddings), INT_MAX after.
int layer_of(const std::string& n) {
  if (n.rfind("layers.", 0) == 0) return std::atoi(n.c_str() + 7);
  return n.find("embed") != std::string::npos ? -1 : 1 << 30;
}

/// Output name of a normalised name: HF-style "model." prefix (lm_head stays top-level).
std::string out_name(const std::string& n) { return n.rfind("lm_head", 0) == 0 ? n : "model." + n; }

/// The base of a quantized weight: "x.weight" -> "x"; fused-style names keep theirs.
std::string base_of(const std::string& n) { return n.ends_with(".weight") ? n.substr(0, n.size() - 7) : n; }

/// One step of the output: a few consecutive tensors and the code that produces their bytes.
struct Unit {
  std::vector<SafetensorsWriter::Spec> specs;
  int layer = 0;
  bool expert = false;       // independent small unit: produced in parallel with its neighbours
  uint64_t source_bytes = 0;
  std::vector<const io::TensorRef*> sources;  // released from the mapping once written
  std::function<void(ops::ThreadPool*, const Sink&)> produce;
};

/// The quantized tensors of a matrix: specs for {base}.qweight/.scales(/.codebook: when q stores one).
void quant_specs(std::vector<SafetensorsWriter::Spec>* specs, const std::string& base, const ClassSpec& s, int64_t rows,
                 int64_t cols, const QuantOptions& q) {
  const int g = effective_group(s.group, cols);
  const int64_t G = cols / g;
  specs->push_back({base + ".qweight", io::DType::U8, {rows, G * ops::qtype_group_bytes(s.type, g)}});
  specs->push_back({base + ".scales", io::DType::F16, {rows, G}});
  if (q.stores_codebook(s.type)) specs->push_back({base + ".codebook", io::DType::F32, {levels(s.type)}});
}

/// Quantizes the source matrix `t` ([rows, cols] float) and sends qweight, scales, codebook
/// (none for q8 unless opt keeps the fixed tables: QuantOptions::stores_codebook).
/// Rows are split over `pool` (nullptr: the calling thread only).
/// The codebook comes from fit_codebook() over the rotated source rows when opt.codebook says so.
void quantize_to(const io::TensorRef& t, const ClassSpec& s, const int8_t* signs, const QuantOptions& opt, ops::ThreadPool* pool,
                 const Sink& sink) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const int g = effective_group(s.group, cols);
  check_group(cols, g);
  const int64_t G = cols / g, rb = G * ops::qtype_group_bytes(s.type, g);
  const ops::WType wt = source_wtype(t);
  const uint64_t src_row = static_cast<uint64_t>(cols) * ops::wtype_size(wt);
  std::vector<uint8_t> qweight(static_cast<size_t>(rows * rb));
  std::vector<uint16_t> scales(static_cast<size_t>(rows * G));
  std::vector<float> cb;
  if (opt.codebook == CodebookSource::kFit) {
    try {
      cb = fit_codebook(s.type, g, rows, cols, [&](int64_t r, float* out) {
        ops::row_to_f32(wt, t.data + r * src_row, cols, out);
        if (signs != nullptr) rotate_input(signs, out, cols, out);
      }, opt.scale_search);
    } catch (const Error& e) {
      fail("%s: %s", t.name.c_str(), e.what());
    }
  } else {
    const std::span<const float> gauss = codebook(s.type);
    cb.assign(gauss.begin(), gauss.end());
  }
  const Coder coder(cb);
  auto work = [&](int64_t r0, int64_t r1) {
    constexpr int64_t kBlock = 64;
    std::vector<float> buf;
    for (int64_t b = r0; b < r1; b += kBlock) {
      const int64_t n = std::min(kBlock, r1 - b);
      buf.resize(static_cast<size_t>(n * cols));
      ops::row_to_f32(wt, t.data + b * src_row, n * cols, buf.data());
      try {
        quantize_rows(buf.data(), cols, s.type, g, signs, 0, n, qweight.data() + b * rb, scales.data() + b * G, coder,
                      opt.scale_search);
      } catch (const Error& e) {
        fail("%s (rows %lld..%lld): %s", t.name.c_str(), (long long)b, (long long)(b + n), e.what());
      }
    }
  };
  if (pool != nullptr && rows >= 64) pool->parallel_for(rows, 16, [&](int64_t r0, int64_t r1, int) { work(r0, r1); });
  else work(0, rows);
  sink(qweight.data(), qweight.size());
  sink(scales.data(), scales.size() * 2);
  if (opt.stores_codebook(s.type)) sink(cb.data(), cb.size() * 4);
}

/// Sends `t` as bf16, converting in chunks of 1M elements.
void bf16_to(const io::TensorRef& t, const Sink& sink) {
  if (t.dtype == io::DType::BF16) {
    sink(t.data, t.nbytes);
    return;
  }
  const ops::WType wt = source_wtype(t);
  const int64_t n = t.numel();
  constexpr int64_t kChunk = 1 << 20;
  std::vector<float> f;
  std::vector<uint16_t> h;
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    f.resize(static_cast<size_t>(m));
    h.resize(static_cast<size_t>(m));
    ops::row_to_f32(wt, t.data + i * ops::wtype_size(wt), m, f.data());
    for (int64_t j = 0; j < m; ++j) h[j] = ops::f32_to_bf16(f[j]);
    sink(h.data(), h.size() * 2);
  }
}


struct Planner {
  const io::Checkpoint& ck;
  const ConvertOptions& opt;
  ConvertResult* result;
  std::vector<Unit> units;
  // Sign vectors live as long as the conversion (units reference them).
  std::map<std::string, std::vector<int8_t>> signs;

  const int8_t* signs_for(const std::string& name, int64_t cols) {
    if (!opt.rotate) return nullptr;
    auto [it, fresh] = signs.try_emplace(name);
    if (fresh) it->second = rotation_signs(opt.rotation_seed, name, cols);
    return it->second.data();
  }

  void count(TensorClass c, const ClassSpec& s, int64_t params, const std::vector<SafetensorsWriter::Spec>& specs, size_t from,
             int64_t cols) {
    ClassStats& cs = result->classes[class_name(c)];
    if (c != TensorClass::kKeep && !s.keep && cols > 0) cs.groups.insert(effective_group(s.group, cols));
    cs.tensors += 1;
    cs.params += params;
    for (size_t i = from; i < specs.size(); ++i) cs.bytes += specs[i].nbytes();
  }

  /// A non-expert tensor: kept (bf16) or quantized with its own sign vector.
  void plain(const io::TensorRef& t) {
    TensorClass c = opt.keep_float != nullptr && opt.keep_float(t.name) ? TensorClass::kKeep : classify(t.name, t.shape);
    if (c == TensorClass::kEmbed && opt.recipe.spec_for(t.name, c).keep) c = TensorClass::kKeep;  // counted as "kept", as before the class
    const ClassSpec& s = opt.recipe.spec_for(t.name, c);
    Unit u;
    u.layer = layer_of(t.name);
    u.source_bytes = t.nbytes;
    u.sources.push_back(&t);
    if (c == TensorClass::kKeep || s.keep || t.numel() == 0) {
      u.specs.push_back({out_name(t.name), io::DType::BF16, t.shape});
      u.produce = [&t](ops::ThreadPool*, const Sink& sink) { bf16_to(t, sink); };
    } else {
      const std::string base = out_name(base_of(t.name));
      const int64_t cols = t.shape[1];
      quant_specs(&u.specs, base, s, t.shape[0], cols, opt.quant);
      const int8_t* sg = signs_for(t.name, cols);
      if (sg != nullptr) u.specs.push_back({base + ".signs", io::DType::I8, {cols}});
      u.produce = [&t, &s, sg, cols, q = opt.quant](ops::ThreadPool* pool, const Sink& sink) {
        quantize_to(t, s, sg, q, pool, sink);
        if (sg != nullptr) sink(sg, static_cast<uint64_t>(cols));
      };
    }
    count(c, s, t.numel(), u.specs, 0, t.numel() == 0 || t.shape.size() != 2 ? 0 : t.shape[1]);
    units.push_back(std::move(u));
  }

  /// The routed experts of `layer`: the two shared sign vectors, then expert by expert.
  /// gpt-oss: gate is the fused gate_up [2I, H] (interleaved rows, no up projection); MXFP4
  /// experts (HF blocks + E8M0 scales) are kept as they are, as per-expert
  /// `.blocks` / `.e8m0_scales` tensors.
  void experts(int layer, int n_experts) {
    const io::TensorRef& d0 = ck.expert(layer, 0, io::ExpertProj::kDown);
    const bool mx0 = d0.expert_part == io::ExpertPart::kMxBlocks;
    const int64_t H = d0.shape[0], I = mx0 ? d0.shape[1] * 32 : d0.shape[1];
    const bool fused = !ck.has_expert(layer, 0, io::ExpertProj::kUp);
    // Seeds come from the name without ".signs" (layers.L.mlp.experts.gate_up / .down).
    const std::string gu_file = io::expert_signs_name(layer, io::ExpertProj::kGate);
    const std::string dn_file = io::expert_signs_name(layer, io::ExpertProj::kDown);
    const std::string gu_name = gu_file.substr(0, gu_file.size() - 6), dn_name = dn_file.substr(0, dn_file.size() - 6);
    // Per expert: its own format (a calibrated allocation), else its layer's, else the class's.
    auto spec_of = [&](int e, bool down) -> const ClassSpec& {
      auto it = opt.recipe.tensor_specs.find(expert_slot_key(layer, e, down));
      if (it != opt.recipe.tensor_specs.end()) return it->second;
      return opt.recipe.spec_for(down ? dn_name : gu_name, down ? TensorClass::kExpertDown : TensorClass::kExpertGateUp);
    };
    bool gu_quant = false, dn_quant = false;  // the layer's sign vectors are written when any expert is quantized
    for (int e = 0; e < n_experts; ++e) {
      gu_quant |= !spec_of(e, false).keep;
      dn_quant |= !spec_of(e, true).keep;
    }
    const int8_t* gu = gu_quant ? signs_for(gu_name, H) : nullptr;
    const int8_t* dn = dn_quant ? signs_for(dn_name, I) : nullptr;
    for (auto [sg, name, cols] : {std::tuple{gu, gu_name, H}, std::tuple{dn, dn_name, I}}) {
      if (sg == nullptr) continue;
      Unit u;
      u.layer = layer;
      u.specs.push_back({out_name(name + ".signs"), io::DType::I8, {cols}});
      u.produce = [sg = sg, cols = cols](ops::ThreadPool*, const Sink& sink) { sink(sg, static_cast<uint64_t>(cols)); };
      const TensorClass c = name == gu_name ? TensorClass::kExpertGateUp : TensorClass::kExpertDown;
      result->classes[class_name(c)].bytes += static_cast<uint64_t>(cols);
      units.push_back(std::move(u));
    }
    for (int e = 0; e < n_experts; ++e) {
      Unit u;
      u.layer = layer;
      u.expert = true;
      std::vector<std::pair<const io::TensorRef*, const ClassSpec*>> parts;
      std::vector<const int8_t*> part_signs;
      for (io::ExpertProj p : {io::ExpertProj::kGate, io::ExpertProj::kUp, io::ExpertProj::kDown}) {
        if (fused && p == io::ExpertProj::kUp) continue;
        const io::TensorRef& t = ck.expert(layer, e, p);
        const bool down = p == io::ExpertProj::kDown;
        const ClassSpec& s = spec_of(e, down);
        const int64_t gate_rows = fused ? 2 * I : I;
        if (t.expert_part == io::ExpertPart::kMxBlocks) {  // MXFP4: blocks and scales copied as stored
          const io::TensorRef* sc = ck.expert_part(layer, e, p, io::ExpertPart::kMxScales);
          const int64_t rows = down ? H : gate_rows, cols = down ? I : H;
          if (sc == nullptr || t.shape != std::vector<int64_t>{rows, cols / 32, 16} || sc->shape != std::vector<int64_t>{rows, cols / 32})
            fail("%s: MXFP4 expert tensor '%s' has shape %s (scales %s), expected [%lld, %lld, 16]", ck.dir().c_str(), t.name.c_str(),
                 t.shape_str().c_str(), sc ? sc->shape_str().c_str() : "missing", (long long)rows, (long long)(cols / 32));
          const size_t from = u.specs.size();
          u.specs.push_back({out_name(t.name), io::DType::U8, t.shape});
          u.specs.push_back({out_name(sc->name), io::DType::U8, sc->shape});
          count(TensorClass::kKeep, ClassSpec{}, rows * cols, u.specs, from, 0);
          u.source_bytes += t.nbytes + sc->nbytes;
          u.sources.push_back(&t);
          u.sources.push_back(sc);
          parts.push_back({&t, nullptr});
          parts.push_back({sc, nullptr});
          part_signs.push_back(nullptr);
          part_signs.push_back(nullptr);
          continue;
        }
        const std::vector<int64_t> want = down ? std::vector<int64_t>{H, I} : std::vector<int64_t>{gate_rows, H};
        if (t.shape != want)
          fail("%s: expert tensor '%s' has shape %s, expected [%lld, %lld]", ck.dir().c_str(), t.name.c_str(), t.shape_str().c_str(),
               (long long)want[0], (long long)want[1]);
        const size_t from = u.specs.size();
        const std::string base = out_name(base_of(t.name));
        if (s.keep) u.specs.push_back({base + ".weight", io::DType::BF16, t.shape});
        else quant_specs(&u.specs, base, s, t.shape[0], t.shape[1], opt.quant);
        count(down ? TensorClass::kExpertDown : TensorClass::kExpertGateUp, s, t.numel(), u.specs, from, t.shape[1]);
        u.source_bytes += t.nbytes;
        u.sources.push_back(&t);
        parts.push_back({&t, &s});
        part_signs.push_back(down ? dn : gu);
      }
      u.produce = [parts, part_signs, q = opt.quant](ops::ThreadPool*, const Sink& sink) {
        for (size_t i = 0; i < parts.size(); ++i) {
          if (parts[i].second == nullptr) sink(parts[i].first->data, parts[i].first->nbytes);  // MXFP4 bytes as stored
          else if (parts[i].second->keep) bf16_to(*parts[i].first, sink);
          else quantize_to(*parts[i].first, *parts[i].second, part_signs[i], q, nullptr, sink);
        }
      };
      units.push_back(std::move(u));
    }
  }

  void plan() {
    // Non-expert tensors in source order, grouped by layer; each layer's experts after them.
    std::vector<const io::TensorRef*> plain_tensors;
    std::map<int, int> expert_layers;  // layer -> number of experts
    for (const auto& t : ck.tensors()) {
      if (t.expert_layer >= 0) {
        if (t.expert_part != io::ExpertPart::kWeight && t.expert_part != io::ExpertPart::kMxBlocks &&
            t.expert_part != io::ExpertPart::kMxScales)
          fail("%s is already quantized (tensor '%s'); convert the original checkpoint", ck.dir().c_str(), t.name.c_str());
        int& n = expert_layers[t.expert_layer];
        n = std::max(n, t.expert_id + 1);
        continue;
      }
      if (t.dtype != io::DType::F32 && t.dtype != io::DType::F16 && t.dtype != io::DType::BF16)
        fail("%s: tensor '%s' has dtype %s; only F32/F16/BF16 checkpoints can be converted (is it already quantized?)",
             ck.dir().c_str(), t.name.c_str(), io::dtype_name(t.dtype));
      plain_tensors.push_back(&t);
    }
    std::stable_sort(plain_tensors.begin(), plain_tensors.end(),
                     [](const io::TensorRef* a, const io::TensorRef* b) { return layer_of(a->name) < layer_of(b->name); });
    size_t i = 0;
    auto flush_until = [&](int layer) {  // plain tensors of layers < layer ... and == layer
      while (i < plain_tensors.size() && layer_of(plain_tensors[i]->name) <= layer) plain(*plain_tensors[i++]);
    };
    for (auto [layer, n] : expert_layers) {
      flush_until(layer);
      for (int e = 0; e < n; ++e)
        for (io::ExpertProj p : {io::ExpertProj::kGate, io::ExpertProj::kUp, io::ExpertProj::kDown})
          if (!ck.has_expert(layer, e, p) && !(p == io::ExpertProj::kUp && !ck.has_expert(layer, 0, io::ExpertProj::kUp))) fail("%s: layer %d is missing expert %d's %s", ck.dir().c_str(), layer, e, p == io::ExpertProj::kDown ? "down_proj" : p == io::ExpertProj::kGate ? "gate_proj" : "up_proj");
      experts(layer, n);
    }
    flush_until(1 << 30);
  }
};

// One class of the quantization block: bits and group size as requested, plus the group sizes
// actually used when a matrix was narrower than the group (e.g. g32 for 32-input down_proj).
nlohmann::ordered_json class_json(const ClassSpec& s, const ClassStats* stats) {
  if (s.keep) return {{"bits", "bf16"}};
  nlohmann::ordered_json j = {{"bits", s.type == ops::QType::kTernary ? nlohmann::ordered_json("ternary")
                                                                      : nlohmann::ordered_json(qtype_bits(s.type))},
                              {"group_size", s.group}};
  if (stats != nullptr && !(stats->groups.size() == 1 && *stats->groups.begin() == s.group) && !stats->groups.empty())
    j["group_sizes_used"] = stats->groups;
  return j;
}

void prepare_out_dir(const ConvertOptions& opt) {
  if (opt.out_dir.empty()) throw UsageError("--out is required");
  std::error_code ec;
  if (fs::exists(opt.out_dir) && !fs::is_directory(opt.out_dir)) fail("--out %s exists and is not a directory", opt.out_dir.c_str());
  fs::create_directories(opt.out_dir, ec);
  if (ec) fail("%s: cannot create the directory (%s)", opt.out_dir.c_str(), ec.message().c_str());
  if (fs::equivalent(opt.in_dir, opt.out_dir)) fail("%s: the output directory must differ from the input", opt.out_dir.c_str());
  if (!fs::is_empty(opt.out_dir)) {
    if (!opt.force) fail("%s is not empty; choose an empty directory (or pass --force to replace spool's files there)", opt.out_dir.c_str());
    for (const auto& e : fs::directory_iterator(opt.out_dir)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("model", 0) == 0 && n.find(".safetensors") != std::string::npos) fs::remove(e.path());
    }
  }
}

}  // namespace

ConvertResult convert(const ConvertOptions& in_opt, const std::function<void(uint64_t, uint64_t)>& progress) {
  ConvertOptions opt = in_opt;
  if (opt.rules == nullptr) fail("convert: no family rules given (ConvertOptions::rules)");
  // The multi-token-prediction head travels too (quantized as its classes say; a run without
  // --spec mtp drops it again: io::Checkpoint::Options::mtp).
  io::Checkpoint ck = io::Checkpoint::open(opt.in_dir, *opt.rules, {.mtp = true});
  if (ck.raw_config().json().contains("quantization"))
    fail("%s is already a spool quantized checkpoint; convert the original", opt.in_dir.c_str());

  const int threads = opt.threads > 0 ? opt.threads : std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  ops::ThreadPool pool(threads);
  ConvertResult r;
  if (opt.target_bpw > 0) {
    r.allocation = allocate(ck, {.target_bpw = opt.target_bpw, .rotate = opt.rotate, .rotation_seed = opt.rotation_seed,
                                 .quant = opt.quant, .weights = opt.alloc_weights,
                                 .expert_usage = opt.expert_usage, .expert_shares = opt.expert_shares, .keep_float = opt.keep_float}, &pool);
    opt.recipe.tensor_specs = r.allocation.specs;
  }
  prepare_out_dir(opt);  // after the allocation: an unreachable target leaves no directory behind
  Planner p{ck, opt, &r, {}, {}};
  p.plan();
  for (const Unit& u : p.units) {
    r.source_bytes += u.source_bytes;
    for (const auto& s : u.specs) {
      r.data_bytes += s.nbytes();
      r.tensors += 1;
    }
  }
  for (const auto& [k, c] : r.classes) r.params += c.params;

  // Shards: whole layers, a new shard once the current one passes shard_bytes.
  std::vector<std::pair<size_t, size_t>> shards;  // unit ranges
  uint64_t cur = 0;
  for (size_t i = 0; i < p.units.size(); ++i) {
    uint64_t n = 0;
    for (const auto& s : p.units[i].specs) n += s.nbytes();
    const bool new_layer = i > 0 && p.units[i].layer != p.units[i - 1].layer;
    if (shards.empty() || (new_layer && cur > 0 && cur + n > opt.shard_bytes)) {
      shards.push_back({i, i});
      cur = 0;
    }
    shards.back().second = i + 1;
    cur += n;
  }

  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  const int ns = static_cast<int>(shards.size());
  uint64_t done = 0;
  for (int si = 0; si < ns; ++si) {
    const std::string fname = ns == 1 ? "model.safetensors" : strfmt("model-%05d-of-%05d.safetensors", si + 1, ns);
    std::vector<SafetensorsWriter::Spec> specs;
    for (size_t i = shards[si].first; i < shards[si].second; ++i)
      for (const auto& s : p.units[i].specs) {
        specs.push_back(s);
        weight_map[s.name] = fname;
      }
    const std::string path = opt.out_dir + "/" + fname;
    SafetensorsWriter w(path, specs, {{"format", "pt"}, {"spool", "quantized"}, {"recipe", opt.recipe.name}});
    const Sink to_file = [&w](const void* d, uint64_t n) { w.append(d, n); };
    size_t i = shards[si].first;
    while (i < shards[si].second) {
      if (!p.units[i].expert) {
        p.units[i].produce(&pool, to_file);
        for (const io::TensorRef* t : p.units[i].sources) release(*t);
        done += p.units[i].source_bytes;
        ++i;
      } else {  // a window of experts in parallel, written in order
        size_t j = i;
        while (j < shards[si].second && p.units[j].expert && j - i < static_cast<size_t>(8 * threads)) ++j;
        std::vector<std::vector<uint8_t>> out(j - i);
        pool.run(static_cast<int64_t>(j - i), [&](int64_t k, int) {
          std::vector<uint8_t>& o = out[k];
          p.units[i + k].produce(nullptr, [&o](const void* d, uint64_t n) {
            const uint8_t* b = static_cast<const uint8_t*>(d);
            o.insert(o.end(), b, b + n);
          });
        });
        for (size_t k = i; k < j; ++k) {
          w.append(out[k - i].data(), out[k - i].size());
          for (const io::TensorRef* t : p.units[k].sources) release(*t);
          done += p.units[k].source_bytes;
        }
        i = j;
      }
      if (progress) progress(done, r.source_bytes);
    }
    w.finish();
    r.file_bytes += fs::file_size(path);
  }
  r.shards = ns;

  auto write_json = [&](const std::string& name, const nlohmann::ordered_json& j) {
    write_file_atomic(opt.out_dir + "/" + name, j.dump(2) + "\n");
  };
  if (ns > 1) write_json("model.safetensors.index.json", {{"metadata", {{"total_size", r.data_bytes}}}, {"weight_map", weight_map}});
  // config.json as written, plus the quantization block.
  nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(read_whole_file(opt.in_dir + "/config.json"));
  nlohmann::ordered_json classes = nlohmann::ordered_json::object();
  auto stats = [&](const char* k) -> const ClassStats* { auto it = r.classes.find(k); return it == r.classes.end() ? nullptr : &it->second; };
  classes["dense"] = class_json(opt.recipe.dense, stats("dense"));
  // Tied embeddings: no lm_head tensor, the output projection is the embedding (bf16, or the
  // quantized table when --embed-bits quantized it).
  if (stats("lm_head")) {
    classes["lm_head"] = class_json(opt.recipe.lm_head, stats("lm_head"));
  } else {
    const ClassStats* e = stats("embed_tokens");
    classes["lm_head"] = e != nullptr ? class_json(opt.recipe.embed, e) : nlohmann::ordered_json{{"bits", "bf16"}};
    classes["lm_head"]["tied_to"] = "embed_tokens";
  }
  classes["expert_gate_up"] = class_json(opt.recipe.expert_gate_up, stats("expert_gate_up"));
  classes["expert_down"] = class_json(opt.recipe.expert_down, stats("expert_down"));
  // Only when quantized: bf16 tables leave the block (and so every earlier file) as it was.
  if (const ClassStats* e = stats("embed_tokens")) classes["embed_tokens"] = class_json(opt.recipe.embed, e);
  cfg["quantization"] = {{"quant_method", "spool"},
                         {"format_version", 1},
                         {"recipe", opt.recipe.name},
                         {"rotation", opt.rotate ? "hadamard" : "none"},
                         {"rotation_seed", opt.rotation_seed}};
  // Written only when they differ from the original rules, so that mode's files stay byte-identical.
  if (!opt.quant.is_legacy()) {
    cfg["quantization"]["scale_search"] = scale_search_name(opt.quant.scale_search);
    cfg["quantization"]["codebook"] = codebook_source_name(opt.quant.codebook);
  }
  if (!opt.recipe.tensor_specs.empty()) {
    // Allocated per matrix: the classes say so, the formats are listed by matrix.
    for (auto& [k, v] : classes.items()) v = {{"bits", "per tensor"}};
    nlohmann::ordered_json t = nlohmann::ordered_json::object();
    for (const auto& [k, v] : opt.recipe.tensor_specs) t[k] = v.describe();
    cfg["quantization"]["target_bpw"] = opt.target_bpw;
    if (!opt.calibration_note.empty()) cfg["quantization"]["calibration"] = opt.calibration_note;
    cfg["quantization"]["tensors"] = t;
  }
  cfg["quantization"]["classes"] = classes;
  cfg["quantization"]["bits_per_weight"] = r.bpw();
  write_json("config.json", cfg);
  for (const auto& e : fs::directory_iterator(opt.in_dir)) {
    const std::string name = e.path().filename().string();
    static const std::set<std::string> kWeightExt = {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx"};
    if (!e.is_regular_file() || name == "config.json" || name.ends_with(".index.json") || kWeightExt.count(e.path().extension().string()) ||
        name.find(".tmp") != std::string::npos)
      continue;
    fs::copy_file(e.path(), opt.out_dir + "/" + name, fs::copy_options::overwrite_existing);
  }
  return r;
}

}  // namespace spool::quant
