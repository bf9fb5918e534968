#include "constrain/json_schema.h"

#include <cctype>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/json_string.h"

namespace spool::constrain {

using json = nlohmann::ordered_json;

namespace {

bool is_annotation(const std::string& k) {
  static const std::set<std::string> kAnn = {"title",    "description", "default",  "examples",  "$schema", "$id",
                                             "$comment", "strict",      "deprecated", "readOnly", "writeOnly", "$defs",
                                             "definitions"};
  return kAnn.count(k) > 0;
}

// Throws SchemaError for a keyword outside the supported subset.
void check_keywords(const json& s, const std::string& path) {
  static const std::set<std::string> kOk = {"type",  "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
                                            "enum",  "const",      "anyOf",    "oneOf",                "$ref",  "minLength", "maxLength"};
  for (const auto& [k, v] : s.items()) {
    if (is_annotation(k) || kOk.count(k)) continue;
    throw SchemaError(strfmt("JSON Schema keyword '%s' (at %s) is not supported by constrained decoding; supported: type, properties, "
                             "required, additionalProperties (false), items, minItems, maxItems, enum, const, anyOf, oneOf, $ref, "
                             "minLength, maxLength",
                             k.c_str(), path.c_str()));
  }
}

int64_t get_count(const json& s, const char* key, int64_t dflt, const std::string& path) {
  auto it = s.find(key);
  if (it == s.end()) return dflt;
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    throw SchemaError(strfmt("'%s' (at %s) must be a non-negative integer", key, path.c_str()));
  return it->get<int64_t>();
}

std::vector<std::string> type_list(const json& s, const std::string& path) {
  std::vector<std::string> out;
  auto it = s.find("type");
  if (it == s.end()) return out;
  static const std::set<std::string> kTypes = {"object", "array", "string", "integer", "number", "boolean", "null"};
  auto add = [&](const json& t) {
    if (!t.is_string() || !kTypes.count(t.get<std::string>()))
      throw SchemaError(strfmt("'type' (at %s) must be one of object, array, string, integer, number, boolean, null", path.c_str()));
    out.push_back(t.get<std::string>());
  };
  if (it->is_array()) {
    for (const auto& t : *it) add(t);
    if (out.empty()) throw SchemaError(strfmt("'type' (at %s) is an empty list", path.c_str()));
  } else {
    add(*it);
  }
  return out;
}

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

std::string canonical_json(const json& v) {
  std::string out;
  if (v.is_string()) {
    append_json_string(out, v.get_ref<const std::string&>());
  } else if (v.is_array()) {
    out += "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + canonical_json(v[i]);
    out += "]";
  } else if (v.is_object()) {
    out += "{";
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      if (!first) out += ", ";
      first = false;
      append_json_string(out, k);
      out += ": " + canonical_json(x);
    }
    out += "}";
  } else {
    out = v.dump();
  }
  return out;
}

std::string dialect_text(const json& v, const JsonDialect& d) {
  if (d.quote == "\"" && !d.raw_strings && !d.bare_keys && d.colon == ": " && d.comma == ", ") return canonical_json(v);
  std::string out;
  if (v.is_string()) {
    if (d.raw_strings) out = d.quote + v.get<std::string>() + d.quote;
    else append_json_string(out, v.get_ref<const std::string&>());
  } else if (v.is_array()) {
    out += "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? d.comma : "") + dialect_text(v[i], d);
    out += "]";
  } else if (v.is_object()) {
    out += "{";
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      if (!first) out += d.comma;
      first = false;
      out += d.bare_keys ? k : dialect_text(json(k), d);
      out += d.colon + dialect_text(x, d);
    }
    out += "}";
  } else {
    out = v.dump();
  }
  return out;
}

SchemaCompiler::SchemaCompiler(GrammarBuilder& g, const json& root, JsonDialect dialect)
    : g_(g), root_(root), d_(std::move(dialect)) {}

