// libFuzzer target for the expert-prediction input files: arbitrary bytes as a routing trace
// (JSON lines, the "g" guesses included) and as an expert predictor (safetensors with its
// metadata). Errors must be spool::Error, never a crash, a hang or an out-of-bounds read; a trace
// that reads must map its guesses onto another shape within range, and a predictor that loads
// must score a row with finite inputs.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"
#include "experts/predictor.h"
#include "experts/routing_trace.h"

namespace {

std::string write(const std::string& suffix, const uint8_t* data, size_t size) {
  const std::string path = "/tmp/spool_predictor_trace_fuzz_" + std::to_string(getpid()) + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return "";
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace spool;
  if (const std::string p = write(".jsonl", data, size); !p.empty()) {
    try {
      const experts::Trace t = experts::read_trace(p);
      const experts::TraceMap map(t, {0, 2, 3}, 3 * t.shape.n_experts + 1);
      std::vector<int> g(8);
      for (int layer : {0, 2, 3})
        for (int64_t tok = 0; tok < 3; ++tok) {
          const int n = map.guess(layer, tok, g);
          for (int i = 0; i < n; ++i)
            if (g[i] < 0 || g[i] >= map.target_experts()) std::abort();
        }
    } catch (const Error&) {
    }
  }
  if (const std::string p = write(".safetensors", data, size); !p.empty()) {
    try {
      const experts::ExpertPredictor pr = experts::ExpertPredictor::load(p);
      if (pr.hidden() <= 4096 && pr.n_experts() <= 4096) {
        std::vector<float> h(static_cast<size_t>(pr.hidden()), 0.5f);
        std::vector<int> top(static_cast<size_t>(pr.top_k()));
        for (const experts::PredictorHead& hd : pr.heads()) {
          pr.top_m(hd, h.data(), 1, pr.top_k(), top.data());
          for (int e : top)
            if (e < 0 || e >= pr.n_experts()) std::abort();
        }
      }
    } catch (const Error&) {
    }
  }
  return 0;
}
