// Tests of the chat-template engine. Expected strings were produced with Python jinja2 3.1
// configured like transformers (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, tojson = json.dumps(ensure_ascii=False)) and are hard-coded here.
// Unsupported features and extensions are listed in chat_template.h.
#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "template/chat_template.h"

namespace spool::tmpl {
namespace {

using nlohmann::ordered_json;

/// gtest predicate: `hay` contains `needle`.
::testing::AssertionResult Contains(const std::string& hay, const std::string& needle) {
  if (hay.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << hay << "\" does not contain \"" << needle << "\"";
}

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
  ordered_json two = ordered_json::array({{{"role", "user"}, {"content", "a"}}, {{"role", "user"}, {"content", "b"}}});
  EXPECT_EQ(apply_chat_template(t, two, opt, ordered_json::object()), "True False True <B> False 2 False");
  EXPECT_THROW(apply_chat_template(t, ordered_json::array(), opt, ordered_json::object()), Error);
}

// ---------------------------------------------------------------- Jinja features
// Expected strings below were printed by Python jinja2 (see the file comment).

TEST(Jinja, TextAndExpressions) {
  EXPECT_EQ(R(R"J(plain text)J"),
            R"J(plain text)J");
  EXPECT_EQ(R(R"J({{ 1 + 2 }}|{{ "a" ~ 1 ~ none }}|{{ x }}|{{ none }}|{{ true }}|{{ False }})J"),
            R"J(3|a1None||None|True|False)J");
  EXPECT_EQ(R(R"J({{ name }} has {{ n }} items)J", R"J({"name": "Ann", "n": 3})J"),
            R"J(Ann has 3 items)J");
  EXPECT_EQ(R(R"J({{ 1, 2 }}|{{ (1,) }}|{{ () }}|{{ [1, "a", none, true, 1.5] }}|{{ {"k": "v", "n": [1]} }})J"),
            R"J((1, 2)|(1,)|()|[1, 'a', None, True, 1.5]|{'k': 'v', 'n': [1]})J");
  EXPECT_EQ(R(R"J({{ "it's" }}|{{ ["it's", "say \"hi\"", "both'\"", "\t\n\\"] }})J"),
            R"J(it's|["it's", 'say "hi"', 'both\'"', '\t\n\\'])J");
  EXPECT_EQ(R(R"J({{ ["é€😀", "\u200b\x7f\xa0"] }})J"),
            R"J(['é€😀', '\u200b\x7f\xa0'])J");
}

TEST(Jinja, TrailingNewlineAndLineEndings) {
  EXPECT_EQ(R(R"J(a
)J"),
            R"J(a)J");
  EXPECT_EQ(R(R"J(a

)J"),
            R"J(a
)J");
  EXPECT_EQ(R(R"J(a
b
c
)J"),
            R"J(a
b
c)J");
  EXPECT_EQ(R(R"J({{ "x" }}
)J"),
            R"J(x)J");
}

TEST(Jinja, WhitespaceControl) {
  EXPECT_EQ(R(R"J(a  {%- if true %} b {% endif -%}  c)J"),
            R"J(a b c)J");
  EXPECT_EQ(R(R"J(a {{- "x" -}} b)J"),
            R"J(axb)J");
  EXPECT_EQ(R(R"J(a
  {{- "x" }}
)J"),
            R"J(ax)J");
  EXPECT_EQ(R(R"J(  {%- for x in [1,2] -%}
  {{ x }}
  {%- endfor %})J"),
            R"J(12)J");
  EXPECT_EQ(R(R"J(x  {#- c #}  y)J"),
            R"J(x  y)J");
  EXPECT_EQ(R(R"J({#- c -#}  
  x)J"),
            R"J(x)J");
  EXPECT_EQ(R(R"J({%- if true -%}

   yes   

{%- endif -%})J"),
            R"J(yes)J");
}

