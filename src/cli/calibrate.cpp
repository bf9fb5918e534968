// spool calibrate: trace routing on a text, write the hot experts (pin file), a
// co-activation expert order (perm file for spool repack) and/or the routing trace itself
// (--trace-out: docs/routing-trace.md).
#include <cmath>
#include <cstdio>
#include <memory>

#include "cli/common.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sysinfo.h"
#include "experts/calibrate.h"
#include "experts/routing_trace.h"

namespace spool::cli {

namespace {

struct CalibrateOptions {
  ModelOptions model;
  std::string file, pin_out, perm_out, trace_out;
  int64_t max_tokens = 16384;
  int64_t window = 512;
  double pin_gb = 0;
};

void run(const CalibrateOptions& o) {
  if (o.pin_out.empty() && o.perm_out.empty() && o.trace_out.empty()) throw UsageError("give --pin-out, --perm-out and/or --trace-out");
  if (!o.pin_out.empty() && !(o.pin_gb > 0)) throw UsageError("--pin-out needs --pin-gb > 0");
  if (o.max_tokens < 2) throw UsageError("--max-tokens must be at least 2");
  if (o.window <= 0) throw UsageError(strfmt("--window must be positive (got %lld)", (long long)o.window));
  const std::string text = read_file(o.file);
  engine::LoadOptions lo = o.model.load_options();  // windows of --window tokens in one forward pass each
  lo.ctx_size = std::min(o.window, o.max_tokens);
  lo.prefill_step = lo.ctx_size;
  Loaded l = engine::load(lo);
  if (!l.tok) throw Error(strfmt("%s has no tokenizer.json; calibrate needs one", o.model.dir().c_str()));
  const auto& spec = l.model->spec();
  std::vector<int32_t> ids = l.tok->encode(text, false);
  if (static_cast<int64_t>(ids.size()) > o.max_tokens) ids.resize(o.max_tokens);
  experts::RoutingTrace trace(spec.n_layers, spec.moe.n_experts);
  // --trace-out: every (layer, token) decision, tokens numbered through the whole text.
  std::unique_ptr<experts::TraceWriter> out;
  if (!o.trace_out.empty()) out = std::make_unique<experts::TraceWriter>(o.trace_out, trace_shape_of(spec, o.model.max_active_experts, "calibrate"));
  size_t window_start = 0;
  l.model->hooks.on_route = [&](int layer, int64_t row, std::span<const int> e, std::span<const float> w) {
    trace.record(layer, e);
    if (out) out->write(layer, static_cast<int64_t>(window_start) + row, e, w);
  };
  const double t0 = now_seconds();
  models::State st = l.model->new_state();
  for (size_t s = 0; s < ids.size(); s += o.window) {
    st.reset();
    window_start = s;
    const size_t n = std::min<size_t>(o.window, ids.size() - s);
    l.model->forward(std::span<const int32_t>(ids.data() + s, n), st, models::LogitsMode::kNone, nullptr);
  }
  l.model->hooks.on_route = nullptr;
  log_info("traced %zu tokens in %.1f s", ids.size(), now_seconds() - t0);
  if (out) {
    out->close();
    // The skew of what was recorded: share of routings taken by each layer's hottest 10% of experts.
    const experts::Trace t = experts::read_trace(o.trace_out);
    const std::vector<double> share = experts::top_share(t, 0.10);
    std::string per_layer;
    double mean = 0;
    for (double x : share) {
      per_layer += strfmt("%s%.1f%%", per_layer.empty() ? "" : " ", 100.0 * x);
      mean += x / static_cast<double>(share.size());
    }
    std::printf("trace %s: %lld tokens x %d MoE layers, %d of %d experts per token; hottest 10%% of experts take %.1f%% of "
                "routings (uniform: %.1f%%), per layer: %s\n",
                o.trace_out.c_str(), (long long)t.n_tokens, t.n_moe(), t.shape.top_k, t.shape.n_experts, 100.0 * mean,
                100.0 * std::ceil(0.10 * t.shape.n_experts - 1e-9) / t.shape.n_experts, per_layer.c_str());
  }
  // Bytes of one expert (gate + up + down) from the checkpoint.
  int first_moe = 0;
  while (first_moe < spec.n_layers && spec.ffns[first_moe] != models::FfnKind::kMoE) ++first_moe;
  uint64_t expert_bytes = 0;
  for (auto p : {io::ExpertProj::kGate, io::ExpertProj::kUp, io::ExpertProj::kDown}) expert_bytes += l.ckpt->expert(first_moe, 0, p).nbytes;
  if (!o.pin_out.empty()) {
    auto pins = experts::hot_set(trace, static_cast<uint64_t>(o.pin_gb * (1ull << 30)), expert_bytes);
    uint64_t covered = 0;
    for (auto [layer, e] : pins) covered += trace.count(layer, e);
    const double coverage = trace.total_requests() ? static_cast<double>(covered) / trace.total_requests() : 0.0;
    experts::write_pin_file(o.pin_out, pins, expert_bytes, coverage, ids.size());
    std::printf("pin file %s: %zu experts (%s), covering %.1f%% of routed experts on the calibration text\n", o.pin_out.c_str(),
                pins.size(), format_bytes(pins.size() * expert_bytes).c_str(), 100.0 * coverage);
  }
  if (!o.perm_out.empty()) {
    experts::write_perm_file(o.perm_out, experts::coactivation_order(trace));
    std::printf("perm file %s: co-activation order of %d experts for %d layers\n", o.perm_out.c_str(), spec.moe.n_experts, spec.n_layers);
  }
}

}  // namespace

void register_calibrate(CLI::App& app) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* c = app.add_subcommand("calibrate", "Trace routing on a text: hot experts to pin, a co-activation order for repack, the routing trace");
  o->model.add_to(c);
  c->add_option("-f,--file", o->file, "Calibration text")->required();
  c->add_option("--max-tokens", o->max_tokens, "Tokens of the text to trace (default 16384)");
  c->add_option("--window", o->window, "Tokens per window, fresh state each (default 512)");
  c->add_option("--pin-gb", o->pin_gb, "Size of the hot set to pin, in GB");
  c->add_option("--pin-out", o->pin_out, "Write the hot set here ({\"pin\": [[layer, expert], ...]}, hottest first)");
  c->add_option("--perm-out", o->perm_out, "Write the co-activation order here (for spool repack)");
  c->add_option("--trace-out", o->trace_out,
                "Write the routing trace here: (layer, token, experts, gate weights) of every token, JSON lines "
                "(docs/routing-trace.md; replay with spool bench --routing-trace, plan with spool plan --trace)");
  c->callback([o] { run(*o); });
}

}  // namespace spool::cli
