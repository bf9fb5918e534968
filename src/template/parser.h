// Recursive-descent parser from tokens to ast::Program, following jinja2/parser.py
// (operator precedence, tuple rules, test-argument rules, statement grammar).
// Unsupported statements (extends, include, import, from, block, autoescape) and unknown
// tags, filters or tests are rejected here with a spool::Error naming line and column.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "template/ast.h"

namespace spool::tmpl {

/// Maximum nesting of expressions and of blocks accepted by the parser.
constexpr int kMaxParseDepth = 100;

/// Parses template source (already normalized or not) into a Program.
std::unique_ptr<ast::Program> parse_program(std::string_view source, const std::string& label);

}  // namespace spool::tmpl
