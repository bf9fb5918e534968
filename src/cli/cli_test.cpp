// End-to-end tests of the spool binary: golden output, JSON shape, exit codes, bad input.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <set>
#include <string>
#include <thread>

namespace {

namespace fs = std::filesystem;
const std::string kSpool = std::string(SPOOL_BINARY_DIR) + "/spool";
const std::string kData = SPOOL_TEST_DATA_DIR;

struct Result {
  int code = -1;
  std::string out, err;
};

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `spool <args>` through the shell; args must be shell-quoted by the caller.
Result spool(const std::string& args) {
  static int n = 0;
  const std::string base = ::testing::TempDir() + "/cli_" + std::to_string(getpid()) + "_" + std::to_string(n++);
  const std::string cmd = kSpool + " " + args + " >" + base + ".out 2>" + base + ".err";
  int st = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  return r;
}

// A scratch copy of a fixture model directory (model.safetensors unpacked by the build).
std::string copy_fixture(const std::string& name, const std::string& tag) {
  const std::string dst = ::testing::TempDir() + "/cli_fx_" + tag;
  fs::remove_all(dst);
  fs::copy(kData + "/models/" + name, dst, fs::copy_options::recursive);
  return dst;
}

TEST(Cli, GenerateDemoGoldenContinuation) {
  Result r = spool("generate --prompt 'Call me Ishmael. Some years ago' --temp 0 --max-tokens 48 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  auto g = nlohmann::json::parse(slurp(kData + "/models/spool-demo-moe/golden_prompts.json"));
  EXPECT_EQ(j["prompt_ids"], g[0]["prompt_ids"]);
  EXPECT_EQ(j["output_ids"], g[0]["greedy_ids"]);
  EXPECT_EQ(j["text"], g[0]["greedy_text"]);
  EXPECT_EQ(j["finish_reason"], "length");
  for (const char* k : {"load_s", "prefill_s", "prefill_tok_s", "decode_s", "decode_tok_s"}) EXPECT_TRUE(j["timings"].contains(k)) << k;
  EXPECT_GT(j["peak_rss_bytes"].get<uint64_t>(), 1000000u);
  // Streaming text mode prints the same continuation, stats on stderr.
  Result t = spool("generate --prompt 'Call me Ishmael. Some years ago' --temp 0 --max-tokens 48");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(t.out, g[0]["greedy_text"].get<std::string>() + "\n");
  EXPECT_NE(t.err.find("decode"), std::string::npos);
  EXPECT_NE(t.err.find("peak RSS"), std::string::npos);
}

// --ignore-eos: a copy of the demo model whose end-of-sequence id is the second token it writes
// greedily after "Oh, Lord" stops there; with the flag it runs on through the same tokens to
// --max-tokens.
TEST(Cli, GenerateIgnoreEosRunsPastEndOfSequence) {
  Result g = spool("generate --prompt 'Oh, Lord' --temp 0 --max-tokens 8 --json");
  ASSERT_EQ(g.code, 0) << g.err;
  const nlohmann::json greedy = nlohmann::json::parse(g.out)["output_ids"];
  ASSERT_EQ(greedy.size(), 8u);
  ASSERT_NE(greedy[0], greedy[1]);
  const std::string dir = ::testing::TempDir() + "/cli_ignore_eos_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::copy(SPOOL_DEFAULT_MODEL_DIR, dir, fs::copy_options::recursive);
  for (const char* f : {"config.json", "generation_config.json"}) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(slurp(dir + "/" + f));
    j["eos_token_id"] = greedy[1];
    if (j.contains("text_config")) j["text_config"]["eos_token_id"] = greedy[1];
    std::ofstream(dir + "/" + f) << j.dump(2);
  }
  Result stop = spool("generate --model " + dir + " --prompt 'Oh, Lord' --temp 0 --max-tokens 8 --json");
  ASSERT_EQ(stop.code, 0) << stop.err;
  const auto s = nlohmann::json::parse(stop.out);
  EXPECT_EQ(s["finish_reason"], "stop");
  EXPECT_EQ(s["output_ids"], nlohmann::json({greedy[0], greedy[1]}));
  Result on = spool("generate --model " + dir + " --prompt 'Oh, Lord' --temp 0 --max-tokens 8 --ignore-eos --json");
  ASSERT_EQ(on.code, 0) << on.err;
  const auto o = nlohmann::json::parse(on.out);
  EXPECT_EQ(o["finish_reason"], "length");
  EXPECT_EQ(o["output_ids"], greedy);
  fs::remove_all(dir);
}

TEST(Cli, GenerateChatRendersTheChatTemplate) {
  Result r = spool("generate --chat --system 'Be brief.' --prompt 'Hello there' --temp 0 --max-tokens 4 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  // The same ids as the rendered Qwen3 prompt given as raw text.
  const std::string raw = ::testing::TempDir() + "/cli_chat_prompt.txt";
  std::ofstream(raw) << "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n";
  Result ids = spool("generate --file " + raw + " --max-tokens 0 --json");
  ASSERT_EQ(ids.code, 0) << ids.err;
  auto j = nlohmann::json::parse(r.out), t = nlohmann::json::parse(ids.out);
  EXPECT_EQ(j["prompt_ids"], t["prompt_ids"]) << ids.out;
  EXPECT_EQ(spool("generate --system x --prompt hi").code, 2);
  EXPECT_EQ(spool("generate --chat --prompt-ids 1,2").code, 2);
  EXPECT_EQ(spool("generate --chat --prompt hi --chat-template-kwargs '[1]'").code, 2);
}

// GLM-4.5, GLM-4.7-Flash and MiniMax-M2 fixtures (no tokenizer): spool generate from ids gives
// transformers' greedy ids, resident and streamed through an empty expert cache.
TEST(Cli, GlmAndMiniMaxGenerateGreedyIds) {
  for (const char* f : {"glm4_moe", "glm4_moe_lite", "minimax_m2"}) {
    SCOPED_TRACE(f);
    const std::string dir = kData + "/models/" + f;
    auto g = nlohmann::json::parse(slurp(dir + "/golden.json"));
    std::string ids;
    for (auto& x : g["prompt_ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(x.get<int>());
    for (const char* mode : {"--no-stream", "--stream --cache-budget-gb 0"}) {
      Result r = spool("generate --model " + dir + " --prompt-ids " + ids + " --temp 0 --max-tokens 12 --json " + mode);
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_EQ(nlohmann::json::parse(r.out)["output_ids"], g["greedy_ids"]) << mode;
    }
  }
}

TEST(Cli, PromptIdsWithoutTokenizer) {
  auto g = nlohmann::json::parse(slurp(kData + "/models/qwen3_5_moe_vl_fused/golden.json"));
  std::string ids;
  for (auto& x : g["prompt_ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(x.get<int>());
  Result r = spool("generate --model " + kData + "/models/qwen3_5_moe_vl_fused --prompt-ids " + ids + " --temp 0 --max-tokens 12 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["output_ids"], g["greedy_ids"]);
  EXPECT_FALSE(j.contains("text"));
  Result p = spool("generate --model " + kData + "/models/qwen3_moe --prompt hello");
  EXPECT_EQ(p.code, 1);
  EXPECT_NE(p.err.find("tokenizer.json"), std::string::npos) << p.err;
}

TEST(Cli, UsageErrorsExit2) {
  EXPECT_EQ(spool("").code, 2);
  EXPECT_EQ(spool("generate").code, 2);
  EXPECT_EQ(spool("generate --prompt a --prompt-ids 1").code, 2);
  EXPECT_EQ(spool("generate --prompt a --temp -1").code, 2);
  EXPECT_EQ(spool("generate --prompt a --top-p 1.5").code, 2);
  EXPECT_EQ(spool("generate --prompt a --max-tokens abc").code, 2);
  EXPECT_EQ(spool("generate --prompt-ids 1,x").code, 2);
  EXPECT_EQ(spool("generate --no-such-flag").code, 2);
  EXPECT_EQ(spool("frobnicate").code, 2);
  EXPECT_EQ(spool("perplexity").code, 2);
  EXPECT_EQ(spool("generate --help").code, 0);
  const Result act = spool("generate --prompt-ids 1 --max-tokens 1 --act-bits 7");
  EXPECT_EQ(act.code, 2);
  EXPECT_NE(act.err.find("--act-bits must be 8, 32 or auto (got '7')"), std::string::npos) << act.err;
  // (the demo is safetensors: the flag parses and runs, and says it changes nothing; the int8 path
  // itself: ggml_q8_test, GgufKQuantModel.WideModelWithInt8Activations)
  const Result act8 = spool("generate --prompt-ids 1,2,3 --max-tokens 2 --temp 0 --act-bits 8");
  EXPECT_EQ(act8.code, 0) << act8.err;
  EXPECT_NE(act8.err.find("--act-bits 8"), std::string::npos) << act8.err;
  EXPECT_EQ(act8.err.find("int8 activations"), std::string::npos) << "no Q4_K / Q6_K weights here: " << act8.err;
  for (const char* bits : {"auto", "32", ""}) {  // the default (auto) and 32 say nothing on a safetensors model
    const Result r = spool(std::string("generate --prompt-ids 1,2,3 --max-tokens 2 --temp 0") +
                           (*bits != 0 ? std::string(" --act-bits ") + bits : std::string()));
    EXPECT_EQ(r.code, 0) << bits << ": " << r.err;
    EXPECT_EQ(r.err.find("act-bits"), std::string::npos) << bits << ": " << r.err;
    EXPECT_EQ(r.err.find("int8 activations"), std::string::npos) << bits << ": " << r.err;
  }
}

// spool bench: the plain table on the demo model; --spec mtp adds the "tgN mtp" row beside the
// plain "tgN" of the same run (both greedy generations, repetitions interleaved) with acceptance,
// tokens per verify step and speedup, in the markdown table and the JSON; bad spec flags exit 2.
TEST(Cli, BenchSpecMtpRowsBesideThePlainOnes) {
  Result r = spool("bench -p 16 -n 8 -r 1 -t 2 -o json");
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[1]["test"], "tg8");
  EXPECT_FALSE(j[1].contains("spec"));  // the plain bench is unchanged

  // (auto-off off: its timing probe depends on the machine, the rows here must not)
  r = spool("bench -p 0 -n 40 -r 2 -t 2 --spec mtp --spec-min-acceptance 0 -o json");
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u) << r.out;
  const auto& plain = j[0];
  const auto& mtp = j[1];
  EXPECT_EQ(plain["test"], "tg40");
  EXPECT_EQ(plain["spec"], "none");
  EXPECT_FALSE(plain.contains("acceptance"));
  EXPECT_EQ(mtp["test"], "tg40 mtp");
  EXPECT_EQ(mtp["spec"], "mtp");
  EXPECT_EQ(mtp["draft_max"], 1);
  EXPECT_EQ(mtp["samples_ts"].size(), 2u);
  EXPECT_EQ(plain["samples_ts"].size(), 2u);
  const double acc = mtp["acceptance"].get<double>(), tps = mtp["tokens_per_step"].get<double>();
  EXPECT_GT(acc, 0.0);
  EXPECT_LT(acc, 1.0);
  // One draft per step: each step emits 1 + its accepted draft.
  EXPECT_NEAR(tps, 1.0 + acc, 1e-9);
  EXPECT_EQ(mtp["accepted"].get<int64_t>(), static_cast<int64_t>(std::llround(acc * mtp["drafted"].get<double>())));
  EXPECT_TRUE(mtp["same_output"].get<bool>());  // greedy: the head changes the speed, not the tokens
  EXPECT_TRUE(plain["same_output"].get<bool>());
  EXPECT_NEAR(mtp["speedup"].get<double>(), mtp["avg_ts"].get<double>() / plain["avg_ts"].get<double>(), 1e-9);
  EXPECT_EQ(mtp["auto_off_runs"], 0);

  r = spool("bench -p 0 -n 24 -r 1 -t 2 --spec mtp --draft-max 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| acceptance | tokens/step | speedup |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| tg24 mtp |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| tg24 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tg24 mtp: 2 draft(s) per step, acceptance"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("output identical to the plain row's"), std::string::npos) << r.out;

  EXPECT_EQ(spool("bench -p 0 -n 8 --draft-max 2").code, 2);       // needs --spec mtp
  EXPECT_EQ(spool("bench -p 16 -n 0 --spec mtp").code, 2);         // no tg test to speculate in
  EXPECT_EQ(spool("bench -n 8 --spec mtp --draft-max 17").code, 2);
  EXPECT_EQ(spool("bench -n 8 --spec eagle").code, 2);
}

// spool bench --lora / --lora-distinct (docs/lora.md): each test runs once per D, rows "<test>
// loraD" with lora_distinct (and n_lora) in the JSON, every row with its own -r samples; without
// --lora-distinct the rows keep their names. D beyond the adapters loaded, a D listed twice and
// --lora-distinct with --spec mtp are usage errors.
TEST(Cli, BenchLoraDistinctRows) {
  const std::string a = kData + "/lora/spool-demo-moe-dev";
  Result r = spool("bench -p 8 -n 4 -r 2 -t 2 --parallel 1,2 --lora " + a + " --lora-distinct 0,1 -o json");
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  const std::vector<std::pair<std::string, int>> want = {{"pp8 lora0", 0}, {"pp8 lora1", 1},    {"tg4 lora0", 0},
                                                         {"tg4 lora1", 1}, {"tg4 x2 lora0", 0}, {"tg4 x2 lora1", 1}};
  ASSERT_EQ(j.size(), want.size()) << r.out;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(j[i]["test"], want[i].first) << i;
    EXPECT_EQ(j[i]["lora_distinct"], want[i].second) << i;
    EXPECT_EQ(j[i]["n_lora"], 1) << i;
    EXPECT_EQ(j[i]["samples_ts"].size(), 2u) << i;
    EXPECT_GT(j[i]["avg_ts"].get<double>(), 0.0) << i;
  }
  EXPECT_EQ(j[4]["n_parallel"], 2);

  r = spool("bench -p 0 -n 4 -r 1 -t 2 --lora " + a + " --lora " + a + " --lora-distinct 2,0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| tg4 lora2 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| tg4 lora0 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("loraD rows: D of the 2 --lora adapters active"), std::string::npos) << r.out;

  r = spool("bench -p 0 -n 4 -r 1 -t 2 -o json --lora " + a);  // no --lora-distinct: plain names
  ASSERT_EQ(r.code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["test"], "tg4");
  EXPECT_FALSE(j[0].contains("lora_distinct"));
  EXPECT_EQ(j[0]["n_lora"], 1);

  Result over = spool("bench -p 8 -n 4 --lora " + a + " --lora-distinct 2");
  EXPECT_EQ(over.code, 2);
  EXPECT_NE(over.err.find("--lora-distinct 2: needs 0..1"), std::string::npos) << over.err;
  EXPECT_EQ(spool("bench -p 8 -n 4 --lora-distinct 1").code, 2);  // no adapters
  EXPECT_EQ(spool("bench -p 8 -n 4 --lora " + a + " --lora-distinct 1,1").code, 2);
  EXPECT_EQ(spool("bench -p 0 -n 4 --lora " + a + " --lora-distinct 0 --spec mtp").code, 2);
}

// spool bench -d N (llama-bench's --n-depth): every test runs after N tokens of context, its rows
// named "<test> @ dN" with n_depth in the JSON; a negative depth or one beside --spec mtp exits 2.
TEST(Cli, BenchDepthRows) {
  Result r = spool("bench -p 8 -n 4 -d 20 -r 1 -t 2 -o json");
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["test"], "pp8 @ d20");
  EXPECT_EQ(j[1]["test"], "tg4 @ d20");
  EXPECT_EQ(j[1]["n_depth"], 20);
  EXPECT_GT(j[1]["avg_ts"].get<double>(), 0.0);
  EXPECT_EQ(spool("bench -p 8 -n 4 -d -1").code, 2);
  EXPECT_EQ(spool("bench -p 0 -n 4 -d 8 --spec mtp").code, 2);
}

// synth --mtp: a family without an MTP layout is a usage error naming it.
TEST(Cli, SynthMtpNeedsAnMtpFamily) {
  const Result r = spool("synth --preset tiny-gemma4-moe --mtp --no-check -o " + ::testing::TempDir() + "/cli_synth_mtp_bad");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--mtp: preset tiny-gemma4-moe (family gemma4_text_moe) has no multi-token-prediction layout"), std::string::npos) << r.err;
}

// --device: cpu runs and says so in the stats; a malformed value is a usage error (2); cuda on a
// machine without a GPU (or a build without CUDA) is refused with a message naming the problem.
TEST(Cli, DeviceFlag) {
  Result r = spool("generate --prompt-ids 1,2,3 --max-tokens 2 --temp 0 --device cpu --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["stats"]["device"], "cpu");
  Result bad = spool("generate --prompt-ids 1,2,3 --max-tokens 2 --device gpu");
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--device must be cpu, cuda, cuda:N or auto"), std::string::npos) << bad.err;
  EXPECT_EQ(spool("generate --prompt-ids 1 --max-tokens 1 --device cuda --vram-budget-gb lots").code, 2);
  EXPECT_EQ(spool("generate --prompt-ids 1 --max-tokens 1 --vram-experts everywhere").code, 2);
  EXPECT_EQ(spool("generate --prompt-ids 1,2,3 --max-tokens 2 --temp 0 --device cpu --vram-experts static").code, 0)
      << "a CPU run takes the flag (it places nothing)";
  Result g = spool("generate --prompt-ids 1,2,3 --max-tokens 2 --device cuda:7");
  EXPECT_NE(g.code, 0);
  EXPECT_TRUE(g.err.find("no such GPU") != std::string::npos || g.err.find("no CUDA backend") != std::string::npos) << g.err;
}

// Each broken checkpoint gives exit 1 and a message naming the problem.
void expect_model_error(const std::string& dir, const std::string& needle) {
  Result r = spool("generate --model " + dir + " --prompt-ids 1,2,3 --max-tokens 2");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
}

TEST(Cli, BadCheckpointsExit1) {
  expect_model_error(::testing::TempDir() + "/no/such/dir", "does not exist");
  {  // truncated weights
    std::string d = copy_fixture("qwen3_moe", "trunc");
    fs::resize_file(d + "/model.safetensors", fs::file_size(d + "/model.safetensors") / 2);
    expect_model_error(d, "past the end");
  }
  {  // header length past EOF
    std::string d = copy_fixture("qwen3_moe", "hlen");
    std::fstream f(d + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    const char big[8] = {'\xff', '\xff', '\xff', '\x00', 0, 0, 0, 0};
    f.write(big, 8);
    f.close();
    expect_model_error(d, "header length");
  }
  {  // offsets edited to overlap: rewrite the header with the first two tensors sharing bytes
    std::string d = copy_fixture("qwen3_moe", "overlap");
    std::string bytes = slurp(d + "/model.safetensors");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
    auto h = nlohmann::ordered_json::parse(bytes.substr(8, n));
    auto it = h.begin();
    if (it.key() == "__metadata__") ++it;
    auto& a = it.value();
    ++it;
    auto& b = it.value();
    b["data_offsets"][0] = a["data_offsets"][0];
    b["data_offsets"][1] = a["data_offsets"][0].get<uint64_t>() + (b["data_offsets"][1].get<uint64_t>() - b["data_offsets"][0].get<uint64_t>());
    std::string hs = h.dump();
    hs.resize(n, ' ');
    ASSERT_EQ(hs.size(), n);
    bytes.replace(8, n, hs);
    std::ofstream(d + "/model.safetensors", std::ios::binary) << bytes;
    expect_model_error(d, "overlap");
  }
  {  // config disagrees with tensor shapes
    std::string d = copy_fixture("qwen3_moe", "shape");
    auto c = nlohmann::json::parse(slurp(d + "/config.json"));
    c["moe_intermediate_size"] = 48;
    std::ofstream(d + "/config.json") << c.dump();
    expect_model_error(d, "has shape");
  }
  {  // missing config field
    std::string d = copy_fixture("qwen3_next", "field");
    auto c = nlohmann::json::parse(slurp(d + "/config.json"));
    c.erase("num_hidden_layers");
    std::ofstream(d + "/config.json") << c.dump();
    expect_model_error(d, "num_hidden_layers");
  }
  {  // unknown architecture
    std::string d = copy_fixture("qwen3_moe", "arch");
    auto c = nlohmann::json::parse(slurp(d + "/config.json"));
    c["model_type"] = "llama4_text";
    std::ofstream(d + "/config.json") << c.dump();
    expect_model_error(d, "llama4_text");
  }
  {  // missing shard
    std::string d = copy_fixture("qwen3_moe", "shard");
    std::ofstream(d + "/model.safetensors.index.json") << R"({"weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}})";
    expect_model_error(d, "missing shard");
  }
  {  // malformed config.json
    std::string d = copy_fixture("qwen3_moe", "json");
    std::ofstream(d + "/config.json") << "{\"model_type\": \"qwen3_moe\",";
    expect_model_error(d, "not valid JSON");
  }
  {  // token id outside the vocabulary
    Result r = spool("generate --model " + kData + "/models/qwen3_moe --prompt-ids 1,999999 --max-tokens 2");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("vocabulary"), std::string::npos) << r.err;
  }
}

TEST(Cli, TokenizeInfoPerplexity) {
  Result t = spool("tokenize --text 'The whale' --json");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(nlohmann::json::parse(t.out)["ids"], nlohmann::json::parse("[1935, 886]"));
  {  // a .gguf's tokenizer.ggml.* metadata, text from a file (its newline included)
    const std::string f = ::testing::TempDir() + "cli_tokenize_text.txt";
    std::ofstream(f) << "The whale\n";
    Result g = spool("tokenize --model " + kData + "/gguf/qwen3_tokenizer.gguf --text-file " + f);
    ASSERT_EQ(g.code, 0) << g.err;
    EXPECT_EQ(g.out, "785 50019 198\n");
    Result none = spool("tokenize --model " + kData + "/gguf/qwen3_tokenizer.gguf");
    EXPECT_EQ(none.code, 2);
    EXPECT_NE(none.err.find("--text or --text-file"), std::string::npos) << none.err;
  }
  Result i = spool("info");
  ASSERT_EQ(i.code, 0) << i.err;
  EXPECT_NE(i.out.find("qwen3_5_moe_text"), std::string::npos);
  Result ij = spool("info --json --model " + kData + "/models/qwen3_5_moe_vl_fused");
  ASSERT_EQ(ij.code, 0) << ij.err;
  EXPECT_EQ(nlohmann::json::parse(ij.out)["expert_layout"], "fused");
  Result p = spool("perplexity --file " + kData + "/corpus/dev.txt --chunks 2 --json");
  ASSERT_EQ(p.code, 0) << p.err;
  auto pj = nlohmann::json::parse(p.out);
  EXPECT_EQ(pj["tokens"], 1024);
  EXPECT_GT(pj["ppl"].get<double>(), 10.0);
  EXPECT_LT(pj["ppl"].get<double>(), 200.0);
  EXPECT_EQ(spool("perplexity --file /no/such/file.txt").code, 1);
  // llama-perplexity's definition: 2 chunks of 64 tokens, 31 scored in each; its output format.
  Result l = spool("perplexity --llama-compat -c 64 --chunks 2 --threads 2 --file " + kData + "/corpus/dev.txt --json");
  ASSERT_EQ(l.code, 0) << l.err;
  auto lj = nlohmann::json::parse(l.out);
  EXPECT_EQ(lj["definition"], "llama-perplexity");
  EXPECT_EQ(lj["chunks"], 2);
  EXPECT_EQ(lj["tokens"], 62);
  ASSERT_EQ(lj["running_ppl"].size(), 2u);
  EXPECT_DOUBLE_EQ(lj["running_ppl"][1].get<double>(), lj["ppl"].get<double>());
  Result lt = spool("perplexity --llama-compat -c 64 --chunks 2 --threads 2 --file " + kData + "/corpus/dev.txt");
  ASSERT_EQ(lt.code, 0) << lt.err;
  EXPECT_EQ(lt.out.rfind("[1]", 0), 0u) << lt.out;
  EXPECT_NE(lt.out.find(",[2]"), std::string::npos) << lt.out;
  EXPECT_NE(lt.out.find("\nFinal estimate: PPL = "), std::string::npos) << lt.out;
  // --kl-reference over llama-perplexity's scored positions, run in steps of 16 so the unscored
  // first half goes through logit-free steps: the reference (the exact demo model) scores the same
  // tokens as a plain run with the same steps; the model under test (4 of 8 experts) differs from it.
  Result l16 = spool("perplexity --llama-compat -c 64 --chunks 2 --threads 2 --prefill-step-size 16 --file " + kData +
                     "/corpus/dev.txt --json");
  ASSERT_EQ(l16.code, 0) << l16.err;
  const double ppl16 = nlohmann::json::parse(l16.out)["ppl"].get<double>();
  Result k = spool("perplexity --llama-compat -c 64 --chunks 2 --threads 2 --prefill-step-size 16 --max-active-experts 4 --file " +
                   kData + "/corpus/dev.txt --json --kl-reference " + std::string(SPOOL_DEFAULT_MODEL_DIR));
  ASSERT_EQ(k.code, 0) << k.err;
  auto kj = nlohmann::json::parse(k.out);
  EXPECT_EQ(kj["tokens"], 62);
  // Same per-token NLLs; only the order of the double sums differs (per token vs per chunk).
  EXPECT_NEAR(kj["reference"]["ppl"].get<double>(), ppl16, 1e-12 * ppl16);
  EXPECT_NE(kj["ppl"].get<double>(), ppl16);
  EXPECT_GT(kj["reference"]["mean_kl"].get<double>(), 0.0);
  EXPECT_GT(kj["reference"]["top1_agreement"].get<double>(), 0.5);
  EXPECT_LT(kj["reference"]["top1_agreement"].get<double>(), 1.0);
  Result kt = spool("perplexity --llama-compat -c 64 --chunks 2 --threads 2 --file " + kData +
                    "/corpus/dev.txt --kl-reference " + std::string(SPOOL_DEFAULT_MODEL_DIR));
  ASSERT_EQ(kt.code, 0) << kt.err;
  EXPECT_NE(kt.out.find("\nMean KLD: 0.000000\nSame top p: 100.000 %"), std::string::npos) << kt.out;
  Result few = spool("perplexity --llama-compat -c 100000 --file " + kData + "/corpus/dev.txt");
  EXPECT_EQ(few.code, 1);
  EXPECT_NE(few.err.find("you need at least 200000 tokens"), std::string::npos) << few.err;
  EXPECT_EQ(spool("perplexity --llama-compat -c 1 --file " + kData + "/corpus/dev.txt").code, 2);
}

// --lora FILE[:SCALE] (docs/lora.md): the demo model's trained adapter gives PEFT's greedy ids
// and dev perplexity (40 windows of 512, make_fixtures5.py's ppl()); at scale 0 the base's ids.
TEST(Cli, LoraGenerateAndPerplexityMatchPeft) {
  const std::string a = kData + "/lora/spool-demo-moe-dev";
  const nlohmann::json lora = nlohmann::json::parse(slurp(a + "/golden_prompts_lora.json"));
  const nlohmann::json base = nlohmann::json::parse(slurp(a + "/golden_prompts_base.json"));
  const std::string gen = "generate --prompt 'Call me Ishmael. Some years ago' --temp 0 --max-tokens 48 --json --threads 2 ";
  Result r = spool(gen + "--lora " + a);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["output_ids"], lora[0]["greedy_ids"]);
  EXPECT_NE(r.err.find("LoRA adapter 0: " + a), std::string::npos) << r.err;
  Result f = spool(gen + "--lora " + a + "/adapter_model.safetensors:1");
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_EQ(nlohmann::json::parse(f.out)["output_ids"], lora[0]["greedy_ids"]);
  Result z = spool(gen + "--lora " + a + ":0");
  ASSERT_EQ(z.code, 0) << z.err;
  EXPECT_EQ(nlohmann::json::parse(z.out)["output_ids"], base[0]["greedy_ids"]);
  // The adapter's bytes (its f32 A and B, and the transposed B the products read) count as resident.
  Result plain = spool(gen);
  ASSERT_EQ(plain.code, 0) << plain.err;
  const auto resident = [](const Result& x) { return nlohmann::json::parse(x.out)["stats"]["memory"]["dense_resident"].get<int64_t>(); };
  const int64_t file = static_cast<int64_t>(fs::file_size(a + "/adapter_model.safetensors"));
  EXPECT_GE(resident(r) - resident(plain), file - 65536);
  EXPECT_LE(resident(r) - resident(plain), 2 * file);
  Result h = spool(gen + "--lora " + a + ":0.5 --lora " + a + ":0.5");  // two halves add up to the whole
  ASSERT_EQ(h.code, 0) << h.err;
  EXPECT_EQ(nlohmann::json::parse(h.out)["output_ids"], lora[0]["greedy_ids"]);
  const nlohmann::json ppl = nlohmann::json::parse(slurp(a + "/golden_perplexity_lora.json"))["dev_with_lora"];
  Result p = spool("perplexity --file " + kData + "/corpus/dev.txt --chunks 40 --threads 2 --json --lora " + a);
  ASSERT_EQ(p.code, 0) << p.err;
  const nlohmann::json pj = nlohmann::json::parse(p.out);
  EXPECT_EQ(pj["tokens"], ppl["tokens"]);
  EXPECT_NEAR(pj["mean_nll"].get<double>(), ppl["mean_nll"].get<double>(), 1e-5 * ppl["mean_nll"].get<double>());
}

TEST(Cli, LoraBadInput) {
  Result none = spool("generate --prompt x --max-tokens 1 --lora /no/such/adapter:2");
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.err.find("/no/such/adapter: no such LoRA adapter"), std::string::npos) << none.err;
  Result empty = spool("generate --prompt x --max-tokens 1 --lora :2");
  EXPECT_EQ(empty.code, 2);
  EXPECT_NE(empty.err.find("no adapter path"), std::string::npos) << empty.err;
  // An adapter of another model: its modules' shapes do not fit the demo model's.
  Result other = spool("generate --prompt x --max-tokens 1 --lora " + kData + "/lora/qwen3_5_moe_text/attn_mlp");
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.err.find("shape mismatch"), std::string::npos) << other.err;
}

