// spool plan / doctor / bench as a user runs them: exit codes (0 fits, 1 does not fit or
// error, 2 usage), the documented --json keys, and the llama-bench-style table.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <regex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "models/presets.h"

namespace {

struct Result {
  int code = -1;
  std::string out;
};

// Runs `spool <args>` (stderr discarded); args are shell-quoted by the caller.
Result spool(const std::string& args) {
  const std::string cmd = std::string(SPOOL_BINARY_DIR) + "/spool " + args + " 2>/dev/null";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

const std::string kDemo = SPOOL_DEFAULT_MODEL_DIR;

TEST(PlanCli, JsonKeysAndExitCodes) {
  Result r = spool("plan -m " + kDemo + " --json --mem-gbps 10");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"verdict", "peak_bytes", "resident_weight_bytes", "expert_bytes", "kv_bytes_per_token", "cache_budget_bytes", "command"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["verdict"], "resident");
  EXPECT_EQ(j["kv_bytes_per_token"], 2 * 2 * 64 * 4 * 2);  // K and V, 2 KV heads x 64 dims, f32, 2 attention layers
  EXPECT_GT(j["decode_tok_s_mem_bound"].get<double>(), 0);

  r = spool("plan -m " + kDemo + " --json --ram-gb 0.5");  // 0.5 GiB: the 512 MiB reserve leaves nothing
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["verdict"], "no_fit");

  r = spool("plan -m " + kDemo + " --json --cache-budget-gb 0.005 --kv-bits 8");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = nlohmann::json::parse(r.out);
  EXPECT_EQ(s["verdict"], "stream");
  EXPECT_EQ(s["cache_budget_bytes"], static_cast<uint64_t>(0.005 * (1ull << 30)));
  EXPECT_NE(s["command"].get<std::string>().find("--stream --cache-budget-gb 0.00 --kv-bits 8"), std::string::npos) << s["command"];

  EXPECT_EQ(spool("plan -m /nonexistent/dir").code, 1);
  EXPECT_EQ(spool("plan").code, 2);
  EXPECT_EQ(spool("plan -m " + kDemo + " --kv-bits 7").code, 2);
  EXPECT_EQ(spool("plan -m " + kDemo + " --ctx-size 0").code, 2);
  EXPECT_EQ(spool("plan -m " + kDemo + " --cache-budget-gb lots").code, 2);
  EXPECT_EQ(spool("plan -m " + kDemo + " --stream --no-stream").code, 2);
}

// --ranks (expert parallelism): one rank's memory holds the largest share of the routed experts,
// the bytes between the ranks follow the exchange (per MoE layer top_k rows of hidden_size floats,
// (R - 1) / R of them into each rank), the decode estimate adds the link terms, and the command
// runs under mpirun. The demo model: 64 experts top-8, hidden 256, 8 MoE layers.
TEST(PlanCli, RanksSplitTheExpertsAndCountTheExchange) {
  const Result one = spool("plan -m " + kDemo + " --json --mem-gbps 10 --ram-gb 4");
  ASSERT_EQ(one.code, 0) << one.out;
  const auto a = nlohmann::json::parse(one.out);
  EXPECT_FALSE(a.contains("expert_parallel"));
  for (int R : {2, 3}) {
    const Result r = spool("plan -m " + kDemo + " --json --mem-gbps 10 --ram-gb 4 --ranks " + std::to_string(R) +
                           " --link-latency-us 50 --link-gbps 1");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_TRUE(j.contains("expert_parallel")) << r.out;
    const auto& e = j["expert_parallel"];
    const uint64_t experts = a["expert_bytes"].get<uint64_t>();
    const int most = (64 + R - 1) / R;
    EXPECT_EQ(e["ranks"], R);
    EXPECT_EQ(e["rank_expert_bytes"].get<uint64_t>(), static_cast<uint64_t>(static_cast<double>(experts) * most / 64));
    const int n_moe = 8;  // the demo's MoE layers (every layer)
    EXPECT_EQ(e["net_bytes_per_token"].get<uint64_t>(), static_cast<uint64_t>(n_moe) * 8 * 256 * 4 * (R - 1));
    EXPECT_EQ(e["exchanges_per_token"], n_moe);
    const double active = e["rank_active_bytes_per_token"].get<double>();
    const double want = 1.0 / (active / 10e9 + n_moe * 50e-6 + e["net_bytes_per_token"].get<double>() / R / 1e9);
    EXPECT_NEAR(e["decode_tok_s"].get<double>(), want, want * 1e-9);
    EXPECT_LT(j["peak_bytes"].get<uint64_t>(), a["peak_bytes"].get<uint64_t>());  // the experts' share only
    EXPECT_EQ(j["command"].get<std::string>().rfind("mpirun -n " + std::to_string(R) + " spool generate", 0), 0u) << j["command"];
  }
  // Without the link figures: the bytes, no estimate.
  const auto n = nlohmann::json::parse(spool("plan -m " + kDemo + " --json --mem-gbps 10 --ranks 2").out);
  EXPECT_TRUE(n["expert_parallel"]["decode_tok_s"].is_null());
  // Usage errors.
  for (const char* bad : {"--ranks 0", "--expert-owners x.json", "--link-gbps 1", "--ranks 2 --link-gbps 0", "--ranks 2 --link-latency-us -3",
                          "--ranks 2 --link-latency-us -1", "--ranks 2 --vram-gb 8", "--ranks 2 --device cuda", "--ranks 2 --trace x.json"})
    EXPECT_EQ(spool("plan -m " + kDemo + " " + bad).code, 2) << bad;
}