TEST(Jinja, TrimAndLstripBlocks) {
  EXPECT_EQ(R(R"J(line1
    {% if true %}
    inside
    {% endif %}
line2)J"),
            R"J(line1
    inside
line2)J");
  EXPECT_EQ(R(R"J(x
  {# own-line comment #}
y)J"),
            R"J(x
y)J");
  EXPECT_EQ(R(R"J({% for i in [1,2] %}
{{ i }}
{% endfor %}
)J"),
            R"J(1
2
)J");
  EXPECT_EQ(R(R"J(   {{ "var" }}   
   {% if true %}blk{% endif %}   
)J"),
            R"J(   var   
blk   )J");
  EXPECT_EQ(R(R"J(	{%+ if true %}plus{% endif %})J"),
            R"J(	plus)J");
  EXPECT_EQ(R(R"J(a
{% if true +%}
b
{% endif %})J"),
            R"J(a

b
)J");
  EXPECT_EQ(R(R"J({{ "v" }}  {% if true %}not at line start{% endif %})J"),
            R"J(v  not at line start)J");
  EXPECT_EQ(R(R"J(  {% if true %}unicode space{% endif %})J"),
            R"J(unicode space)J");
}

TEST(Jinja, RawAndComments) {
  EXPECT_EQ(R(R"J({% raw %}{{ not evaluated }} {% if %}{% endraw %})J"),
            R"J({{ not evaluated }} {% if %})J");
  EXPECT_EQ(R(R"J(a
  {% raw -%}
   {{x}}
  {%- endraw %}
b)J"),
            R"J(a
{{x}}b)J");
  EXPECT_EQ(R(R"J({% raw %}
r
{% endraw %}
after)J"),
            R"J(
r
after)J");
  EXPECT_EQ(R(R"J(x{# multi
line #}y)J"),
            R"J(xy)J");
  EXPECT_EQ(R(R"J({{ '}}' }}{{ "%}" }}{{ {'a': {'b': 1}} }})J"),
            R"J(}}%}{'a': {'b': 1}})J");
}

TEST(Jinja, Literals) {
  EXPECT_EQ(R(R"J({{ 1_000 + 0x10 + 0o7 + 0b11 }} {{ 1e2 }} {{ 2E-1 }} {{ 1.5 }} {{ "a" "b" 'c' }})J"),
            R"J(1026 100.0 0.2 1.5 abc)J");
  EXPECT_EQ(R(R"J({{ "tab\there" }}|{{ "uni\u00e9" }}|{{ "oct\101" }}|{{ "hex\x41" }}|{{ "unknown\q" }}|{{ "bs\\" }})J"),
            R"J(tab	here|unié|octA|hexA|unknown\q|bs\)J");
  EXPECT_EQ(R(R"J({{ [1, 2,] }}{{ {"a": 1,} }}{{ (1, 2,) }}{{ True }}{{ None }}{{ none is none }})J"),
            R"J([1, 2]{'a': 1}(1, 2)TrueNoneTrue)J");
}

TEST(Jinja, Arithmetic) {
  EXPECT_EQ(R(R"J({{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ 10 / 4 }} {{ 6 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }})J"),
            R"J(3 -4 1 2 1.5 2.5 3.0 1024 0.5 64 4)J");
  EXPECT_EQ(R(R"J({{ 1 + true }} {{ 1.5 + 1 }} {{ 10 // 3.0 }} {{ -7 // 2.0 }} {{ 2 * 3 + 4 }} {{ (2 + 3) * 4 }} {{ 10 - 2 - 3 }})J"),
            R"J(2 2.5 3.0 -4.0 10 20 5)J");
  EXPECT_EQ(R(R"J({{ "ab" * 2 }} {{ 2 * "c" }} {{ [0] * 3 }} {{ [1] + [2] }} {{ (1,) + (2,) }} {{ "a" + "b" }})J"),
            R"J(abab cc [0, 0, 0] [1, 2] (1, 2) ab)J");
}

TEST(Jinja, FloatRepr) {
  EXPECT_EQ(R(R"J({{ 1e3 }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 1e-4 }} {{ 1/3 }} {{ 123456789012345678.0 }} {{ -0.0 }} {{ 1e300 * 1e10 }} {{ 5e-324 }})J"),
            R"J(1000.0 1.0 0.30000000000000004 1e+16 1000000000000000.0 1e-05 0.0001 0.3333333333333333 1.2345678901234568e+17 -0.0 inf 5e-324)J");
}

TEST(Jinja, ComparisonsAndLogic) {
  EXPECT_EQ(R(R"J({{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1] == [1.0] }} {{ (1,) == [1] }} {{ "abc" < "abd" }} {{ [1, 2] < [1, 3] }})J"),
            R"J(True False True True True False True True)J");
  EXPECT_EQ(R(R"J({{ "a" in "cat" }} {{ 1 in [1, 2] }} {{ "a" in {"a": 1} }} {{ "x" not in "abc" }} {{ not none is defined }})J"),
            R"J(True True True True False)J");
  EXPECT_EQ(R(R"J({{ none or "x" }}|{{ 0 and 1 }}|{{ 1 and "y" }}|{{ [] or {} }}|{{ not [] }}|{{ u or "z" }}|{{ u and 1 }})J"),
            R"J(x|0|y|{}|True|z|)J");
  EXPECT_EQ(R(R"J({{ 1 if false }}|{{ 1 if true else 2 }}|{{ "a" if x else "b" if y else "c" }})J"),
            R"J(|1|c)J");
}

TEST(Jinja, UndefinedBehaviour) {
  EXPECT_EQ(R(R"J([{{ u }}]{{ u is defined }}{{ u is undefined }}{{ u == u }}{{ u == none }}{{ not u }}{{ u|length }}{{ u|default("d") }})J"),
            R"J([]FalseTrueTrueFalseTrue0d)J");
  EXPECT_EQ(R(R"J({% for x in u %}never{% else %}empty{% endfor %}{{ u|list }}{{ u|join(",") }}{{ u|string }}|{{ u|upper }}|{{ "a" in u }})J"),
            R"J(empty[]||False)J");
  EXPECT_EQ(R(R"J({{ d.missing }}|{{ d.missing is defined }}|{{ d["missing"] }}|{{ l[9] }}|{{ none.attr }}|{{ "s".nope }}|{{ d.a }})J", R"J({"d": {"a": 1}, "l": [1]})J"),
            R"J(|False|||||1)J");
  EXPECT_EQ(R(R"J({{ u is iterable }}{{ u is sequence }}{{ u is mapping }}{{ u is string }}{{ u is none }})J"),
            R"J(TrueTrueFalseFalseFalse)J");
}

TEST(Jinja, SlicingAndIndexing) {
  EXPECT_EQ(R(R"J({{ [1,2,3][::-1] }} {{ [1,2,3][1:] }} {{ [1,2,3][:-1] }} {{ [1,2,3,4,5][-2:] }} {{ [1,2,3,4,5][::-2] }} {{ [1,2,3][5:] }})J"),
            R"J([3, 2, 1] [2, 3] [1, 2] [4, 5] [5, 3, 1] [])J");
  EXPECT_EQ(R(R"J({{ "hello"[1:4] }} {{ "hello"[::2] }} {{ "héllo"[1] }} {{ "héllo"[::-1] }} {{ "abc"[-10:10] }} {{ "abc"[-1] }})J"),
            R"J(ell hlo é olléh abc c)J");
  EXPECT_EQ(R(R"J({{ l[0] }}{{ l[-1] }}{{ l.1 }}{{ t[0] }}{{ t[1:] }}{{ m[0].content }}{{ m[-1]["role"] }})J", R"J({"l": [1, 2], "t": [7, 8], "m": [{"role": "user", "content": "hi"}]})J"),
            R"J(1227[8]hiuser)J");
}

TEST(Jinja, IfElifElse) {
  EXPECT_EQ(R(R"J({% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %},{% endfor %})J"),
            R"J(one,two,many,)J");
  EXPECT_EQ(R(R"J({% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }})J"),
            R"J(2)J");
}

TEST(Jinja, ForLoopVariables) {
  EXPECT_EQ(R(R"J({% for i in range(3) %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %})J"),
            R"J(1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|)J");
  EXPECT_EQ(R(R"J({% for i in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %})J"),
            R"J(-2;1-3;2-;)J");
  EXPECT_EQ(R(R"J({% for i in [1, 2, 3, 4] if i is even %}{{ i }}:{{ loop.index }}:{{ loop.last }} {% else %}none{% endfor %})J"),
            R"J(2:1:False 4:2:True )J");
  EXPECT_EQ(R(R"J({% for i in [] %}x{% else %}empty{% endfor %})J"),
            R"J(empty)J");
  EXPECT_EQ(R(R"J({% for i in [1, 2] %}{% for j in "ab" %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}{% endfor %})J"),
            R"J(11a 21b 12a 22b )J");
  EXPECT_EQ(R(R"J({% for a, b in [(1, 2), (3, 4)] %}{{ a }}{{ b }}{% endfor %}|{% for k, v in {"x": 1, "y": 2}.items() %}{{ k }}={{ v }};{% endfor %})J"),
            R"J(1234|x=1;y=2;)J");
  EXPECT_EQ(R(R"J({% for k in {"b": 1, "a": 2} %}{{ k }}{% endfor %}|{% for c in "héllo" %}{{ c }}.{% endfor %})J"),
            R"J(ba|h.é.l.l.o.)J");
  EXPECT_EQ(R(R"J({% for i in [1, 2, 1, 3] %}{% if loop.changed(i) %}{{ i }}{% endif %}{{ loop.cycle("a", "b") }}{% endfor %})J"),
            R"J(1a2b1a3b)J");
  EXPECT_EQ(R(R"J({% for item in tree recursive %}[{{ item.n }}{% if item.c %}{{ loop(item.c) }}{% endif %}]{% endfor %})J", R"J({"tree": [{"n": 1, "c": [{"n": 2, "c": []}, {"n": 3}]}, {"n": 4}]})J"),
            R"J([1[2][3]][4])J");
}

TEST(Jinja, LoopScoping) {
  EXPECT_EQ(R(R"J({% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }})J"),
            R"J(12121)J");
  EXPECT_EQ(R(R"J({% for i in [1, 2] %}{% endfor %}[{{ i }}])J"),
            R"J([])J");
}

TEST(Jinja, BreakContinue) {
  EXPECT_EQ(R(R"J({% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %})J"),
            R"J(0134)J");
}

TEST(Jinja, SetAndNamespace) {
  EXPECT_EQ(R(R"J({% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c, d = [3, 4] %}{{ c + d }})J"),
            R"J(127)J");
  EXPECT_EQ(R(R"J({% set ns = namespace(total=0, names=[]) %}{% for i in range(4) %}{% set ns.total = ns.total + i %}{% set ns.names = ns.names + [i|string] %}{% endfor %}{{ ns.total }} {{ ns.names|join("-") }})J"),
            R"J(6 0-1-2-3)J");
  EXPECT_EQ(R(R"J({% set ns = namespace(a=1) %}{{ ns.a }}{{ ns.missing is defined }}{{ ns }})J"),
            R"J(1False<Namespace {'a': 1}>)J");
  EXPECT_EQ(R(R"J({% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]{% set y | trim | upper %}  padded  {% endset %}[{{ y }}])J"),
            R"J([block 2][PADDED])J");
  EXPECT_EQ(R(R"J({% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}])J"),
            R"J(3[])J");
}

TEST(Jinja, Macros) {
  EXPECT_EQ(R(R"J({% macro m(a, b=2, c="z") %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c=5) }}|{{ m(a=7) }}|{{ m() }})J"),
            R"J(12z|13z|125|72z|2z)J");
  EXPECT_EQ(R(R"J({% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }})J"),
            R"J(1(2, 3){'x': 4})J");
  EXPECT_EQ(R(R"J({% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }})J"),
            R"J(120)J");
  EXPECT_EQ(R(R"J({% set g = "global" %}{% macro show() %}{{ g }}{% endmacro %}{% set g = "late" %}{{ show() }})J"),
            R"J(late)J");
  EXPECT_EQ(R(R"J({% macro m(x, y=x * 2) %}{{ x }},{{ y }}{% endmacro %}{{ m(3) }})J"),
            R"J(3,6)J");
  EXPECT_EQ(R(R"J({% macro outer() %}[{{ caller() }}]{% endmacro %}{% call outer() %}inner{% endcall %}|{% macro twice(x) %}{{ caller(x) }}{{ caller(x * 2) }}{% endmacro %}{% call(v) twice(2) %}<{{ v }}>{% endcall %})J"),
            R"J([inner]|<2><4>)J");
}

TEST(Jinja, FilterBlockAndGeneration) {
  EXPECT_EQ(R(R"J({% filter upper %}hello {{ "world" }}{% endfilter %})J"),
            R"J(HELLO WORLD)J");
  EXPECT_EQ(R(R"J({% for m in ["a", "b"] %}{% generation %}<{{ m }}>{% endgeneration %}{% endfor %})J"),
            R"J(<a><b>)J");
}

TEST(Jinja, StringMethods) {
  EXPECT_EQ(R(R"J({{ "Hello World".split() }}{{ "a,b,,c".split(",") }}{{ "a b c".split(" ", 1) }}{{ "a b c".rsplit(" ", 1) }}{{ "  a  b  ".split(None, 1) }}{{ "  a  b  ".rsplit(None, 1) }}{{ "".split() }})J"),
            R"J(['Hello', 'World']['a', 'b', '', 'c']['a', 'b c']['a b', 'c']['a', 'b  ']['  a', 'b'][])J");
  EXPECT_EQ(R(R"J([{{ "  x  ".strip() }}|{{ "xxhixx".strip("x") }}|{{ "\n\nhi\n".lstrip("\n") }}|{{ "hi\n\n".rstrip() }}|{{ "\u3000pad\u3000".strip() }}])J"),
            R"J([x|hi|hi
|hi|pad])J");
  EXPECT_EQ(R(R"J({{ "abc".startswith("a") }}{{ "abc".startswith(("x", "ab")) }}{{ "abc".endswith("bc") }}{{ "abc".startswith("b", 1) }}{{ "abc".find("c") }}{{ "abc".find("z") }}{{ "abcabc".count("b") }}{{ "abcabc".rfind("b") }}{{ "héllo".find("l") }})J"),
            R"J(TrueTrueTrueTrue2-1242)J");
  EXPECT_EQ(R(R"J({{ "hello world".title() }}|{{ "hello WORLD".capitalize() }}|{{ "Hi".upper() }}|{{ "Hi".lower() }}|{{ "Straße ﬁ".upper() }}|{{ "hello wORLD".swapcase() }})J"),
            R"J(Hello World|Hello world|HI|hi|STRASSE FI|HELLO World)J");
  EXPECT_EQ(R(R"J({{ "a\nb\r\nc".splitlines() }}{{ "x".replace("x", "yy") }}{{ "aaa".replace("a", "b", 2) }}{{ "abc".replace("", "-") }})J"),
            R"J(['a', 'b', 'c']yybba-a-b-c-)J");
  EXPECT_EQ(R(R"J({{ "x".center(7, "*") }}|{{ "x".ljust(3, ".") }}|{{ "x".rjust(3) }}|{{ "42".zfill(5) }}|{{ "a=b=c".partition("=") }}|{{ "a=b=c".rpartition("=") }}|{{ ", ".join(["a", "b"]) }})J"),
            R"J(***x***|x..|  x|00042|('a', '=', 'b=c')|('a=b', '=', 'c')|a, b)J");
  EXPECT_EQ(R(R"J({{ "abc".isalpha() }}{{ "123".isdigit() }}{{ "a1".isalnum() }}{{ "  ".isspace() }}{{ "Title Case".istitle() }}{{ "abc".islower() }}{{ "ABC".isupper() }})J"),
            R"J(TrueTrueTrueTrueTrueTrueTrue)J");
}