// --ctx-size and --prefill-step-size reach the loader: the KV/state and workspace it keeps out
// of the expert-cache budget are `spool plan`'s for the same settings (stats.memory of --json).
TEST(Cli, LoaderBudgetUsesCtxSizeAndPrefillStep) {
  auto plan = [](int64_t ctx, int64_t step) {
    Result r = spool("plan --model " + std::string(SPOOL_DEFAULT_MODEL_DIR) + " --stream --threads 2 --mem-gbps 10 --ctx-size " +
                     std::to_string(ctx) + " --prefill-step-size " + std::to_string(step) + " --json");
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out)["components"];
  };
  auto expect_same = [](const nlohmann::json& m, const nlohmann::json& c) {
    EXPECT_EQ(m["dense_resident"], c["dense_resident"]);
    EXPECT_EQ(m["state"].get<uint64_t>(), c["kv"].get<uint64_t>() + c["recurrent_state"].get<uint64_t>() + c["kv_grow_transient"].get<uint64_t>());
    EXPECT_EQ(m["workspace"], c["workspace"]);
    EXPECT_EQ(m["tokenizer"], c["tokenizer"]);
    EXPECT_EQ(m["tables"], c["tables"]);
  };
  const std::string ids7 = " --prompt-ids 1,2,3,4,5,6,7";
  std::set<uint64_t> workspaces;
  for (int64_t step : {16, 64, 512}) {
    SCOPED_TRACE(step);
    Result g = spool("generate --stream --threads 2 --temp 0 -n 4 --ctx-size 600 --prefill-step-size " + std::to_string(step) + ids7 +
                     " --json");
    ASSERT_EQ(g.code, 0) << g.err;
    const auto m = nlohmann::json::parse(g.out)["stats"]["memory"];
    EXPECT_EQ(m["ctx_size"], 600);
    EXPECT_EQ(m["prefill_step"], step);
    EXPECT_TRUE(m["streaming"]);
    EXPECT_TRUE(m["cache_budget_auto"]);
    expect_same(m, plan(600, step));
    workspaces.insert(m["workspace"].get<uint64_t>());
  }
  EXPECT_EQ(workspaces.size(), 3u);  // the step sizes the workspace
  {
    // Default context: the prompt's 7 tokens + --max-tokens 9.
    Result g = spool("generate --stream --threads 2 --temp 0 -n 9 --prefill-step-size 64" + ids7 + " --json");
    ASSERT_EQ(g.code, 0) << g.err;
    const auto m = nlohmann::json::parse(g.out)["stats"]["memory"];
    EXPECT_EQ(m["ctx_size"], 16);
    expect_same(m, plan(16, 64));
  }
  // An explicit --ctx-size sizes the KV cache and attention scores.
  Result g = spool("generate --stream --threads 2 --temp 0 -n 4 --ctx-size 3000 --prefill-step-size 128" + ids7 + " --json");
  ASSERT_EQ(g.code, 0) << g.err;
  const auto m = nlohmann::json::parse(g.out)["stats"]["memory"];
  EXPECT_EQ(m["ctx_size"], 3000);
  expect_same(m, plan(3000, 128));
  EXPECT_EQ(spool("generate --ctx-size 5 -n 1" + ids7).code, 2);  // the prompt does not fit
  // perplexity: a window is the context.
  Result p = spool("perplexity --file " + kData + "/corpus/dev.txt --chunks 1 --window 200 --prefill-step-size 64 --threads 2 --stream --json");
  ASSERT_EQ(p.code, 0) << p.err;
  const auto pm = nlohmann::json::parse(p.out)["stats"]["memory"];
  EXPECT_EQ(pm["ctx_size"], 200);
  EXPECT_EQ(pm["prefill_step"], 64);
  expect_same(pm, plan(200, 64));
}

