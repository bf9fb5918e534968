// Byte-level context-free grammars and an incremental matcher over them (constrained decoding).
//
// A Grammar is a set of rules; a rule is a list of alternatives; an alternative is a sequence of
// elements, each either a byte set (matches one byte) or a reference to a rule. Repetition is
// written as right recursion (R ::= X R | ""), which the matcher runs in constant stack depth.
// Left recursion is not allowed (the builders in this module never produce it; the matcher
// throws spool::Error on runaway expansion).
//
// The Matcher tracks every way the bytes so far can be read as a prefix of the grammar's
// language: a set of stacks (a nondeterministic pushdown automaton, the approach of llama.cpp's
// GBNF sampler and of Earley-style parsers). Stacks are hash-consed (equal stacks have equal
// ids) and per-(stack, byte) transitions are memoized, so the same state reached again — as in
// every step of a long string — costs array lookups. All of this is single-threaded.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace spool::constrain {

/// A set of byte values.
using ByteSet = std::bitset<256>;

/// One grammar element: exactly one of `set` (index into Grammar::sets) or `rule` is >= 0.
struct Element {
  int32_t set = -1;
  int32_t rule = -1;
};

/// A sequence of elements.
using Seq = std::vector<Element>;

/// An immutable grammar once built (GrammarBuilder), shared by the matchers of many requests.
struct Grammar {
  std::vector<ByteSet> sets;                    ///< byte sets, deduplicated
  std::vector<std::vector<Seq>> rules;          ///< rule -> alternatives -> elements
  std::vector<std::string> rule_names;          ///< for debugging and messages
  int32_t root = -1;                            ///< the start rule
};

/// Helpers to write grammars. Rules are created empty (so they can be referenced before they
/// are defined, for recursion) and get their alternatives with alt().
class GrammarBuilder {
 public:
  /// A new rule with no alternatives yet; `name` is for debugging.
  int32_t rule(std::string name);
  /// Adds alternative `seq` to `rule` (an empty seq matches the empty string).
  void alt(int32_t rule, Seq seq);
  /// A rule with the given alternatives.
  int32_t rule(std::string name, std::vector<Seq> alts);
  /// Element matching one byte of `s`.
  Element set(const ByteSet& s);
  /// Element matching bytes lo..hi (inclusive).
  Element range(uint8_t lo, uint8_t hi);
  /// Element referencing `rule`.
  static Element ref(int32_t rule) { return Element{-1, rule}; }
  /// The bytes of `text`, one element each.
  Seq lit(std::string_view text);
  /// Rule for `item` repeated between lo and hi times (hi < 0: unbounded), items separated by
  /// `sep` (may be empty). Bounded repetition is a chain of hi rules.
  int32_t repeat(std::string name, const Seq& item, int64_t lo, int64_t hi, const Seq& sep = {});
  /// Rule matching any text that does not contain `stop`, followed by `stop` itself. `stop`'s
  /// first byte must not occur again in it (true of "</think>" and "\n</parameter>"), which
  /// makes the automaton a simple counter of matched bytes. Throws spool::Error otherwise.
  int32_t until(std::string name, std::string_view stop);
  /// Finishes with `root` as the start rule. Throws spool::Error for a referenced rule that has
  /// no alternatives.
  std::shared_ptr<const Grammar> build(int32_t root);

 private:
  Grammar g_;
  std::unordered_map<std::string, int32_t> set_ids_;
};

/// Incremental recognizer of a Grammar's prefixes over bytes. Movable, not copyable.
class Matcher {
 public:
  /// The empty stack: all of the grammar has been matched.
  static constexpr int32_t kDone = 0;

  explicit Matcher(std::shared_ptr<const Grammar> g);

  /// Consumes byte `b`; false (state unchanged) when no reading allows it.
  bool advance(uint8_t b);
  /// Consumes all of `bytes`, or none of them (false) when some byte is not allowed.
  bool advance(std::string_view bytes);
  /// True when the bytes so far are a complete sentence of the grammar.
  bool accepting() const;
  /// True when nothing can follow (no reading left; never true of a fresh matcher of a
  /// grammar whose language is not empty).
  bool dead() const { return tops_.empty(); }
  /// The bytes that may come next.
  ByteSet next_bytes() const;

  /// Current state: sorted ids of the stacks (kDone = accepting reading).
  const std::vector<int32_t>& tops() const { return tops_; }
  /// Returns to a state earlier read with tops() (same matcher).
  void restore(std::vector<int32_t> tops) { tops_ = std::move(tops); }
  /// Appends to `out` the stacks that stack `top` becomes after byte `b` (none when `b` is
  /// not allowed there; kDone never advances). Memoized; may grow the internal tables.
  void step(int32_t top, uint8_t b, std::vector<int32_t>& out);
  /// Byte set of the element on top of stack `top` (empty for kDone).
  const ByteSet& top_set(int32_t top) const;

 private:
  struct Node {
    int32_t rule, alt, idx, parent;
  };
  int32_t intern(int32_t rule, int32_t alt, int32_t idx, int32_t parent);
  void expand(int32_t rule, int32_t alt, int32_t idx, int32_t parent, std::vector<int32_t>& out, int depth);

  std::shared_ptr<const Grammar> g_;
  std::vector<Node> nodes_;
  struct NodeHash {
    size_t operator()(const Node& n) const;
  };
  struct NodeEq {
    bool operator()(const Node& a, const Node& b) const {
      return a.rule == b.rule && a.alt == b.alt && a.idx == b.idx && a.parent == b.parent;
    }
  };
  std::unordered_map<Node, int32_t, NodeHash, NodeEq> node_ids_;
  // memo_[node]: per byte, (begin, count) into memo_pool_; begin == UINT32_MAX: not computed.
  std::vector<std::unique_ptr<std::array<std::pair<uint32_t, uint32_t>, 256>>> memo_;
  std::vector<int32_t> memo_pool_;
  std::vector<int32_t> tops_;
  std::vector<int32_t> scratch_;
  ByteSet empty_set_;
};

}  // namespace spool::constrain