TEST(Jinja, StringFormatting) {
  EXPECT_EQ(R(R"J({{ "{} and {}".format(1, "two") }}|{{ "{0}{1}{0}".format("a", "b") }}|{{ "{name}!".format(name="x") }}|{{ "{:>5}|{:<5}|{:^5}".format("a", "b", "c") }}|{{ "{:.2f}".format(3.14159) }}|{{ "{:05d}".format(42) }}|{{ "{:,}".format(1234567) }})J"),
            R"J(1 and two|aba|x!|    a|b    |  c  |3.14|00042|1,234,567)J");
  EXPECT_EQ(R(R"J({{ "%s-%d-%05.2f-%x-%r" % ("a", 3, 2.5, 255, "q") }}|{{ "%(a)s=%(b)s" % {"a": 1, "b": 2} }}|{{ "%s"|format("x") }}|{{ "%5s|%-5s|" % ("a", "b") }}|{{ "%.3f"|format(2.0) }})J"),
            R"J(a-3-02.50-ff-'q'|1=2|x|    a|b    ||2.000)J");
}

TEST(Jinja, DictAndListMethods) {
  EXPECT_EQ(R(R"J({{ d.get("a") }} {{ d.get("zz") }} {{ d.get("zz", 5) }} {{ d.keys() }} {{ d.values() }} {{ d.items() }} {{ d.keys()|list }})J", R"J({"d": {"a": 1, "b": [1, 2]}})J"),
            R"J(1 None 5 dict_keys(['a', 'b']) dict_values([1, [1, 2]]) dict_items([('a', 1), ('b', [1, 2])]) ['a', 'b'])J");
  EXPECT_EQ(R(R"J({{ l.count(2) }} {{ l.index(3) }} {{ (1, 2).count(1) }})J", R"J({"l": [1, 2, 2, 3]})J"),
            R"J(2 3 1)J");
}