int32_t SchemaCompiler::quoted(int32_t body) {
  Seq q = g_.lit(d_.quote);
  q.push_back(GrammarBuilder::ref(body));
  Seq e = g_.lit(d_.quote);
  q.insert(q.end(), e.begin(), e.end());
  return g_.rule("string", {q});
}

const json& SchemaCompiler::resolve(const json& s, const std::string& path, int depth) {
  if (!s.is_object()) return s;
  auto it = s.find("$ref");
  if (it == s.end()) return s;
  if (depth > 32) throw SchemaError(strfmt("$ref chain too long at %s", path.c_str()));
  if (!it->is_string()) throw SchemaError(strfmt("'$ref' (at %s) must be a string", path.c_str()));
  const std::string ref = it->get<std::string>();
  if (ref == "#") return root_;
  for (const char* pre : {"#/$defs/", "#/definitions/"}) {
    const std::string p = pre;
    if (ref.rfind(p, 0) == 0) {
      const std::string name = ref.substr(p.size());
      const std::string sect = p.substr(2, p.size() - 3);
      auto d = root_.find(sect);
      if (d != root_.end() && d->is_object() && d->contains(name)) return resolve((*d)[name], path, depth + 1);
      throw SchemaError(strfmt("'$ref' \"%s\" (at %s) names no definition", ref.c_str(), path.c_str()));
    }
  }
  throw SchemaError(strfmt("'$ref' \"%s\" (at %s) is not supported: only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\"", ref.c_str(),
                           path.c_str()));
}

int32_t SchemaCompiler::literal_rule(const std::string& text) { return g_.rule("lit", {g_.lit(text)}); }

int32_t SchemaCompiler::char_rule(bool raw) {
  int32_t& r = raw ? raw_char_ : json_char_;
  if (r >= 0) return r;
  r = g_.rule(raw ? "raw_char" : "json_char");
  ByteSet ascii;
  for (int b = 0x20; b <= 0x7f; ++b) ascii.set(static_cast<size_t>(b));
  if (raw) {
    ascii.reset('<');
    ascii.set('\t');
  } else {
    ascii.reset('"');
    ascii.reset('\\');
  }
  g_.alt(r, {g_.set(ascii)});
  const Element cont = g_.range(0x80, 0xbf);
  // Well-formed UTF-8 (Unicode 15, table 3-7), scalar values only.
  g_.alt(r, {g_.range(0xc2, 0xdf), cont});
  g_.alt(r, {g_.range(0xe0, 0xe0), g_.range(0xa0, 0xbf), cont});
  ByteSet e3;
  for (int b = 0xe1; b <= 0xef; ++b)
    if (b != 0xed) e3.set(static_cast<size_t>(b));
  g_.alt(r, {g_.set(e3), cont, cont});
  g_.alt(r, {g_.range(0xed, 0xed), g_.range(0x80, 0x9f), cont});
  g_.alt(r, {g_.range(0xf0, 0xf0), g_.range(0x90, 0xbf), cont, cont});
  g_.alt(r, {g_.range(0xf1, 0xf3), cont, cont, cont});
  g_.alt(r, {g_.range(0xf4, 0xf4), g_.range(0x80, 0x8f), cont, cont});
  if (!raw) {
    ByteSet esc;
    for (char c : std::string("\"\\/bfnrt")) esc.set(static_cast<unsigned char>(c));
    g_.alt(r, {g_.range('\\', '\\'), g_.set(esc)});
    ByteSet hex, hex_nd, low;
    for (char c : std::string("0123456789abcdefABCDEF")) hex.set(static_cast<unsigned char>(c));
    hex_nd = hex;
    hex_nd.reset('d');
    hex_nd.reset('D');
    for (char c : std::string("01234567")) low.set(static_cast<unsigned char>(c));
    ByteSet dd;
    dd.set('d');
    dd.set('D');
    // \uXXXX other than the surrogates D800-DFFF (a lone surrogate is not a character).
    g_.alt(r, {g_.range('\\', '\\'), g_.range('u', 'u'), g_.set(hex_nd), g_.set(hex), g_.set(hex), g_.set(hex)});
    g_.alt(r, {g_.range('\\', '\\'), g_.range('u', 'u'), g_.set(dd), g_.set(low), g_.set(hex), g_.set(hex)});
  }
  return r;
}

