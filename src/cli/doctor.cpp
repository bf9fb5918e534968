// spool doctor: is this machine ready (and a model, with --model)? ok / warn / fail checks,
// each with a one-line fix. Exit 0 when nothing failed, 1 otherwise.
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cli/common.h"
#include "common/error.h"
#include "common/sysinfo.h"
#include "engine/loader.h"
#include "cli/doctor_checks.h"

namespace spool::cli {

namespace {

struct DoctorOptions {
  std::string model;
  bool json = false;
};

// One check per GPU the CUDA runtime sees: name, memory, compute capability and the measured
// host-to-device bandwidth (pinned and pageable, 256 MiB copies), which bounds decode when the
// routed experts stay in host memory. Without a GPU (or a CUDA build) one ok line says so.
std::vector<plan::Check> gpu_checks() {
  std::vector<plan::Check> out;
  const int n = engine::cuda_devices();
  if (n == 0) {
    if (engine::has_cuda_backend())
      out.push_back({"gpu", plan::CheckStatus::kOk, "no CUDA device visible: models run on the CPU", ""});
    else
      out.push_back({"gpu", plan::CheckStatus::kOk, "CPU build (no CUDA backend): models run on the CPU",
                     "for an NVIDIA GPU, build with cmake -DSPOOL_CUDA=ON (needs the CUDA toolkit)"});
    return out;
  }
  for (int i = 0; i < n; ++i) {
    const engine::GpuInfo g = engine::gpu_info(i);
    plan::Check c{strfmt("gpu%d", i), plan::CheckStatus::kOk, "", ""};
    try {
      const double pinned = engine::h2d_gbps(i, 256ull << 20, true), pageable = engine::h2d_gbps(i, 256ull << 20, false);
      c.detail = strfmt("cuda:%d %s, %s, sm_%d%d; host->device %.1f GB/s pinned, %.1f GB/s pageable", i, g.name.c_str(),
                        format_bytes(g.total_bytes).c_str(), g.major, g.minor, pinned, pageable);
    } catch (const Error& e) {
      c.status = plan::CheckStatus::kFail;
      c.detail = strfmt("cuda:%d %s: %s", i, g.name.c_str(), e.what());
      c.fix = "check the driver (nvidia-smi) and that no other process holds the GPU's memory";
    }
    out.push_back(std::move(c));
  }
  return out;
}

void run(const DoctorOptions& o) {
  const unsigned hw = std::thread::hardware_concurrency();
  std::vector<plan::Check> checks = plan::run_doctor(o.model, hw ? static_cast<int>(hw) : 1);
  for (plan::Check& c : gpu_checks()) checks.push_back(std::move(c));
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