TEST(Jinja, ContainerFilters) {
  EXPECT_EQ(R(R"J({{ [3, 1, 2]|sort }}{{ ["b", "A", "c"]|sort }}{{ ["b", "A", "c"]|sort(case_sensitive=true) }}{{ [3, 1, 2]|sort(reverse=true) }}{{ [{"n": 2}, {"n": 1}]|sort(attribute="n") }})J"),
            R"J([1, 2, 3]['A', 'b', 'c']['A', 'b', 'c'][3, 2, 1][{'n': 1}, {'n': 2}])J");
  EXPECT_EQ(R(R"J({{ {"b": 1, "a": 2}|dictsort }}{{ {"b": 1, "a": 2}|dictsort(by="value") }}{{ {"B": 1, "a": 2}|dictsort(reverse=true) }})J"),
            R"J([('a', 2), ('b', 1)][('b', 1), ('a', 2)][('B', 1), ('a', 2)])J");
  EXPECT_EQ(R(R"J({{ [1, 2, 2, 3, 1]|unique|list }}{{ ["a", "A", "b"]|unique|list }}{{ [1, 2, 3]|sum }}{{ [3, 1, 2]|min }}{{ [3, 1, 2]|max }}{{ ["b", "A"]|max }})J"),
            R"J([1, 2, 3]['a', 'b']613b)J");
  EXPECT_EQ(R(R"J({{ users|map(attribute="name")|join(", ") }}|{{ users|selectattr("active")|map(attribute="name")|list }}|{{ users|rejectattr("active")|list|length }}|{{ users|selectattr("age", "gt", 20)|list|length }}|{{ users|map(attribute="x", default="?")|list }}|{{ users|join(", ", attribute="name") }})J", R"J({"users": [{"name": "Ann", "active": true, "age": 30}, {"name": "bob", "active": false, "age": 18}, {"name": "Cid", "active": true, "age": 25}]})J"),
            R"J(Ann, bob, Cid|['Ann', 'Cid']|1|2|['?', '?', '?']|Ann, bob, Cid)J");
  EXPECT_EQ(R(R"J({{ [1, 2, 3, 4]|select("odd")|list }}{{ [1, 2, 3, 4]|reject("odd")|list }}{{ ["a", "b"]|map("upper")|list }}{{ [1, 0, 2]|select|list }}{{ [1, 2]|map("string")|join }})J"),
            R"J([1, 3][2, 4]['A', 'B'][1, 2]12)J");
  EXPECT_EQ(R(R"J({% for g in users|groupby("active") %}{{ g.grouper }}:{{ g.list|map(attribute="name")|join("+") }};{% endfor %})J", R"J({"users": [{"name": "Ann", "active": true, "age": 30}, {"name": "bob", "active": false, "age": 18}, {"name": "Cid", "active": true, "age": 25}]})J"),
            R"J(False:bob;True:Ann+Cid;)J");
  EXPECT_EQ(R(R"J({{ [1, 2, 3, 4, 5]|batch(2)|list }}{{ [1, 2, 3, 4, 5]|batch(2, 0)|list }}{{ [1, 2, 3, 4, 5]|slice(2)|list }})J"),
            R"J([[1, 2], [3, 4], [5]][[1, 2], [3, 4], [5, 0]][[1, 2, 3], [4, 5]])J");
  EXPECT_EQ(R(R"J({{ [1, 2, 3]|first }}{{ [1, 2, 3]|last }}{{ "hi"|first }}{{ {"a": 1}|first }}{{ []|first is defined }}{{ [1, 2, 3]|reverse|list }}{{ "abc"|reverse }}{{ [1, 2]|length }}{{ "héllo"|length }}{{ {"a": 1}|count }})J"),
            R"J(13haFalse[3, 2, 1]cba251)J");
  EXPECT_EQ(R(R"J({{ {"a": 1}|items|list }}{{ "ab"|list }}{{ (1, 2)|list }})J"),
            R"J([('a', 1)]['a', 'b'][1, 2])J");
}