// --ranks with --parallel plans `mpirun -n N spool serve`: rank 0 also broadcasts each MoE layer's
// rows (hidden_size floats) and routing (top_k ints) per token, two exchanges per MoE layer.
// --expert-owners FILE (a profile recorded by generate): the busiest rank's share of the routings
// under the balanced map, at most the contiguous blocks' and at least even, and that rank's reads.
TEST(PlanCli, RanksServeAndBalancedOwners) {
  const auto s = nlohmann::json::parse(spool("plan -m " + kDemo + " --json --mem-gbps 10 --ranks 2 --parallel 2").out);
  ASSERT_TRUE(s.contains("expert_parallel"));
  EXPECT_EQ(s["expert_parallel"]["exchanges_per_token"], 16);
  EXPECT_EQ(s["expert_parallel"]["net_bytes_per_token"].get<uint64_t>(), 8ull * (8 * 256 * 4 + 256 * 4 + 8 * 4));
  EXPECT_EQ(s["command"].get<std::string>().rfind("mpirun -n 2 spool serve", 0), 0u) << s["command"];
  const std::string prof = ::testing::TempDir() + "/plan_owners_" + std::to_string(getpid()) + ".json";
  ASSERT_EQ(spool("generate -p 'The sea' -n 48 --threads 1 --stream --expert-profile " + prof).code, 0);
  const Result r = spool("plan -m " + kDemo + " --json --mem-gbps 10 --ranks 2 --expert-owners " + prof);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const auto& e = j["expert_parallel"];
  const double b = e["rank_load_share"].get<double>(), c = e["contiguous_load_share"].get<double>();
  EXPECT_GE(b, 0.5 - 1e-12);
  EXPECT_LT(b, c);  // (the recorded routing is skewed: contiguous blocks are uneven)
  const double expert = j["expert_bytes_per_token"].get<double>(), active = j["active_bytes_per_token"].get<double>();
  EXPECT_NEAR(e["rank_active_bytes_per_token"].get<double>(), active - expert + expert * b, 1.0);
  EXPECT_NE(j["command"].get<std::string>().find("--expert-owners " + prof), std::string::npos) << j["command"];
  EXPECT_EQ(spool("plan -m " + kDemo + " --ranks 2 --expert-owners /nonexistent.json").code, 1);
  std::remove(prof.c_str());
}

