// spool repack: permute experts (and router rows) so co-activated experts sit together on disk.
#include <unistd.h>

#include <cstdio>

#include "cli/common.h"
#include "common/error.h"
#include "common/sysinfo.h"
#include "experts/calibrate.h"
#include "experts/repack.h"
#include "models/spec.h"

namespace spool::cli {

namespace {

struct RepackOptions {
  ModelOptions model;
  std::string perm, out;
};

void run(const RepackOptions& o) {
  io::Checkpoint ck = io::Checkpoint::open(o.model.dir());
  models::ModelSpec spec = models::build_spec(ck);
  auto perm = experts::read_perm_file(o.perm, spec.n_layers, spec.moe.n_experts);
  const bool tty = isatty(STDERR_FILENO);
  int last = -1;
  const double t0 = now_seconds();
  experts::repack(ck, perm, o.out, [&](uint64_t done, uint64_t total) {
    const int pct = static_cast<int>(done * 100 / std::max<uint64_t>(total, 1));
    if (pct == last || (!tty && pct % 25 != 0)) return;
    last = pct;
    std::fprintf(stderr, "%srepack %3d%% %s / %s%s", tty ? "\r" : "", pct, format_bytes(done).c_str(), format_bytes(total).c_str(),
                 tty ? "" : "\n");
  });
  if (tty) std::fprintf(stderr, "\n");
  std::printf("wrote %s (experts permuted per %s) in %.1f s\n", o.out.c_str(), o.perm.c_str(), now_seconds() - t0);
}

}  // namespace

void register_repack(CLI::App& app) {
  auto o = std::make_shared<RepackOptions>();
  CLI::App* c = app.add_subcommand("repack", "Write a copy of a checkpoint with experts and router rows permuted (same output)");
  o->model.add_to(c, /*runs_model=*/false);
  c->add_option("--perm", o->perm, "Permutation file from spool calibrate --perm-out")->required();
  c->add_option("-o,--out", o->out, "Output directory (new or empty)")->required();
  c->callback([o] { run(*o); });
}

}  // namespace spool::cli
