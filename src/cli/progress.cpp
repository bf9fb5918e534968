#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

#include "common/sysinfo.h"

namespace spool::cli {

ProgressBar::ProgressBar(std::string label) : label_(std::move(label)), tty_(isatty(STDERR_FILENO)), t0_(now_seconds()) {}

ProgressBar::~ProgressBar() {
  if (tty_ && drawn_) std::fputc('\n', stderr);
}

double ProgressBar::elapsed() const { return now_seconds() - t0_; }

void ProgressBar::update(uint64_t done, uint64_t total, const std::string& detail) {
  const int pct = static_cast<int>(done * 100 / (total ? total : 1));
  if (pct == last_pct_ || (!tty_ && pct / 10 == last_pct_ / 10 && done != total)) return;
  last_pct_ = pct;
  drawn_ = true;
  const int bar = pct * 30 / 100;
  std::fprintf(stderr, "%s%s [%.*s%*s] %3d%% %s%s", tty_ ? "\r" : "", label_.c_str(), bar, "==============================", 30 - bar,
               "", pct, detail.c_str(), tty_ ? "" : "\n");
  std::fflush(stderr);
}

}  // namespace spool::cli
