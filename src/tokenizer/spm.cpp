#include "tokenizer/spm.h"

#include <cstdio>
#include <queue>

#include "common/error.h"

namespace spool::tokenizer {
namespace {

// Length of the UTF-8 sequence a lead byte starts (1 for a continuation or invalid byte), as
// SentencePiece splits characters.
size_t utf8_len(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// One symbol of the segment: a byte range, linked to its live neighbours.
struct Symbol {
  size_t start, len;  // len 0: merged into its left neighbour
  int prev, next;
};

// A candidate merge of the symbols `left` and its next neighbour `right`, whose texts were
// `size` bytes together when it was queued.
struct Pair {
  int left, right;
  float score;
  size_t size;
};

// Highest score first; equal scores: the leftmost pair first.
struct PairOrder {
  bool operator()(const Pair& a, const Pair& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

Spm::Spm(const std::vector<std::string>& tokens, const std::vector<float>& scores, int32_t unk_id,
         const std::string& label)
    : label_(label), strings_(tokens), scores_(scores), unk_id_(unk_id) {
  scores_.resize(strings_.size(), 0.0f);
  ids_.reserve(strings_.size());
  for (size_t i = 0; i < strings_.size(); ++i) ids_[strings_[i]] = static_cast<int32_t>(i);
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    int32_t id = lookup(hex);
    if (id < 0) id = lookup(std::string(1, static_cast<char>(b)));
    byte_ids_[static_cast<size_t>(b)] = id;
  }
}

int32_t Spm::lookup(std::string_view token) const {
  const auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

void Spm::fallback(std::string_view piece, std::vector<int32_t>& out) const {
  bool all_bytes = true;
  for (const char c : piece) all_bytes = all_bytes && byte_ids_[static_cast<uint8_t>(c)] >= 0;
  if (all_bytes) {
    for (const char c : piece) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
  } else if (unk_id_ >= 0) {
    out.push_back(unk_id_);
  } else {
    const uint8_t b = static_cast<uint8_t>(piece[0]);
    fail("%s: the character starting with byte 0x%02X is no token, has no byte-fallback tokens <0xXX> and the "
         "vocabulary has no unknown token", label_.c_str(), b);
  }
}

void Spm::encode(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<Symbol> sym;
  for (size_t at = 0; at < text.size();) {
    const size_t n = std::min(utf8_len(static_cast<uint8_t>(text[at])), text.size() - at);
    const int i = static_cast<int>(sym.size());
    sym.push_back({at, n, i - 1, at + n == text.size() ? -1 : i + 1});
    at += n;
  }
  std::priority_queue<Pair, std::vector<Pair>, PairOrder> queue;
  auto try_pair = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const size_t size = sym[l].len + sym[r].len;
    const int32_t id = lookup(text.substr(sym[l].start, size));
    if (id < 0) return;
    queue.push({l, r, scores_[static_cast<size_t>(id)], size});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_pair(i - 1, i);
  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    Symbol& l = sym[p.left];
    Symbol& r = sym[p.right];
    // Stale: one side already merged elsewhere, or grew since the pair was queued.
    if (l.len == 0 || r.len == 0 || l.len + r.len != p.size) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = p.left;
    try_pair(l.prev, p.left);
    try_pair(p.left, l.next);
  }
  for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
    const std::string_view piece = text.substr(sym[i].start, sym[i].len);
    // Every merged symbol is a token; only a single character can be missing.
    if (const int32_t id = lookup(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    fallback(piece, out);
  }
}

}  // namespace spool::tokenizer