int32_t SchemaCompiler::string_rule(const json& s, const std::string& path, bool raw) {
  const int64_t lo = get_count(s, "minLength", 0, path);
  const int64_t hi = s.contains("maxLength") ? get_count(s, "maxLength", 0, path) : -1;
  if (hi >= 0 && hi < lo) throw SchemaError(strfmt("'maxLength' < 'minLength' at %s", path.c_str()));
  if (hi > 4096) throw SchemaError(strfmt("'maxLength' (at %s) above 4096 is not supported", path.c_str()));
  const int32_t body = g_.repeat("str_body", {GrammarBuilder::ref(char_rule(raw || d_.raw_strings))}, lo, hi);
  if (raw) return body;
  return quoted(body);
}

int32_t SchemaCompiler::any_value() {
  if (any_ >= 0) return any_;
  any_ = g_.rule("any");
  const int32_t str = string_rule(json::object(), "any", false);
  const int32_t num = typed("number", json::object(), "any");
  // pair ::= key colon any (key: a string, or an identifier in a bare_keys dialect)
  int32_t key = str;
  if (d_.bare_keys) {
    ByteSet id;
    for (int c = 0; c < 256; ++c)
      if (std::isalnum(c) || c == '_') id.set(static_cast<size_t>(c));
    key = g_.repeat("bare_key", {g_.set(id)}, 1, 64);
  }
  Seq p = {GrammarBuilder::ref(key)};
  for (auto e : g_.lit(d_.colon)) p.push_back(e);
  p.push_back(GrammarBuilder::ref(any_));
  const int32_t pair_full = g_.rule("any_pair", {p});
  const int32_t pairs = g_.repeat("any_pairs", {GrammarBuilder::ref(pair_full)}, 0, -1, g_.lit(d_.comma));
  Seq obj = g_.lit("{");
  obj.push_back(GrammarBuilder::ref(pairs));
  obj.push_back(g_.range('}', '}'));
  any_obj_ = g_.rule("any_object", {obj});
  const int32_t items = g_.repeat("any_items", {GrammarBuilder::ref(any_)}, 0, -1, g_.lit(d_.comma));
  Seq arr = g_.lit("[");
  arr.push_back(GrammarBuilder::ref(items));
  arr.push_back(g_.range(']', ']'));
  for (const Seq& a : std::vector<Seq>{{GrammarBuilder::ref(any_obj_)}, arr, {GrammarBuilder::ref(str)}, {GrammarBuilder::ref(num)},
                                       g_.lit("true"), g_.lit("false"), g_.lit("null")})
    g_.alt(any_, a);
  return any_;
}

int32_t SchemaCompiler::any_object() {
  any_value();
  return any_obj_;
}