// A converted model in `dir` generates 12 greedy tokens, the same ones resident and streaming its
// experts through a 1 MB cache.
void expect_generates_resident_and_streamed(const std::string& dir) {
  Result g = spool("generate --model " + dir + " --prompt 'Call me Ishmael.' --temp 0 --max-tokens 12 --json");
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(nlohmann::json::parse(g.out)["output_ids"].size(), 12u);
  Result s = spool("generate --model " + dir + " --stream --cache-budget-gb 0.001 --prompt 'Call me Ishmael.' --temp 0 --max-tokens 12 --json");
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(nlohmann::json::parse(s.out)["output_ids"], nlohmann::json::parse(g.out)["output_ids"]);
}

// convert --embed-bits 4: the embedding table quantized (summary, info), the model generates
// the same ids resident and streamed; a bad value is a usage error naming the flag.
TEST(Cli, ConvertEmbedBits) {
  const std::string out = ::testing::TempDir() + "/cli_convert_q4_embed4";
  fs::remove_all(out);
  Result c = spool("convert --recipe q4 --embed-bits 4 --out " + out + " --json");
  ASSERT_EQ(c.code, 0) << c.err;
  auto cj = nlohmann::json::parse(c.out);
  ASSERT_TRUE(cj["classes"].contains("embed_tokens")) << c.out;
  EXPECT_EQ(cj["classes"]["embed_tokens"]["tensors"], 1);
  EXPECT_NEAR(cj["classes"]["embed_tokens"]["bits_per_weight"].get<double>(), 4.25, 0.01);  // 4 + 16/64 (+ codebook, signs)
  EXPECT_NE(c.err.find("embed_tokens q4 g64"), std::string::npos) << c.err;
  Result i = spool("info --model " + out);
  ASSERT_EQ(i.code, 0) << i.err;
  EXPECT_NE(i.out.find("embed_tokens 4 g64"), std::string::npos) << i.out;
  expect_generates_resident_and_streamed(out);
  Result bad = spool("convert --embed-bits 7 --out " + out + "_x");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--embed-bits must be 2, 3, 4, 5, 6, 8, ternary or bf16"), std::string::npos) << bad.err;
  fs::remove_all(out);
}

