// spool repack: permute experts (and router rows) so co-activated experts sit together on disk.
#include <unistd.h>

#include <cstdio>

#include "cli/common.h"
#include "cli/progress.h"
#include "common/error.h"
#include "common/sysinfo.h"
#include "experts/calibrate.h"
#include "experts/repack.h"
#include "models/spec.h"
#include "models/family.h"

namespace spool::cli {

namespace {

struct RepackOptions {
  ModelOptions model;
  std::string perm, out;
};

void run(const RepackOptions& o) {
  io::Checkpoint ck = models::open_checkpoint(o.model.dir());
  models::ModelSpec spec = models::build_spec(ck);
  auto perm = experts::read_perm_file(o.perm, spec.n_layers, spec.moe.n_experts);
  const double t0 = now_seconds();
  {
    ProgressBar bar("repack");
    experts::repack(ck, perm, o.out, [&](uint64_t done, uint64_t total) {
      bar.update(done, total, format_bytes(done) + " / " + format_bytes(total));
    });
  }
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