int32_t SchemaCompiler::typed(const std::string& type, const json& s, const std::string& path) {
  if (type == "null") return literal_rule("null");
  if (type == "boolean") return g_.rule("boolean", {g_.lit("true"), g_.lit("false")});
  if (type == "string") return string_rule(s, path, false);
  if (type == "integer" || type == "number") {
    // -?(0|[1-9][0-9]{0,15}) for integers; numbers add (.[0-9]{1,16})?([eE][+-]?[0-9]{1,3})?.
    const Element digit = g_.range('0', '9');
    const int32_t more = g_.repeat("digits", {digit}, 0, 15);
    const int32_t uint = g_.rule("uint", {g_.lit("0"), {g_.range('1', '9'), GrammarBuilder::ref(more)}});
    const int32_t sign = g_.rule("sign", {{}, g_.lit("-")});
    Seq num = {GrammarBuilder::ref(sign), GrammarBuilder::ref(uint)};
    if (type == "number") {
      const int32_t frac_digits = g_.repeat("frac", {digit}, 1, 16);
      const int32_t frac = g_.rule("frac_opt", {{}, {g_.range('.', '.'), GrammarBuilder::ref(frac_digits)}});
      const int32_t exp_digits = g_.repeat("exp", {digit}, 1, 2);
      ByteSet e;
      e.set('e');
      e.set('E');
      ByteSet pm;
      pm.set('+');
      pm.set('-');
      const int32_t exp_sign = g_.rule("exp_sign", {{}, {g_.set(pm)}});
      const int32_t exp = g_.rule("exp_opt", {{}, {g_.set(e), GrammarBuilder::ref(exp_sign), GrammarBuilder::ref(exp_digits)}});
      num.push_back(GrammarBuilder::ref(frac));
      num.push_back(GrammarBuilder::ref(exp));
    }
    return g_.rule(type, {num});
  }
  if (type == "array") {
    const int64_t lo = get_count(s, "minItems", 0, path);
    const int64_t hi = s.contains("maxItems") ? get_count(s, "maxItems", 0, path) : -1;
    if (hi >= 0 && hi < lo) throw SchemaError(strfmt("'maxItems' < 'minItems' at %s", path.c_str()));
    if (hi > 1024) throw SchemaError(strfmt("'maxItems' (at %s) above 1024 is not supported", path.c_str()));
    auto it = s.find("items");
    const int32_t item = it == s.end() ? any_value() : value(*it, path + ".items");
    const int32_t items = g_.repeat("items", {GrammarBuilder::ref(item)}, lo, hi, g_.lit(d_.comma));
    Seq arr = g_.lit("[");
    arr.push_back(GrammarBuilder::ref(items));
    arr.push_back(g_.range(']', ']'));
    return g_.rule("array", {arr});
  }
  return object(s, path, nullptr);  // "object"
}

int32_t SchemaCompiler::object(const json& s, const std::string& path, const XmlParams* xml) {
  auto props_it = s.find("properties");
  auto addl = s.find("additionalProperties");
  if (addl != s.end() && !addl->is_boolean())
    throw SchemaError(strfmt("'additionalProperties' (at %s) as a schema is not supported (only true or false)", path.c_str()));
  std::set<std::string> required;
  if (auto r = s.find("required"); r != s.end()) {
    if (!r->is_array()) throw SchemaError(strfmt("'required' (at %s) must be an array of strings", path.c_str()));
    for (const auto& k : *r) {
      if (!k.is_string()) throw SchemaError(strfmt("'required' (at %s) must be an array of strings", path.c_str()));
      required.insert(k.get<std::string>());
    }
  }
  if (props_it == s.end() && !xml) {
    if (!required.empty()) throw SchemaError(strfmt("'required' (at %s) names properties but there is no 'properties'", path.c_str()));
    if (addl != s.end() && !addl->get<bool>()) return literal_rule("{}");
    return any_object();
  }
  static const json kEmpty = json::object();
  const json& props = props_it == s.end() ? kEmpty : *props_it;
  if (!props.is_object()) throw SchemaError(strfmt("'properties' (at %s) must be an object", path.c_str()));
  for (const auto& k : required)
    if (!props.contains(k))
      throw SchemaError(strfmt("'required' (at %s) names '%s', which is not in 'properties' (additional properties are not generated)",
                               path.c_str(), k.c_str()));
  std::vector<std::pair<std::string, Seq>> kvs;  // property, its text
  for (const auto& [k, sub] : props.items()) {
    const std::string sub_path = path + ".properties." + k;
    Seq kv;
    if (xml) {
      kv = g_.lit(xml->open + k + xml->name_end);
      kv.push_back(GrammarBuilder::ref(xml_value(sub, sub_path)));
      for (auto e : g_.lit(xml->close)) kv.push_back(e);
    } else {
      kv = g_.lit((d_.bare_keys ? k : dialect_text(json(k), d_)) + d_.colon);
      kv.push_back(GrammarBuilder::ref(value(sub, sub_path)));
    }
    kvs.emplace_back(k, std::move(kv));
  }
  const size_t n = kvs.size();
  // first[i]: properties i.. with none written yet; rest[i]: with some written (JSON: a ", "
  // comes first). XML parameters have no separator, so first and rest coincide.
  std::vector<int32_t> first(n + 1), rest(n + 1);
  for (size_t i = 0; i <= n; ++i) {
    first[i] = g_.rule("props_first");
    rest[i] = xml ? first[i] : g_.rule("props_rest");
  }
  g_.alt(first[n], {});
  if (!xml) g_.alt(rest[n], {});
  for (size_t i = n; i-- > 0;) {
    const bool req = required.count(kvs[i].first) > 0;
    Seq a = kvs[i].second;
    a.push_back(GrammarBuilder::ref(rest[i + 1]));
    g_.alt(first[i], a);
    if (!req) g_.alt(first[i], {GrammarBuilder::ref(first[i + 1])});
    if (!xml) {
      Seq b = g_.lit(d_.comma);
      b.insert(b.end(), a.begin(), a.end());
      g_.alt(rest[i], b);
      if (!req) g_.alt(rest[i], {GrammarBuilder::ref(rest[i + 1])});
    }
  }
  if (xml) return first[0];
  Seq obj = g_.lit("{");
  obj.push_back(GrammarBuilder::ref(first[0]));
  obj.push_back(g_.range('}', '}'));
  return g_.rule("object", {obj});
}