// convert -> info -> generate -> perplexity --kl-reference on the demo model, and convert's
// usage errors.
TEST(Cli, ConvertThenGenerate) {
  const std::string out = ::testing::TempDir() + "/cli_convert_q4";
  fs::remove_all(out);
  Result c = spool("convert --recipe q4 --out " + out + " --json");
  ASSERT_EQ(c.code, 0) << c.err;
  auto cj = nlohmann::json::parse(c.out);
  EXPECT_EQ(cj["recipe"], "q4");
  EXPECT_EQ(cj["padding_bytes"], 0);
  EXPECT_GT(cj["bits_per_weight"].get<double>(), 4.0);
  EXPECT_LT(cj["bits_per_weight"].get<double>(), 7.0);  // embeddings stay bf16: ~5.9 on the demo
  Result i = spool("info --model " + out);
  ASSERT_EQ(i.code, 0) << i.err;
  EXPECT_NE(i.out.find("quantized   spool recipe q4"), std::string::npos) << i.out;
  expect_generates_resident_and_streamed(out);
  Result p = spool("perplexity --model " + out + " --kl-reference " + std::string(SPOOL_DEFAULT_MODEL_DIR) +
                   " --file " + kData + "/corpus/dev.txt --chunks 1 --json");
  ASSERT_EQ(p.code, 0) << p.err;
  auto pj = nlohmann::json::parse(p.out);
  EXPECT_GT(pj["reference"]["mean_kl"].get<double>(), 0.0);
  EXPECT_LT(pj["reference"]["mean_kl"].get<double>(), 0.5);
  EXPECT_GT(pj["reference"]["top1_agreement"].get<double>(), 0.5);
  // Usage errors exit 2; a non-empty output directory or a quantized source exits 1.
  EXPECT_EQ(spool("convert --recipe q7 --out " + out + "_x").code, 2);
  EXPECT_EQ(spool("convert --bits 7 --out " + out + "_x").code, 2);
  EXPECT_EQ(spool("convert --bits 9 --out " + out + "_x").code, 2);
  EXPECT_EQ(spool("convert --attn-bits 7 --out " + out + "_x").code, 2);
  EXPECT_EQ(spool("convert --group-size 48 --out " + out + "_x").code, 2);
  EXPECT_EQ(spool("convert --expert-bits 1 --out " + out + "_x").code, 2);
  EXPECT_EQ(spool("convert --rotation fourier --out " + out + "_x").code, 2);
  EXPECT_EQ(spool("convert --recipe q4").code, 2);  // --out missing
  EXPECT_EQ(spool("convert --recipe q4 --out " + out).code, 1);
  Result q = spool("convert --model " + out + " --out " + out + "_y");
  EXPECT_EQ(q.code, 1);
  EXPECT_NE(q.err.find("already"), std::string::npos) << q.err;
  // --target-bpw and its companions: usage errors (2), an unreachable size (1, naming the minimum).
  EXPECT_EQ(spool("convert --target-bpw 4 --recipe q4 --out " + out + "_x").code, 2);
  EXPECT_EQ(spool("convert --target-bpw 17 --out " + out + "_x").code, 2);
  EXPECT_EQ(spool("convert --target-bpw 4 --sensitivity dense=-1 --out " + out + "_x").code, 2);
  EXPECT_EQ(spool("convert --target-bpw 4 --sensitivity colour=1 --out " + out + "_x").code, 2);
  EXPECT_EQ(spool("convert --sensitivity dense=1 --out " + out + "_x").code, 2);
  EXPECT_EQ(spool("convert --recipe q4 --calibration tests/data/corpus/dev.txt --out " + out + "_x").code, 2);
  Result low = spool("convert --target-bpw 1 --out " + out + "_low");
  EXPECT_EQ(low.code, 1);
  EXPECT_NE(low.err.find("below what this checkpoint can reach"), std::string::npos) << low.err;
  EXPECT_FALSE(std::filesystem::exists(out + "_low"));
}

// The streaming statistics of `generate --json` are the counts they are named after, checked
// against what is known independently: every decode token asks for K experts at each of the L
// MoE layers (the demo model has no dense-MLP layers).
TEST(Cli, StreamingStatsAreTheCounts) {
  Result info = spool("info --json");
  ASSERT_EQ(info.code, 0) << info.err;
  const auto ij = nlohmann::json::parse(info.out);
  const double L = ij["layers"].get<double>(), K = ij["experts_per_token"].get<double>();
  const std::string gen = "generate --prompt 'Call me Ishmael. Some years ago' --temp 0 --max-tokens 9 --json --stream ";
  auto stats = [&](const std::string& flags) {
    Result r = spool(gen + flags);
    EXPECT_EQ(r.code, 0) << flags << ": " << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("stats")) << r.out;
    return j.is_object() && j.contains("stats") ? j["stats"] : nlohmann::json::object();
  };
  // No cache beyond the current layer: every request is a read, K * L per token, no hits.
  const auto none = stats("--cache-budget-gb 0");
  ASSERT_TRUE(none.contains("tokens"));
  const double T = none["tokens"].get<double>();
  EXPECT_EQ(T, 8);  // 9 tokens: the first comes from the prefill, 8 decode forwards
  EXPECT_EQ(none["streaming"], true);
  EXPECT_DOUBLE_EQ(none["experts_read_per_token"].get<double>(), K * L);
  EXPECT_EQ(none["cache_hit_rate"].get<double>(), 0.0);
  EXPECT_EQ(none["prefetch_issued"].get<uint64_t>(), 0u);
  EXPECT_EQ(none["prefetch_rescue_rate"].get<double>(), 0.0);
  EXPECT_NEAR(none["bytes_read_per_token"].get<double>() * T, none["bytes_read"].get<double>(), 1.0);
  // Every expert fits: requests = hits + reads.
  const double requests = K * L * T;
  const auto all = stats("--cache-budget-gb 1");
  const double reads = all["experts_read_per_token"].get<double>() * T, hits = all["cache_hit_rate"].get<double>() * requests;
  EXPECT_NEAR(reads + hits, requests, 1e-6);
  EXPECT_GT(hits, 0.0);
  EXPECT_EQ(all["prefetch_rescue_rate"].get<double>(), 0.0);
  // Prefetch-ahead without a cache: the run without prefetch has no hit, so every hit now is a
  // prefetched expert that was used (rescued): rescue rate = hit rate; and experts read = the
  // remaining misses + the prefetches.
  const auto pf = stats("--cache-budget-gb 0 --prefetch-ahead 2");
  const double issued = pf["prefetch_issued"].get<double>();
  const double pf_hits = pf["cache_hit_rate"].get<double>() * requests;
  EXPECT_GT(issued, 0.0);
  EXPECT_GT(pf_hits, 0.5);
  EXPECT_NEAR(pf["prefetch_rescue_rate"].get<double>(), pf["cache_hit_rate"].get<double>(), 1e-12);
  EXPECT_NEAR(pf["experts_read_per_token"].get<double>() * T, requests - pf_hits + issued, 1e-6);
}

// Expert predictors end to end on the demo model: calibrate trains heads (its recall table), a
// second calibrate measures them on other text, a trace records their guesses, bench replays the
// trace with them and decodes --text through a streamed cache with --predictor (prefetch) and
// --route-by-predictor, and perplexity prints the cost of routing by them; bad uses are errors.
TEST(Cli, ExpertPredictorTrainUseAndErrors) {
  const std::string dir = ::testing::TempDir() + "/cli_predictor_" + std::to_string(getpid());
  fs::create_directories(dir);
  const std::string pred = dir + "/pred.safetensors", trace = dir + "/trace.jsonl", text = kData + "/corpus/dev.txt";
  Result t = spool("calibrate -f " + text + " --max-tokens 600 --window 200 --train-predictor " + pred + " --predictor-epochs 3 -t 2");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("| layer | from | rows | router recall@8 | head recall@8 | router recall@16 | head recall@16 | epoch |"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("| 7 | 6 | 60 |"), std::string::npos) << t.out;  // validation: the last tenth of 600 rows
  EXPECT_NE(t.out.find("7 heads (linear)"), std::string::npos) << t.out;
  Result e = spool("calibrate -f " + text + " --max-tokens 300 --predictor " + pred + " --trace-out " + trace + " --trace-guesses 12 -t 2");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("every row of this text"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("| 1 | 0 | 300 |"), std::string::npos) << e.out;
  {
    std::ifstream f(trace);
    std::string header, first, second;
    std::getline(f, header), std::getline(f, first), std::getline(f, second);
    EXPECT_NE(header.find(R"("guesses":12,"guess_source":"predictor")"), std::string::npos) << header;
  }
  const std::string stream = " -o json -p 0 -n 8 -r 1 -t 2 --stream --cache-budget-gb 0.006 --parallel 1,2 ";
  Result rb = spool("bench" + stream + "--routing-trace " + trace + " --prefetch-next 12");
  ASSERT_EQ(rb.code, 0) << rb.err;
  EXPECT_NE(rb.err.find("replays the trace's guesses (12 per token, made by the predictor)"), std::string::npos) << rb.err;
  EXPECT_GT(nlohmann::json::parse(rb.out)[0]["prefetch_next_reads_per_token"].get<double>(), 0.0) << rb.out;
  for (const std::string mode : {std::string("--predictor " + pred + " --prefetch-next 12"), std::string("--predictor " + pred + " --route-by-predictor")}) {
    Result b = spool("bench" + stream + "--text " + text + " " + mode);
    ASSERT_EQ(b.code, 0) << mode << b.err;
    const auto bj = nlohmann::json::parse(b.out);
    ASSERT_EQ(bj.size(), 2u);
    EXPECT_GT(bj[0]["prefetch_next_reads_per_token"].get<double>(), 0.0) << mode;
    EXPECT_LT(bj[0]["cache_hit_rate"].get<double>(), 1.0) << mode;
  }
  Result pp = spool("perplexity -f " + text + " --chunks 1 --window 64 --predictor " + pred + " --route-by-predictor --kl-reference " +
                    std::string(SPOOL_DEFAULT_MODEL_DIR) + " --json -t 2");
  ASSERT_EQ(pp.code, 0) << pp.err;
  const auto pj = nlohmann::json::parse(pp.out);
  EXPECT_GT(pj["reference"]["mean_kl"].get<double>(), 0.0) << pp.out;  // routing by guesses changes the model
  EXPECT_LT(pj["reference"]["top1_agreement"].get<double>(), 1.0) << pp.out;
  struct Bad {
    std::string args;
    int code;
    std::string words;
  };
  const std::vector<Bad> bad = {
      {"generate -p hi -n 1 --route-by-predictor", 2, "--route-by-predictor needs --predictor FILE"},
      {"generate -p hi -n 1 --predictor " + dir + "/missing.safetensors", 1, "missing.safetensors"},
      {"generate -p hi -n 1 --predictor " + trace, 1, trace},
      {"calibrate -f " + text + " --trace-guesses 4", 2, "--trace-guesses needs --trace-out"},
      {"calibrate -f " + text + " --train-predictor " + dir + "/x --predictor " + pred, 2, "not both"},
      {"calibrate -f " + text + " --train-predictor " + dir + "/x --predictor-lr 2", 2, "--predictor-lr must be in (0, 1)"},
      {"bench -p 0 -n 2 --text " + text + " --routing-trace " + trace, 2, "--text and --routing-trace cannot be combined"},
      {"bench -p 0 -n 2 --text " + dir + "/none.txt", 1, "none.txt"},
  };
  for (const Bad& b : bad) {
    Result r = spool(b.args);
    EXPECT_EQ(r.code, b.code) << b.args << "\n" << r.err;
    EXPECT_NE(r.err.find(b.words), std::string::npos) << b.args << "\n" << r.err;
  }
  fs::remove_all(dir);
}