// --spec mtp counts the head's weights, its KV cache and the step trail's copies of the recurrent
// state; without it the head is a note only.
TEST(PlanCli, SpecMtpCountsTheHead) {
  const Result plain = spool("plan -m " + kDemo + " --json --mem-gbps 10");
  const Result mtp = spool("plan -m " + kDemo + " --json --mem-gbps 10 --spec mtp --draft-max 3");
  ASSERT_EQ(plain.code, 0) << plain.out;
  ASSERT_EQ(mtp.code, 0) << mtp.out;
  const auto a = nlohmann::json::parse(plain.out)["components"], b = nlohmann::json::parse(mtp.out)["components"];
  EXPECT_GT(b["weights_total"].get<uint64_t>(), a["weights_total"].get<uint64_t>());
  EXPECT_GT(b["kv"].get<uint64_t>(), a["kv"].get<uint64_t>());  // the head's attention layer
  EXPECT_EQ(a["spec_trail"].get<uint64_t>(), 0u);
  EXPECT_EQ(b["spec_trail"].get<uint64_t>(), 3 * b["recurrent_state"].get<uint64_t>());
  EXPECT_EQ(spool("plan -m " + kDemo + " --draft-max 2").code, 2);
  EXPECT_EQ(spool("plan -m " + kDemo + " --spec mtp --draft-max 17").code, 2);
  EXPECT_EQ(spool("plan --preset tiny-qwen3.5 --spec mtp").code, 2);
}

