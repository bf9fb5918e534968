// gpt-oss harmony output: a sequence of messages
//   [<|start|>assistant][ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json| json]
//   <|message|>BODY(<|end|>|<|call|>|<|return|>)
// (the generation prompt ends with <|start|>assistant, so the first message has no <|start|>).
// analysis → reasoning; a message with a recipient (`to=functions.NAME`, in the role part or the
// channel header) → a tool call whose arguments are its JSON body; final and commentary without
// a recipient → content. <|call|> and <|return|> are stop tokens in serving; in text they end the
// message like <|end|>.
#include <algorithm>

#include "server/formats/family.h"

namespace spool::server::formats {

namespace {

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kEnds[] = {"<|end|>", "<|call|>", "<|return|>"};
constexpr size_t kMaxHeader = 512;

class HarmonyParser final : public FamilyParser {
 public:
  explicit HarmonyParser(OutputParser::Options opt) : FamilyParser(std::move(opt), {}) {}

  bool in_markup() const override {
    if (finished()) return false;
    if (st_ == St::kHeader || st_ == St::kBetween) return pos_ < raw_.size() || st_ == St::kBetween;
    if (st_ == St::kBody && !recipient_.empty() && opt_.tool_calls) return !json_args_in_value(from(body_start_));
    return false;
  }

  bool in_reasoning() const override {
    return st_ == St::kBody && channel_ == "analysis" && recipient_.empty() && opt_.parse_reasoning;
  }

 private:
  enum class St { kHeader, kBody, kBetween, kPlain };

  // The earliest message terminator at or after `a`: its position and length; partial at the end
  // counts (length 0) when more text may come.
  std::pair<size_t, size_t> find_end(size_t a) const {
    size_t best = std::string::npos, len = 0;
    for (std::string_view e : kEnds) {
      size_t i = raw_.find(e, a);
      if (i < best) best = i, len = e.size();
    }
    size_t i = raw_.find(kStart, a);  // a new message without <|end|>
    if (i < best) best = i, len = 0;
    if (best == std::string::npos && !eof_ && raw_.size() > a) {
      if (raw_.back() == '<') return {raw_.size() - 1, std::string::npos};
      size_t lt = raw_.rfind("<|");
      if (lt != std::string::npos && lt >= a) {
        auto tail = from(lt);
        for (std::string_view e : kEnds)
          if (match_lit(tail, e) == 0) return {lt, std::string::npos};
        if (match_lit(tail, kStart) == 0) return {lt, std::string::npos};
      }
    }
    return {best, len};
  }

  bool parse_header(std::string_view h) {
    if (h.substr(0, kStart.size()) == kStart) h.remove_prefix(kStart.size());
    size_t c = h.find(kChannel);
    if (c == std::string_view::npos) return false;
    std::string_view role = h.substr(0, c), chan = h.substr(c + kChannel.size());
    recipient_.clear();
    auto find_to = [&](std::string_view s) {
      size_t t = s.find("to=");
      if (t == std::string_view::npos) return;
      size_t e = t + 3;
      while (e < s.size() && !is_ws(s[e]) && s[e] != '<') ++e;
      recipient_ = std::string(s.substr(t + 3, e - t - 3));
    };
    find_to(role);
    size_t w = 0;
    while (w < chan.size() && !is_ws(chan[w]) && chan[w] != '<') ++w;
    channel_ = std::string(chan.substr(0, w));
    if (recipient_.empty()) find_to(chan.substr(w));
    if (channel_.empty()) return false;
    if (recipient_.rfind("functions.", 0) == 0) recipient_.erase(0, 10);
    return true;
  }

  bool step() override {
    const size_t n = raw_.size();
    switch (st_) {
      case St::kBetween:
      case St::kHeader: {
        size_t p = pos_;
        if (st_ == St::kBetween) {
          while (p < n && is_ws(raw_[p])) ++p;
          if (p == n) {
            if (eof_) pos_ = n;
            return false;
          }
          // The next header: <|start|>assistant..., or (models drop it) <|channel|> / to=.
          auto rest = from(p);
          int m = std::max({match_lit(rest, kStart), match_lit(rest, kChannel), match_lit(rest, "to=")});
          if (m == 0 && !eof_) return false;
          if (m != 1) {  // text after a message: content
            pos_ = p;
            st_ = St::kPlain;
            return true;
          }
          pos_ = p;
          st_ = St::kHeader;
        }
        if (pos_ == n) return false;
        size_t m = raw_.find(kMessage, pos_);
        if (m == std::string::npos) {
          // A header must start like one; otherwise the output is plain content.
          auto h = from(pos_);
          size_t q = 0;
          while (q < h.size() && h[q] == ' ') ++q;
          bool looks = match_lit(h.substr(q), kStart) >= 0 || match_lit(h.substr(q), kChannel) >= 0 ||
                       match_lit(h.substr(q), "to=") >= 0;
          if (!looks || h.size() > kMaxHeader || eof_) {
            st_ = St::kPlain;
            return true;
          }
          return false;
        }
        if (m - pos_ > kMaxHeader || !parse_header(view(pos_, m))) {
          st_ = St::kPlain;
          return true;
        }
        pos_ = body_start_ = m + kMessage.size();
        st_ = St::kBody;
        return true;
      }

      case St::kBody: {
        const bool call = !recipient_.empty() && opt_.tool_calls;
        auto [e, len] = find_end(pos_);
        const bool partial = len == std::string::npos;
        if (call) {
          if ((e == std::string::npos && !eof_) || partial) {
            // Stream the arguments written so far (complete top-level members).
            size_t j = body_start_;
            while (j < n && is_ws(raw_[j])) ++j;
            std::string prefix = json_members_prefix(raw_, j);
            if (!prefix.empty() && valid_name(recipient_)) open_call(recipient_, "", prefix);
            return false;
          }
          size_t stop = e == std::string::npos ? n : e;
          std::string args = json_object_text(view(body_start_, stop));
          if (args.empty()) {
            abandon_call();
            emit_content(view(body_start_, stop));
          } else {
            emit_call(Call{recipient_, args, ""});
          }
          pos_ = e == std::string::npos ? n : e + len;
          st_ = St::kBetween;
          return e != std::string::npos;
        }
        size_t stop = e == std::string::npos ? n : e;
        auto text = view(pos_, stop);
        if (channel_ == "analysis" && opt_.parse_reasoning) {
          emit_reasoning(text);
        } else {
          emit_content(text);
        }
        pos_ = stop;
        if (e == std::string::npos || partial) return false;
        pos_ = e + len;
        st_ = St::kBetween;
        return true;
      }

      case St::kPlain:
        emit_content(view(pos_, n));
        pos_ = n;
        return false;
    }
    return false;
  }

  St st_ = St::kHeader;
  std::string channel_, recipient_;
  size_t body_start_ = 0;
};

}  // namespace

std::unique_ptr<FamilyParser> make_harmony_parser(OutputParser::Options opt) {
  return std::make_unique<HarmonyParser>(std::move(opt));
}

}  // namespace spool::server::formats
