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
#include "dist/comm.h"
#include "dist/link.h"

#include <unistd.h>

#include <optional>
#include <set>

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

// Under mpirun (expert parallelism, docs/distributed.md): the ranks, the hosts they run on and
// the links between them as an MoE layer's exchange uses them (dist::measure_link), with the
// `spool plan --ranks` flags that carry the measurement. A collective: every rank runs it.
plan::Check link_check() {
  dist::Comm& w = dist::world();
  std::set<std::string> hosts;
  for (int r = 0; r < w.size(); ++r) {
    char name[256] = {};
    if (w.rank() == r && gethostname(name, sizeof(name) - 1) != 0) std::snprintf(name, sizeof(name), "rank%d", r);
    w.broadcast(name, sizeof(name), r);
    name[sizeof(name) - 1] = '\0';
    hosts.insert(name);
  }
  const dist::LinkMeasure m = dist::measure_link(w);
  plan::Check c{"link", plan::CheckStatus::kOk, "", ""};
  c.detail = strfmt("%d ranks (%s) on %zu host%s; one exchange %.1f us, %.2f GB/s into a rank: spool plan --ranks %d "
                    "--link-latency-us %.1f --link-gbps %.2f",
                    m.ranks, w.name(), hosts.size(), hosts.size() == 1 ? "" : "s", m.latency_us, m.gbps, m.ranks, m.latency_us, m.gbps);
  if (m.latency_us > 1000 || m.gbps < 0.1) {
    c.status = plan::CheckStatus::kWarn;
    c.fix = "a slow link: each MoE layer of a decoded token waits for two exchanges; prefer a faster network (or fewer ranks)";
  }
  return c;
}

void run(const DoctorOptions& o) {
  const unsigned hw = std::thread::hardware_concurrency();
  // (the link check first: its collectives run on every rank before any rank's other checks can throw)
  std::optional<plan::Check> link;
  if (dist::launched_by_mpi()) link = link_check();
  std::vector<plan::Check> checks = plan::run_doctor(o.model, hw ? static_cast<int>(hw) : 1);
  for (plan::Check& c : gpu_checks()) checks.push_back(std::move(c));
  if (link) checks.push_back(std::move(*link));
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