// --lora: the adapters' resident bytes (A, B and B's transposed copy, f32) join the dense part
// exactly as the loader counts them (generate --json's stats.memory.dense_resident), and the
// printed command repeats the flag.
TEST(PlanCli, LoraCountsTheAdaptersAsTheRunDoes) {
  const std::string ad = std::string(SPOOL_TEST_DATA_DIR) + "/lora/spool-demo-moe-dev";
  const Result plain = spool("plan -m " + kDemo + " --json --mem-gbps 10 --ram-gb 8");
  const Result with = spool("plan -m " + kDemo + " --json --mem-gbps 10 --ram-gb 8 --lora " + ad + ":0.5");
  ASSERT_EQ(plain.code, 0) << plain.out;
  ASSERT_EQ(with.code, 0) << with.out;
  const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(with.out);
  const uint64_t lora = b["lora_bytes"].get<uint64_t>();
  EXPECT_EQ(a["lora_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(lora, 1000000u);  // rank 8 on 8 layers' attention / DeltaNet / shared expert: ~1.1 MB of f32
  EXPECT_EQ(b["resident_weight_bytes"].get<uint64_t>(), a["resident_weight_bytes"].get<uint64_t>() + lora);
  EXPECT_NE(b["command"].get<std::string>().find(" --lora " + ad + ":0.5"), std::string::npos) << b["command"];
  const Result run = spool("generate -m " + kDemo + " --lora " + ad + " --prompt The -n 1 --json");
  ASSERT_EQ(run.code, 0) << run.out;
  const auto r = nlohmann::json::parse(run.out.substr(run.out.find('{')));
  EXPECT_EQ(r["stats"]["memory"]["dense_resident"].get<uint64_t>(), b["resident_weight_bytes"].get<uint64_t>());
  EXPECT_EQ(spool("plan -m " + kDemo + " --lora /nonexistent/adapter").code, 1);
  EXPECT_EQ(spool("plan -m " + kDemo + " --lora :0.5").code, 2);  // no path
  EXPECT_EQ(spool("plan --preset tiny-qwen3.5 --lora " + ad).code, 2);
}

TEST(PlanCli, TextNamesTheVerdictAndCommand) {
  const Result r = spool("plan -m " + kDemo + " --ram-gb 8 --mem-gbps 10 --disk-gbps 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("verdict    RESIDENT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("command    spool generate --model " + kDemo + " --no-stream"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("peak (VmHWM)"), std::string::npos) << r.out;
}

TEST(PlanCli, ProjectsTheRegisteredFamilies) {
  const std::string ds = std::string(SPOOL_TEST_DATA_DIR) + "/models/deepseek_v3";
  Result r = spool("plan -m " + ds + " --json --mem-gbps 10 --ram-gb 8");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verdict"], "resident");
  EXPECT_NE(j["command"].get<std::string>().find("spool generate"), std::string::npos) << j["command"];
  EXPECT_EQ(j["model_type"], "deepseek_v3");
  EXPECT_EQ(j["kv_bytes_per_token"], 3 * (32 + 8) * 4);  // MLA latent + RoPE key (keys only), f32, 3 layers
  EXPECT_EQ(j["expert_bytes"], 2 * 16 * 3 * 32 * 64 * 4);
  r = spool("plan -m " + ds + " --json --ram-gb 0.51");  // 10 MiB past the 512 MiB reserve: too little
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["verdict"], "no_fit");
  r = spool("plan -m " + ds + " --ram-gb 8 --mem-gbps 10");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("MLA: 32 latent + 8 RoPE key elements"), std::string::npos) << r.out;
  for (const char* name : {"deepseek_v2_lite", "deepseek_v3_kimi", "mixtral", "olmoe", "ernie4_5_moe"}) {
    r = spool("plan -m " + std::string(SPOOL_TEST_DATA_DIR) + "/models/" + name + " --json --mem-gbps 10 --ram-gb 8");
    ASSERT_EQ(r.code, 0) << name << r.out;
    EXPECT_NE(nlohmann::json::parse(r.out)["command"], "") << name;  // every family runs
  }
  r = spool("plan -m " + kDemo + " --json --mem-gbps 10 --ram-gb 8");
  ASSERT_EQ(r.code, 0) << r.out;
}

// Released total parameter counts (model cards and papers), for `plan --preset` at full size.
// The synth layout is bf16 (2 bytes a parameter) without multi-token-prediction layers.
const std::map<std::string, double> kReleasedParams = {
    {"qwen3.6-35b-a3b", 35e9},      // Qwen3.5/3.6-35B-A3B (text model)
    {"qwen3-next-80b-a3b", 80e9},   // Qwen3-Next-80B-A3B
    {"qwen3-30b-a3b", 30.5e9},      // Qwen3-30B-A3B
    {"mixtral-8x7b", 46.7e9},       // Mixtral-8x7B
    {"olmoe-1b-7b", 6.9e9},         // OLMoE-1B-7B
    {"deepseek-v2-lite", 15.7e9},   // DeepSeek-V2-Lite
    {"deepseek-v3-671b", 671e9},    // DeepSeek-V3 (without the 14B MTP module)
    {"kimi-k2", 1.04e12},           // Kimi K2 technical report: 1.04 trillion
};
// Presets released with quantized experts (MXFP4 blocks + E8M0 scales, bf16 rest): the bytes of
// the released safetensors files, which plan --preset must reproduce.
const std::map<std::string, double> kReleasedBytes = {
    {"gpt-oss-20b", 13.76e9},   // openai/gpt-oss-20b: 3 shards, 13.76 GB
    {"gpt-oss-120b", 65.25e9},  // openai/gpt-oss-120b: 15 shards, 65.25 GB
};

// KV cache bytes per token at --kv-bits 32 by the family rules, from the preset's config.json:
// MLA keeps one latent of kv_lora_rank + qk_rope_head_dim f32 per layer (keys only); other
// attention keeps K and V of num_key_value_heads x head_dim in every attention layer (sliding
// ones included: the figure is per position held), none in linear-attention layers. Gemma 4
// (global_head_dim): its full_attention layers keep K and V of num_global_key_value_heads (with
// attention_k_eq_v) x global_head_dim. `kind` "sliding_attention" / "full_attention" counts
// only the layers of that kind; empty counts all.
uint64_t expected_kv_per_token(const nlohmann::ordered_json& config, const std::string& kind = "") {
  const auto& t = config.contains("text_config") ? config["text_config"] : config;
  const uint64_t layers = t["num_hidden_layers"].get<uint64_t>();
  if (t.contains("kv_lora_rank") && !t["kv_lora_rank"].is_null())
    return layers * (t["kv_lora_rank"].get<uint64_t>() + t["qk_rope_head_dim"].get<uint64_t>()) * 4;
  const uint64_t heads = t["num_attention_heads"].get<uint64_t>();
  const uint64_t head_dim = t.contains("head_dim") && !t["head_dim"].is_null() ? t["head_dim"].get<uint64_t>()
                                                                              : t["hidden_size"].get<uint64_t>() / heads;
  const uint64_t kv = t["num_key_value_heads"].get<uint64_t>();
  const bool global = t.contains("global_head_dim") && !t["global_head_dim"].is_null();
  const uint64_t full_kv = global && t.value("attention_k_eq_v", false) && t.contains("num_global_key_value_heads")
                               ? t["num_global_key_value_heads"].get<uint64_t>()
                               : kv;
  auto layer_bytes = [&](const std::string& lt) -> uint64_t {
    if (lt == "linear_attention" || (!kind.empty() && lt != kind)) return 0;
    if (global && lt == "full_attention") return 2 * full_kv * t["global_head_dim"].get<uint64_t>() * 4;
    return 2 * kv * head_dim * 4;
  };
  uint64_t sum = 0;
  if (t.contains("layer_types")) {
    for (const auto& lt : t["layer_types"]) sum += layer_bytes(lt.get<std::string>());
    return sum;
  }
  const uint64_t attn = t.contains("full_attention_interval") ? layers / t["full_attention_interval"].get<uint64_t>() : layers;
  const bool all_windowed = t.contains("sliding_window") && !t["sliding_window"].is_null();  // Mixtral-style
  if (!kind.empty() && (kind == "sliding_attention") != all_windowed) return 0;
  return attn * 2 * kv * head_dim * 4;
}

// Every synth preset in the registry, planned at its released size with no files: the weight
// bytes match the released parameter count in bf16, and the KV per token follows the family
// rules (MLA: the latent). A preset added later is covered as it is registered: its released
// count comes from kReleasedParams or, failing that, the "<N>B" / "<N>T" of its name or
// description (within 10%); test shapes ("tiny-*") get every check but the count.
TEST(PlanCli, EveryPresetPlansAtItsReleasedSize) {
  ASSERT_GE(spool::models::presets().size(), 9u);
  for (const auto& p : spool::models::presets()) {
    SCOPED_TRACE(p.name);
    Result r = spool("plan --preset " + p.name + " --json --ram-gb 8192 --mem-gbps 10 --kv-bits 32 --ctx-size 4096");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["verdict"], "resident");
    EXPECT_EQ(j["model"], "preset " + p.name);
    const auto& t = p.config.contains("text_config") ? p.config["text_config"] : p.config;
    EXPECT_EQ(j["model_type"].get<std::string>(), t["model_type"].get<std::string>());
    EXPECT_EQ(j["kv_bytes_per_token"].get<uint64_t>(), expected_kv_per_token(p.config));
    const bool mla = t.contains("kv_lora_rank") && !t["kv_lora_rank"].is_null();
    EXPECT_EQ(j["architecture"].get<std::string>().rfind("MLA:", 0) == 0, mla) << j["architecture"];
    // Every layer at its capacity: gpt-oss's sliding-window layers (layer_types) at the bounded one.
    const uint64_t layers = t["num_hidden_layers"].get<uint64_t>();
    uint64_t windowed = 0;
    if (t.contains("layer_types"))
      for (const auto& lt : t["layer_types"]) windowed += lt == "sliding_attention";
    else if (t.contains("sliding_window") && !t["sliding_window"].is_null())
      windowed = layers;
    EXPECT_EQ(j["components"]["kv_positions_windowed"].get<uint64_t>() > 0, windowed > 0);
    const uint64_t per = j["kv_bytes_per_token"].get<uint64_t>(), full = j["components"]["kv_positions"].get<uint64_t>();
    if (windowed == 0)
      EXPECT_EQ(j["components"]["kv"].get<uint64_t>(), per * full);
    else  // each layer kind at its capacity (gpt-oss: every layer attention; Gemma 4: kinds of different widths)
      EXPECT_EQ(j["components"]["kv"].get<uint64_t>(),
                expected_kv_per_token(p.config, "full_attention") * full +
                    expected_kv_per_token(p.config, "sliding_attention") * j["components"]["kv_positions_windowed"].get<uint64_t>());
    const double bytes = j["components"]["weights_total"].get<double>();
    if (p.name.rfind("tiny-", 0) == 0) continue;
    EXPECT_GT(j["expert_bytes"].get<double>(), 0.5 * bytes);  // MoE at full size: most weights are routed experts
    if (auto it = kReleasedBytes.find(p.name); it != kReleasedBytes.end()) {
      EXPECT_NEAR(bytes / it->second, 1.0, 0.02) << bytes << " bytes, released " << it->second;
      continue;
    }
    double params = 0, tol = 0.02;
    if (auto it = kReleasedParams.find(p.name); it != kReleasedParams.end()) {
      params = it->second;
    } else {
      std::smatch m;
      const std::string text = p.name + " " + p.description;
      const std::regex size_re("(\\d+(?:\\.\\d+)?)\\s*([bBtT])\\b");
      ASSERT_TRUE(std::regex_search(text, m, size_re)) << "give preset " << p.name << " its released parameter count in kReleasedParams";
      params = std::stod(m[1].str()) * ((m[2] == "t" || m[2] == "T") ? 1e12 : 1e9);
      tol = 0.10;
    }
    EXPECT_NEAR(bytes / 2.0 / params, 1.0, tol) << bytes / 2.0 << " parameters in bf16, released " << params;
  }
  // A 1 T model needs no files and no memory to plan; a name not in the registry is a usage error.
  EXPECT_EQ(spool("plan --preset no-such-model --json").code, 2);
  EXPECT_EQ(spool("plan --preset kimi-k2 -m " + kDemo).code, 2);
  Result small = spool("plan --preset deepseek-v3-671b --json --ram-gb 16 --mem-gbps 10");
  EXPECT_EQ(small.code, 1) << small.out;  // 1.3 TB of bf16 weights: the dense part alone outgrows 16 GiB
}

