#include "tokenizer/pretokenizer.h"

#include <algorithm>
#include <optional>

#include "common/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace spool::tokenizer {
namespace {

// The regex ByteLevel applies when use_regex is true (fixed by the HF implementation).
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

constexpr int kMaxDepth = 16;  // nesting limit for Sequence pre-tokenizers

// How a Split step treats the delimiters it found (HF SplitDelimiterBehavior).
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// A piece of the input and whether it was matched by the pattern.
struct Flagged {
  size_t start;
  size_t end;
  bool match;
};

Behavior parse_behavior(const nlohmann::json& j, const std::string& label) {
  if (!j.is_string()) fail("%s: Split \"behavior\" must be a string", label.c_str());
  const std::string b = j.get<std::string>();
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  fail("%s: unknown Split behavior '%s'", label.c_str(), utf8::clip(b).c_str());
}

bool get_bool(const nlohmann::json& j, const char* key, bool fallback, const std::string& label) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    fail("%s: pre_tokenizer field \"%s\" must be a boolean", label.c_str(), key);
  return it->get<bool>();
}

// Turns a flagged partition of `piece` into the kept pieces (HF NormalizedString::split),
// appending the non-empty ones to `out`. `m` covers the piece left to right.
void emit(std::string_view piece, const std::vector<Flagged>& m, Behavior behavior,
          std::vector<std::string_view>& out) {
  auto push = [&](size_t s, size_t e) {
    if (e > s) out.push_back(piece.substr(s, e - s));
  };
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Flagged& f : m) push(f.start, f.end);
      return;
    case Behavior::kRemoved:
      for (const Flagged& f : m) {
        if (!f.match) push(f.start, f.end);
      }
      return;
    case Behavior::kContiguous:
    case Behavior::kMergedWithPrevious: {
      const bool contiguous = behavior == Behavior::kContiguous;
      std::vector<Flagged> acc;
      bool previous = false;
      for (const Flagged& f : m) {
        const bool merge = contiguous ? f.match == previous : (f.match && !previous);
        if (merge && !acc.empty())
          acc.back().end = f.end;
        else
          acc.push_back(f);
        previous = f.match;
      }
      for (const Flagged& f : acc) push(f.start, f.end);
      return;
    }
    case Behavior::kMergedWithNext: {
      std::vector<Flagged> acc;
      bool previous = false;
      for (auto it = m.rbegin(); it != m.rend(); ++it) {
        if (it->match && !previous && !acc.empty())
          acc.back().start = it->start;
        else
          acc.push_back(*it);
        previous = it->match;
      }
      for (auto it = acc.rbegin(); it != acc.rend(); ++it) push(it->start, it->end);
      return;
    }
  }
}

// Partition of `piece` by regex matches (HF Pattern::find_matches for a regex).
void regex_partition(std::string_view piece, const Regex& re, PreTokenizeScratch& scratch,
                     std::vector<Flagged>& m) {
  m.clear();
  if (piece.empty()) {
    m.push_back({0, 0, false});
    return;
  }
  scratch.ranges.clear();
  re.find_all(piece, scratch.match, scratch.ranges);
  size_t prev = 0;
  for (const ByteRange& r : scratch.ranges) {
    if (prev != r.start) m.push_back({prev, r.start, false});
    m.push_back({r.start, r.end, true});
    prev = r.end;
  }
  if (prev != piece.size()) m.push_back({prev, piece.size(), false});
}

// Partition of `piece` where every numeric character is its own match (HF char predicate).
void numeric_partition(std::string_view piece, std::vector<Flagged>& m) {
  m.clear();
  if (piece.empty()) {
    m.push_back({0, 0, false});
    return;
  }
  size_t last = 0, i = 0;
  while (i < piece.size()) {
    const size_t b = i;
    const uint32_t cp = utf8::next(piece, i);
    if (unicode::is_numeric(cp)) {
      if (last < b) m.push_back({last, b, false});
      m.push_back({b, i, true});
      last = i;
    }
  }
  if (piece.size() > last) m.push_back({last, piece.size(), false});
}

}  // namespace

struct PreTokenizer::Step {
  enum class Kind { kSplit, kDigits, kByteLevel };
  Kind kind = Kind::kSplit;
  std::optional<Regex> regex;  // Split pattern, or GPT-2 regex for ByteLevel use_regex
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
  bool map_bytes = true;  // ByteLevel: apply the byte alphabet in this step

