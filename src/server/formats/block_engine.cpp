// The generic family parser: reasoning between BlockSpec::think_open / think_close, content, and
// tool-call blocks parsed whole by the family (family.h, chat_format.h for the contract).
#include <algorithm>

#include "server/formats/family.h"

namespace spool::server::formats {

namespace {

// Longest whitespace run held back before possible markup; longer runs are emitted.
constexpr size_t kMaxWs = 64;

class BlockParser final : public FamilyParser {
 public:
  BlockParser(const BlockSpec& spec, OutputParser::Options opt, const std::vector<std::string>& stops)
      : FamilyParser(std::move(opt), stops), spec_(spec) {
    for (auto m : spec_.call_open)
      if (opt_.tool_calls) content_markers_.push_back(m);
    for (auto m : spec_.drop) content_markers_.push_back(m);
    for (auto m : content_markers_) first_bytes_ += m[0];
    const bool think = opt_.parse_reasoning && !spec_.think_open.empty();
    st_ = think ? St::kStart : St::kContent;
  }

  bool in_markup() const override {
    if (finished() || st_ != St::kBlock) return false;
    return !(spec_.in_value && spec_.in_value(from(block_start_)));
  }

  bool in_reasoning() const override {
    return st_ == St::kReasoning || (st_ == St::kStart && opt_.starts_in_reasoning && opt_.parse_reasoning);
  }

 protected:
  enum class St { kStart, kReasoning, kAfterThink, kContent, kBlock };

  // Start of the trailing whitespace run of [a, b), at most kMaxWs long.
  size_t ws_start(size_t a, size_t b) const {
    size_t w = b;
    while (w > a && b - w < kMaxWs && is_ws(raw_[w - 1])) --w;
    return w;
  }
  void content_to(size_t e) {
    if (e > pos_) {
      emit_content(view(pos_, e));
      after_call_ = false;
    }
    pos_ = std::max(pos_, e);
  }