// The GPU part of a plan (plan::place_on_gpu, the loader's rule) for a stated GPU: experts in
// VRAM when dense + KV/state + workspace + experts fit the budget, else in host memory with the
// top-k experts' bytes copied per token and a decode bound from --h2d-gbps; a budget below the
// dense part does not fit (exit 1).
TEST(PlanCli, GpuPlacementForAStatedGpu) {
  const std::string base = "plan --preset qwen3.6-35b-a3b --json --ram-gb 256 --mem-gbps 10 --ctx-size 4096 --h2d-gbps 25";
  Result big = spool(base + " --vram-gb 100");
  ASSERT_EQ(big.code, 0) << big.out;
  const auto b = nlohmann::json::parse(big.out);
  const auto& g = b["gpu"];
  ASSERT_TRUE(g.is_object()) << big.out;
  EXPECT_EQ(g["device"], "stated");
  EXPECT_EQ(g["vram_budget_bytes"].get<uint64_t>(), 100ull << 30);
  EXPECT_EQ(g["expert_bytes"].get<uint64_t>(), b["expert_bytes"].get<uint64_t>());
  EXPECT_EQ(g["dense_bytes"].get<uint64_t>(), b["resident_weight_bytes"].get<uint64_t>());
  EXPECT_EQ(g["state_bytes"].get<uint64_t>(), b["components"]["kv"].get<uint64_t>() + b["components"]["recurrent_state"].get<uint64_t>());
  EXPECT_EQ(g["workspace_bytes"].get<uint64_t>(), b["components"]["workspace"].get<uint64_t>());
  const uint64_t base_bytes = g["dense_bytes"].get<uint64_t>() + g["state_bytes"].get<uint64_t>() + g["workspace_bytes"].get<uint64_t>();
  EXPECT_TRUE(g["fits"].get<bool>());
  EXPECT_TRUE(g["experts_in_vram"].get<bool>());  // ~65 GiB of bf16 experts + ~2 GiB dense in 100 GiB
  EXPECT_EQ(g["vram_used_bytes"].get<uint64_t>(), base_bytes + g["expert_bytes"].get<uint64_t>());
  EXPECT_EQ(g["h2d_bytes_per_token"].get<uint64_t>(), 0u);
  EXPECT_TRUE(g["decode_tok_s_h2d_bound"].is_null());

  Result mid = spool(base + " --vram-gb 16");
  ASSERT_EQ(mid.code, 0) << mid.out;
  const auto m = nlohmann::json::parse(mid.out);
  EXPECT_TRUE(m["gpu"]["fits"].get<bool>());
  EXPECT_FALSE(m["gpu"]["experts_in_vram"].get<bool>());
  EXPECT_EQ(m["gpu"]["vram_used_bytes"].get<uint64_t>(), base_bytes);
  const uint64_t per_token = m["gpu"]["h2d_bytes_per_token"].get<uint64_t>();
  // The rest of the budget holds VRAM expert slots: the misses' share of the top-k bytes crosses.
  const uint64_t slots = m["gpu"]["vram_expert_slots"].get<uint64_t>();
  const uint64_t expert_count = 40 * 256;  // Qwen3.6-35B-A3B: 40 MoE layers of 256 experts
  EXPECT_EQ(slots, (m["gpu"]["vram_budget_bytes"].get<uint64_t>() - base_bytes) / (m["expert_bytes"].get<uint64_t>() / expert_count));
  const double hit = m["gpu"]["vram_hit_rate"].get<double>();
  EXPECT_DOUBLE_EQ(hit, static_cast<double>(slots) / expert_count);
  EXPECT_GT(hit, 0.1);
  EXPECT_LT(hit, 0.3);  // ~11.5 GiB of slots for 60 GiB of experts
  EXPECT_NEAR(static_cast<double>(per_token), m["expert_bytes_per_token"].get<double>() * (1.0 - hit), 1.0);
  EXPECT_GT(per_token, 0u);
  EXPECT_NEAR(m["gpu"]["decode_tok_s_h2d_bound"].get<double>(), 25e9 / static_cast<double>(per_token), 1e-9);
  Result text = spool("plan --preset qwen3.6-35b-a3b --ram-gb 256 --mem-gbps 10 --h2d-gbps 25 --vram-gb 16");
  EXPECT_NE(text.out.find("routed experts"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("in host memory"), std::string::npos) << text.out;

  Result small = spool(base + " --vram-gb " + std::to_string(static_cast<double>(base_bytes) / 2 / (1ull << 30)));
  EXPECT_EQ(small.code, 1) << small.out;
  EXPECT_FALSE(nlohmann::json::parse(small.out)["gpu"]["fits"].get<bool>());
  // Without --vram-gb and without a GPU there is no GPU part; --vram-gb contradicts --device cpu.
  Result none = spool("plan -m " + kDemo + " --json --ram-gb 8 --mem-gbps 10 --device cpu");
  ASSERT_EQ(none.code, 0) << none.out;
  EXPECT_TRUE(nlohmann::json::parse(none.out)["gpu"].is_null());
  EXPECT_EQ(spool("plan -m " + kDemo + " --device cpu --vram-gb 8").code, 2);
  EXPECT_EQ(spool("plan -m " + kDemo + " --vram-gb -3").code, 2);
}

TEST(PlanCli, MemoryProbeBuffer) {
  // This machine's probe: auto sizes the buffer from the cache (at least 256 MiB), --mem-probe-mib
  // sets it, and a stated bandwidth or machine measures nothing.
  Result r = spool("plan -m " + kDemo + " --json --disk-gbps 1");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GE(j["mem_probe_bytes"].get<uint64_t>(), 256ull << 20);
  EXPECT_LE(j["mem_probe_bytes"].get<uint64_t>(), 2048ull << 20);
  EXPECT_GT(j["mem_gbps"].get<double>(), 0);
  r = spool("plan -m " + kDemo + " --json --disk-gbps 1 --mem-probe-mib 32");
  ASSERT_EQ(r.code, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["mem_probe_bytes"].get<uint64_t>(), 32ull << 20);
  EXPECT_GT(j["mem_gbps"].get<double>(), 0);
  r = spool("plan -m " + kDemo + " --disk-gbps 1 --mem-probe-mib 32");
  EXPECT_NE(r.out.find("GB/s measured over 32.00 MiB"), std::string::npos) << r.out;
  r = spool("plan -m " + kDemo + " --json --mem-gbps 10");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(nlohmann::json::parse(r.out)["mem_probe_bytes"].is_null());
  EXPECT_EQ(spool("plan -m " + kDemo + " --mem-gbps 10 --mem-probe-mib 32").code, 2);
  EXPECT_EQ(spool("plan -m " + kDemo + " --ram-gb 8 --mem-probe-mib 32").code, 2);
  EXPECT_EQ(spool("plan -m " + kDemo + " --mem-probe-mib -1").code, 2);
}

TEST(DoctorCli, ChecksWithFixes) {
  Result r = spool("doctor -m " + kDemo + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["ok"].get<bool>());
  std::set<std::string> names;
  for (const auto& c : j["checks"]) {
    names.insert(c["name"].get<std::string>());
    const std::string st = c["status"];
    EXPECT_TRUE(st == "ok" || st == "warn" || st == "fail") << st;
    if (st != "ok") {
      EXPECT_FALSE(c["fix"].get<std::string>().empty()) << c.dump();
    }
  }
  for (const char* n : {"model", "tokenizer", "simd", "memory", "disk", "o_direct", "io_uring"}) EXPECT_TRUE(names.count(n)) << n;
  EXPECT_TRUE(names.count("gpu") || names.count("gpu0"));  // "gpu" without a GPU, one "gpuN" per GPU
  r = spool("doctor -m /nonexistent/dir --json");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(nlohmann::json::parse(r.out)["checks"][0]["status"], "fail");
}

TEST(BenchCli, LlamaBenchTable) {
  Result r = spool("bench -m " + kDemo + " -p 16 -n 4 -r 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("| model | size | params | backend | threads | test | t/s |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| pp16 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| tg4 |"), std::string::npos) << r.out;
  r = spool("bench -m " + kDemo + " -p 8 -n 2 -r 2 --stream --cache-budget-gb 0.002 -o json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["test"], "pp8");
  EXPECT_EQ(j[0]["samples_ts"].size(), 2u);
  EXPECT_TRUE(j[1]["streaming"].get<bool>());
  EXPECT_LT(j[1]["cache_hit_rate"].get<double>(), 1.0);
  EXPECT_GT(j[1]["bytes_read_per_token"].get<double>(), 0);
  EXPECT_EQ(spool("bench -m " + kDemo + " -r 0").code, 2);
  EXPECT_EQ(spool("bench -m " + kDemo + " -o xml").code, 2);
  EXPECT_EQ(spool("bench -m " + kDemo + " -p 0 -n 0").code, 2);
}

}  // namespace

namespace {

// The cache policy flags: plan refuses them without --trace and a policy it does not know (usage
// errors, exit 2); with a trace, lfu is simulated and named in the JSON with the modelled stall.
TEST(PlanCli, CachePolicyNeedsATraceAndAKnownName) {
  for (const char* bad : {"--cache-policy lfu", "--cache-policy arc --trace x.jsonl", "--cache-half-life 0 --trace x.jsonl", "--expert-profile p.json",
                          "--no-hits-first", "--compute-gbps 5", "--compute-gbps -1 --trace x.jsonl"})
    EXPECT_EQ(spool("plan -m " + kDemo + " " + bad).code, 2) << bad;
  // A trace of the demo's shape (8 MoE layers, 64 experts, top-8) written here: 24 tokens.
  const std::string trace = "/tmp/spool_plan_policy_" + std::to_string(getpid()) + ".jsonl";
  {
    FILE* f = std::fopen(trace.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "{\"format\":\"spool-routing-trace\",\"version\":1,\"model_type\":\"x\",\"n_layers\":8,"
                    "\"moe_layers\":[0,1,2,3,4,5,6,7],\"n_experts\":64,\"top_k\":8,\"source\":\"calibrate\"}\n");
    for (int t = 0; t < 24; ++t)
      for (int l = 0; l < 8; ++l) {
        std::fprintf(f, "{\"l\":%d,\"t\":%d,\"e\":[", l, t);
        for (int i = 0; i < 8; ++i) std::fprintf(f, "%s%d", i ? "," : "", i < 4 ? i : 8 + (i * 5 + t * 3 + l) % 56);  // 4 hot, 4 moving
        std::fprintf(f, "],\"w\":[0.125,0.125,0.125,0.125,0.125,0.125,0.125,0.125]}\n");
      }
    std::fclose(f);
  }
  const Result r = spool("plan -m " + kDemo + " --json --stream --cache-budget-gb 0.002 --trace " + trace +
                         " -n 8 -r 1 --cache-policy lfu --mem-gbps 10 --disk-gbps 1 --compute-gbps 5");
  std::remove(trace.c_str());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["trace"]["cache_policy"], "lfu");
  EXPECT_GT(j["trace"]["stall_ms_per_token"].get<double>(), 0);
  EXPECT_GT(j["trace"]["decode_tok_s"].get<double>(), 0);
  EXPECT_EQ(j["trace"]["compute_gbps"].get<double>(), 5);
}

}  // namespace