// Routing traces end to end on the demo model: calibrate records one, bench replays it through a
// streaming cache, and plan's simulated hit rate and bytes read are exactly what bench measured
// (one sequence and four); bad trace files are errors naming the file.
TEST(Cli, RoutingTraceCalibratePlanBench) {
  const std::string trace = ::testing::TempDir() + "/cli_trace_" + std::to_string(getpid()) + ".jsonl";
  Result c = spool("calibrate -f " + kData + "/corpus/dev.txt --max-tokens 300 --window 100 --trace-out " + trace);
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("300 tokens x 8 MoE layers, 8 of 64 experts per token; hottest 10% of experts take"), std::string::npos) << c.out;
  std::ifstream f(trace);
  std::string header;
  std::getline(f, header);
  const auto h = nlohmann::json::parse(header);
  EXPECT_EQ(h["format"], "spool-routing-trace");
  EXPECT_EQ(h["version"], 1);
  EXPECT_EQ(h["n_experts"], 64);
  EXPECT_EQ(h["top_k"], 8);
  EXPECT_EQ(h["moe_layers"].size(), 8u);
  // A budget of about a quarter of the demo's 512 experts.
  const std::string budget = " --cache-budget-gb 0.006 ";
  for (const std::string par : {std::string("1"), std::string("4")}) {
    Result p = spool("plan --model " + std::string(SPOOL_DEFAULT_MODEL_DIR) + " --json --disk-gbps 1 --mem-gbps 10 --ram-gb 8 " + budget + "--trace " + trace + " -n 12 -r 2 --parallel " + par);
    ASSERT_EQ(p.code, 0) << p.err;
    const auto pj = nlohmann::json::parse(p.out);
    ASSERT_TRUE(pj["trace"].is_object()) << p.out;
    Result b = spool("bench -o json -p 0 -n 12 -r 2 -t 2 --stream --parallel " + par + budget + "--routing-trace " + trace);
    ASSERT_EQ(b.code, 0) << b.err;
    const auto bj = nlohmann::json::parse(b.out);
    ASSERT_EQ(bj.size(), 1u);
    EXPECT_EQ(bj[0]["routing_trace"], trace);
    const double want = pj["trace"]["hit_rate"].get<double>();
    EXPECT_GT(want, 0.05) << "--parallel " << par;
    EXPECT_LT(want, 0.95) << "--parallel " << par;
    EXPECT_DOUBLE_EQ(bj[0]["cache_hit_rate"].get<double>(), want) << "--parallel " << par;
    EXPECT_NEAR(bj[0]["bytes_read_per_token"].get<double>(), pj["trace"]["bytes_read_per_token"].get<double>(),
                1e-9 * pj["trace"]["bytes_read_per_token"].get<double>()) << "--parallel " << par;
  }
  const std::string bad = ::testing::TempDir() + "/cli_trace_bad_" + std::to_string(getpid()) + ".jsonl";
  {
    std::ofstream o(bad);
    o << header << "\n" << R"({"l":0,"t":0,"e":[1,2],"w":[0.5,0.5]})" << "\n";
  }
  const std::vector<std::string> cmds = {"bench -p 0 -n 2 -r 1 --routing-trace ",
                                         "plan --model " + std::string(SPOOL_DEFAULT_MODEL_DIR) + " --ram-gb 8 --cache-budget-gb 0.006 --trace "};
  for (const std::string& cmd : cmds) {
    Result r = spool(cmd + bad);
    EXPECT_EQ(r.code, 1) << cmd << r.err;
    EXPECT_NE(r.err.find(bad + ":2: 2 experts and 2 weights; the header's top_k is 8"), std::string::npos) << cmd << r.err;
  }
  Result none = spool("bench -p 0 -n 2 -r 1 --routing-trace " + trace + ".missing");
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.err.find("cannot open the routing trace"), std::string::npos) << none.err;
  fs::remove(trace);
  fs::remove(bad);
}

// The tier statistics of `generate --json` (and its stats line) with expert slots in front of
// the experts (--host-expert-slots: the VRAM tier's code over host memory on the CPU): every
// decode token acquires K experts at each of the L MoE layers, each a slot hit or miss; each
// miss copies one slot's bytes and is one request to the RAM tier (the streaming cache).
TEST(Cli, TierStatsAreTheCounts) {
  Result info = spool("info --json");
  ASSERT_EQ(info.code, 0) << info.err;
  const auto ij = nlohmann::json::parse(info.out);
  const double L = ij["layers"].get<double>(), K = ij["experts_per_token"].get<double>();
  const std::string gen = "generate --prompt 'Call me Ishmael. Some years ago' --temp 0 --max-tokens 9 --json ";
  // (Half the demo's experts and fewer: 8 layers x 8 experts per token evict each other in fewer than 64 slots.)
  for (const std::string flags : {"--stream --cache-budget-gb 1 --host-expert-slots 256", "--no-stream --host-expert-slots 200"}) {
    SCOPED_TRACE(flags);
    Result r = spool(gen + flags);
    ASSERT_EQ(r.code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("stats")) << r.out;
    const auto st = j["stats"];
    const double T = st["tokens"].get<double>();
    EXPECT_EQ(T, 8);
    ASSERT_TRUE(st.contains("vram_tier")) << st.dump();
    const auto v = st["vram_tier"];
    const uint64_t hits = v["hits"].get<uint64_t>(), misses = v["misses"].get<uint64_t>();
    EXPECT_EQ(static_cast<double>(hits + misses), K * L * T);
    EXPECT_GT(hits, 0u);
    EXPECT_GT(misses, 0u);
    EXPECT_EQ(v["bytes_copied"].get<uint64_t>(), misses * v["slot_bytes"].get<uint64_t>());
    EXPECT_NEAR(v["bytes_copied_per_token"].get<double>() * T, v["bytes_copied"].get<double>(), 1e-6);
    EXPECT_NEAR(v["hit_rate"].get<double>(), static_cast<double>(hits) / (hits + misses), 1e-12);
    EXPECT_LE(v["early_copies"].get<uint64_t>(), misses);
    EXPECT_GE(v["stall_s"].get<double>(), 0.0);
    EXPECT_EQ(v["slots"].get<uint64_t>(), flags.find("256") != std::string::npos ? 256u : 200u);
    if (flags.starts_with("--stream")) {
      ASSERT_TRUE(st.contains("ram_tier")) << st.dump();
      const auto ram = st["ram_tier"];
      EXPECT_EQ(ram["requests"].get<uint64_t>(), misses);  // the RAM tier serves exactly the slots' misses
      EXPECT_EQ(ram["hits"].get<uint64_t>() + ram["misses"].get<uint64_t>(), misses);
      EXPECT_EQ(ram["bytes_read"].get<uint64_t>(), st["bytes_read"].get<uint64_t>());
      EXPECT_GE(ram["stall_s"].get<double>(), 0.0);
      EXPECT_EQ(ram["pinned_bytes"].get<uint64_t>(), 0u);  // the CPU pins nothing
      EXPECT_NE(r.err.find("stall"), std::string::npos) << r.err;
    } else {
      EXPECT_FALSE(st.contains("ram_tier"));
      EXPECT_EQ(v["early_copies"].get<uint64_t>(), misses);  // the mapping has every expert: prepare() copies them all
    }
    // The stats line carries the same counts.
    char line[160];
    std::snprintf(line, sizeof line, "host slots: hit rate %.1f%% (%llu hits, %llu misses", 100.0 * hits / (hits + misses),
                  (unsigned long long)hits, (unsigned long long)misses);
    EXPECT_NE(r.err.find(line), std::string::npos) << r.err;
  }
  // Without slots there is no VRAM tier; a bad count is a usage error.
  Result plain = spool(gen + "--stream");
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_FALSE(nlohmann::json::parse(plain.out)["stats"].contains("vram_tier"));
  EXPECT_EQ(spool(gen + "--host-expert-slots -1").code, 2);
}

// page_cache_resident_bytes counts the model's pages in the page cache: on a fresh copy whose
// pages were dropped, it equals what mincore() reports for the same files after the run.
// (Measured: an O_DIRECT streaming run of the demo still leaves ~98% of the files cached,
// through the mmap'd dense tensors that sit between the experts, so no tighter bound holds.)
uint64_t resident_bytes(const std::string& dir) {
  uint64_t total = 0;
  const long page = sysconf(_SC_PAGESIZE);
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    const size_t size = fs::file_size(e.path());
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    std::vector<unsigned char> v((size + page - 1) / page);
    if (m != MAP_FAILED && ::mincore(m, size, v.data()) == 0)
      for (unsigned char b : v) total += (b & 1) ? static_cast<uint64_t>(page) : 0;
    if (m != MAP_FAILED) ::munmap(m, size);
    ::close(fd);
    total -= std::min<uint64_t>(total, v.size() * page - size);  // the last page is partly past EOF
  }
  return total;
}

TEST(Cli, PageCacheResidentBytesIsWhatTheKernelHolds) {
  const std::string d = ::testing::TempDir() + "/cli_pagecache_demo";
  fs::remove_all(d);
  fs::copy(SPOOL_DEFAULT_MODEL_DIR, d, fs::copy_options::recursive);
  for (const auto& e : fs::directory_iterator(d)) {
    if (e.path().extension() != ".safetensors") continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    ASSERT_GE(fd, 0) << e.path();
    ASSERT_EQ(::fdatasync(fd), 0);
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    ::close(fd);
  }
  const uint64_t before = resident_bytes(d);
  Result r = spool("generate --model " + d + " --prompt 'Call me Ishmael.' --temp 0 --max-tokens 4 --json --stream --no-page-cache");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto st = nlohmann::json::parse(r.out)["stats"];
  const uint64_t after = resident_bytes(d), reported = st["page_cache_resident_bytes"].get<uint64_t>();
  EXPECT_LT(before, after / 2) << "dropping the copy's pages did not work";
  EXPECT_GT(reported, 0u);
  EXPECT_LE(reported, st["model_file_bytes"].get<uint64_t>());
  EXPECT_NEAR(static_cast<double>(reported), static_cast<double>(after), 64.0 * 1024) << "before the run: " << before;
  fs::remove_all(d);
}

