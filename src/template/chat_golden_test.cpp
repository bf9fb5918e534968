// Data-driven goldens: every case of tests/data/chat/<name>/chat_cases.json and
// assistant_cases.json must render byte-identically with spool's engine. One GoogleTest case
// per (template, index), so ctest names the exact case that deviates.
//
// Where the goldens come from:
//  - glm4_6, glm4_7_flash, gpt_oss, deepseek_v3_1, kimi_k2_*, minimax_m2, qwen3_coder:
//    tests/reference/make_chat_goldens.py, transformers 5.17's render_jinja_template itself;
//  - mistral_small_3_2, ministral_3_reasoning, gemma2, gemma4 (chat_cases.json only, with a
//    "reference" field): tests/reference/make_jinja_goldens.py, plain jinja2 3.1 set up the way
//    transformers sets it up, which reproduces all the transformers goldens above before it writes.
//
// How they were rendered (and so what these tests pass):
//  - context = special_tokens (only deepseek_v3_1 has bos/eos among the transformers ones) + the
//    case's extra kwargs (enable_thinking, reasoning_effort, ...) + messages / tools (None when
//    absent) / documents None / add_generation_prompt;
//  - strftime_now() returns 2026-06-01 00:00:00: here SOURCE_DATE_EPOCH=1780272000 fixes it;
//  - assistant cases: generation_prompt = render(prior, tools or None, add_generation_prompt=True)
//    and the script kept a case only when render(prior + [message], add_generation_prompt=False)
//    starts with it, storing the rest as `emitted`. So by construction
//    render(prior + [message], False) == generation_prompt + emitted, and both renders are checked.
//  - a case the template refuses carries "error": "<type>: <message>" instead of "rendered":
//    spool must refuse it too, with exactly the message for raise_exception (TemplateError).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "template/chat_template.h"

namespace spool::tmpl {
namespace {

using nlohmann::ordered_json;

/// 2026-06-01 00:00:00 UTC, the date make_chat_goldens.py gave strftime_now.
constexpr const char* kGoldenEpoch = "1780272000";

std::string slurp(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open " + path.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::filesystem::path chat_dir() { return std::filesystem::path(SPOOL_TEST_DATA_DIR) / "chat"; }

/// One golden: template directory name, which file and the case's index in it.
struct GoldenCase {
  std::string name;
  bool assistant;  ///< assistant_cases.json (else chat_cases.json)
  size_t index;
};

/// gtest printer: "glm4_6 chat_cases.json[3]" instead of the struct's bytes.
void PrintTo(const GoldenCase& g, std::ostream* os) {
  *os << g.name << (g.assistant ? " assistant_cases.json[" : " chat_cases.json[") << g.index << "]";
}

/// Lists every case of every tests/data/chat/<name>/ that has goldens (at registration time).
std::vector<GoldenCase> all_cases() {
  std::vector<GoldenCase> out;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(chat_dir()))
    if (std::filesystem::exists(e.path() / "chat_cases.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    ordered_json chat = ordered_json::parse(slurp(chat_dir() / n / "chat_cases.json"));
    for (size_t i = 0; i < chat.at("cases").size(); ++i) out.push_back({n, false, i});
    if (std::filesystem::exists(chat_dir() / n / "assistant_cases.json")) {
      ordered_json a = ordered_json::parse(slurp(chat_dir() / n / "assistant_cases.json"));
      for (size_t i = 0; i < a.size(); ++i) out.push_back({n, true, i});
    }
  }
  return out;
}

class ChatGolden : public ::testing::TestWithParam<GoldenCase> {
 protected:
  void SetUp() override { ASSERT_EQ(setenv("SOURCE_DATE_EPOCH", kGoldenEpoch, 1), 0); }
  void TearDown() override { unsetenv("SOURCE_DATE_EPOCH"); }
};

TEST_P(ChatGolden, RendersLikeTransformers) {
  const GoldenCase& g = GetParam();
  const auto dir = chat_dir() / g.name;
  ordered_json chat = ordered_json::parse(slurp(dir / "chat_cases.json"));
  const ordered_json tokens = chat.at("special_tokens");
  Template t = Template::parse(slurp(dir / "chat_template.jinja"), g.name);
  if (!g.assistant) {
    const ordered_json& c = chat.at("cases").at(g.index);
    ChatOptions opt;
    opt.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    opt.extra_kwargs = ordered_json::object();
    for (const auto& [k, v] : c.items()) {
      if (k == "messages" || k == "add_generation_prompt" || k == "rendered" || k == "error") continue;
      if (k == "tools") {
        opt.tools = v;
      } else {
        opt.extra_kwargs[k] = v;
      }
    }
    if (c.contains("rendered")) {
      EXPECT_EQ(apply_chat_template(t, c.at("messages"), opt, tokens), c.at("rendered").get<std::string>());
      return;
    }
    const std::string error = c.at("error").get<std::string>();
    const std::string raised = "TemplateError: ";
    try {
      std::string got = apply_chat_template(t, c.at("messages"), opt, tokens);
      ADD_FAILURE() << "rendered what the reference refused (" << error << "):\n" << got;
    } catch (const Error& e) {
      if (error.rfind(raised, 0) == 0) {
        EXPECT_EQ(std::string(e.what()), error.substr(raised.size()));
      }
    }
    return;
  }
  ordered_json cases = ordered_json::parse(slurp(dir / "assistant_cases.json"));
  const ordered_json& c = cases.at(g.index);
  ASSERT_TRUE(c.contains("emitted")) << "golden has no rendering: " << c.value("error", "");
  ChatOptions opt;
  // The script passed `tools or None`: an empty list is no tools argument.
  if (c.at("tools").is_array() && !c["tools"].empty()) opt.tools = c["tools"];
  opt.add_generation_prompt = true;
  const std::string head = c.at("generation_prompt").get<std::string>();
  EXPECT_EQ(apply_chat_template(t, c.at("prior"), opt, tokens), head) << "generation prompt";
  ordered_json full = c.at("prior");
  full.push_back(c.at("message"));
  opt.add_generation_prompt = false;
  EXPECT_EQ(apply_chat_template(t, full, opt, tokens), head + c.at("emitted").get<std::string>())
      << "prior + message";
}

std::string case_name(const ::testing::TestParamInfo<GoldenCase>& info) {
  return info.param.name + (info.param.assistant ? "_assistant_" : "_chat_") + std::to_string(info.param.index);
}

INSTANTIATE_TEST_SUITE_P(Templates, ChatGolden, ::testing::ValuesIn(all_cases()), case_name);

}  // namespace
}  // namespace spool::tmpl
