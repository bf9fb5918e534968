#include "experts/repack.h"

#include <filesystem>
#include <regex>

#include "common/error.h"
#include "io/safetensors.h"

namespace spool::experts {

namespace fs = std::filesystem;

void repack(const io::Checkpoint& in, const std::vector<std::vector<int>>& perm, const std::string& out_dir,
            const std::function<void(uint64_t, uint64_t)>& progress) {
  if (fs::exists(out_dir) && !fs::is_empty(out_dir)) fail("%s is not empty; choose a new directory", out_dir.c_str());
  fs::create_directories(out_dir);
  if (fs::equivalent(in.dir(), out_dir)) fail("%s: the output directory must differ from the input", out_dir.c_str());
  static const std::regex per_expert(R"(^layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$)");
  static const std::regex fused(R"(^layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(\.weight)?$)");
  static const std::regex router(R"(^layers\.(\d+)\.mlp\.gate\.(weight|e_score_correction_bias)$)");
  static const std::regex mixtral(R"(^layers\.(\d+)\.block_sparse_moe\.(experts\.(\d+)\.(w1|w2|w3)\.weight|gate\.weight)$)");
  auto layer_perm = [&](int l) -> const std::vector<int>& {
    if (l < 0 || l >= static_cast<int>(perm.size())) fail("repack: no permutation for layer %d", l);
    return perm[l];
  };
  uint64_t total = 0, done = 0;
  for (const auto& sh : in.shards()) total += sh.file_size();
  for (const auto& sh : in.shards()) {
    std::vector<io::SafetensorsWriter::Spec> specs;
    for (const auto& t : sh.tensors()) specs.push_back({t.name, t.dtype, t.shape});
    const std::string out_path = out_dir + "/" + fs::path(sh.path()).filename().string();
    io::SafetensorsWriter w(out_path, specs, sh.metadata());
    for (const auto& t : sh.tensors()) {
      const std::string n = io::normalize_tensor_name(t.name);
      const uint8_t* src = sh.data(t);
      std::smatch m;
      auto proj_of = [](const std::string& p) {
        return p == "gate_proj" || p == "w1" ? io::ExpertProj::kGate : p == "up_proj" || p == "w3" ? io::ExpertProj::kUp : io::ExpertProj::kDown;
      };
      if (std::regex_match(n, m, per_expert)) {
        const int l = std::stoi(m[1]);
        const io::TensorRef& s = in.expert(l, layer_perm(l).at(std::stoi(m[2])), proj_of(m[3]));
        w.append(s.data, s.nbytes);
      } else if (std::regex_match(n, m, mixtral)) {
        const int l = std::stoi(m[1]);
        if (m[3].matched) {  // experts.{e}.w1/w2/w3
          const io::TensorRef& s = in.expert(l, layer_perm(l).at(std::stoi(m[3])), proj_of(m[4]));
          w.append(s.data, s.nbytes);
        } else {  // router rows
          const auto& pm = layer_perm(l);
          const uint64_t row = t.nbytes / static_cast<uint64_t>(t.shape[0]);
          for (int e : pm) w.append(src + e * row, row);
        }
      } else if (std::regex_match(n, m, fused)) {
        const int l = std::stoi(m[1]);
        const bool gate_up = m[2] == "gate_up_proj";
        for (int e : layer_perm(l)) {
          if (gate_up) {
            const io::TensorRef& g = in.expert(l, e, io::ExpertProj::kGate);
            const io::TensorRef& u = in.expert(l, e, io::ExpertProj::kUp);
            w.append(g.data, g.nbytes);
            w.append(u.data, u.nbytes);
          } else {
            const io::TensorRef& d = in.expert(l, e, io::ExpertProj::kDown);
            w.append(d.data, d.nbytes);
          }
        }
      } else if (std::regex_match(n, m, router)) {
        const auto& pm = layer_perm(std::stoi(m[1]));
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
