#include "cli/common.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/sysinfo.h"
#include "ops/matmul.h"

namespace spool::cli {

namespace fs = std::filesystem;

void ModelOptions::add_to(CLI::App* app, bool with_threads) {
  app->add_option("-m,--model", model, "Model directory (HF layout: config.json, *.safetensors, tokenizer.json); default: the demo model");
  if (with_threads) app->add_option("-t,--threads", threads, "Threads for compute (default: all hardware threads)");
}

std::string ModelOptions::dir() const {
  if (!model.empty()) {
    if (!fs::is_directory(model)) throw Error(strfmt("model directory '%s' does not exist", model.c_str()));
    return model;
  }
  // The demo model the build unpacked, or one next to the executable (installed layouts).
  std::vector<std::string> candidates = {SPOOL_DEFAULT_MODEL_DIR};
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back((exe.parent_path() / "models/spool-demo-moe").string());
  for (const auto& c : candidates)
    if (fs::exists(c + "/config.json")) return c;
  throw Error(strfmt("no --model given and the demo model is missing at %s (run the build to unpack it)", SPOOL_DEFAULT_MODEL_DIR));
}

int ModelOptions::thread_count() const {
  if (threads < 0 || threads > 1024) throw UsageError(strfmt("--threads must be between 1 and 1024 (got %d)", threads));
  if (threads > 0) return threads;
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

bool has_tokenizer(const std::string& dir) { return fs::exists(dir + "/tokenizer.json"); }

Loaded load_model(const ModelOptions& opt) {
  Loaded l;
  const std::string dir = opt.dir();
  const int threads = opt.thread_count();
  double t0 = now_seconds();
  l.ckpt = std::make_shared<io::Checkpoint>(io::Checkpoint::open(dir));
  l.pool = std::make_unique<ops::ThreadPool>(threads);
  l.model = models::load_model(l.ckpt, l.pool.get());
  if (has_tokenizer(dir)) l.tok = tokenizer::Tokenizer::load(dir);
  l.load_s = now_seconds() - t0;
  const auto& s = l.model->spec();
  log_info("loaded %s (%s, %d layers, %.1fM params, %.1fM active) from %s in %.2f s; %d threads, SIMD %s", s.model_type.c_str(),
           s.family.c_str(), s.n_layers, s.params_total / 1e6, s.params_active / 1e6, dir.c_str(), l.load_s, threads,
           ops::simd_target_name());
  return l;
}

std::vector<int32_t> parse_id_list(const std::string& s) {
  std::vector<int32_t> ids;
  std::string tok;
  std::stringstream ss(s);
  while (std::getline(ss, tok, ',')) {
    size_t b = tok.find_first_not_of(" \t"), e = tok.find_last_not_of(" \t");
    if (b == std::string::npos) throw UsageError(strfmt("--prompt-ids: empty entry in '%s'", s.c_str()));
    tok = tok.substr(b, e - b + 1);
    char* end = nullptr;
    long long v = std::strtoll(tok.c_str(), &end, 10);
    if (end == tok.c_str() || *end != '\0' || v < 0 || v > INT32_MAX)
      throw UsageError(strfmt("--prompt-ids: '%s' is not a token id", tok.c_str()));
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) throw UsageError("--prompt-ids: no ids given");
  return ids;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(strfmt("%s: cannot open file", path.c_str()));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace spool::cli
