#include "experts/repack.h"

#include <filesystem>

#include "common/error.h"
#include "io/safetensors.h"

namespace spool::experts {

namespace fs = std::filesystem;

void repack(const io::Checkpoint& in, const std::vector<std::vector<int>>& perm, const std::string& out_dir,
            const std::function<void(uint64_t, uint64_t)>& progress) {
  if (fs::exists(out_dir) && !fs::is_empty(out_dir)) fail("%s is not empty; choose a new directory", out_dir.c_str());
  fs::create_directories(out_dir);
  if (fs::equivalent(in.dir(), out_dir)) fail("%s: the output directory must differ from the input", out_dir.c_str());
  auto layer_perm = [&](int l) -> const std::vector<int>& {
    if (l < 0 || l >= static_cast<int>(perm.size())) fail("repack: no permutation for layer %d", l);
    return perm[l];
  };
  // Every expert's bytes move into another's place in the file's table: both must be stored
  // alike (a calibrated conversion may give the experts of one layer different formats).
  for (int l = 0; l < static_cast<int>(perm.size()); ++l)
    for (int e = 0; e < static_cast<int>(perm[l].size()); ++e) {
      const int src = perm[l][e];
      if (src == e) continue;
      const std::vector<const io::TensorRef*> a = in.expert_tensors(l, e), b = in.expert_tensors(l, src);
      bool same = a.size() == b.size();
      for (size_t i = 0; same && i < a.size(); ++i) {
        const io::TensorRef* match = nullptr;
        for (const io::TensorRef* y : b)
          if (y->expert_proj == a[i]->expert_proj && y->expert_part == a[i]->expert_part) match = y;
        same = match != nullptr && match->dtype == a[i]->dtype && match->shape == a[i]->shape;
      }
      if (!same)
        fail("repack: experts %d and %d of layer %d are stored in different formats (types, shapes or parts; e.g. a "
             "spool convert --calibration checkpoint): repack moves experts only between slots of one format",
             e, src, l);
    }
  uint64_t total = 0, done = 0;
  for (const auto& sh : in.shards()) total += sh.file_size();
  for (const auto& opened : in.shards()) {
    // The shard's own table (file names and order): the Checkpoint keeps only its normalised one.
    const io::SafetensorsFile sh = io::SafetensorsFile::open(opened.path());
    std::vector<io::SafetensorsWriter::Spec> specs;
    for (const auto& t : sh.tensors()) specs.push_back({t.name, t.dtype, t.shape});
    const std::string out_path = out_dir + "/" + fs::path(sh.path()).filename().string();
    io::SafetensorsWriter w(out_path, specs, sh.metadata());
    for (const auto& t : sh.tensors()) {
      const std::string n = in.normalized_name(t.name);  // the family's renames too (Mixtral w1/w3/w2)
      const uint8_t* src = sh.data(t);
      if (std::optional<io::ExpertName> en = io::parse_expert_name(n)) {
        const auto& pm = layer_perm(en->layer);
        if (en->fused) {  // [E, rows, cols]: write each new expert's slice from its source expert
          for (int e : pm) {
            if (en->proj == io::ExpertProj::kGate) {
              for (auto proj : {io::ExpertProj::kGate, io::ExpertProj::kUp}) {
                const io::TensorRef& x = in.expert(en->layer, e, proj);
                w.append(x.data, x.nbytes);
              }
            } else {
              const io::TensorRef& x = in.expert(en->layer, e, io::ExpertProj::kDown);
              w.append(x.data, x.nbytes);
            }
          }
        } else {  // one expert's tensor: take the source expert's bytes of the same part
          const io::TensorRef* x = in.expert_part(en->layer, pm.at(en->expert), en->proj, en->part);
          if (x == nullptr) fail("repack: %s has no source tensor for expert %d", t.name.c_str(), pm.at(en->expert));
          w.append(x->data, x->nbytes);
        }
      } else if (std::optional<int> layer = io::parse_router_name(n)) {  // router rows follow the experts
        const auto& pm = layer_perm(*layer);
        if (t.shape.empty() || static_cast<size_t>(t.shape[0]) != pm.size())
          fail("%s: router '%s' has %lld rows, the permutation %zu", sh.path().c_str(), t.name.c_str(),
               t.shape.empty() ? 0LL : (long long)t.shape[0], pm.size());
        const uint64_t row = t.nbytes / static_cast<uint64_t>(t.shape[0]);
        for (int e : pm) w.append(src + e * row, row);
      } else {
        w.append(src, t.nbytes);
      }
      done += t.nbytes;
      if (progress) progress(done, total);
    }
    w.finish();
  }
  for (const auto& e : fs::directory_iterator(in.dir())) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && e.path().extension() != ".safetensors" && name.find(".tmp") == std::string::npos)
      fs::copy_file(e.path(), out_dir + "/" + name, fs::copy_options::overwrite_existing);
  }
}

}  // namespace spool::experts
