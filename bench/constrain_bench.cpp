// Constrained-decoding overhead on the Qwen3 vocabulary (151,669 tokens, tests/data): per
// generated token, the mask (trie walk, or a cached state) plus the matcher advance, for a
// forced Qwen3 tool call and for a long free string; and the sampler with and without a mask
// (the unconstrained path takes no mask). Run: build/bench/constrain_bench
// [--benchmark_filter=...]; the tokenizer is read from SPOOL_TEST_DATA_DIR (build/tests/data).
#include <benchmark/benchmark.h>

#include <random>

#include "constrain/call_format.h"
#include "constrain/token_mask.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace spool;
using ojson = nlohmann::ordered_json;

const tokenizer::Tokenizer& tok() {
  static const tokenizer::Tokenizer t = tokenizer::Tokenizer::load(std::string(SPOOL_TEST_DATA_DIR) + "/tokenizers/qwen3");
  return t;
}

std::shared_ptr<const constrain::TokenIndex> index() {
  static auto ix = constrain::TokenIndex::from_tokenizer(tok(), tok().vocab_size());
  return ix;
}

// Per token of `text` (tokenized as the model would write it): fill_mask + accept, on a fresh
// state each iteration (so first-visit trie walks are counted, as in a new request).
void run_call(benchmark::State& st, const std::shared_ptr<const constrain::Constraint>& c, const std::string& text) {
  const std::vector<int32_t> ids = tok().encode(text);
  const int32_t im_end = tok().token_to_id("<|im_end|>");
  std::vector<uint64_t> mask;
  int64_t allowed = 0;
  for (auto _ : st) {
    st.PauseTiming();
    constrain::ConstraintState s(c, index(), {im_end});
    st.ResumeTiming();
    for (int32_t id : ids) {
      allowed += s.fill_mask(mask);
      if (!s.accept(id)) st.SkipWithError("token refused");
    }
    benchmark::DoNotOptimize(allowed);
  }
  st.SetItemsProcessed(st.iterations() * static_cast<int64_t>(ids.size()));
  st.counters["tokens"] = static_cast<double>(ids.size());
}

void BM_MaskForcedToolCall(benchmark::State& st) {
  const ojson params = ojson::parse(R"({"type": "object", "properties": {"city": {"type": "string"},
      "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer"}}, "required": ["city", "unit"]})");
  auto c = constrain::compile_tool_call(constrain::qwen3_json_format(), {{"get_weather", params}}, false);
  run_call(st, c,
           "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"San Francisco, California\", \"unit\": \"celsius\", "
           "\"days\": 3}}\n</tool_call>");
}
BENCHMARK(BM_MaskForcedToolCall)->Unit(benchmark::kMicrosecond);

void BM_MaskLongFreeString(benchmark::State& st) {
  const ojson schema = ojson::parse(R"({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})");
  auto c = constrain::compile_json(&schema, false, "");
  std::string body;
  for (int i = 0; i < 12; ++i) body += "The quick brown fox jumps over the lazy dog, and then it runs away. ";
  run_call(st, c, "{\"text\": \"" + body + "\"}");
}
BENCHMARK(BM_MaskLongFreeString)->Unit(benchmark::kMicrosecond);

// Sampler over the Qwen3 vocabulary, default truncations (top_k 40): without and with a mask that
// allows 1/16 of the tokens.
void BM_Sample(benchmark::State& st) {
  const bool masked = st.range(0) != 0;
  const int64_t V = tok().vocab_size();
  engine::SamplingParams p;
  p.temperature = 0.8f;
  engine::Sampler s(p, V);
  std::vector<float> logits(static_cast<size_t>(V));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& x : logits) x = nd(rng);
  std::vector<uint64_t> mask(static_cast<size_t>((V + 63) / 64), 0);
  for (int64_t i = 0; i < V; i += 16) mask[static_cast<size_t>(i >> 6)] |= uint64_t{1} << (i & 63);
  std::vector<float> work;
  for (auto _ : st) {
    work = logits;
    benchmark::DoNotOptimize(s.sample(work.data(), {}, {}, masked ? mask.data() : nullptr));
  }
}
BENCHMARK(BM_Sample)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