int32_t SchemaCompiler::value(const json& s0, const std::string& path) {
  if (s0.is_boolean()) {
    if (!s0.get<bool>()) throw SchemaError(strfmt("the schema at %s is false (no value is valid)", path.c_str()));
    return any_value();
  }
  if (!s0.is_object()) throw SchemaError(strfmt("the schema at %s must be an object or a boolean", path.c_str()));
  if (auto it = s0.find("$ref"); it != s0.end()) {
    for (const auto& [k, v] : s0.items())
      if (k != "$ref" && !is_annotation(k))
        throw SchemaError(strfmt("'%s' beside '$ref' (at %s) is not supported", k.c_str(), path.c_str()));
    const std::string key = it->is_string() ? it->get<std::string>() : "";
    if (auto r = refs_.find(key); r != refs_.end()) return r->second;
    const int32_t r = g_.rule("ref " + key);
    refs_[key] = r;
    const json& target = resolve(s0, path, 0);
    g_.alt(r, {GrammarBuilder::ref(value(target, key))});
    return r;
  }
  check_keywords(s0, path);
  const json& s = s0;
  if (auto c = s.find("const"); c != s.end()) return literal_rule(dialect_text(*c, d_));
  if (auto e = s.find("enum"); e != s.end()) {
    if (!e->is_array() || e->empty()) throw SchemaError(strfmt("'enum' (at %s) must be a non-empty array", path.c_str()));
    const int32_t r = g_.rule("enum");
    for (const auto& v : *e) g_.alt(r, g_.lit(dialect_text(v, d_)));
    return r;
  }
  for (const char* comb : {"anyOf", "oneOf"}) {
    auto it = s.find(comb);
    if (it == s.end()) continue;
    for (const auto& [k, v] : s.items())
      if (k != comb && !is_annotation(k))
        throw SchemaError(strfmt("'%s' beside '%s' (at %s) is not supported: move it into each alternative", k.c_str(), comb, path.c_str()));
    if (!it->is_array() || it->empty()) throw SchemaError(strfmt("'%s' (at %s) must be a non-empty array", comb, path.c_str()));
    const int32_t r = g_.rule(comb);
    for (size_t i = 0; i < it->size(); ++i)
      g_.alt(r, {GrammarBuilder::ref(value((*it)[i], path + "." + comb + "[" + std::to_string(i) + "]"))});
    return r;
  }
  const std::vector<std::string> types = type_list(s, path);
  if (types.empty()) {
    if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) return object(s, path, nullptr);
    if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return typed("array", s, path);
    if (s.contains("minLength") || s.contains("maxLength")) return string_rule(s, path, false);
    return any_value();
  }
  if (types.size() == 1) return typed(types[0], s, path);
  const int32_t r = g_.rule("types");
  for (const auto& t : types) g_.alt(r, {GrammarBuilder::ref(typed(t, s, path))});
  return r;
}

