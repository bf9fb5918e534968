// JSON string literals written byte for byte the way Python's json.dumps writes them (shared by
// the chat-template interpreter's tojson and the server's tool-call arguments).
#pragma once

#include <string>
#include <string_view>

namespace spool {

/// Appends `s` (UTF-8) as a double-quoted JSON string literal, as Python's json.dumps does: `"`
/// and `\` escaped, \n \r \t \b \f short escapes, other control bytes as \u00XX. Without
/// `ensure_ascii` everything else (UTF-8 included) is copied verbatim; with it, DEL and every
/// non-ASCII character become \uXXXX (a UTF-16 surrogate pair above U+FFFF, and an ill-formed
/// byte b becomes \udcXX, Python's "surrogateescape").
void append_json_string(std::string& out, std::string_view s, bool ensure_ascii = false);

}  // namespace spool