TEST(Jinja, GeneratorsAreOneShot) {
  EXPECT_EQ(R(R"J({% set g = [1, 2, 3]|select("odd") %}{{ g|list }}{{ g|list }}{% if g %}truthy{% endif %}{% if []|select %}also{% endif %})J"),
            R"J([1, 3][]truthyalso)J");
}

TEST(Jinja, StringFilters) {
  EXPECT_EQ(R(R"J({{ "x"|upper }}{{ "X"|lower }}{{ "hello world"|capitalize }}{{ "a-b_c d(e)"|title }}{{ "  x "|trim }}|{{ "xxyxx"|trim("x") }}|{{ "Hello"|replace("l", "L") }}|{{ "Hello"|replace("l", "L", 1) }})J"),
            R"J(XxHello worldA-B_c D(E)x|y|HeLLo|HeLlo)J");
  EXPECT_EQ(R(R"J({{ 42|string }}{{ 42|string|length }}{{ "Hello World"|wordcount }}|{{ "ab"|center(6) }}|{{ "<a href=\"x\">&</a>"|e }}|{{ "<b>"|safe }}|{{ "<b>"|escape|safe }})J"),
            R"J(4222|  ab  |&lt;a href=&#34;x&#34;&gt;&amp;&lt;/a&gt;|<b>|&lt;b&gt;)J");
  EXPECT_EQ(R(R"J({{ "line1\nline2\n\nline4"|indent }}|{{ "line1\nline2"|indent(2, true) }}|{{ "a\n\nb"|indent(2, blank=true) }}|{{ "x\ny"|indent("> ") }})J"),
            R"J(line1
    line2

    line4|  line1
  line2|a
  
  b|x
> y)J");
  EXPECT_EQ(R(R"J({{ "hello world foo bar"|truncate(9) }}|{{ "hello world foo bar"|truncate(9, true) }}|{{ "hello world foo bar"|truncate(11, false, "...", 0) }})J"),
            R"J(hello...|hello ...|hello...)J");
}