  bool step() override {
    const size_t n = raw_.size();
    switch (st_) {
      case St::kStart: {
        size_t p = pos_;
        while (p < n && is_ws(raw_[p]) && p - pos_ <= kMaxWs) ++p;
        int m = p - pos_ > kMaxWs ? -1 : match_lit(from(p), spec_.think_open);
        if (m == 1) {
          pos_ = p + spec_.think_open.size();
          st_ = St::kReasoning;
          reasoning_lead_ = true;
          return true;
        }
        if (m == 0 && !eof_) return false;
        st_ = opt_.starts_in_reasoning ? St::kReasoning : St::kContent;
        reasoning_lead_ = true;
        return true;
      }

      case St::kReasoning: {
        if (reasoning_lead_) {
          while (pos_ < n && is_ws(raw_[pos_])) ++pos_;
          if (pos_ == n && !eof_) return false;
          reasoning_lead_ = false;
        }
        // Earliest closer (or call marker) at or after pos_, complete or partial at the end.
        size_t best = std::string_view::npos, best_len = 0;
        bool best_partial = false, best_is_call = false;
        auto consider = [&](std::string_view m, bool is_call) {
          size_t i = raw_.find(m, pos_);
          if (i != std::string::npos && i < best) {
            best = i, best_len = m.size(), best_partial = false, best_is_call = is_call;
          }
          // partial at the end
          for (size_t k = std::min(m.size() - 1, n - pos_); k >= 1; --k) {
            if (raw_.compare(n - k, k, m, 0, k) == 0) {
              if (n - k < best) best = n - k, best_len = k, best_partial = true, best_is_call = is_call;
              break;
            }
          }
        };
        consider(spec_.think_close, false);
        if (spec_.call_ends_reasoning && opt_.tool_calls)
          for (auto m : spec_.call_open) consider(m, true);
        auto nonws_end = [&](size_t e) {
          while (e > pos_ && is_ws(raw_[e - 1])) --e;
          return e;
        };
        if (best == std::string_view::npos || (best_partial && eof_)) {
          size_t e = nonws_end(n);
          emit_reasoning(view(pos_, e));
          pos_ = eof_ ? n : e;
          return false;
        }
        if (best_partial) {
          size_t e = nonws_end(best);
          emit_reasoning(view(pos_, e));
          pos_ = e;
          return false;
        }
        emit_reasoning(view(pos_, nonws_end(best)));
        if (best_is_call) {
          pos_ = best;
          st_ = St::kContent;
        } else {
          pos_ = best + best_len;
          st_ = St::kAfterThink;
        }
        return true;
      }

      case St::kAfterThink:
        while (pos_ < n && is_ws(raw_[pos_])) ++pos_;
        if (pos_ == n && !eof_) return false;
        st_ = St::kContent;
        return true;

      case St::kContent: {
        if (skip_ws_) {  // whitespace after a dropped marker, however it is split
          while (pos_ < n && is_ws(raw_[pos_])) ++pos_;
          if (pos_ == n && !eof_) return false;
          skip_ws_ = false;
        }
        size_t i = first_bytes_.empty() ? std::string::npos : raw_.find_first_of(first_bytes_, pos_);
        if (i == std::string::npos) {
          size_t w = ws_start(pos_, n);
          content_to(w);
          if (eof_) {
            if (!after_call_) content_to(n);
            pos_ = n;
          }
          return false;
        }
        bool partial = false;
        for (auto m : content_markers_) {
          int r = match_lit(from(i), m);
          if (r == 0) partial = true;
          if (r != 1) continue;
          const bool is_call = std::find(spec_.drop.begin(), spec_.drop.end(), m) == spec_.drop.end();
          if (is_call) {
            content_to(ws_start(pos_, i));
            block_start_ = pos_ = i;
            marker_len_ = m.size();
            reported_ = 0;
            st_ = St::kBlock;
          } else {
            content_to(ws_start(pos_, i));
            pos_ = i + m.size();
            skip_ws_ = true;
          }
          return true;
        }
        if (partial && !eof_) {
          content_to(ws_start(pos_, i));
          return false;
        }
        content_to(i + 1);
        return true;
      }

      case St::kBlock: {
        BlockParse r = spec_.parse(from(block_start_), eof_, opt_.tools);
        for (size_t k = reported_; k < r.calls.size(); ++k) emit_call(r.calls[k]);
        reported_ = std::max(reported_, r.calls.size());
        if (r.kind == BlockParse::kDone) {
          pos_ = block_start_ + r.end;
          after_call_ = true;
          st_ = St::kContent;
          return true;
        }
        if (r.kind == BlockParse::kNeedMore && !eof_) {
          // Stream the call being written (its name once known, then its arguments).
          if (!r.partial_name.empty() && reported_ == r.calls.size()) open_call(r.partial_name, r.partial_id, r.partial_args);
          return false;
        }
        // Broken or cut off: complete calls stay (a streamed one is closed, incomplete); the
        // rest is content, verbatim.
        abandon_call();
        if (reported_ > 0) {
          pos_ = block_start_ + r.end;
          after_call_ = true;
        } else {
          pos_ = block_start_;
          content_to(block_start_ + marker_len_);
        }
        st_ = St::kContent;
        return true;
      }
    }
    return false;
  }

 private:
  const BlockSpec& spec_;
  std::vector<std::string_view> content_markers_;
  std::string first_bytes_;
  St st_;
  bool reasoning_lead_ = true;
  bool after_call_ = false;
  bool skip_ws_ = false;  // drop whitespace at pos_ (after a dropped marker)
  size_t block_start_ = 0, marker_len_ = 0, reported_ = 0;
};

}  // namespace

std::unique_ptr<FamilyParser> make_block_parser(const BlockSpec& spec, OutputParser::Options opt,
                                                const std::vector<std::string>& extra_stops) {
  return std::make_unique<BlockParser>(spec, std::move(opt), extra_stops);
}

}  // namespace spool::server::formats
