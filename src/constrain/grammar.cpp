#include "constrain/grammar.h"

#include <algorithm>
#include <climits>

#include "common/error.h"

namespace spool::constrain {

int32_t GrammarBuilder::rule(std::string name) {
  g_.rules.emplace_back();
  g_.rule_names.push_back(std::move(name));
  return static_cast<int32_t>(g_.rules.size() - 1);
}

void GrammarBuilder::alt(int32_t rule, Seq seq) { g_.rules.at(static_cast<size_t>(rule)).push_back(std::move(seq)); }

int32_t GrammarBuilder::rule(std::string name, std::vector<Seq> alts) {
  const int32_t r = rule(std::move(name));
  for (auto& a : alts) alt(r, std::move(a));
  return r;
}

Element GrammarBuilder::set(const ByteSet& s) {
  const std::string key = s.to_string();
  auto [it, fresh] = set_ids_.emplace(key, static_cast<int32_t>(g_.sets.size()));
  if (fresh) g_.sets.push_back(s);
  return Element{it->second, -1};
}

Element GrammarBuilder::range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(static_cast<size_t>(b));
  return set(s);
}

Seq GrammarBuilder::lit(std::string_view text) {
  Seq out;
  for (unsigned char c : text) out.push_back(range(c, c));
  return out;
}

int32_t GrammarBuilder::repeat(std::string name, const Seq& item, int64_t lo, int64_t hi, const Seq& sep) {
  if (lo < 0 || (hi >= 0 && hi < lo)) fail("grammar: bad repetition bounds %lld..%lld", (long long)lo, (long long)hi);
  const int32_t r = rule(name);
  if (hi == 0) {
    alt(r, {});
    return r;
  }
  // k_rules[k-1]: k items written so far (k >= 1). Unbounded: the last one loops.
  const int64_t n = hi < 0 ? std::max<int64_t>(lo, 1) : hi;
  std::vector<int32_t> k_rules;
  for (int64_t k = 1; k <= n; ++k) k_rules.push_back(rule(name + "_" + std::to_string(k)));
  auto then = [&](int32_t next) {
    Seq s = item;
    s.push_back(ref(next));
    return s;
  };
  alt(r, then(k_rules[0]));
  if (lo == 0) alt(r, {});
  for (int64_t k = 1; k <= n; ++k) {
    const int32_t kr = k_rules[static_cast<size_t>(k - 1)];
    const bool more = hi < 0 || k < hi;
    if (more) {
      const int32_t next = k < n ? k_rules[static_cast<size_t>(k)] : kr;
      Seq s = sep;
      Seq t = then(next);
      s.insert(s.end(), t.begin(), t.end());
      alt(kr, std::move(s));
    }
    if (k >= lo) alt(kr, {});
  }
  return r;
}

int32_t GrammarBuilder::until(std::string name, std::string_view stop) {
  if (stop.empty() || stop.find(stop[0], 1) != std::string_view::npos)
    fail("grammar: until() needs a stop string whose first byte does not occur again (got \"%s\")", std::string(stop).c_str());
  const size_t n = stop.size();
  std::vector<int32_t> st;
  for (size_t j = 0; j < n; ++j) st.push_back(rule(name + "_" + std::to_string(j)));
  const auto b0 = static_cast<uint8_t>(stop[0]);
  for (size_t j = 0; j < n; ++j) {
    const auto bj = static_cast<uint8_t>(stop[j]);
    Seq match{range(bj, bj)};
    if (j + 1 < n) match.push_back(ref(st[j + 1]));
    alt(st[j], std::move(match));
    if (j > 0) alt(st[j], {range(b0, b0), ref(st[1])});
    ByteSet other;
    other.set();
    other.reset(bj);
    other.reset(b0);
    alt(st[j], {set(other), ref(st[0])});
  }
  return st[0];
}

std::shared_ptr<const Grammar> GrammarBuilder::build(int32_t root) {
  g_.root = root;
  for (const auto& alts : g_.rules)
    for (const auto& seq : alts)
      for (const Element& e : seq)
        if (e.rule >= 0 && g_.rules[static_cast<size_t>(e.rule)].empty())
          fail("grammar: rule '%s' is referenced but has no alternatives", g_.rule_names[static_cast<size_t>(e.rule)].c_str());
  return std::make_shared<const Grammar>(std::move(g_));
}

size_t Matcher::NodeHash::operator()(const Node& n) const {
  uint64_t h = static_cast<uint32_t>(n.rule);
  h = h * 0x9E3779B97F4A7C15ull + static_cast<uint32_t>(n.alt);
  h = h * 0x9E3779B97F4A7C15ull + static_cast<uint32_t>(n.idx);
  h = h * 0x9E3779B97F4A7C15ull + static_cast<uint32_t>(n.parent);
  return static_cast<size_t>(h ^ (h >> 29));
}

