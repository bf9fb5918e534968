// Tests of the chat-template engine. Expected strings were produced with Python jinja2 3.1
// configured like transformers (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, tojson = json.dumps(ensure_ascii=False)) and are hard-coded here.
//
// Deliberately unsupported (clear spool::Error instead of output): extends/include/import/
// from/block/autoescape tags, filters pprint/random/striptags/urlize/urlencode/wordwrap/
// xmlattr/filesizeformat, globals lipsum/cycler, integers beyond 64 bits.
// Deliberate extensions over transformers: list.append() works (the sandbox forbids it) and
// the `startingwith` test exists.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "common/error.h"
#include "template/chat_template.h"

namespace spool::tmpl {
namespace {

using nlohmann::ordered_json;
using ::testing::HasSubstr;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ordered_json read_json(const std::string& path) { return ordered_json::parse(read_file(path)); }

/// Renders `src` with `ctx` (a JSON object literal).
std::string R(const std::string& src, const std::string& ctx = "{}") {
  return Template::parse(src, "test").render(ordered_json::parse(ctx));
}

/// Message of the spool::Error thrown by parsing or rendering, or "" when none.
std::string E(const std::string& src, const std::string& ctx = "{}") {
  try {
    R(src, ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------- real chat templates

struct ChatFixture {
  const char* name;
  std::string template_path;
  bool template_in_config;
  const char* tokens_config;
};

void check_chat_cases(const ChatFixture& fx) {
  const std::string data = SPOOL_TEST_DATA_DIR;
  ordered_json token_cfg = read_json(data + "/tokenizers/" + fx.tokens_config + "/tokenizer_config.json");
  std::string source = fx.template_in_config
                           ? read_json(data + "/tokenizers/" + fx.template_path)["chat_template"].get<std::string>()
                           : read_file(data + "/tokenizers/" + fx.template_path);
  Template t = Template::parse(source, fx.name);
  ordered_json tokens = special_tokens_from_config(token_cfg);
  ordered_json cases = read_json(data + "/tokenizer/" + fx.name + "/chat_cases.json");
  ASSERT_FALSE(cases.empty());
  for (size_t i = 0; i < cases.size(); ++i) {
    const ordered_json& c = cases[i];
    ChatOptions opt;
    opt.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    if (c.contains("tools")) opt.tools = c["tools"];
    opt.extra_kwargs = ordered_json::object();
    if (c.contains("enable_thinking")) opt.extra_kwargs["enable_thinking"] = c["enable_thinking"];
    std::string got = apply_chat_template(t, c.at("messages"), opt, tokens);
    EXPECT_EQ(got, c.at("rendered").get<std::string>()) << fx.name << " case " << i;
  }
}

TEST(ChatTemplate, Qwen3CasesMatchTransformers) {
  check_chat_cases({"qwen3", "qwen3/tokenizer_config.json", true, "qwen3"});
}

TEST(ChatTemplate, Qwen35CasesMatchTransformers) {
  check_chat_cases({"qwen3_5", "qwen3_5/chat_template.jinja", false, "qwen3"});
}

TEST(ChatTemplate, DeepSeekV3CasesMatchTransformers) {
  check_chat_cases({"deepseek_v3", "deepseek_v3/tokenizer_config.json", true, "deepseek_v3"});
}

TEST(ChatTemplate, SpecialTokensFromConfig) {
  ordered_json cfg = ordered_json::parse(R"({
    "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
    "eos_token": "</s>", "unk_token": null, "pad_token": "<pad>", "chat_template": "x"})");
  nlohmann::json t = special_tokens_from_config(cfg);
  EXPECT_EQ(t.dump(), R"({"bos_token":"<s>","eos_token":"</s>","pad_token":"<pad>"})");
}

TEST(ChatTemplate, ContextLikeTransformers) {
  // tools and documents are always passed (None when absent); kwargs override special tokens.
  Template t = Template::parse(
      "{{ tools is defined }} {{ tools is none }} {{ documents is none }} {{ bos_token }} "
      "{{ add_generation_prompt }} {{ messages|length }} {{ enable_thinking }}",
      "ctx");
  ChatOptions opt;
  opt.extra_kwargs = {{"enable_thinking", false}, {"bos_token", "<B>"}};
  EXPECT_EQ(apply_chat_template(t, ordered_json::array({{{"role", "user"}, {"content", "x"}}}), opt,
                                {{"bos_token", "<s>"}}),
            "True True True <B> True 1 False");
  opt.tools = ordered_json::array({{{"name", "f"}}});
  opt.add_generation_prompt = false;
  EXPECT_EQ(apply_chat_template(t, ordered_json::array(), opt, ordered_json::object()),
            "True False True <B> False 0 False");
}

}  // namespace
}  // namespace spool::tmpl