  // Applies this step to one piece, appending the resulting pieces to `out`.
  void apply(std::string_view piece, PreTokenizeScratch& scratch, std::vector<Flagged>& flagged,
             std::vector<std::string_view>& out) const {
    switch (kind) {
      case Kind::kSplit:
        regex_partition(piece, *regex, scratch, flagged);
        if (invert) {
          for (Flagged& f : flagged) f.match = !f.match;
        }
        emit(piece, flagged, behavior, out);
        return;
      case Kind::kDigits:
        numeric_partition(piece, flagged);
        emit(piece, flagged, behavior, out);
        return;
      case Kind::kByteLevel: {
        if (add_prefix_space && piece.front() != ' ') {
          std::string& s = scratch.arena.emplace_back();
          s.reserve(piece.size() + 1);
          s.push_back(' ');
          s.append(piece);
          piece = s;
        }
        const size_t first = out.size();
        if (regex) {
          regex_partition(piece, *regex, scratch, flagged);
          emit(piece, flagged, Behavior::kIsolated, out);
        } else {
          out.push_back(piece);
        }
        if (map_bytes) {
          for (size_t k = first; k < out.size(); ++k) {
            std::string& s = scratch.arena.emplace_back();
            byte_level::map_bytes(out[k], s);
            out[k] = s;
          }
        }
        return;
      }
    }
  }
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j, const std::string& label) {
  PreTokenizer p;
  parse_steps(j, label, 0, p.steps_);
  if (!p.steps_.empty() && p.steps_.back().kind == Step::Kind::kByteLevel) {
    p.steps_.back().map_bytes = false;
    p.defer_byte_mapping_ = true;
  }
  return p;
}

void PreTokenizer::parse_steps(const nlohmann::json& j, const std::string& label, int depth,
                               std::vector<Step>& steps) {
  if (j.is_null()) return;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    fail("%s: pre_tokenizer must be null or an object with a string \"type\"", label.c_str());
  }
  if (depth > kMaxDepth) fail("%s: pre_tokenizer Sequence nested too deeply", label.c_str());
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    const auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) {
      fail("%s: pre_tokenizer Sequence needs a \"pretokenizers\" array", label.c_str());
    }
    for (const auto& sub : *it) parse_steps(sub, label, depth + 1, steps);
  } else if (type == "Split") {
    Step s;
    s.kind = Step::Kind::kSplit;
    const auto pat = j.find("pattern");
    if (pat == j.end() || !pat->is_object() || pat->size() != 1) {
      fail("%s: Split needs \"pattern\": {\"Regex\": ...} or {\"String\": ...}", label.c_str());
    }
    const bool is_regex = pat->contains("Regex");
    const auto& text = is_regex                  ? (*pat)["Regex"]
                       : pat->contains("String") ? (*pat)["String"]
                                                 : nlohmann::json();
    if (!text.is_string()) {
      fail("%s: Split \"pattern\" must be {\"Regex\": string} or {\"String\": string}",
           label.c_str());
    }
    s.regex.emplace(text.get_ref<const std::string&>(), !is_regex,
                    label + ": pre_tokenizer Split pattern");
    const auto beh = j.find("behavior");
    if (beh == j.end()) fail("%s: Split needs a \"behavior\"", label.c_str());
    s.behavior = parse_behavior(*beh, label);
    s.invert = get_bool(j, "invert", false, label);
    steps.push_back(std::move(s));
  } else if (type == "ByteLevel") {
    Step s;
    s.kind = Step::Kind::kByteLevel;
    s.add_prefix_space = get_bool(j, "add_prefix_space", true, label);
    if (get_bool(j, "use_regex", true, label)) {
      s.regex.emplace(kGpt2Regex, false, label + ": ByteLevel regex");
    }
    steps.push_back(std::move(s));
  } else if (type == "Digits") {
    Step s;
    s.kind = Step::Kind::kDigits;
    s.behavior = get_bool(j, "individual_digits", false, label) ? Behavior::kIsolated
                                                                : Behavior::kContiguous;
    steps.push_back(std::move(s));
  } else {
    fail(
        "%s: unsupported pre_tokenizer type '%s' (supported: Split, ByteLevel, Digits, "
        "Sequence)",
        label.c_str(), utf8::clip(type).c_str());
  }
}

void PreTokenizer::run(std::string_view text, PreTokenizeScratch& scratch,
                       std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  if (steps_.empty()) {
    out.push_back(text);
    return;
  }
  std::vector<std::string_view> cur{text};
  std::vector<Flagged> flagged;
  for (size_t k = 0; k < steps_.size(); ++k) {
    const bool last = k + 1 == steps_.size();
    std::vector<std::string_view>& dst = last ? out : scratch.next;
    if (!last) dst.clear();
    for (const std::string_view piece : cur) steps_[k].apply(piece, scratch, flagged, dst);
    if (!last) std::swap(cur, scratch.next);
  }
}

}  // namespace spool::tokenizer