// ------------------------------------------------------- DeepSeek-V3 tokenizer + chat template

// A tiny deepseek_v3 checkpoint (`spool synth --preset tiny-deepseek-v3`, V3's 129280-token
// vocabulary) carrying the real DeepSeek-V3 tokenizer.json and tokenizer_config.json (chat
// template inside) instead of the demo tokenizer synth copies.
// Per process (ctest may run the test cases in parallel processes); removed at exit.
const std::string& deepseek_chat_model() {
  struct RemoveAtExit {
    std::string dir;
    ~RemoveAtExit() { fs::remove_all(dir); }
  };
  static const RemoveAtExit model{[] {
    const std::string d = ::testing::TempDir() + "/cli_dsv3_chat_" + std::to_string(getpid());
    fs::remove_all(d);
    Result r = spool("synth --preset tiny-deepseek-v3 --dtype f32 --no-check -o " + d);
    EXPECT_EQ(r.code, 0) << r.err;
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) fs::remove(d + "/" + f);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(kData + "/tokenizers/deepseek_v3/" + f, d + "/" + f);
    return d;
  }()};
  return model.dir;
}

nlohmann::json deepseek_chat_cases() {
  auto cases = nlohmann::json::parse(slurp(kData + "/tokenizer/deepseek_v3/chat_cases.json"));
  for (const auto& c : cases) EXPECT_TRUE(c.contains("ids") && c.contains("rendered")) << c.dump();
  return cases;
}

// Shell-quotes `s` with single quotes.
std::string shq(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// `generate --chat` builds the golden prompt ids of every chat case it can express (an
// optional system message, then one user message).
TEST(Cli, GenerateChatDeepSeekV3MatchesTheChatGoldens) {
  const std::string& dir = deepseek_chat_model();
  int checked = 0;
  for (const auto& c : deepseek_chat_cases()) {
    const auto& m = c["messages"];
    const bool with_system = m.size() == 2 && m[0]["role"] == "system" && m[1]["role"] == "user";
    if (!(m.size() == 1 && m[0]["role"] == "user") && !with_system) continue;  // multi-turn: serve only
    std::string args = "generate --model " + dir + " --chat --temp 0 --max-tokens 2 --json --prompt " +
                       shq(m[with_system ? 1 : 0]["content"].get<std::string>());
    if (with_system) args += " --system " + shq(m[0]["content"].get<std::string>());
    if (c.contains("enable_thinking"))
      args += " --chat-template-kwargs " + shq(nlohmann::json{{"enable_thinking", c["enable_thinking"]}}.dump());
    Result r = spool(args);
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["prompt_ids"], c["ids"]) << c["rendered"];
    EXPECT_EQ(j["output_ids"].size(), 2u);
    // The ids read back are the golden rendering, BOS included.
    const std::string f = ::testing::TempDir() + "/cli_dsv3_rendered_" + std::to_string(getpid()) + ".txt";
    std::ofstream(f, std::ios::binary) << c["rendered"].get<std::string>();
    Result t = spool("generate --model " + dir + " --file " + f + " --max-tokens 0 --json");
    ASSERT_EQ(t.code, 0) << t.err;
    EXPECT_EQ(nlohmann::json::parse(t.out)["prompt_ids"], c["ids"]);
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

// A plain HTTP/1.1 exchange over loopback (Connection: close): the status and body.
struct HttpReply {
  int status = 0;
  std::string body;
};
HttpReply http(int port, const std::string& method, const std::string& path, const std::string& body = "") {
  HttpReply out;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return out;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return out;
  }
  const std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                          "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  for (size_t sent = 0; sent < req.size();) {
    const ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  if (resp.rfind("HTTP/1.1 ", 0) != 0) return out;
  out.status = std::atoi(resp.c_str() + 9);
  const size_t hdr_end = resp.find("\r\n\r\n");
  if (hdr_end != std::string::npos) out.body = resp.substr(hdr_end + 4);
  return out;
}

// `spool serve` on a free port, stopped (SIGTERM) when destroyed.
struct Serve {
  explicit Serve(const std::string& args) {
    log = ::testing::TempDir() + "/cli_serve_" + std::to_string(getpid()) + ".log";
    pid = ::fork();
    if (pid == 0) {
      const std::string cmd = "exec " + kSpool + " serve --port 0 " + args + " 2>" + log + " >/dev/null";
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 1200 && port == 0; ++i) {  // the port, then /health 200
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const std::string l = slurp(log);
      const size_t at = l.find("listening on http://127.0.0.1:");
      if (at == std::string::npos) continue;
      const int p = std::atoi(l.c_str() + at + 30);
      if (http(p, "GET", "/health").status == 200) port = p;
    }
  }
  ~Serve() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
    fs::remove(log);
  }
  nlohmann::json post(const std::string& path, const nlohmann::json& body, int want_status = 200) const {
    const HttpReply r = http(port, "POST", path, body.dump());
    EXPECT_EQ(r.status, want_status) << path << ": " << r.body;
    return nlohmann::json::parse(r.body, nullptr, false);
  }
  pid_t pid = -1;
  int port = 0;
  std::string log;
};

