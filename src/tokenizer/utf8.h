// The tokenizer's UTF-8 helpers live in common/utf8.h (shared with the template and server
// modules); this keeps the name tokenizer::utf8 for the tokenizer's code.
#pragma once

#include "common/utf8.h"

namespace spool::tokenizer {

/// The shared UTF-8 helpers (see common/utf8.h).
namespace utf8 = ::spool::utf8;

}  // namespace spool::tokenizer