TEST(Jinja, NumberFilters) {
  EXPECT_EQ(R(R"J({{ "42"|int + 1 }} {{ "4.7"|int }} {{ "x"|int }} {{ "x"|int(7) }} {{ "3.5"|float }} {{ 3|float }} {{ "0x1A"|int(0, 16) }} {{ " 12 "|int }} {{ true|int }} {{ none|int }} {{ "1e3"|float }})J"),
            R"J(43 4 0 7 3.5 3.0 26 12 1 0 1000.0)J");
  EXPECT_EQ(R(R"J({{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 42.55|round(1, "floor") }} {{ 42.55|round(1, "ceil") }} {{ 3|round }} {{ -3|abs }} {{ -3.5|abs }})J"),
            R"J(2.0 4.0 2.67 42.5 42.6 3 3 3.5)J");
}

TEST(Jinja, DefaultFilter) {
  EXPECT_EQ(R(R"J({{ "x"|default("d") }}|{{ u|default("d") }}|{{ ""|default("d") }}|{{ ""|default("d", true) }}|{{ none|default("d") }}|{{ u|d("short") }}|{{ 0|d(5, boolean=true) }})J"),
            R"J(x|d||d|None|short|5)J");
}

TEST(Jinja, Tests) {
  EXPECT_EQ(R(R"J({{ "x" is string }}{{ 1 is number }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ none is none }}{{ {} is mapping }}{{ [] is sequence }}{{ "a" is sequence }}{{ 1 is iterable }}{{ "a" is iterable }})J"),
            R"J(TrueTrueTrueFalseTrueTrueTrueTrueTrueTrueFalseTrue)J");
  EXPECT_EQ(R(R"J({{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 2 is in [1, 2] }}{{ "a" is lower }}{{ "A" is upper }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 0 is false }})J"),
            R"J(TrueTrueTrueTrueTrueTrueTrueFalseTrueFalse)J");
  EXPECT_EQ(R(R"J({{ 1 is eq 1 }}{{ 1 is equalto 1 }}{{ 1 is ne 2 }}{{ 1 is lt 2 }}{{ 1 is le 1 }}{{ 2 is gt 1 }}{{ 2 is ge 2 }}{{ 1 is greaterthan 0 }}{{ 1 is lessthan 0 }})J"),
            R"J(TrueTrueTrueTrueTrueTrueTrueTrueFalse)J");
  EXPECT_EQ(R(R"J({{ "upper" is filter }}{{ "odd" is test }}{{ "nope" is filter }}{{ range is callable }}{{ none is sameas none }}{{ x is not defined }}{{ not x is defined }})J"),
            R"J(TrueTrueFalseTrueTrueTrueTrue)J");
}

TEST(Jinja, ToJson) {
  EXPECT_EQ(R(R"J({{ {"a": 1, "b": [1, 2, {"c": none}], "d": true, "e": 1.5}|tojson }})J"),
            R"J({"a": 1, "b": [1, 2, {"c": null}], "d": true, "e": 1.5})J");
  EXPECT_EQ(R(R"J({{ {"a": [1, {"b": none}], "e": {}}|tojson(indent=2) }})J"),
            R"J({
  "a": [
    1,
    {
      "b": null
    }
  ],
  "e": {}
})J");
  EXPECT_EQ(R(R"J({{ [1, [2, 3]]|tojson(indent=4) }}|{{ {"b": 1, "a": 2}|tojson(sort_keys=true) }}|{{ [1, 2]|tojson(separators=(",", ":")) }})J"),
            R"J([
    1,
    [
        2,
        3
    ]
]|{"a": 2, "b": 1}|[1,2])J");
  EXPECT_EQ(R(R"J({{ "é\"\n\t\\ \u0001 \u2028 😀"|tojson }}|{{ "é😀"|tojson(ensure_ascii=true) }}|{{ 1.0|tojson }}|{{ 1e20|tojson }}|{{ (1, 2)|tojson }}|{{ {1: "a", 2.5: "b", true: "c", none: "d"}|tojson }})J"),
            R"J("é\"\n\t\\ \u0001   😀"|"\u00e9\ud83d\ude00"|1.0|1e+20|[1, 2]|{"1": "c", "2.5": "b", "null": "d"})J");
  EXPECT_EQ(R(R"J({{ tool|tojson }})J", R"J({"tool": {"type": "function", "function": {"name": "f", "description": "Ünïcode «q»", "parameters": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}, "required": ["z"]}}}})J"),
            R"J({"type": "function", "function": {"name": "f", "description": "Ünïcode «q»", "parameters": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}, "required": ["z"]}}})J");
}

TEST(Jinja, Globals) {
  EXPECT_EQ(R(R"J({{ range(5)|list }}{{ range(1, 10, 3)|list }}{{ range(5, 0, -2)|list }}{{ dict(a=1, b=2) }}{{ dict([("x", 1)]) }}{{ namespace(a=1).a }})J"),
            R"J([0, 1, 2, 3, 4][1, 4, 7][5, 3, 1]{'a': 1, 'b': 2}{'x': 1}1)J");
  EXPECT_EQ(R(R"J({% set j = joiner("|") %}{% for i in [1, 2, 3] %}{{ j() }}{{ i }}{% endfor %})J"),
            R"J(1|2|3)J");
}