// `spool serve` renders every chat case to the golden text and ids: /apply-template gives the
// rendered text, /tokenize its ids, and /v1/chat/completions runs exactly those ids (its
// usage.prompt_tokens, and its greedy output equals /v1/completions given the golden ids).
TEST(Cli, ServeChatDeepSeekV3MatchesTheChatGoldens) {
  Serve s("--model " + deepseek_chat_model() + " --threads 2 --ctx-size 256 --prefill-step-size 16");
  ASSERT_GT(s.port, 0) << slurp(s.log);
  int checked = 0;
  for (const auto& c : deepseek_chat_cases()) {
    nlohmann::json req = {{"messages", c["messages"]}};
    if (c.contains("enable_thinking")) req["chat_template_kwargs"] = {{"enable_thinking", c["enable_thinking"]}};
    const auto at = s.post("/apply-template", req);
    EXPECT_EQ(at["prompt"], c["rendered"]);
    const auto tk = s.post("/tokenize", {{"content", c["rendered"]}});
    EXPECT_EQ(tk["tokens"], c["ids"]);
    // No end-of-sequence: both runs go to max_tokens.
    req["max_tokens"] = 4;
    req["temperature"] = 0;
    req["logit_bias"] = {{"1", -100}};
    const auto chat = s.post("/v1/chat/completions", req);
    EXPECT_EQ(chat["usage"]["prompt_tokens"], c["ids"].size()) << chat.dump();
    const auto comp = s.post("/v1/completions", {{"prompt", c["ids"]}, {"max_tokens", 4}, {"temperature", 0}, {"logit_bias", {{"1", -100}}}});
    EXPECT_EQ(comp["usage"]["prompt_tokens"], c["ids"].size());
    const auto& msg = chat["choices"][0]["message"];
    const std::string said = msg.value("reasoning_content", std::string()) + msg.value("content", std::string());
    EXPECT_EQ(said, comp["choices"][0]["text"].get<std::string>()) << chat.dump() << comp.dump();
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

// `spool serve --trace-out`: the served steps' routing, rows numbered through the steps (two
// requests' prefill chunks and decode tokens), every token with every MoE layer; the file is a
// trace bench replays.
TEST(Cli, ServeTraceOutRecordsTheServedRows) {
  const std::string trace = ::testing::TempDir() + "/cli_serve_trace_" + std::to_string(getpid()) + ".jsonl";
  int64_t rows = 0;
  {
    Serve s("--threads 2 --ctx-size 128 --prefill-step-size 8 --parallel 2 --prompt-cache-checkpoints 0 --trace-out " + trace);
    ASSERT_GT(s.port, 0) << slurp(s.log);
    for (int r = 0; r < 2; ++r) {
      const auto comp = s.post("/v1/completions", {{"prompt", {5, 17, 99, 3, 250, 7, 8, 1000, 42, 11, 12 + r}},
                                                    {"max_tokens", 5}, {"temperature", 0}, {"logit_bias", {{"0", -100}}}});
      ASSERT_TRUE(comp.is_object() && comp.contains("usage")) << comp.dump();
      // The prompt's rows (no prefix reuse), then one decode row per generated token after the first.
      rows += comp["usage"]["prompt_tokens"].get<int64_t>() + comp["usage"]["completion_tokens"].get<int64_t>() - 1;
    }
  }
  std::ifstream f(trace);
  std::string line;
  ASSERT_TRUE(std::getline(f, line));
  const auto h = nlohmann::json::parse(line);
  EXPECT_EQ(h["source"], "serve");
  EXPECT_EQ(h["version"], 1);
  std::set<std::pair<int64_t, int>> seen;
  while (std::getline(f, line)) {
    const auto r = nlohmann::json::parse(line);
    EXPECT_TRUE(seen.emplace(r["t"].get<int64_t>(), r["l"].get<int>()).second) << line;
    EXPECT_EQ(r["e"].size(), 8u);
  }
  EXPECT_GE(rows, 2 * 11);
  EXPECT_EQ(static_cast<int64_t>(seen.size()), rows * 8);
  EXPECT_EQ(seen.rbegin()->first, rows - 1);
  Result b = spool("bench -p 0 -n 4 -r 1 -o json --routing-trace " + trace);
  EXPECT_EQ(b.code, 0) << b.err;
  fs::remove(trace);
}

// --expert-profile across commands: generate creates the file and records its tokens, a served
// model stopped by SIGTERM saves what it served on top, bench warms from it (the log says how
// many experts) and records its rows too; a corrupt file exits 1 naming it, a bad half-life 2.
TEST(Cli, ExpertProfileAcrossGenerateServeAndBench) {
  const std::string dir = ::testing::TempDir() + "/cli_profile_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string profile = dir + "/p.json";
  const std::string stream = " --threads 2 --stream --cache-budget-gb 0.01 --expert-profile " + profile;
  Result g = spool("generate --prompt-ids 5,17,99,3 --max-tokens 4 --temp 0 --ignore-eos" + stream);
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_NE(g.err.find("does not exist yet"), std::string::npos) << g.err;
  auto tokens = [&] { return nlohmann::json::parse(slurp(profile), nullptr, false).value("tokens_total", -1); };
  EXPECT_EQ(tokens(), 4 + 3);  // the prompt and every generated token but the last
  {
    Serve s("--ctx-size 128 --prefill-step-size 8" + stream);
    ASSERT_GT(s.port, 0) << slurp(s.log);
    const auto comp = s.post("/v1/completions", {{"prompt", {5, 17, 99, 3, 250, 7}}, {"max_tokens", 3}, {"temperature", 0},
                                                  {"logit_bias", {{"0", -100}}}});
    ASSERT_TRUE(comp.is_object() && comp.contains("usage")) << comp.dump();
    EXPECT_NE(slurp(s.log).find("preloaded the"), std::string::npos) << slurp(s.log);
    const std::string m = http(s.port, "GET", "/metrics").body;
    const size_t at = m.find("\nspool_expert_cache_preloaded ");
    ASSERT_NE(at, std::string::npos) << m;
    EXPECT_GT(std::atof(m.c_str() + at + 30), 0) << m.substr(at, 60);
  }  // SIGTERM: the profile is written on the way out
  EXPECT_EQ(tokens(), 7 + 6 + 2);
  Result b = spool("bench -p 8 -n 4 -r 1" + stream);
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_NE(b.err.find("preloaded the"), std::string::npos) << b.err;
  EXPECT_EQ(tokens(), 15 + 2 * 8 + 2 * 4);  // warm-up and one timed repetition of each test
  Result j = spool("generate --prompt-ids 5,17 --max-tokens 2 --json" + stream);
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_GT(nlohmann::json::parse(j.out)["stats"]["ram_tier"].value("preloaded", 0), 0) << j.out;
  // A corrupt file: exit 1, naming it; a resident run does not read it.
  std::ofstream(profile, std::ios::trunc) << "{\"format\": \"spool-expert-profile\", \"version\": 1";
  Result c = spool("generate --prompt-ids 5,17 --max-tokens 2" + stream);
  EXPECT_EQ(c.code, 1) << c.err;
  EXPECT_NE(c.err.find(profile + ": not a valid expert profile"), std::string::npos) << c.err;
  Result r = spool("generate --prompt-ids 5,17 --max-tokens 2 --threads 2 --no-stream --expert-profile " + profile);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("neither read nor written"), std::string::npos) << r.err;
  EXPECT_EQ(spool("generate --prompt-ids 5 --max-tokens 1 --expert-profile-half-life 0" + stream).code, 2);
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- spool template render

// Writes `text` to a scratch file and returns its path.
std::string scratch(const std::string& tag, const std::string& text) {
  const std::string f = ::testing::TempDir() + "/cli_tmpl_" + std::to_string(getpid()) + "_" + tag;
  std::ofstream(f, std::ios::binary) << text;
  return f;
}

// The render command's arguments for a golden case: messages / tools by @file, the case's extra
// kwargs (and, with `specials`, the special tokens, which only --model would otherwise give).
std::string render_args(const nlohmann::ordered_json& c, const nlohmann::ordered_json& specials, const std::string& tag) {
  std::string args = " --messages @" + scratch(tag + "_m.json", c["messages"].dump());
  if (c.contains("tools")) args += " --tools @" + scratch(tag + "_t.json", c["tools"].dump());
  nlohmann::ordered_json kw = specials;
  for (const auto& [k, v] : c.items())
    if (k != "messages" && k != "tools" && k != "add_generation_prompt" && k != "rendered" && k != "ids" && k != "error") kw[k] = v;
  if (!kw.empty()) args += " --kwargs " + shq(kw.dump());
  if (!c["add_generation_prompt"].get<bool>()) args += " --no-generation-prompt";
  return args;
}

/// Sets SOURCE_DATE_EPOCH for the spool processes a test starts (restored after).
struct GoldenDate {
  GoldenDate() { setenv("SOURCE_DATE_EPOCH", "1780272000", 1); }  // 2026-06-01, the goldens' strftime_now
  ~GoldenDate() { unsetenv("SOURCE_DATE_EPOCH"); }
};

// `template render --template F` prints the tests/data/chat goldens byte for byte (transformers'
// and the jinja2 references), and fails with the template's own message where the golden is an
// error. Cases 1 (system message, enable_thinking) and 5 (tools, two calls, reasoning) of each
// template: chat_golden_test renders every case through the library.
// serve --lora: /v1/completions continues the golden prompt with the adapter's greedy ids.
TEST(Cli, ServeWithLoraMatchesPeft) {
  const std::string a = kData + "/lora/spool-demo-moe-dev";
  const nlohmann::json lora = nlohmann::json::parse(slurp(a + "/golden_prompts_lora.json"));
  Serve s("--threads 2 --ctx-size 256 --lora " + a);
  ASSERT_GT(s.port, 0) << slurp(s.log);
  const auto& g = lora[1];
  const size_t n = g["greedy_ids"].size();
  const auto comp = s.post("/v1/completions", {{"prompt", g["prompt_ids"]}, {"max_tokens", n}, {"temperature", 0}});
  EXPECT_EQ(comp["choices"][0]["text"], g["greedy_text"]) << comp.dump();
}

// serve --lora A --lora-init-without-apply: the adapter loads at default scale 0 (GET
// /lora-adapters), requests without a lora field get the base's greedy text, with
// `lora: [{"id": 0, "scale": 1}]` the adapter's.
TEST(Cli, ServeLoraInitWithoutApplyLeavesItOff) {
  const std::string a = kData + "/lora/spool-demo-moe-dev";
  const nlohmann::json lora = nlohmann::json::parse(slurp(a + "/golden_prompts_lora.json"));
  const nlohmann::json base = nlohmann::json::parse(slurp(a + "/golden_prompts_base.json"));
  Serve s("--threads 2 --ctx-size 256 --lora " + a + " --lora-init-without-apply");
  ASSERT_GT(s.port, 0) << slurp(s.log);
  const HttpReply list = http(s.port, "GET", "/lora-adapters", "");
  EXPECT_EQ(list.status, 200);
  const nlohmann::json l = nlohmann::json::parse(list.body, nullptr, false);
  ASSERT_EQ(l.size(), 1u) << list.body;
  EXPECT_EQ(l[0]["id"], 0);
  EXPECT_EQ(l[0]["path"], a);
  EXPECT_EQ(l[0]["scale"], 0.0);
  const size_t n = base[1]["greedy_ids"].size();
  const nlohmann::json body = {{"prompt", base[1]["prompt_ids"]}, {"max_tokens", n}, {"temperature", 0}};
  EXPECT_EQ(s.post("/v1/completions", body)["choices"][0]["text"], base[1]["greedy_text"]);
  nlohmann::json with = body;
  with["lora"] = nlohmann::json::array({{{"id", 0}, {"scale", 1}}});
  EXPECT_EQ(s.post("/v1/completions", with)["choices"][0]["text"], lora[1]["greedy_text"]);
}

TEST(Cli, TemplateRenderMatchesTheChatGoldens) {
  GoldenDate date;
  int rendered = 0, refused = 0;
  for (const auto& e : fs::directory_iterator(kData + "/chat")) {
    if (!fs::exists(e.path() / "chat_cases.json")) continue;
    const std::string name = e.path().filename().string();
    const auto chat = nlohmann::ordered_json::parse(slurp((e.path() / "chat_cases.json").string()));
    const std::string tmpl = (e.path() / "chat_template.jinja").string();
    for (size_t i : {1, 5}) {
      const auto& c = chat["cases"][i];
      const Result r = spool("template render --template " + tmpl + render_args(c, chat["special_tokens"], name));
      if (c.contains("rendered")) {
        EXPECT_EQ(r.code, 0) << name << " " << i << ": " << r.err;
        EXPECT_EQ(r.out, c["rendered"].get<std::string>()) << name << " " << i;
        ++rendered;
      } else {
        EXPECT_EQ(r.code, 1) << name << " " << i;
        const std::string err = c["error"].get<std::string>();
        EXPECT_NE(r.err.find(err.substr(err.find(": ") + 2)), std::string::npos) << r.err;
        ++refused;
      }
    }
  }
  EXPECT_GE(rendered, 18);
  EXPECT_GE(refused, 3);
}

// The parse-back goldens' renders: the generation prompt, then the whole conversation without one
// (= generation_prompt + emitted, see chat_golden_test.cpp).
TEST(Cli, TemplateRenderAssistantTurns) {
  GoldenDate date;
  int checked = 0;
  for (const char* name : {"gpt_oss", "qwen3_coder", "glm4_6"}) {
    const std::string dir = kData + "/chat/" + name;
    const auto cases = nlohmann::ordered_json::parse(slurp(dir + "/assistant_cases.json"));
    for (const auto& a : cases) {
      std::string args = "template render --template " + dir + "/chat_template.jinja";
      if (!a["tools"].empty()) args += " --tools " + shq(a["tools"].dump());
      const Result head = spool(args + " --messages " + shq(a["prior"].dump()));
      EXPECT_EQ(head.code, 0) << head.err;
      EXPECT_EQ(head.out, a["generation_prompt"].get<std::string>()) << name;
      auto full = a["prior"];
      full.push_back(a["message"]);
      const Result all = spool(args + " --no-generation-prompt --messages " + shq(full.dump()));
      EXPECT_EQ(all.code, 0) << all.err;
      EXPECT_EQ(all.out, a["generation_prompt"].get<std::string>() + a["emitted"].get<std::string>()) << name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 8);
}

// --model takes the template and the special tokens (bos_token) the model has: a tokenizer
// directory (chat template in tokenizer_config.json) and a tokenizer-only GGUF
// (tokenizer.chat_template); the messages may come from stdin.
TEST(Cli, TemplateRenderModelTemplate) {
  const auto ds = nlohmann::ordered_json::parse(slurp(kData + "/tokenizer/deepseek_v3/chat_cases.json"));
  for (size_t i : {0, 1}) {  // plain, and with enable_thinking
    const Result r = spool("template render --model " + kData + "/tokenizers/deepseek_v3" +
                           render_args(ds[i], nlohmann::ordered_json::object(), "ds" + std::to_string(i)));
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, ds[i]["rendered"].get<std::string>()) << i;
    EXPECT_EQ(r.out.rfind("<｜begin▁of▁sentence｜>", 0), 0u) << "bos_token comes from the model";
  }
  const auto qw = nlohmann::ordered_json::parse(slurp(kData + "/tokenizer/qwen3/chat_cases.json"));
  for (size_t i : {4, 5}) {  // tools, and enable_thinking
    const Result r = spool("template render --model " + kData + "/gguf/qwen3_tokenizer.gguf" +
                           render_args(qw[i], nlohmann::ordered_json::object(), "qw" + std::to_string(i)));
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, qw[i]["rendered"].get<std::string>()) << i;
  }
  const std::string msgs = scratch("stdin.json", qw[0]["messages"].dump());
  Result r = spool("template render --model " + kData + "/gguf/qwen3_tokenizer.gguf" +
                   (qw[0].contains("enable_thinking") ? " --kwargs " + shq(nlohmann::json{{"enable_thinking", qw[0]["enable_thinking"]}}.dump()) : std::string()) +
                   (qw[0]["add_generation_prompt"].get<bool>() ? "" : " --no-generation-prompt") + " < " + msgs);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, qw[0]["rendered"].get<std::string>());
  // --template replaces the model's template; the model's special tokens stay.
  const std::string t = scratch("bos.jinja", "{{ bos_token }}|{{ messages[0].content }}|{{ add_generation_prompt }}");
  r = spool("template render --model " + kData + "/tokenizers/deepseek_v3 --template " + t +
            " --no-generation-prompt --messages '[{\"role\": \"user\", \"content\": \"hi\"}]'");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "<｜begin▁of▁sentence｜>|hi|False");
}

