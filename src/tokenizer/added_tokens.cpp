#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace spool::tokenizer {
namespace {

constexpr size_t kMaxTokenBytes = 4096;  // longest added token content accepted

bool flag(const nlohmann::json& t, const char* key, bool fallback, const std::string& label,
          size_t index) {
  const auto it = t.find(key);
  if (it == t.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    fail("%s: added_tokens[%zu].%s must be a boolean", label.c_str(), index, key);
  }
  return it->get<bool>();
}

// Code point of the character that ends at byte `end` of well-formed `s` (end > 0).
uint32_t char_before(std::string_view s, size_t end) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return utf8::next(s, b);
}

// Start of the whitespace run that ends s[..end] (HF `\s*$`).
size_t trailing_space_start(std::string_view s, size_t end) {
  size_t start = end;
  while (start > 0) {
    size_t b = start - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    size_t probe = b;
    if (!unicode::is_white_space(utf8::next(s, probe))) break;
    start = b;
  }
  return start;
}

// End of the whitespace run that starts at s[begin] (HF `^\s*`).
size_t leading_space_end(std::string_view s, size_t begin) {
  size_t i = begin;
  while (i < s.size()) {
    size_t probe = i;
    if (!unicode::is_white_space(utf8::next(s, probe))) break;
    i = probe;
  }
  return i;
}

}  // namespace

void AddedVocab::Trie::insert(std::string_view pattern, int32_t id) {
  if (terminal.empty()) terminal.push_back(-1);  // root
  int32_t node = 0;
  for (const char c : pattern) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(c);
    const auto it = edges.find(key);
    if (it != edges.end()) {
      node = it->second;
    } else {
      const auto child = static_cast<int32_t>(terminal.size());
      terminal.push_back(-1);
      edges.emplace(key, child);
      node = child;
    }
  }
  first[static_cast<unsigned char>(pattern.front())] = true;
  terminal[static_cast<size_t>(node)] = id;  // a later duplicate pattern wins
}

std::pair<size_t, int32_t> AddedVocab::Trie::longest_at(std::string_view text, size_t pos) const {
  std::pair<size_t, int32_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[i]);
    const auto it = edges.find(key);
    if (it == edges.end()) break;
    node = it->second;
    if (terminal[static_cast<size_t>(node)] >= 0) {
      best = {i + 1 - pos, terminal[static_cast<size_t>(node)]};
    }
  }
  return best;
}

