// Random sentences of a constrained-decoding grammar (constrain/grammar.h), for tests that check
// that whatever the grammar lets a model write parses and validates.
#pragma once

#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "constrain/grammar.h"

namespace spool::test_support {

/// One random walk of `g`: each byte drawn uniformly among those the grammar allows, except that
/// an allowed byte of `prefer` (markup such as quotes and brackets) is taken half the time, so
/// walks end. Once the text is a complete sentence the walk stops when nothing else can follow,
/// or with probability 1 / `end_one_in` (1: at once). nullopt when it did not end within
/// `max_steps` bytes or the grammar allowed no byte (a dead end: a grammar bug).
inline std::optional<std::string> random_walk(const std::shared_ptr<const constrain::Grammar>& g, std::mt19937_64& rng,
                                              std::string_view prefer, int end_one_in, int max_steps) {
  constrain::Matcher m(g);
  std::string text;
  for (int step = 0; step < max_steps; ++step) {
    if (m.accepting() && (m.tops().size() == 1 || end_one_in <= 1 || rng() % end_one_in == 0)) return text;
    const constrain::ByteSet nb = m.next_bytes();
    std::vector<int> opts;
    for (int b = 0; b < 256; ++b)
      if (nb.test(static_cast<size_t>(b))) opts.push_back(b);
    if (opts.empty()) return std::nullopt;
    int pick = opts[rng() % opts.size()];
    for (int b : opts)
      if (prefer.find(static_cast<char>(b)) != std::string_view::npos && rng() % 2 == 0) pick = b;
    if (!m.advance(static_cast<uint8_t>(pick))) return std::nullopt;
    text.push_back(static_cast<char>(pick));
  }
  return std::nullopt;
}

}  // namespace spool::test_support