TEST(Cli, TemplateRenderErrors) {
  const std::string t = scratch("ok.jinja", "{{ messages|length }}");
  const std::string m = " --messages '[{\"role\": \"user\", \"content\": \"hi\"}]'";
  auto expect = [](const Result& r, int code, const std::string& says) {
    EXPECT_EQ(r.code, code) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  };
  // Usage (2): no subcommand, no template source, an unknown flag.
  EXPECT_EQ(spool("template").code, 2);
  expect(spool("template render" + m), 2, "give --model M");
  EXPECT_EQ(spool("template render --template " + t + m + " --no-such-flag").code, 2);
  EXPECT_EQ(spool("template render --help").code, 0);
  // Bad input (1), each named.
  expect(spool("template render --template " + t + " --messages '[{\"role\": '"), 1, "--messages: not valid JSON");
  expect(spool("template render --template " + t + " --messages @/nonexistent/m.json"), 1, "/nonexistent/m.json");
  expect(spool("template render --template " + t + " --messages '{\"role\": \"user\"}'"), 1, "--messages must be a JSON array");
  expect(spool("template render --template " + t + " --messages '[]'"), 1, "--messages is empty");
  expect(spool("template render --template " + t + " --messages '[1]'"), 1, "--messages[0] must be an object");
  expect(spool("template render --template " + t + m + " --tools '{\"a\": 1}'"), 1, "--tools must be a JSON array");
  expect(spool("template render --template " + t + m + " --tools '[oops'"), 1, "--tools: not valid JSON");
  expect(spool("template render --template " + t + m + " --kwargs '[1]'"), 1, "--kwargs must be a JSON object");
  expect(spool("template render --template " + t + " --messages @" + scratch("bad.json", "[") + ""), 1, "bad.json");
  // A missing template (1): no file, no model, a model without a tokenizer or without a template.
  expect(spool("template render --template /nonexistent/t.jinja" + m), 1, "/nonexistent/t.jinja");
  expect(spool("template render --model /nonexistent/model" + m), 1, "/nonexistent/model");
  const std::string empty = ::testing::TempDir() + "/cli_tmpl_empty_" + std::to_string(getpid());
  fs::create_directories(empty);
  expect(spool("template render --model " + empty + m), 1, "has no tokenizer");
  const std::string notmpl = ::testing::TempDir() + "/cli_tmpl_notmpl_" + std::to_string(getpid());
  fs::remove_all(notmpl);
  fs::create_directories(notmpl);
  fs::copy_file(kData + "/tokenizers/deepseek_v3/tokenizer.json", notmpl + "/tokenizer.json");
  auto cfg = nlohmann::json::parse(slurp(kData + "/tokenizers/deepseek_v3/tokenizer_config.json"));
  cfg.erase("chat_template");
  std::ofstream(notmpl + "/tokenizer_config.json") << cfg.dump();
  expect(spool("template render --model " + notmpl + m), 1, "has no chat template");
  // A template that does not parse, and one that refuses the conversation (its own message).
  expect(spool("template render --template " + scratch("broken.jinja", "{% if %}") + m), 1, "broken.jinja");
  expect(spool("template render --template " + kData + "/chat/gemma2/chat_template.jinja" +
               " --messages '[{\"role\": \"system\", \"content\": \"x\"}, {\"role\": \"user\", \"content\": \"hi\"}]'"),
         1, "System role not supported");
}

// ---------------------------------------------------------------- spool template parse

// The assistant message `parse` printed, compared with a golden message: ids are generated
// ("call_" + 24 hex digits), arguments are a JSON string (the goldens hold objects), and
// content is null beside tool calls where the golden has "".
void expect_parsed(const Result& r, const nlohmann::ordered_json& want, const std::string& what) {
  ASSERT_EQ(r.code, 0) << what << ": " << r.err;
  const auto got = nlohmann::ordered_json::parse(r.out);
  EXPECT_EQ(got["role"], "assistant") << what;
  const std::string content = want.value("content", "");
  if (content.empty() && want.contains("tool_calls")) EXPECT_TRUE(got["content"].is_null()) << what;
  else EXPECT_EQ(got["content"], content) << what;
  EXPECT_EQ(got.contains("reasoning_content"), want.contains("reasoning_content")) << what << ": " << r.out;
  if (want.contains("reasoning_content")) EXPECT_EQ(got["reasoning_content"], want["reasoning_content"]) << what;
  ASSERT_EQ(got.contains("tool_calls"), want.contains("tool_calls")) << what << ": " << r.out;
  if (!want.contains("tool_calls")) return;
  ASSERT_EQ(got["tool_calls"].size(), want["tool_calls"].size()) << what;
  for (size_t i = 0; i < want["tool_calls"].size(); ++i) {
    const auto& g = got["tool_calls"][i];
    EXPECT_EQ(g["id"].get<std::string>().rfind("call_", 0), 0u) << what;
    EXPECT_EQ(g["type"], "function") << what;
    EXPECT_EQ(g["function"]["name"], want["tool_calls"][i]["function"]["name"]) << what;
    ASSERT_TRUE(g["function"]["arguments"].is_string()) << what << ": arguments must be a JSON string";
    EXPECT_EQ(nlohmann::json::parse(g["function"]["arguments"].get<std::string>()),
              nlohmann::json(want["tool_calls"][i]["function"]["arguments"]))
        << what;
  }
}

// Every GLM-4.6 and gpt-oss parse-back golden: `emitted` on stdin, parsed with the template file
// (format detected from it) back to `message`; once with the golden's generation prompt, once
// rendering the golden's conversation (the server's way).
TEST(Cli, TemplateParseAssistantCases) {
  int parsed = 0;
  for (const char* name : {"glm4_6", "gpt_oss"}) {
    const std::string dir = kData + "/chat/" + name;
    const auto cases = nlohmann::ordered_json::parse(slurp(dir + "/assistant_cases.json"));
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto& a = cases[i];
      const std::string what = std::string(name) + "_" + std::to_string(i);
      const std::string in = scratch(what + "_emitted", a["emitted"].get<std::string>());
      std::string args = "template parse --template " + dir + "/chat_template.jinja";
      if (!a["tools"].empty()) args += " --tools @" + scratch(what + "_tools.json", a["tools"].dump());
      expect_parsed(spool(args + " --generation-prompt @" + scratch(what + "_gp", a["generation_prompt"].get<std::string>()) + " < " + in),
                    a["message"], what + " (--generation-prompt)");
      const Result r = spool(args + " --messages " + shq(a["prior"].dump()) + " < " + in);
      expect_parsed(r, a["message"], what + " (--messages)");
      EXPECT_NE(r.err.find(std::string("format ") + (name == std::string("glm4_6") ? "glm4_5" : "gpt_oss")), std::string::npos) << r.err;
      ++parsed;
    }
  }
  EXPECT_EQ(parsed, 6);
}

// Qwen3.5-style XML calls write every value as text: --tools types them by the schema (3 stays
// the string "3" for a string parameter, becomes a number for an integer one); the generation
// prompt decides whether the output starts inside reasoning; --chat-format overrides detection.
TEST(Cli, TemplateParseQwenXmlTypedBySchema) {
  const std::string tmpl = kData + "/chat/qwen3_coder/chat_template.jinja";
  const std::string out = scratch("xml_out",
                                  "I will check.</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n3\n</parameter>\n"
                                  "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call><|im_end|>\n");
  auto tool = [](const char* city_type) {
    return nlohmann::ordered_json::array(
               {{{"type", "function"},
                 {"function",
                  {{"name", "get_weather"},
                   {"parameters",
                    {{"type", "object"},
                     {"properties", {{"city", {{"type", city_type}}}, {"days", {{"type", "integer"}}}}}}}}}}})
        .dump();
  };
  const std::string base = "template parse --template " + tmpl + " --generation-prompt " + shq("<|im_start|>assistant\n<think>\n");
  Result r = spool(base + " --tools " + shq(tool("string")) + " < " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  auto m = nlohmann::json::parse(r.out);
  EXPECT_EQ(m["reasoning_content"], "I will check.");
  EXPECT_TRUE(m["content"].is_null());
  ASSERT_EQ(m["tool_calls"].size(), 1u) << r.out;
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], "{\"city\": \"3\", \"days\": 3}");
  EXPECT_NE(r.err.find("format qwen3_xml (detected from the chat template); the output starts inside reasoning"), std::string::npos) << r.err;
  r = spool(base + " --tools " + shq(tool("integer")) + " < " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["tool_calls"][0]["function"]["arguments"], "{\"city\": 3, \"days\": 3}");
  // No open <think> in the prompt: the text before </think> is content (with the stray tag).
  r = spool("template parse --template " + tmpl + " --tools " + shq(tool("string")) + " < " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  m = nlohmann::json::parse(r.out);
  EXPECT_FALSE(m.contains("reasoning_content")) << r.out;
  EXPECT_EQ(m["content"], "I will check.</think>") << r.out;  // the whitespace before a call is markup
  EXPECT_NE(r.err.find("starts outside reasoning (a one-user-message conversation rendered)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("markup '</think>'"), std::string::npos) << r.err;
  // --chat-format qwen3_json reads the same text as JSON calls: none parse, the markup is content.
  r = spool(base + " --chat-format qwen3 < " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  m = nlohmann::json::parse(r.out);
  EXPECT_FALSE(m.contains("tool_calls")) << r.out;
  EXPECT_NE(m["content"].get<std::string>().find("<function=get_weather>"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("format qwen3_json (--chat-format)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("markup '<tool_call>': text that did not parse as a tool call"), std::string::npos) << r.err;
  // A call cut off after its name is announced: kept, flagged incomplete on stderr.
  r = spool(base + " < " + scratch("xml_cut", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("tool call 0 (get_weather) is incomplete"), std::string::npos) << r.err;
}

TEST(Cli, TemplateParseErrors) {
  const std::string t = kData + "/chat/qwen3_coder/chat_template.jinja";
  const std::string in = " < " + scratch("parse_in", "Hello");
  auto expect = [](const Result& r, int code, const std::string& says) {
    EXPECT_EQ(r.code, code) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  };
  // Usage (2).
  expect(spool("template parse" + in), 2, "give --model M");
  EXPECT_EQ(spool("template parse --template " + t + " --no-such-flag" + in).code, 2);
  expect(spool("template parse --template " + t + " --tools @-" + in), 2, "stdin carries the model output");
  expect(spool("template parse --template " + t + " --generation-prompt x --messages '[]'" + in), 2, "give one or the other");
  EXPECT_EQ(spool("template parse --help").code, 0);
  // Bad input (1), each named; an unknown format lists the names.
  expect(spool("template parse --template " + t + " --chat-format nope" + in), 1,
         "--chat-format: unknown format 'nope' (one of: none, qwen3_json, qwen3_xml, deepseek_v3");
  expect(spool("template parse --template " + t + " --tools '[oops'" + in), 1, "--tools: not valid JSON");
  expect(spool("template parse --template " + t + " --tools '{\"a\": 1}'" + in), 1, "--tools must be a JSON array");
  expect(spool("template parse --template " + t + " --messages '{'" + in), 1, "--messages: not valid JSON");
  expect(spool("template parse --template " + t + " --kwargs '[1]'" + in), 1, "--kwargs must be a JSON object");
  expect(spool("template parse --template " + t + " --tools '[{\"type\": \"function\"}]'" + in), 1,
         "rendering the generation prompt (a one-user-message conversation): tools[0].function must be an object");
  expect(spool("template parse --template " + t + " --generation-prompt @/nonexistent/gp.txt" + in), 1, "/nonexistent/gp.txt");
  expect(spool("template parse --template " + t + " < " + scratch("parse_bad_utf8", "ok\xff")), 1,
         "stdin: the model output is not valid UTF-8 (at byte 2)");
  // A missing template (1).
  expect(spool("template parse --template /nonexistent/t.jinja" + in), 1, "/nonexistent/t.jinja");
  expect(spool("template parse --model /nonexistent/model" + in), 1, "/nonexistent/model");
  // A template that refuses the default conversation: its message, and the way out.
  expect(spool("template parse --template " + scratch("refuse.jinja", "{{ raise_exception('no thanks') }}") + in), 1,
         "no thanks; give --messages or --generation-prompt");
}

}  // namespace