AddedVocab AddedVocab::from_json(const nlohmann::json& added_tokens, const Bpe& model,
                                 const Normalizer& normalizer, const std::string& label) {
  AddedVocab v;
  if (added_tokens.is_null()) return v;
  if (!added_tokens.is_array()) fail("%s: \"added_tokens\" must be an array", label.c_str());
  // HF: ids not in the model vocabulary are assigned from the model's vocab size upwards.
  auto next_id = static_cast<int64_t>(model.vocab_count());
  size_t index = 0;
  for (const auto& t : added_tokens) {
    if (!t.is_object()) fail("%s: added_tokens[%zu] must be an object", label.c_str(), index);
    const auto content_it = t.find("content");
    if (content_it == t.end() || !content_it->is_string()) {
      fail("%s: added_tokens[%zu] needs a string \"content\"", label.c_str(), index);
    }
    AddedToken tok;
    tok.content = content_it->get<std::string>();
    if (!utf8::is_valid(tok.content)) {
      fail("%s: added_tokens[%zu].content is not valid UTF-8", label.c_str(), index);
    }
    if (tok.content.size() > kMaxTokenBytes) {
      fail("%s: added_tokens[%zu].content is longer than %zu bytes", label.c_str(), index,
           kMaxTokenBytes);
    }
    tok.special = flag(t, "special", false, label, index);
    tok.single_word = flag(t, "single_word", false, label, index);
    tok.lstrip = flag(t, "lstrip", false, label, index);
    tok.rstrip = flag(t, "rstrip", false, label, index);
    tok.normalized = flag(t, "normalized", !tok.special, label, index);
    int64_t file_id = -1;
    if (const auto id_it = t.find("id"); id_it != t.end()) {
      if (!id_it->is_number_integer()) {
        fail("%s: added_tokens[%zu].id must be an integer", label.c_str(), index);
      }
      file_id = id_it->get<int64_t>();
    }
    ++index;
    if (tok.content.empty()) continue;  // HF ignores empty tokens

    std::optional<int32_t> id = v.token_to_id(tok.content);
    if (id) {
      const AddedToken& old = v.tokens_[v.by_id_.at(*id)];
      if (old.content == tok.content && old.single_word == tok.single_word &&
          old.lstrip == tok.lstrip && old.rstrip == tok.rstrip &&
          old.normalized == tok.normalized && old.special == tok.special) {
        continue;  // exact duplicate
      }
    } else {
      id = model.token_to_id(tok.content);
    }
    if (!id) {
      if (next_id >= (int64_t{1} << 24)) fail("%s: too many added tokens", label.c_str());
      id = static_cast<int32_t>(next_id++);
    }
    if (file_id >= 0 && file_id != *id) {
      log_warn("%s: added token '%s' has id %lld in the file but gets id %d", label.c_str(),
               utf8::clip(tok.content).c_str(), static_cast<long long>(file_id), *id);
    }
    tok.id = *id;
    v.by_content_[tok.content] = tok.id;
    if (tok.special) v.special_contents_.insert(tok.content);
    if (const auto it = v.by_id_.find(tok.id); it != v.by_id_.end()) {
      v.tokens_[it->second] = std::move(tok);
    } else {
      v.by_id_.emplace(tok.id, v.tokens_.size());
      v.tokens_.push_back(std::move(tok));
    }
  }
  v.rebuild_matchers(normalizer);
  return v;
}

void AddedVocab::rebuild_matchers(const Normalizer& normalizer) {
  for (const AddedToken& t : tokens_) {
    if (t.normalized) {
      std::string normed = normalizer.normalize(t.content);
      if (normed.empty()) continue;
      if (normed != t.content) normalized_content_[t.id] = normed;
      norm_.insert(normed, t.id);
    } else {
      raw_.insert(t.content, t.id);
    }
  }
}

void AddedVocab::split(std::string_view text, bool normalized,
                       std::vector<TextSegment>& out) const {
  const Trie& trie = normalized ? norm_ : raw_;
  const size_t n = text.size();
  if (trie.terminal.empty()) {
    if (n > 0) out.push_back({0, n, -1});
    return;
  }
  size_t start_offset = 0;  // end of the last emitted token segment
  size_t pos = 0;           // where the matcher resumes
  while (pos < n) {
    // Leftmost-longest match at or after pos.
    size_t start = pos;
    std::pair<size_t, int32_t> m{0, -1};
    for (; start < n; ++start) {
      if (!trie.first[static_cast<unsigned char>(text[start])]) continue;
      m = trie.longest_at(text, start);
      if (m.second >= 0) break;
    }
    if (m.second < 0) break;
    size_t stop = start + m.first;
    pos = stop;
    const AddedToken& tok = tokens_[by_id_.at(m.second)];
    if (tok.single_word) {
      const bool start_space = start == 0 || !unicode::is_word_char(char_before(text, start));
      size_t probe = stop;
      const bool stop_space = stop == n || !unicode::is_word_char(utf8::next(text, probe));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) start = std::max(trailing_space_start(text, start), start_offset);
    if (tok.rstrip) stop = leading_space_end(text, stop);
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
  }
  if (start_offset != n) out.push_back({start_offset, n, -1});
}

const AddedToken* AddedVocab::find(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocab::token_to_id(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const std::string* AddedVocab::id_to_token(int32_t id) const {
  if (const auto it = normalized_content_.find(id); it != normalized_content_.end()) {
    return &it->second;
  }
  const AddedToken* t = find(id);
  return t ? &t->content : nullptr;
}

bool AddedVocab::is_special_content(std::string_view content) const {
  return special_contents_.count(std::string(content)) > 0;
}

}  // namespace spool::tokenizer