int32_t SchemaCompiler::xml_value(const json& s0, const std::string& path) {
  const json& s = resolve(s0, path, 0);
  if (!s.is_object()) return value(s, path);
  // typed_param_json reads a parameter whose (first non-null) type is string as raw text, with
  // "null" as null when the schema admits null; anything else as JSON. So: string alternatives
  // (with null at most) become raw text, others JSON text; a mix cannot be told apart.
  enum Kind { kStr, kNull, kOther };
  auto kind_of = [&](const json& x) {
    const json& r = resolve(x, path, 0);
    if (!r.is_object()) return kOther;
    if (auto e = r.find("enum"); e != r.end() && e->is_array()) {
      bool str = false, other = false;
      for (const auto& v : *e) (v.is_string() ? str : other) = true;
      return str && !other ? kStr : kOther;
    }
    if (auto c = r.find("const"); c != r.end()) return c->is_string() ? kStr : c->is_null() ? kNull : kOther;
    const std::vector<std::string> ts = type_list(r, path);
    if (ts.size() == 1 && ts[0] == "null") return kNull;
    bool other = false;
    for (const auto& t : ts) other = other || (t != "string" && t != "null");
    const bool has_str = std::find(ts.begin(), ts.end(), "string") != ts.end();
    if (has_str && other)
      throw SchemaError(strfmt("the XML tool-call parameter at %s mixes string and non-string types, which its raw-text "
                               "encoding cannot tell apart",
                               path.c_str()));
    return has_str ? kStr : kOther;
  };
  std::vector<const json*> alts;
  for (const char* k : {"anyOf", "oneOf"})
    if (auto it = s.find(k); it != s.end() && it->is_array())
      for (const auto& x : *it) alts.push_back(&x);
  if (alts.empty()) alts.push_back(&s);
  const json* str_alt = nullptr;
  bool has_null = false, has_other = false;
  for (const json* x : alts) {
    const Kind k = kind_of(*x);
    if (k == kStr) {
      if (str_alt) throw SchemaError(strfmt("several string alternatives (at %s) in an XML tool-call parameter are not supported", path.c_str()));
      str_alt = &resolve(*x, path, 0);
    }
    has_null = has_null || k == kNull;
    has_other = has_other || k == kOther;
  }
  if (!str_alt) return value(s, path);
  if (has_other)
    throw SchemaError(strfmt("the XML tool-call parameter at %s mixes string and non-string alternatives, which its raw-text "
                             "encoding cannot tell apart",
                             path.c_str()));
  const json& a = *str_alt;
  check_keywords(a, path);
  const std::vector<std::string> ts = type_list(a, path);
  has_null = has_null || std::find(ts.begin(), ts.end(), "null") != ts.end();
  const int32_t r = g_.rule("xml_string");
  if (auto e = a.find("enum"); e != a.end()) {
    for (const auto& v : *e) g_.alt(r, g_.lit(v.get<std::string>()));
  } else if (auto c = a.find("const"); c != a.end()) {
    g_.alt(r, g_.lit(c->get<std::string>()));
  } else {
    g_.alt(r, {GrammarBuilder::ref(string_rule(a, path, true))});
  }
  if (has_null) g_.alt(r, g_.lit("null"));
  return r;
}

int32_t SchemaCompiler::xml_arguments(const json& schema, const XmlParams& markup, const std::string& path) {
  const json& s = resolve(schema, path, 0);
  if (s.is_boolean() || (s.is_object() && s.empty()) || s.is_null()) return g_.rule("no_params", {{}});
  if (!s.is_object()) throw SchemaError(strfmt("the schema at %s must be an object", path.c_str()));
  check_keywords(s, path);
  const auto types = type_list(s, path);
  if (!types.empty() && (types.size() != 1 || types[0] != "object"))
    throw SchemaError(strfmt("tool parameters (at %s) must be of type object", path.c_str()));
  return object(s, path, &markup);
}

namespace {

struct Validator {
  const json& root;
  std::string why;

