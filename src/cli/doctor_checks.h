// spool doctor's checks: is this machine (and optionally a model) ready to run? Each check
// is ok / warn / fail with a detail line and a one-line fix.
#pragma once

#include <string>
#include <vector>

namespace spool::plan {

enum class CheckStatus { kOk, kWarn, kFail };
/// "ok", "warn" or "fail".
const char* check_status_name(CheckStatus s);

/// One check's outcome.
struct Check {
  std::string name;    // e.g. "model", "simd", "memory", "disk", "o_direct", "io_uring"
  CheckStatus status = CheckStatus::kOk;
  std::string detail;  // what was found
  std::string fix;     // one line; empty when ok
};

/// Runs every check. `model_dir` empty: model checks are skipped and the disk probe reads
/// nothing (it needs a large file to read). Never throws: failures become checks.
std::vector<Check> run_doctor(const std::string& model_dir, int threads);

}  // namespace spool::plan
