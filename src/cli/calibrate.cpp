// spool calibrate: trace routing on a text, write the hot experts (pin file), a
// co-activation expert order (perm file for spool repack) and/or the routing trace itself
// (--trace-out: docs/routing-trace.md).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli/common.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sysinfo.h"
#include "experts/calibrate.h"
#include "experts/predictor.h"
#include "experts/routing_trace.h"

namespace spool::cli {

namespace {

struct CalibrateOptions {
  ModelOptions model;
  std::string file, pin_out, perm_out, trace_out, train_predictor;
  int64_t max_tokens = 16384;
  int64_t window = 512;
  double pin_gb = 0;
  int predictor_mlp = 0;  // --predictor-mlp D (0: linear heads)
  int trace_guesses = 0;  // --trace-guesses M
  experts::PredictorTrainOptions train;
};

// Rows for the expert predictor (--train-predictor, or recall of --predictor): per decoder
// layer, the normalised residual rows entering its FFN [N, H], and its routed experts [N, K].
struct PredictorData {
  std::vector<std::vector<float>> u;
  std::vector<std::vector<int>> ids;
  std::vector<int> sources, targets;  // target MoE layers with a source, and their sources
};

// --train-predictor OUT: one head per MoE layer with a source, trained on the traced rows;
// --predictor FILE alone: the recall of its heads on this text. Prints a table of recall@k and
// @2k, router (the untrained head) against the head, per layer.
void predictor_step(const CalibrateOptions& o, models::Model& model, const PredictorData& d, int K) {
  const auto& spec = model.spec();
  const int E = spec.moe.n_experts, H = static_cast<int>(spec.hidden_size);
  const bool train = !o.train_predictor.empty();
  experts::ExpertPredictor trained(spec.model_type, spec.n_layers, H, E, K, spec.rms_norm_eps);
  std::optional<experts::ExpertPredictor> given;
  if (!train) given = experts::ExpertPredictor::load(o.model.predictor);
  std::printf("%s %s: recall of each MoE layer's experts one layer ahead (%s)\n", train ? "predictor" : "evaluating",
              train ? o.train_predictor.c_str() : o.model.predictor.c_str(),
              train ? "validation: the last tenth of the rows" : "every row of this text");
  std::printf("| layer | from | rows | router recall@%d | head recall@%d | router recall@%d | head recall@%d |%s\n", K, K, 2 * K, 2 * K,
              train ? " epoch |" : "");
  std::printf("|---|---|---|---|---|---|---|%s\n", train ? "---|" : "");
  double sum[4] = {0, 0, 0, 0};
  int n = 0;
  for (size_t t = 0; t < d.targets.size(); ++t) {
    const int j = d.targets[t], i = d.sources[t];
    const int64_t N = static_cast<int64_t>(d.ids[j].size()) / K;
    if (N < 2 || static_cast<int64_t>(d.u[i].size()) != N * H) continue;
    experts::PredictorHead init;
    init.target_layer = j;
    init.source_layer = i;
    model.router_as_linear(j, &init.w, &init.b);
    double r[4];
    int epoch = 0;
    int64_t rows = N;
    if (train) {
      experts::PredictorHead head = init;
      head.mlp = o.predictor_mlp;
      const experts::PredictorTrainReport rep = experts::train_head(trained, head, d.u[i].data(), d.ids[j].data(), N, K, o.train);
      r[0] = rep.router_recall_k, r[1] = rep.head_recall_k, r[2] = rep.router_recall_2k, r[3] = rep.head_recall_2k;
      epoch = rep.epoch;
      rows = rep.validation_rows;
      trained.add(std::move(head));
    } else {
      const experts::PredictorHead* head = given->head(j);
      if (head == nullptr) continue;
      std::vector<float> sr(static_cast<size_t>(N * E)), sh(sr.size());
      init.mlp = 0;
      init.w1.clear();
      given->scores_normed(init, d.u[i].data(), N, sr.data());
      given->scores_normed(*head, d.u[i].data(), N, sh.data());
      r[0] = experts::recall_at(sr.data(), d.ids[j].data(), N, E, K, K);
      r[1] = experts::recall_at(sh.data(), d.ids[j].data(), N, E, K, K);
      r[2] = experts::recall_at(sr.data(), d.ids[j].data(), N, E, K, 2 * K);
      r[3] = experts::recall_at(sh.data(), d.ids[j].data(), N, E, K, 2 * K);
    }
    for (int q = 0; q < 4; ++q) sum[q] += r[q];
    ++n;
    std::printf("| %d | %d | %lld | %.3f | %.3f | %.3f | %.3f |%s\n", j, i, (long long)rows, r[0], r[1], r[2], r[3],
                train ? strfmt(" %d |", epoch).c_str() : "");
  }
  if (n == 0) throw Error("no MoE layer has a predictor source (a MoE layer before it whose router reads the normed FFN input)");
  std::printf("| mean | | | %.3f | %.3f | %.3f | %.3f |%s\n", sum[0] / n, sum[1] / n, sum[2] / n, sum[3] / n, train ? " |" : "");
  if (train) {
    trained.save(o.train_predictor);
    std::printf("predictor %s: %zu heads (%s), %s\n", o.train_predictor.c_str(), trained.heads().size(),
                o.predictor_mlp > 0 ? strfmt("linear + ReLU branch of %d", o.predictor_mlp).c_str() : "linear",
                format_bytes(std::filesystem::file_size(o.train_predictor)).c_str());
  }
}

void run(const CalibrateOptions& o) {
  if (o.trace_guesses < 0) throw UsageError(strfmt("--trace-guesses must be >= 0 (got %d)", o.trace_guesses));
  if (o.trace_guesses > 0 && o.trace_out.empty()) throw UsageError("--trace-guesses needs --trace-out");
  const bool predictor = !o.train_predictor.empty() || !o.model.predictor.empty();
  if (o.pin_out.empty() && o.perm_out.empty() && o.trace_out.empty() && !predictor)
    throw UsageError("give --pin-out, --perm-out, --trace-out, --train-predictor and/or --predictor (its recall on the text)");
  if (o.model.route_by_predictor) throw UsageError("calibrate traces exact routing: --route-by-predictor does not apply");
  if (!o.train_predictor.empty() && !o.model.predictor.empty()) throw UsageError("give --train-predictor or --predictor, not both");
  if (o.predictor_mlp < 0 || o.predictor_mlp > 8192) throw UsageError(strfmt("--predictor-mlp must be between 0 and 8192 (got %d)", o.predictor_mlp));
  if (o.train.epochs < 0 || o.train.epochs > 10000) throw UsageError(strfmt("--predictor-epochs must be between 0 and 10000 (got %d)", o.train.epochs));
  if (!(o.train.lr > 0 && o.train.lr < 1)) throw UsageError(strfmt("--predictor-lr must be in (0, 1) (got %g)", o.train.lr));
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
  // --trace-guesses M: each record also carries the M guesses the prefetch makes for it one layer
  // earlier: the --predictor's heads, or the next router as a linear map (Model::router_as_linear).
  std::optional<experts::ExpertPredictor> guesser;
  std::vector<std::vector<int>> guess_rows;  // [layer][rows of this forward call x M]
  if (o.trace_guesses > 0) {
    if (l.model->backend().device() != ops::Device::kCpu) throw UsageError("--trace-guesses runs on the CPU (--device cpu)");
    if (o.trace_guesses > spec.moe.n_experts) throw UsageError(strfmt("--trace-guesses must be 1..%d (the experts per layer)", spec.moe.n_experts));
    if (!o.model.predictor.empty()) {
      guesser = experts::ExpertPredictor::load(o.model.predictor);
    } else {
      guesser.emplace(spec.model_type, spec.n_layers, static_cast<int>(spec.hidden_size), spec.moe.n_experts, spec.moe.top_k, spec.rms_norm_eps);
      for (int j = 0; j < spec.n_layers; ++j) {
        if (l.model->predictor_source(j) < 0) continue;
        experts::PredictorHead h;
        h.target_layer = j;
        h.source_layer = l.model->predictor_source(j);
        l.model->router_as_linear(j, &h.w, &h.b);
        guesser->add(std::move(h));
      }
    }
    guess_rows.resize(static_cast<size_t>(spec.n_layers));
  }
  std::unique_ptr<experts::TraceWriter> out;
  if (!o.trace_out.empty()) {
    experts::TraceShape ts = trace_shape_of(spec, o.model.max_active_experts, "calibrate");
    if (guesser) ts.guesses = o.trace_guesses, ts.guess_source = o.model.predictor.empty() ? "router" : "predictor";
    out = std::make_unique<experts::TraceWriter>(o.trace_out, ts);
  }
  size_t window_start = 0;
  // --train-predictor / --predictor: every source layer's residual rows and every MoE layer's choice.
  PredictorData pd;
  const int K = o.model.max_active_experts > 0 ? o.model.max_active_experts : spec.moe.top_k;
  if (predictor) {
    if (l.model->backend().device() != ops::Device::kCpu) throw UsageError("--train-predictor and --predictor run on the CPU (--device cpu)");
    pd.u.resize(static_cast<size_t>(spec.n_layers));
    pd.ids.resize(static_cast<size_t>(spec.n_layers));
    for (int j = 0; j < spec.n_layers; ++j)
      if (const int i = l.model->predictor_source(j); i >= 0) pd.targets.push_back(j), pd.sources.push_back(i);
    if (pd.targets.empty()) throw Error("this model has no MoE layer a predictor can read one layer ahead");
    const uint64_t bytes = ids.size() * pd.targets.size() * (spec.hidden_size * sizeof(float) + K * sizeof(int));
    log_info("predictor rows: %zu tokens x %zu layers (%s)", ids.size(), pd.targets.size(), format_bytes(bytes).c_str());
    // (heads are trained in memory: refuse rather than swap or be killed half-way)
    if (const uint64_t avail = available_memory_bytes(); avail > 0 && bytes > avail * 8 / 10)
      throw Error(strfmt("the predictor's rows need %s, more than 80%% of the %s available; lower --max-tokens (now %lld)",
                         format_bytes(bytes).c_str(), format_bytes(avail).c_str(), (long long)o.max_tokens));
    std::vector<char> is_source(static_cast<size_t>(spec.n_layers), 0);
    for (int i : pd.sources) is_source[i] = 1;
    const experts::ExpertPredictor norm(spec.model_type, spec.n_layers, static_cast<int>(spec.hidden_size), spec.moe.n_experts, K,
                                        spec.rms_norm_eps);
    l.model->hooks.on_ffn_input = [&pd, is_source, norm, H = spec.hidden_size](int layer, const float* h, int64_t T) {
      if (layer < 0 || layer >= static_cast<int>(is_source.size()) || !is_source[layer]) return;
      std::vector<float>& u = pd.u[layer];
      const size_t at = u.size();
      u.resize(at + static_cast<size_t>(T * H));
      norm.normalise(h, T, u.data() + at);
    };
  }
  if (guesser) {
    auto inner = l.model->hooks.on_ffn_input;
    l.model->hooks.on_ffn_input = [&, inner](int layer, const float* h, int64_t T) {
      if (inner) inner(layer, h, T);
      const experts::PredictorHead* head = guesser->head_from(layer);
      if (head == nullptr) return;
      std::vector<int>& g = guess_rows[static_cast<size_t>(head->target_layer)];
      g.resize(static_cast<size_t>(T * o.trace_guesses));
      guesser->top_m(*head, h, T, o.trace_guesses, g.data());
    };
  }
  size_t window_rows = 0;  // pd.ids rows before this window
  l.model->hooks.on_route = [&](int layer, int64_t row, std::span<const int> e, std::span<const float> w) {
    trace.record(layer, e);
    if (out) {
      std::span<const int> g;
      if (guesser && !guess_rows[static_cast<size_t>(layer)].empty())
        g = std::span<const int>(guess_rows[static_cast<size_t>(layer)].data() + row * o.trace_guesses, static_cast<size_t>(o.trace_guesses));
      out->write(layer, static_cast<int64_t>(window_start) + row, e, w, g);
    }
    if (predictor) {
      std::vector<int>& v = pd.ids[layer];
      const size_t at = (window_rows + static_cast<size_t>(row)) * K;
      if (v.size() < at + K) v.resize(at + K);
      std::copy(e.begin(), e.end(), v.begin() + at);
    }
  };
  const double t0 = now_seconds();
  models::State st = l.model->new_state();
  for (size_t s = 0; s < ids.size(); s += o.window) {
    st.reset();
    window_start = s;
    const size_t n = std::min<size_t>(o.window, ids.size() - s);
    l.model->forward(std::span<const int32_t>(ids.data() + s, n), st, models::LogitsMode::kNone, nullptr);
    window_rows += n;
  }
  l.model->hooks.on_route = nullptr;
  l.model->hooks.on_ffn_input = nullptr;
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
  if (predictor) predictor_step(o, *l.model, pd, K);
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
  c->add_option("--trace-guesses", o->trace_guesses,
                "With --trace-out: record with each (layer, token) the M experts the next-layer prefetch guesses for it one "
                "layer earlier (--predictor's heads, else the next router), so spool bench --routing-trace --prefetch-next "
                "replays the prefetch too");
  c->add_option("--train-predictor", o->train_predictor,
                "Train an expert predictor on the text and write it here: one head per MoE layer scoring its experts from the "
                "residual stream one layer earlier, for --predictor (docs/predictor.md); prints recall against the router's guess");
  c->add_option("--predictor-mlp", o->predictor_mlp, "With --train-predictor: width of each head's ReLU branch (edge0: 512; default 0 = linear heads)");
  c->add_option("--predictor-epochs", o->train.epochs, "With --train-predictor: passes over the rows (default 20; the best on the validation tail is kept)");
  c->add_option("--predictor-lr", o->train.lr, "With --train-predictor: Adam step size (default 0.001)");
  c->callback([o] { run(*o); });
}

}  // namespace spool::cli
