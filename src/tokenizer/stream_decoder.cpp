#include "tokenizer/stream_decoder.h"

#include "tokenizer/utf8.h"

namespace spool::tokenizer {

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special)
    : tok_(tok), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  if (!tok_.check_id(id, skip_special_)) return "";
  if (tok_.joins_with_space()) {  // null decoder: token strings joined by spaces
    std::string out = any_token_ ? " " : "";
    any_token_ = true;
    out.append(tok_.token_bytes(id));
    return out;
  }
  pending_.append(tok_.token_bytes(id));
  const size_t ready = utf8::complete_prefix(pending_);
  std::string out;
  out.reserve(ready + 3);
  utf8::append_lossy(std::string_view(pending_).substr(0, ready), out);
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::to_valid(pending_);
  pending_.clear();
  any_token_ = false;
  return out;
}

}  // namespace spool::tokenizer