/// Sets an environment variable for one scope and restores the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(Jinja, StrftimeNowHonoursSourceDateEpoch) {
  // Python: datetime(2026, 6, 1).strftime(...) (transformers' datetime.now() is naive: %z/%Z are "").
  {
    ScopedEnv env("SOURCE_DATE_EPOCH", "1780272000");
    EXPECT_EQ(R(R"J({{ strftime_now("%Y-%m-%d %H:%M:%S.%f|%d %B %Y|%a %b|[%z%Z]|%%f|%j") }})J"),
              R"J(2026-06-01 00:00:00.000000|01 June 2026|Mon Jun|[]|%f|152)J");
  }
  {
    ScopedEnv env("SOURCE_DATE_EPOCH", "1780315323");  // formatted in UTC, whatever TZ says
    ScopedEnv tz("TZ", "America/New_York");
    tzset();
    EXPECT_EQ(R(R"J({{ strftime_now("%Y-%m-%d %H:%M:%S") }})J"), R"J(2026-06-01 12:02:03)J");
  }
  tzset();
  for (const char* bad : {"yesterday", "-5", "1.5", "99999999999999999999"}) {
    ScopedEnv env("SOURCE_DATE_EPOCH", bad);
    EXPECT_TRUE(Contains(E(R"J({{ strftime_now("%Y") }})J"), "SOURCE_DATE_EPOCH")) << bad;
  }
  ScopedEnv unset("SOURCE_DATE_EPOCH", nullptr);
  EXPECT_EQ(R(R"J({{ strftime_now("%Y")|length }}{{ strftime_now("[%Z%z]") }})J"), "4[]");
}


// ---------------------------------------------------------------- errors

TEST(JinjaErrors, SyntaxErrorsNameTheLine) {
  EXPECT_TRUE(Contains(E("{% if x %}never closed"), "unexpected end of template"));
  EXPECT_TRUE(Contains(E("{% if x %}never closed"), "'endif'"));
  EXPECT_TRUE(Contains(E("a\n  {% if x %}never closed"), "unclosed 'if' block opened at line 2, column 3"));
  EXPECT_TRUE(Contains(E("{% for x in y %}\n{{ x }}"), "'endfor'"));
  EXPECT_TRUE(Contains(E("{{ x"), "unexpected end of template"));
  EXPECT_TRUE(Contains(E("a\n{# comment"), "Missing end of comment tag at line 2"));
  EXPECT_TRUE(Contains(E("{% raw %}x"), "Missing end of raw directive"));
  EXPECT_TRUE(Contains(E("line1\n{{ 1 + }}"), "line 2"));
  EXPECT_TRUE(Contains(E("{{ ) }}"), "unexpected ')'"));
  EXPECT_TRUE(Contains(E("{{ x..y }}"), "expected name or number"));
  EXPECT_TRUE(Contains(E("{{ 'unterminated }}"), "unexpected char"));
  EXPECT_TRUE(Contains(E("{{ a $ b }}"), "unexpected char '$'"));
  EXPECT_TRUE(Contains(E("{% endif %}"), "unknown tag 'endif'"));
  EXPECT_TRUE(Contains(E("{% if true %}{% endfor %}{% endif %}"), "unknown tag 'endfor'"));
  EXPECT_TRUE(Contains(E("{% break %}"), "outside of a for loop"));
  EXPECT_TRUE(Contains(E("{% macro m(a=1, b) %}{% endmacro %}"), "non-default argument follows default"));
  EXPECT_TRUE(Contains(E("{{ 'x' is nope }}"), "no test named 'nope'"));
  EXPECT_TRUE(Contains(E("{{ x|nope }}"), "no filter named 'nope'"));
  EXPECT_TRUE(Contains(E("{{ 99999999999999999999 }}"), "integer literal too large"));
  EXPECT_TRUE(Contains(E("{{ '\\x4' }}"), "truncated"));
}

TEST(JinjaErrors, UnknownTagAndUnsupportedFeatures) {
  EXPECT_TRUE(Contains(E("{% foo %}"), "unknown tag 'foo' at line 1"));
  EXPECT_TRUE(Contains(E("{% do x %}"), "unknown tag 'do'"));
  for (const char* tag : {"include", "extends", "import", "from", "block", "autoescape"}) {
    std::string src = std::string("text\n  {% ") + tag + " 'x' %}";
    EXPECT_TRUE(Contains(E(src), std::string("unsupported Jinja tag '") + tag + "' at line 2")) << tag;
  }
  // Even in a branch that never runs: unsupported syntax is rejected at parse time.
  EXPECT_THROW(Template::parse("{% if false %}{% include 'x' %}{% endif %}", "t"), Error);
}

TEST(JinjaErrors, UnknownFilterInsideIfIsDeferredLikeJinja) {
  EXPECT_EQ(R("{% if 'from_json' is filter %}{{ x|from_json }}{% else %}no{% endif %}"), "no");
  EXPECT_EQ(R("{{ (x|from_json) if false else 'ok' }}"), "ok");
  EXPECT_TRUE(Contains(E("{% if true %}{{ x|from_json }}{% endif %}"), "no filter named 'from_json'"));
  EXPECT_TRUE(Contains(E("{% for i in [1] %}{{ i|from_json }}{% endfor %}"), "no filter named"));
}

TEST(JinjaErrors, RaiseExceptionCarriesTheMessage) {
  try {
    R("{% if true %}{{ raise_exception('Conversation roles must alternate!') }}{% endif %}");
    FAIL() << "expected an exception";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "Conversation roles must alternate!");
  }
}