Matcher::Matcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
  nodes_.push_back(Node{-1, -1, -1, -1});  // kDone
  memo_.emplace_back();
  const auto& root = g_->rules.at(static_cast<size_t>(g_->root));
  for (int32_t a = 0; a < static_cast<int32_t>(root.size()); ++a) expand(g_->root, a, 0, kDone, tops_, 0);
  std::sort(tops_.begin(), tops_.end());
  tops_.erase(std::unique(tops_.begin(), tops_.end()), tops_.end());
}

int32_t Matcher::intern(int32_t rule, int32_t alt, int32_t idx, int32_t parent) {
  const Node n{rule, alt, idx, parent};
  auto [it, fresh] = node_ids_.emplace(n, static_cast<int32_t>(nodes_.size()));
  if (fresh) {
    nodes_.push_back(n);
    memo_.emplace_back();
  }
  return it->second;
}

// Appends the normalized stacks (top element a byte set, or kDone) for "continue at element
// idx of rule/alt, then at stack `parent`".
void Matcher::expand(int32_t rule, int32_t alt, int32_t idx, int32_t parent, std::vector<int32_t>& out, int depth) {
  if (depth > 10000) fail("grammar: runaway expansion at rule '%s' (left recursion?)", g_->rule_names[static_cast<size_t>(rule)].c_str());
  const Seq& seq = g_->rules[static_cast<size_t>(rule)][static_cast<size_t>(alt)];
  if (idx == static_cast<int32_t>(seq.size())) {
    if (parent == kDone) {
      out.push_back(kDone);
    } else {
      const Node p = nodes_[static_cast<size_t>(parent)];
      expand(p.rule, p.alt, p.idx, p.parent, out, depth + 1);
    }
    return;
  }
  const Element e = seq[static_cast<size_t>(idx)];
  if (e.set >= 0) {
    out.push_back(intern(rule, alt, idx, parent));
    return;
  }
  // A reference: continue after it once the referenced rule is done (tail calls pop at once,
  // so right recursion does not grow the stack).
  const int32_t cont = idx + 1 == static_cast<int32_t>(seq.size()) ? parent : intern(rule, alt, idx + 1, parent);
  const auto& alts = g_->rules[static_cast<size_t>(e.rule)];
  for (int32_t a = 0; a < static_cast<int32_t>(alts.size()); ++a) expand(e.rule, a, 0, cont, out, depth + 1);
}

const ByteSet& Matcher::top_set(int32_t top) const {
  if (top == kDone) return empty_set_;
  const Node& n = nodes_[static_cast<size_t>(top)];
  const Element e = g_->rules[static_cast<size_t>(n.rule)][static_cast<size_t>(n.alt)][static_cast<size_t>(n.idx)];
  return g_->sets[static_cast<size_t>(e.set)];
}

void Matcher::step(int32_t top, uint8_t b, std::vector<int32_t>& out) {
  if (top == kDone || !top_set(top).test(b)) return;
  auto& m = memo_[static_cast<size_t>(top)];
  if (!m) {
    m = std::make_unique<std::array<std::pair<uint32_t, uint32_t>, 256>>();
    m->fill({UINT32_MAX, 0});
  }
  auto entry = (*m)[b];
  if (entry.first == UINT32_MAX) {
    scratch_.clear();
    const Node n = nodes_[static_cast<size_t>(top)];  // copy: expand may grow nodes_
    expand(n.rule, n.alt, n.idx + 1, n.parent, scratch_, 0);
    std::sort(scratch_.begin(), scratch_.end());
    scratch_.erase(std::unique(scratch_.begin(), scratch_.end()), scratch_.end());
    entry = {static_cast<uint32_t>(memo_pool_.size()), static_cast<uint32_t>(scratch_.size())};
    memo_pool_.insert(memo_pool_.end(), scratch_.begin(), scratch_.end());
    (*memo_[static_cast<size_t>(top)])[b] = entry;
  }
  out.insert(out.end(), memo_pool_.begin() + entry.first, memo_pool_.begin() + entry.first + entry.second);
}

bool Matcher::advance(uint8_t b) {
  std::vector<int32_t> next;
  for (int32_t t : tops_) step(t, b, next);
  if (next.empty()) return false;
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  tops_ = std::move(next);
  return true;
}

bool Matcher::advance(std::string_view bytes) {
  const std::vector<int32_t> saved = tops_;
  for (unsigned char c : bytes)
    if (!advance(static_cast<uint8_t>(c))) {
      tops_ = saved;
      return false;
    }
  return true;
}

bool Matcher::accepting() const { return !tops_.empty() && tops_.front() == kDone; }

ByteSet Matcher::next_bytes() const {
  ByteSet s;
  for (int32_t t : tops_) s |= top_set(t);
  return s;
}

}  // namespace spool::constrain
