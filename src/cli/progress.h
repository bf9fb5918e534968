// A progress bar on stderr: redrawn in place on a terminal, one line per 10% otherwise
// (so CI logs stay short).
#pragma once

#include <cstdint>
#include <string>

namespace spool::cli {

class ProgressBar {
 public:
  /// `label` starts every line, e.g. "perplexity".
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  /// Shows done/total with `detail` appended (e.g. "ppl 55.1, 3000 tok/s").
  void update(uint64_t done, uint64_t total, const std::string& detail);
  /// Seconds since construction.
  double elapsed() const;

 private:
  std::string label_;
  bool tty_;
  int last_pct_ = -1;
  bool drawn_ = false;
  double t0_;
};

}  // namespace spool::cli