TEST(JinjaErrors, RuntimeTypeErrors) {
  EXPECT_TRUE(Contains(E("{{ 'a' + 1 }}"), "can only concatenate str"));
  EXPECT_TRUE(Contains(E("{{ u.x }}"), "'u' is undefined"));
  EXPECT_TRUE(Contains(E("{{ u + 1 }}"), "'u' is undefined"));
  EXPECT_TRUE(Contains(E("{{ u() }}"), "'u' is undefined"));
  EXPECT_TRUE(Contains(E("{{ d.q.z }}", R"({"d": {}})"), "'dict object' has no attribute 'q'"));
  EXPECT_TRUE(Contains(E("{{ 1 / 0 }}"), "division by zero"));
  EXPECT_TRUE(Contains(E("{{ 'a' < 1 }}"), "not supported between instances of 'str' and 'int'"));
  EXPECT_TRUE(Contains(E("{% for x in 5 %}{% endfor %}"), "'int' object is not iterable"));
  EXPECT_TRUE(Contains(E("{{ [1]|select('odd')|length }}"), "has no len()"));
  EXPECT_TRUE(Contains(E("{% set a, b = [1] %}"), "not enough values to unpack"));
  EXPECT_TRUE(Contains(E("{% set x = 1 %}{% set x.y = 2 %}"), "non-namespace"));
  EXPECT_TRUE(Contains(E("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"), "takes not more than 1 argument"));
  EXPECT_TRUE(Contains(E("{{ {}|pop }}"), "no filter named 'pop'"));
  EXPECT_TRUE(Contains(E("{{ {}.pop('x') }}"), "unsafe"));
  EXPECT_TRUE(Contains(E("{{ u|tojson }}"), "not JSON serializable"));
  EXPECT_TRUE(Contains(E("{{ 2 ** 64 }}"), "integer overflow"));
  EXPECT_TRUE(Contains(E("{{ range(200000)|length }}"), "MAX_RANGE"));
  EXPECT_TRUE(Contains(E("line1\n{{ 1 / 0 }}"), "at line 2"));
}

// ---------------------------------------------------------------- limits and robustness

TEST(JinjaLimits, RunawayTemplatesFailCleanly) {
  RenderLimits lim;
  lim.max_steps = 200000;
  lim.max_output_bytes = 1 << 20;
  Template loop = Template::parse("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "t");
  EXPECT_THROW(loop.render(ordered_json::object(), lim), Error);
  Template rec = Template::parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "t");
  EXPECT_TRUE(Contains([&] {
    try {
      rec.render(ordered_json::object(), lim);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  }(), "recursion"));
  Template big = Template::parse("{{ 'x' * 100000000 }}", "t");
  EXPECT_THROW(big.render(ordered_json::object(), lim), Error);
  Template doubling =
      Template::parse("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "t");
  EXPECT_THROW(doubling.render(ordered_json::object(), lim), Error);
  Template out = Template::parse("{% for i in range(100000) %}{{ 'y' * 100 }}{% endfor %}", "t");
  EXPECT_THROW(out.render(ordered_json::object(), lim), Error);
  // A namespace that contains itself prints as an error, not a crash.
  Template cyc = Template::parse("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", "t");
  EXPECT_THROW(cyc.render(ordered_json::object(), lim), Error);
  // Deeply nested expressions are rejected by the parser instead of overflowing the stack.
  EXPECT_THROW(Template::parse("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", "t"), Error);
  std::string filters = "{{ x";
  for (int i = 0; i < 5000; ++i) filters += "|trim";
  EXPECT_THROW(Template::parse(filters + " }}", "t"), Error);
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  EXPECT_THROW(Template::parse(chain + " }}", "t"), Error);
  std::string nested;
  for (int i = 0; i < 500; ++i) nested += "{% if true %}";
  EXPECT_THROW(Template::parse(nested, "t"), Error);
}

TEST(JinjaLimits, DeepJsonInputIsRejected) {
  std::string deep(2000, '[');
  deep += std::string(2000, ']');
  ordered_json ctx = {{"x", ordered_json::parse(deep)}};
  EXPECT_THROW(Template::parse("{{ x }}", "t").render(ctx), Error);
}

TEST(JinjaApi, ConcurrentRendersOfOneTemplate) {
  Template t = Template::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content|length %}"
      "{{ m.role }}:{{ m.content|upper }};{% endfor %}{{ ns.n }}",
      "mt");
  ordered_json ctx = {{"messages", ordered_json::array()}};
  for (int i = 0; i < 50; ++i) ctx["messages"].push_back({{"role", "user"}, {"content", "msg" + std::to_string(i)}});
  const std::string want = t.render(ctx);
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int k = 0; k < 8; ++k)
    threads.emplace_back([&, k] {
      for (int r = 0; r < 50; ++r) ok[k] += t.render(ctx) == want;
    });
  for (auto& th : threads) th.join();
  for (int k = 0; k < 8; ++k) EXPECT_EQ(ok[k], 50);
}

TEST(JinjaApi, AcceptsUnorderedJsonContext) {
  nlohmann::json ctx = {{"b", 1}, {"a", 2}};
  EXPECT_EQ(Template::parse("{{ a }}{{ b }}", "j").render(ctx), "21");
  ChatOptions opt;
  opt.tools = nlohmann::json::array();
  opt.extra_kwargs = nlohmann::json{{"enable_thinking", true}};
  nlohmann::json msgs = nlohmann::json::array({{{"role", "user"}, {"content", "hi"}}});
  nlohmann::json cfg = {{"eos_token", "</s>"}};
  EXPECT_EQ(apply_chat_template(Template::parse("{{ messages[0].content }}{{ eos_token }}{{ tools|length }}", "j"), msgs,
                                opt, special_tokens_from_config(cfg)),
            "hi</s>0");
}

TEST(JinjaApi, TemplateIsReusableAndKeepsKeyOrder) {
  Template t = Template::parse("{{ d|tojson }} {% for k, v in d.items() %}{{ k }}{% endfor %}", "order");
  EXPECT_EQ(t.label(), "order");
  ordered_json ctx = ordered_json::parse(R"({"d": {"z": 1, "a": 2, "m": 3}})");
  EXPECT_EQ(t.render(ctx), R"({"z": 1, "a": 2, "m": 3} zam)");
  EXPECT_EQ(t.render(ctx), R"({"z": 1, "a": 2, "m": 3} zam)");
}

}  // namespace
}  // namespace spool::tmpl
