// spool doctor: is this machine ready (and a model, with --model)? ok / warn / fail checks,
// each with a one-line fix. Exit 0 when nothing failed, 1 otherwise.
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cli/common.h"
#include "common/error.h"
#include "plan/doctor.h"

namespace spool::cli {

namespace {

struct DoctorOptions {
  std::string model;
  bool json = false;
};

void run(const DoctorOptions& o) {
  const unsigned hw = std::thread::hardware_concurrency();
  const std::vector<plan::Check> checks = plan::run_doctor(o.model, hw ? static_cast<int>(hw) : 1);
  bool failed = false;
  for (const auto& c : checks) failed |= c.status == plan::CheckStatus::kFail;
  if (o.json) {
    nlohmann::ordered_json j;
    j["ok"] = !failed;
    j["checks"] = nlohmann::ordered_json::array();
    for (const auto& c : checks)
      j["checks"].push_back({{"name", c.name}, {"status", plan::check_status_name(c.status)}, {"detail", c.detail}, {"fix", c.fix}});
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    for (const auto& c : checks) {
      std::printf("[%-4s] %-9s %s\n", plan::check_status_name(c.status), c.name.c_str(), c.detail.c_str());
      if (!c.fix.empty()) std::printf("       %-9s fix: %s\n", "", c.fix.c_str());
    }
  }
  std::fflush(stdout);
  if (failed) std::exit(1);  // documented exit status: a check failed
}

}  // namespace

void register_doctor(CLI::App& app) {
  auto o = std::make_shared<DoctorOptions>();
  CLI::App* c = app.add_subcommand("doctor", "Check the machine (and a model) for running spool: SIMD, memory, disk, O_DIRECT, io_uring");
  c->add_option("-m,--model", o->model, "Model directory to check (files, tokenizer, fit, disk bandwidth)");
  c->add_flag("--json", o->json, "Print JSON");
  c->callback([o] { run(*o); });
}

}  // namespace spool::cli