  bool fail_with(const std::string& path, const std::string& msg) {
    if (why.empty()) why = path + ": " + msg;
    return false;
  }

  const json& deref(const json& s, const std::string& path) {
    const json* cur = &s;
    for (int d = 0; cur->is_object() && cur->contains("$ref"); ++d) {
      if (d > 32) throw SchemaError("$ref chain too long at " + path);
      const std::string ref = (*cur)["$ref"].get<std::string>();
      if (ref == "#") {
        cur = &root;
        continue;
      }
      bool found = false;
      for (const char* pre : {"#/$defs/", "#/definitions/"}) {
        const std::string p = pre;
        if (ref.rfind(p, 0) != 0) continue;
        const json& sect = root.at(p.substr(2, p.size() - 3));
        cur = &sect.at(ref.substr(p.size()));
        found = true;
        break;
      }
      if (!found) throw SchemaError("unsupported $ref " + ref + " at " + path);
    }
    return *cur;
  }

  static bool has_type(const json& v, const std::string& t) {
    if (t == "null") return v.is_null();
    if (t == "boolean") return v.is_boolean();
    if (t == "string") return v.is_string();
    if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    if (t == "number") return v.is_number();
    if (t == "array") return v.is_array();
    return v.is_object();
  }

  bool check(const json& s0, const json& v, const std::string& path) {
    if (s0.is_boolean()) return s0.get<bool>() || fail_with(path, "schema false");
    const json& s = deref(s0, path);
    if (s.is_boolean()) return check(s, v, path);
    check_keywords(s, path);
    if (auto c = s.find("const"); c != s.end() && *c != v) return fail_with(path, "not the const value");
    if (auto e = s.find("enum"); e != s.end() && std::find(e->begin(), e->end(), v) == e->end()) return fail_with(path, "not in enum");
    if (auto a = s.find("anyOf"); a != s.end()) {
      bool any = false;
      for (const auto& x : *a) {
        Validator sub{root, ""};
        any = any || sub.check(x, v, path);
      }
      if (!any) return fail_with(path, "matches no anyOf alternative");
    }
    if (auto a = s.find("oneOf"); a != s.end()) {
      int n = 0;
      for (const auto& x : *a) {
        Validator sub{root, ""};
        n += sub.check(x, v, path);
      }
      if (n != 1) return fail_with(path, strfmt("matches %d oneOf alternatives (exactly one needed)", n));
    }
    const auto types = type_list(s, path);
    if (!types.empty() && std::none_of(types.begin(), types.end(), [&](const std::string& t) { return has_type(v, t); }))
      return fail_with(path, "wrong type (" + std::string(v.type_name()) + ")");
    if (v.is_string()) {
      const size_t n = code_points(v.get_ref<const std::string&>());
      if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return fail_with(path, "shorter than minLength");
      if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return fail_with(path, "longer than maxLength");
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return fail_with(path, "fewer than minItems");
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return fail_with(path, "more than maxItems");
      if (auto it = s.find("items"); it != s.end())
        for (size_t i = 0; i < v.size(); ++i)
          if (!check(*it, v[i], path + "[" + std::to_string(i) + "]")) return false;
    }
    if (v.is_object()) {
      if (auto r = s.find("required"); r != s.end())
        for (const auto& k : *r)
          if (!v.contains(k.get<std::string>())) return fail_with(path, "missing required property " + k.get<std::string>());
      auto props = s.find("properties");
      const bool closed = s.contains("additionalProperties") && s["additionalProperties"] == false;
      for (const auto& [k, x] : v.items()) {
        if (props != s.end() && props->contains(k)) {
          if (!check((*props)[k], x, path + "." + k)) return false;
        } else if (closed) {
          return fail_with(path, "additional property " + k);
        }
      }
    }
    return true;
  }
};

}  // namespace

bool validate(const json& schema, const json& value, std::string* why) {
  Validator v{schema, ""};
  const bool ok = v.check(schema, value, "$");
  if (!ok && why) *why = v.why;
  return ok;
}

}  // namespace spool::constrain
