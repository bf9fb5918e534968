// spool synth: write a synthetic checkpoint of a preset's exact shapes (random weights).
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "cli/common.h"
#include "cli/progress.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sysinfo.h"
#include "models/synth.h"

namespace spool::cli {

namespace {

struct SynthCmd {
  models::SynthOptions s;
  double shard_gb = 4.0;
  bool check = true;
  int threads = 0;
};

void run(SynthCmd& o) {
  if (!(o.shard_gb > 0)) throw UsageError("--shard-size-gb must be positive");
  o.s.shard_bytes = static_cast<uint64_t>(o.shard_gb * (1ull << 30));
  ModelOptions demo;
  try {
    o.s.tokenizer_dir = demo.dir();  // the demo model's tokenizer
  } catch (const Error&) {
    log_warn("demo model not found: the synthetic checkpoint gets no tokenizer");
  }
  const double t0 = now_seconds();
  models::SynthResult r;
  {
    ProgressBar bar("synth");
    r = models::write_synthetic(o.s, [&](uint64_t done, uint64_t total) {
      bar.update(done, total, strfmt("%s / %s, %.0f MB/s", format_bytes(done).c_str(), format_bytes(total).c_str(),
                                     done / std::max(bar.elapsed(), 1e-9) / 1e6));
    });
  }
  std::printf("wrote %s: %s (%lld tensors, %d shard(s), %s) in %.1f s\n", o.s.out_dir.c_str(), r.model_type.c_str(),
              (long long)r.tensors, r.shards, format_bytes(r.bytes).c_str(), now_seconds() - t0);
  if (!o.check) return;
  // Sanity forward: hidden-state RMS per layer must stay finite and O(1).
  ModelOptions mo;
  mo.model = o.s.out_dir;
  mo.threads = o.threads;
  mo.cache_budget = "1";
  Loaded l = load_model(mo);
  const auto& spec = l.model->spec();
  std::vector<double> rms(spec.n_layers + 1, 0.0);
  l.model->hooks.on_hidden = [&](int i, const float* h, int64_t T) {
    double ss = 0;
    for (int64_t j = 0; j < T * spec.hidden_size; ++j) ss += static_cast<double>(h[j]) * h[j];
    rms[i] = std::sqrt(ss / static_cast<double>(T * spec.hidden_size));
  };
  models::State st = l.model->new_state();
  std::vector<int32_t> ids = {1, 2, 3, 4};
  std::vector<float> logits(spec.vocab_size);
  l.model->forward(ids, st, models::LogitsMode::kLast, logits.data());
  l.model->hooks.on_hidden = nullptr;
  std::string line;
  bool finite = true;
  for (size_t i = 0; i < rms.size(); ++i) {
    finite = finite && std::isfinite(rms[i]);
    line += strfmt("%s%.3g", i ? " " : "", rms[i]);
  }
  std::printf("hidden-state RMS per layer (input of each layer, then final norm): %s\n", line.c_str());
  if (!finite) fail("the synthetic model produced non-finite activations");
}

}  // namespace

void register_synth(CLI::App& app) {
  auto o = std::make_shared<SynthCmd>();
  CLI::App* c = app.add_subcommand("synth", "Write a synthetic checkpoint with a preset's exact shapes (random weights)");
  std::string presets;
  for (const auto& p : models::presets()) presets += "\n  " + p.name + ": " + p.description;
  c->add_option("--preset", o->s.preset, "Architecture:" + presets)->required();
  c->add_option("--layers", o->s.layers, "Write only the first N layers (default: all; a full 35B is ~70 GB in bf16)")
      ->check(CLI::PositiveNumber);
  c->add_option("-o,--out", o->s.out_dir, "Output directory (must be empty unless --force)")->required();
  c->add_option("--dtype", o->s.dtype, "bf16 (default), f16 or f32");
  c->add_option("--layout", o->s.layout, "Expert layout: fused or per-expert (default: the release's)");
  c->add_option("--seed", o->s.seed, "Random seed (default 42)");
  c->add_option("--shard-size-gb", o->shard_gb, "Shard size in GB (default 4)");
  c->add_flag("--force", o->s.force, "Write into a non-empty directory");
  c->add_flag("--mtp", o->s.mtp,
              "Also write a random multi-token-prediction head (qwen3_5_moe / qwen3_next: mtp.*; deepseek_v3 / glm4_moe: the "
              "nextn layer): loads with --spec mtp; its drafts are random, so acceptance is near 0 (exercises the auto-off)");
  c->add_flag("!--no-check", o->check, "Skip the sanity forward pass after writing");
  c->add_option("-t,--threads", o->threads, "Threads for the sanity forward pass");
  c->callback([o] { run(*o); });
}

}  // namespace spool::cli
