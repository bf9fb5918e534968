// Python `str` semantics on UTF-8 std::string: code-point aware indexing, case mapping,
// strip/split/replace/find, and the exact text forms Python prints (float repr, str repr,
// json.dumps string escaping). Chat templates are Python-flavoured, so these must match
// CPython byte for byte. Invalid UTF-8 bytes round-trip as lone surrogates U+DC80..U+DCFF
// (Python's "surrogateescape"), so nothing here ever fails on malformed input.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace spool::tmpl::py {

/// Decodes the code point at s[i] and advances i past it (surrogateescape on bad bytes).
char32_t decode_at(std::string_view s, size_t& i);
/// Decodes UTF-8 into code points; an invalid byte b becomes U+DC00+b.
std::u32string decode(std::string_view s);
/// Appends one code point as UTF-8 (U+DC80..U+DCFF are written back as the raw byte).
void append_utf8(std::string& out, char32_t cp);
/// Encodes code points [first, last) as UTF-8.
std::string encode(const char32_t* first, const char32_t* last);
/// Encodes a whole code point string as UTF-8.
inline std::string encode(const std::u32string& s) { return encode(s.data(), s.data() + s.size()); }
/// True when every byte is < 0x80 (then bytes and code points coincide).
bool is_ascii(std::string_view s);
/// Number of code points (Python len()).
size_t length(std::string_view s);

/// Python str.isspace() for one code point.
bool is_space(char32_t c);
/// Unicode letter with case (Lu, Ll, Lt).
bool is_cased(char32_t c);
/// Python str.isprintable() for one code point (decides repr escaping).
bool is_printable(char32_t c);
/// Simple upper/lower/title case mappings of one code point.
char32_t to_upper(char32_t c);
char32_t to_lower(char32_t c);
char32_t to_title(char32_t c);

/// str.upper() / str.lower() / str.title() / str.capitalize() / str.swapcase().
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);
std::string capitalize(std::string_view s);
std::string swapcase(std::string_view s);

/// Character-class predicates of whole strings (str.isalpha() etc.).
enum class StrClass { Alpha, Digit, Decimal, Numeric, Alnum, Space, Upper, Lower, Title };
bool str_is(std::string_view s, StrClass c);

/// str.strip/lstrip/rstrip; `chars` absent strips Unicode whitespace.
std::string strip(std::string_view s, const std::optional<std::string_view>& chars, bool left, bool right);
/// str.split(sep, maxsplit); sep absent splits on whitespace runs. Throws on an empty sep.
std::vector<std::string> split(std::string_view s, const std::optional<std::string_view>& sep,
                               int64_t maxsplit);
/// str.rsplit(sep, maxsplit).
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string_view>& sep,
                                int64_t maxsplit);
/// str.splitlines(keepends).
std::vector<std::string> splitlines(std::string_view s, bool keepends);
/// str.replace(old, new, count); count < 0 replaces all.
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);

/// Resolves Python slice-style optional bounds on a string of `len` code points.
void clamp_range(int64_t len, const std::optional<int64_t>& start, const std::optional<int64_t>& end,
                 int64_t* lo, int64_t* hi);
/// Byte offset of code point index `cp` (0..length) in s.
size_t byte_offset(std::string_view s, int64_t cp);
/// str.find / str.rfind over code point range [start, end); returns a code point index or -1.
int64_t find(std::string_view s, std::string_view sub, const std::optional<int64_t>& start,
             const std::optional<int64_t>& end, bool reverse);
/// str.count(sub, start, end).
int64_t count(std::string_view s, std::string_view sub, const std::optional<int64_t>& start,
              const std::optional<int64_t>& end);
/// str.startswith / str.endswith for one candidate over [start, end).
bool starts_ends_with(std::string_view s, std::string_view affix, const std::optional<int64_t>& start,
                      const std::optional<int64_t>& end, bool at_end);
/// str.center / ljust / rjust with a one-character fill.
std::string pad(std::string_view s, int64_t width, std::string_view fill, char align);

/// Python float.__repr__ (shortest round-trip, "1e+16", "inf", "nan").
std::string float_repr(double v);
/// Python repr() of a str, e.g. 'it\'s' -> "it's".
void repr_str(std::string& out, std::string_view s);
/// json.dumps string encoding (with quotes); ensure_ascii escapes everything non-ASCII.
void json_str(std::string& out, std::string_view s, bool ensure_ascii);
/// markupsafe.escape: & < > " ' as HTML entities (&amp; &lt; &gt; &#34; &#39;).
std::string html_escape(std::string_view s);

/// Decodes a Jinja string literal body the way Python's "unicode-escape" codec does
/// after jinja2 backslash-replaces non-ASCII characters. Throws spool::Error on a bad escape.
std::string unescape_literal(std::string_view body);

}  // namespace spool::tmpl::py
