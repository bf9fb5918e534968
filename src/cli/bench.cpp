// spool bench: prompt processing (pp) and token generation (tg) throughput in the format
// of llama.cpp's llama-bench (test, t/s mean ± sd), plus expert-cache columns. Inputs are
// pseudo-random token ids (as llama-bench uses); each test runs once to warm up, then -r
// times on a fresh sequence state. --parallel N adds aggregate generation over N concurrent
// sequences decoded together (Model::forward_batch: one step = one token of each), the
// throughput a server with N busy slots gets (test "tgNNN xN", t/s summed over sequences).
// --spec mtp adds speculative decoding with the model's MTP head: the single-sequence tg test
// becomes a pair measured in the same run, repetitions interleaved (plain, mtp, mtp, plain, ...):
// "tgNNN" and "tgNNN mtp", both greedy generations of NNN tokens from the same prompt through
// engine::Session::generate (end-of-sequence ids ignored), the plain one without the head; the
// mtp row adds the draft acceptance, tokens per verify step and the speedup over the plain row.
// --routing-trace FILE forces every MoE layer's routing to a recorded trace's (experts::TraceMap:
// any checkpoint, any size), so a synthetic checkpoint streams with real routing statistics:
// pp test repetition r (-1 = warm-up) routes its prompt as trace tokens (r + 1) * n_prompt + i,
// tg tests as experts::tg_trace_token() says (what `spool plan --trace` simulates).
// --lora FILE[:SCALE] (repeatable) loads LoRA adapters applied unmerged (docs/lora.md); every row
// runs them at their scales. --lora-distinct D1,D2,... instead runs each test once per D, with D
// distinct adapters active in its batch (models::SeqStep::lora: sequence i runs adapter i mod D at
// its --lora scale, every other adapter 0; D = 0: all off, the base cost with the adapters
// loaded): rows "pp512 lora1", "tg128 x4 lora4", repetitions interleaved across the D rows of a
// test (D1, D2, ..., then reversed), so drift of the machine's speed falls on all of them alike.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <span>

#include "cli/common.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sysinfo.h"
#include "dist/comm.h"
#include "engine/session.h"
#include "experts/cache_sim.h"
#include "experts/routing_trace.h"
#include "ops/matmul.h"

namespace spool::cli {

namespace {

struct BenchOptions {
  ModelOptions model;
  int n_prompt = 512;
  int n_gen = 128;
  int64_t n_depth = 0;  // -d: tokens already in each sequence's context before a test (untimed)
  int reps = 5;
  int64_t ctx_size = 0;       // 0 = the longer test's tokens + 1
  int64_t prefill_step = 512;
  std::string output = "md";
  std::vector<int> parallel = {1};  // concurrent sequences of the tg tests
  std::string routing_trace;        // --routing-trace: replay this trace's routing
  std::vector<int> lora_distinct;   // --lora-distinct: each D runs every row with D distinct adapters
  std::string text;                 // --text: token ids from this text instead of random ones
};

// --routing-trace: the trace, its map onto the model, and the trace token of each row of the
// step about to run (the model's route_override reads it).
struct Replay {
  experts::Trace trace;
  std::unique_ptr<experts::TraceMap> map;
  std::vector<int64_t> rows;
};

// The prompt of the --spec tg pair when the model has a tokenizer (ordinary prose: a drafter's
// acceptance depends on the text; random ids are used without a tokenizer).
constexpr const char* kSpecPrompt =
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a wooden screw press. Within fifty years,";

// Expert-tier counters summed over the timed runs of one row (the --spec pair's runs interleave,
// so each row sums its own windows).
struct ExpertWindow {
  uint64_t requests = 0, hits = 0, bytes_read = 0;
  uint64_t misses = 0, staged = 0, staged_used = 0;  // --prefetch-next: staged reads and those a layer used
  double stall_s = 0;                                 // seconds acquire() waited for disk reads
  uint64_t vram_hits = 0, vram_misses = 0, vram_bytes = 0;
  double vram_stall_s = 0;
  void add(const TierStats& t) {
    requests += t.ram.requests;
    hits += t.ram.hits;
    bytes_read += t.ram.bytes_read;
    misses += t.ram.misses;
    staged += t.ram.staged;
    staged_used += t.ram.staged_used;
    stall_s += t.ram.stall_s;
    vram_hits += t.vram.hits;
    vram_misses += t.vram.misses;
    vram_bytes += t.vram.bytes_copied;
    vram_stall_s += t.vram.stall_s;
  }
};

struct Result {
  std::string test;
  int n_prompt = 0, n_gen = 0;
  int64_t n_depth = 0;     // context before the test (-d)
  int n_seqs = 1;          // sequences decoded together (tg)
  int lora_distinct = -1;  // --lora-distinct: distinct adapters active in the batch (-1: not given)
  std::vector<double> ts;  // tokens per second per repetition (all sequences together)
  double hit_rate = 1.0, bytes_per_token = 0, experts_per_token = 0;
  double stall_s = 0;                                 // disk waits of the timed repetitions
  double staged_per_token = 0, staged_used_share = 0;  // --prefetch-next: reads per token; share of misses served
  double staged_wasted_per_token = 0;                  // --prefetch-next: staged reads no layer used, per token
  // The VRAM tier (expert slots of a GPU run whose experts do not all fit): hit rate, host->device
  // bytes per token and seconds compute waited for slot copies, over the timed repetitions.
  bool vram_tier = false;
  double vram_hit_rate = 1.0, h2d_bytes_per_token = 0, vram_stall_s = 0;
  // Speculative decoding (--spec mtp rows): "none" or "mtp", the verify steps' counts summed over
  // the timed repetitions, and whether every greedy output equalled the plain row's.
  std::string spec = "none";
  int draft_max = 0;
  int64_t steps = 0, drafted = 0, accepted = 0, emitted = 0;
  int auto_off_runs = 0;
  bool same_output = true;
  double acceptance() const { return drafted > 0 ? static_cast<double>(accepted) / drafted : 0; }
  double tokens_per_step() const { return steps > 0 ? static_cast<double>(emitted) / steps : 0; }
  double mean() const {
    double s = 0;
    for (double x : ts) s += x;
    return ts.empty() ? 0 : s / ts.size();
  }
  double sd() const {
    if (ts.size() < 2) return 0;
    const double m = mean();
    double s = 0;
    for (double x : ts) s += (x - m) * (x - m);
    return std::sqrt(s / (ts.size() - 1));
  }
};

std::vector<int32_t> random_ids(std::mt19937_64& rng, int n, int64_t vocab) {
  std::uniform_int_distribution<int64_t> d(0, vocab - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(d(rng));
  return v;
}

// The expert-cache columns of `r` from the counters of its timed runs over `tokens` tokens.
void set_expert_columns(Result& r, const Loaded& l, const ExpertWindow& w, double tokens) {
  r.experts_per_token = tokens > 0 ? static_cast<double>(w.requests) / tokens : 0;
  r.hit_rate = l.streaming ? (w.requests ? static_cast<double>(w.hits) / w.requests : 0.0) : 1.0;
  r.bytes_per_token = tokens > 0 ? static_cast<double>(w.bytes_read) / tokens : 0;
  r.stall_s = w.stall_s;
  r.staged_per_token = tokens > 0 ? static_cast<double>(w.staged) / tokens : 0;
  r.staged_wasted_per_token = tokens > 0 ? static_cast<double>(w.staged - std::min(w.staged, w.staged_used)) / tokens : 0;
  r.staged_used_share = w.misses ? static_cast<double>(w.staged_used) / static_cast<double>(w.misses) : 0;
  if (l.expert_slots) {
    r.vram_tier = true;
    const uint64_t n = w.vram_hits + w.vram_misses;
    r.vram_hit_rate = n ? static_cast<double>(w.vram_hits) / n : 0.0;
    r.h2d_bytes_per_token = tokens > 0 ? static_cast<double>(w.vram_bytes) / tokens : 0;
    r.vram_stall_s = w.vram_stall_s;
  }
}

// One row of the table: a pp (n_gen == 0) or tg (n_prompt == 0, n_seqs sequences together)
// test, with the per-sequence LoRA scales of --lora-distinct D. Its token ids come from its own
// generator (seed 1234, as every row's), so the rows of one test see the same ids whatever the
// order their repetitions run in.
struct Row {
  Result r;
  std::mt19937_64 rng{1234};
  std::vector<std::vector<float>> lora;  // [n_seqs][adapters]: SeqStep::lora; empty = the adapters' defaults
  ExpertWindow w;                        // expert-tier counters of its timed repetitions
  const std::vector<int32_t>* text = nullptr;  // --text: the text's token ids (null: random ids)
};

// n token ids for a row: the --text ids from `offset` on (wrapping around the text), or the
// row's next n random ids.
std::vector<int32_t> row_ids(Row& row, int n, int64_t offset, int64_t vocab) {
  if (row.text == nullptr) return random_ids(row.rng, n, vocab);
  const std::vector<int32_t>& t = *row.text;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[i] = t[static_cast<size_t>((offset + i) % static_cast<int64_t>(t.size()))];
  return ids;
}

// The SeqStep::lora of sequence q of a row, or an empty span (the defaults).
std::span<const float> lora_of(const Row& row, int q) {
  return row.lora.empty() ? std::span<const float>() : std::span<const float>(row.lora[static_cast<size_t>(q)]);
}

// The row of a pp (n_gen == 0) or tg test over n_seqs sequences after `depth` tokens of context, with `distinct` adapters
// (--lora-distinct: sequence q runs adapter q mod D at its default scale defaults[q mod D], every
// other adapter at 0; D = 0: all off; -1: no --lora-distinct, every sequence at the defaults and
// no test-name suffix).
Row make_row(int n_prompt, int n_gen, int n_seqs, int distinct, const std::vector<float>& defaults, int64_t depth) {
  Row row;
  Result& r = row.r;
  r.n_prompt = n_prompt;
  r.n_gen = n_gen;
  r.n_seqs = n_seqs;
  r.n_depth = depth;
  r.lora_distinct = distinct;
  r.test = n_gen == 0 ? strfmt("pp%d", n_prompt) : n_seqs == 1 ? strfmt("tg%d", n_gen) : strfmt("tg%d x%d", n_gen, n_seqs);
  if (depth > 0) r.test += strfmt(" @ d%lld", static_cast<long long>(depth));  // (llama-bench's name)
  if (distinct >= 0) {
    r.test += strfmt(" lora%d", distinct);
    row.lora.assign(static_cast<size_t>(n_seqs), std::vector<float>(defaults.size(), 0.0f));
    if (distinct > 0)
      for (int q = 0; q < n_seqs; ++q) {
        const size_t a = static_cast<size_t>(q % distinct);
        row.lora[static_cast<size_t>(q)][a] = defaults[a];
      }
  }
  return row;
}

// Token rows this run has put through the model (warm-ups and -d included): the denominator of
// the expert-parallel communication per token.
int64_t g_rows = 0;

// Fills a fresh state with `depth` random tokens (-d; untimed, in steps of `step`, no logits).
void fill_depth(models::Model& m, models::State& st, int64_t depth, int64_t step, std::mt19937_64& rng) {
  const int64_t V = m.spec().vocab_size;
  for (int64_t i = 0; i < depth; i += step) {
    const int64_t n = std::min(step, depth - i);
    const std::vector<int32_t> ids = random_ids(rng, static_cast<int>(n), V);
    const models::SeqStep one{std::span<const int32_t>(ids.data(), ids.size()), &st, models::LogitsMode::kNone, nullptr, nullptr, {}};
    m.forward_batch(std::span<const models::SeqStep>(&one, 1));
    g_rows += n;
  }
}

// One repetition of `row` (rep -1: the warm-up) on fresh sequence states (after -d tokens of
// context, untimed); a timed one adds its t/s (all sequences together) and its expert-tier
// counters to the row.
void run_rep(Loaded& l, Row& row, int rep, int64_t step, Replay* replay) {
  models::Model& m = *l.model;
  Result& r = row.r;
  const int64_t V = m.spec().vocab_size;
  const int n_prompt = r.n_prompt, n_gen = r.n_gen, n_seqs = r.n_seqs;
  std::mt19937_64 depth_rng(99);  // (the depth's ids: the same for every row and repetition)
  double dt = 0;
  if (n_gen == 0) {
    std::vector<float> logits(V);
    models::State st = m.new_state();
    fill_depth(m, st, r.n_depth, step, depth_rng);
    const TierStats before = stats_snapshot(l);
    const std::vector<int32_t> ids = row_ids(row, n_prompt, static_cast<int64_t>(rep + 1) * n_prompt, V);
    const double t0 = now_seconds();
    for (int64_t i = 0; i < n_prompt; i += step) {
      const int64_t n = std::min<int64_t>(step, n_prompt - i);
      if (replay) {
        replay->rows.resize(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) replay->rows[j] = (static_cast<int64_t>(rep + 1) * n_prompt + i + j) % replay->trace.n_tokens;
      }
      const models::SeqStep one{std::span<const int32_t>(ids.data() + i, n), &st,
                                i + n == n_prompt ? models::LogitsMode::kLast : models::LogitsMode::kNone, logits.data(), nullptr,
                                lora_of(row, 0)};
      m.forward_batch(std::span<const models::SeqStep>(&one, 1));
      g_rows += n;
    }
    dt = now_seconds() - t0;
    if (rep >= 0) row.w.add(stats_snapshot(l) - before);
  } else {
    // n_seqs sequences decoded together (one forward_batch step = one token of each).
    std::vector<models::State> states;
    std::vector<std::vector<int32_t>> ids;
    std::vector<std::vector<float>> out(n_seqs, std::vector<float>(V));
    for (int q = 0; q < n_seqs; ++q) {
      states.push_back(m.new_state());
      fill_depth(m, states.back(), r.n_depth, step, depth_rng);
      // (--text: sequence q reads the text where a replayed trace's sequence q would: tg_trace_token)
      ids.push_back(row_ids(row, n_gen, row.text ? experts::tg_trace_token(static_cast<int64_t>(row.text->size()), q, n_seqs, rep, n_gen, 0) : 0, V));
    }
    std::vector<models::SeqStep> step_seqs(n_seqs);
    const TierStats before = stats_snapshot(l);
    const double t0 = now_seconds();
    for (int i = 0; i < n_gen; ++i) {
      for (int q = 0; q < n_seqs; ++q)
        step_seqs[q] = {std::span<const int32_t>(&ids[q][i], 1), &states[q], models::LogitsMode::kLast, out[q].data(), nullptr, lora_of(row, q)};
      if (replay) {
        replay->rows.resize(static_cast<size_t>(n_seqs));
        for (int q = 0; q < n_seqs; ++q) replay->rows[q] = experts::tg_trace_token(replay->trace.n_tokens, q, n_seqs, rep, n_gen, i);
      }
      m.forward_batch(step_seqs);
      g_rows += n_seqs;
    }
    dt = now_seconds() - t0;
    if (rep >= 0) row.w.add(stats_snapshot(l) - before);
  }
  if (rep < 0) return;
  r.ts.push_back((n_gen == 0 ? n_prompt : static_cast<double>(n_gen) * n_seqs) / std::max(dt, 1e-9));
}

// The rows of one test (one per --lora-distinct value; a single row without it): a warm-up of
// each, then `reps` timed repetitions interleaved across the rows, in order on even repetitions
// and reversed on odd ones (drift of the machine's speed over the run falls on every row alike).
std::vector<Result> run_rows(Loaded& l, std::vector<Row> rows, int reps, int64_t step, Replay* replay) {
  for (Row& row : rows) run_rep(l, row, -1, step, replay);
  for (int rep = 0; rep < reps; ++rep)
    for (size_t k = 0; k < rows.size(); ++k) run_rep(l, rows[rep % 2 == 0 ? k : rows.size() - 1 - k], rep, step, replay);
  std::vector<Result> out;
  for (Row& row : rows) {
    Result& r = row.r;
    set_expert_columns(r, l, row.w, static_cast<double>(reps) * (r.n_gen == 0 ? r.n_prompt : static_cast<double>(r.n_gen) * r.n_seqs));
    out.push_back(std::move(r));
  }
  return out;
}

// The --spec tg pair: greedy generations of n_gen tokens from `prompt`, plain and with `spec`,
// one warm-up each, then `reps` timed runs each in the order plain, mtp, mtp, plain, ... (drift
// over the run falls on both rows alike). t/s = the tokens after the first over the decode time
// (Session's Timings: the prompt is not timed). Returns {plain, mtp}.
std::pair<Result, Result> run_spec_pair(Loaded& l, const std::vector<int32_t>& prompt, int n_gen, int reps, int64_t step,
                                        int64_t ctx_size, const engine::SpecParams& spec) {
  engine::Session session(*l.model);
  engine::GenerateRequest req;
  req.prompt = prompt;
  req.max_tokens = n_gen;
  req.sampling.temperature = 0;  // greedy; no stop ids: every run makes n_gen tokens
  req.prefill_step = step;
  req.ctx_size = ctx_size;
  Result plain, mtp;
  plain.n_gen = mtp.n_gen = n_gen;
  plain.test = strfmt("tg%d", n_gen);
  mtp.test = strfmt("tg%d mtp", n_gen);
  mtp.spec = "mtp";
  mtp.draft_max = spec.draft_max;
  ExpertWindow wp, wm;
  std::vector<int32_t> reference;  // the plain greedy output
  auto one = [&](bool with_spec, bool timed) {
    req.spec = with_spec ? spec : engine::SpecParams{};
    const TierStats before = stats_snapshot(l);
    const engine::GenerateResult res = session.generate(req, nullptr);
    const TierStats window = stats_snapshot(l) - before;
    if (static_cast<int>(res.output.size()) != n_gen)
      fail("bench: a generation made %zu tokens, not %d", res.output.size(), n_gen);
    if (!with_spec && reference.empty()) reference = res.output;
    Result& r = with_spec ? mtp : plain;
    r.same_output = r.same_output && res.output == reference;
    if (!timed) return;
    r.ts.push_back(res.timings.decode_tok_s());
    (with_spec ? wm : wp).add(window);
    if (with_spec) {
      r.steps += res.spec.steps;
      r.drafted += res.spec.drafted;
      r.accepted += res.spec.accepted;
      r.emitted += res.spec.emitted;
      r.auto_off_runs += res.spec.auto_off ? 1 : 0;
    }
  };
  one(false, false);  // warm-up (and the reference output)
  one(true, false);
  for (int rep = 0; rep < reps; ++rep) {
    const bool mtp_first = rep % 2 == 1;
    one(mtp_first, true);
    one(!mtp_first, true);
  }
  // Expert columns per generated token (the prompt's forwards included: they are few).
  set_expert_columns(plain, l, wp, static_cast<double>(reps) * n_gen);
  set_expert_columns(mtp, l, wm, static_cast<double>(reps) * n_gen);
  return {plain, mtp};
}

// The --spec tg pair's prompt: kSpecPrompt through the tokenizer (ids inside the model's
// vocabulary), else 32 pseudo-random ids.
std::vector<int32_t> spec_prompt(const std::optional<tokenizer::Tokenizer>& tok, int64_t vocab) {
  if (tok) {
    std::vector<int32_t> ids = tok->encode_prompt(kSpecPrompt);
    if (!ids.empty() && std::all_of(ids.begin(), ids.end(), [&](int32_t id) { return id >= 0 && id < vocab; })) return ids;
  }
  std::mt19937_64 rng(4321);
  return random_ids(rng, 32, vocab);
}

// Under mpirun (expert parallelism): what the ranks moved between them, per token row of the run,
// the time rank 0 spent in the collectives against the run's `seconds`, and each rank's peak RSS.
// A collective itself: every rank calls it.
// `ex`: the MoE exchange's communicator (MPI's world, or NCCL over its ranks: --comm); the
// figures are gathered over the world.
void print_comm_line(const dist::Comm& ex, double seconds) {
  dist::Comm& w = dist::world();
  const dist::CommStats st = ex.stats();
  const float mine[3] = {static_cast<float>(st.bytes_received), static_cast<float>(st.seconds), static_cast<float>(peak_rss_bytes())};
  std::vector<float> all;
  w.allgather_rows(mine, 1, 3, all);
  double bytes = 0;
  std::string rss;
  for (int r = 0; r < w.size(); ++r) {
    bytes += all[static_cast<size_t>(3 * r)];
    rss += (r ? ", " : "") + format_bytes(static_cast<uint64_t>(all[static_cast<size_t>(3 * r + 2)]));
  }
  std::printf("expert parallelism: %d ranks (%s): %s between ranks in all, %s per token row (%lld rows); rank 0 in collectives "
              "%.2f s of %.2f s (%.1f%%), %llu calls; peak RSS per rank: %s\n",
              w.size(), ex.name(), format_bytes(static_cast<uint64_t>(bytes)).c_str(),
              format_bytes(static_cast<uint64_t>(bytes / std::max<double>(1.0, static_cast<double>(g_rows)))).c_str(),
              static_cast<long long>(g_rows), st.seconds, seconds, 100.0 * st.seconds / std::max(seconds, 1e-9),
              static_cast<unsigned long long>(st.calls), rss.c_str());
}

void run(const BenchOptions& o) {
  const double t_run = now_seconds();
  if (o.n_prompt < 0 || o.n_gen < 0) throw UsageError("-p and -n must be >= 0");
  if (o.n_prompt == 0 && o.n_gen == 0) throw UsageError("nothing to run: -p and -n are both 0");
  if (o.n_depth < 0) throw UsageError(strfmt("-d must be >= 0 (got %lld)", (long long)o.n_depth));
  if (o.n_depth > 0 && !o.routing_trace.empty()) throw UsageError("-d and --routing-trace cannot be combined (the trace numbers the test's tokens)");
  if (o.reps < 1 || o.reps > 1000) throw UsageError(strfmt("-r must be 1..1000 (got %d)", o.reps));
  if (o.output != "md" && o.output != "json") throw UsageError(strfmt("-o must be md or json (got '%s')", o.output.c_str()));
  if (o.prefill_step < 1) throw UsageError(strfmt("--prefill-step-size must be positive (got %lld)", (long long)o.prefill_step));
  const engine::SpecParams spec = o.model.spec_params();  // UsageError for bad --spec / --draft-max values
  if (spec.mtp && o.n_gen == 0) throw UsageError("--spec mtp measures the tg test: -n must be > 0");
  if (spec.mtp && o.n_depth > 0) throw UsageError("-d and --spec mtp cannot be combined (the mtp pair generates from its own prompt)");
  if (spec.mtp && !o.routing_trace.empty()) throw UsageError("--routing-trace and --spec mtp cannot be combined (drafts route on their own)");
  for (size_t i = 0; i < o.lora_distinct.size(); ++i) {
    const int d = o.lora_distinct[i];
    if (d < 0 || d > static_cast<int>(o.model.lora.size()))
      throw UsageError(strfmt("--lora-distinct %d: needs 0..%zu (the number of --lora adapters loaded)", d, o.model.lora.size()));
    for (size_t k = 0; k < i; ++k)
      if (o.lora_distinct[k] == d) throw UsageError(strfmt("--lora-distinct lists %d twice", d));
  }
  if (spec.mtp && !o.lora_distinct.empty())
    throw UsageError("--lora-distinct and --spec mtp cannot be combined (the mtp pair runs every adapter at its --lora scale)");
  std::unique_ptr<Replay> replay;
  if (!o.text.empty() && !o.routing_trace.empty()) throw UsageError("--text and --routing-trace cannot be combined (the trace routes)");
  if (!o.text.empty() && spec.mtp) throw UsageError("--text and --spec mtp cannot be combined (the mtp pair generates from its own prompt)");
  if (!o.routing_trace.empty()) {
    replay = std::make_unique<Replay>();
    replay->trace = experts::read_trace(o.routing_trace);  // before loading: a bad trace fails fast
  }
  engine::LoadOptions lo = o.model.load_options();
  // The --spec pair generates after a prompt: the tokenizer first, to size the context.
  std::optional<tokenizer::Tokenizer> tok;
  if (spec.mtp || !o.text.empty()) tok = engine::load_tokenizer(lo.model_dir);
  std::vector<int32_t> text_ids;
  if (!o.text.empty()) {
    if (!tok) throw Error(strfmt("%s has no tokenizer.json; --text needs one", lo.model_dir.c_str()));
    text_ids = tok->encode(read_file(o.text), false);
    if (text_ids.size() < 2) throw Error(strfmt("--text %s: fewer than 2 tokens", o.text.c_str()));
  }
  std::vector<int32_t> prompt;
  int64_t needed = o.n_depth + std::max(o.n_prompt, o.n_gen) + 1;
  if (spec.mtp) {
    // The vocabulary is checked against the model after loading; the context needs the length only.
    prompt = spec_prompt(tok, std::numeric_limits<int32_t>::max());
    // (32: the random ids spec_prompt() falls back to when the text's ids are outside the vocabulary)
    needed = std::max<int64_t>(needed, static_cast<int64_t>(std::max<size_t>(prompt.size(), 32)) + o.n_gen + 1);
  }
  if (o.ctx_size < 0 || (o.ctx_size > 0 && o.ctx_size < needed))
    throw UsageError(strfmt("--ctx-size must hold the longer test (%lld tokens), or be 0 (got %lld)", (long long)needed, (long long)o.ctx_size));
  lo.ctx_size = o.ctx_size > 0 ? o.ctx_size : needed;
  lo.prefill_step = o.prefill_step;
  int max_seqs = 1;
  for (int n : o.parallel) {
    if (n < 1 || n > 256) throw UsageError(strfmt("--parallel values must be 1..256 (got %d)", n));
    max_seqs = std::max(max_seqs, n);
  }
  engine::LoadedModel l = engine::load(lo, std::move(tok));
  l.model->reserve_workspace(std::max<int64_t>(std::min<int64_t>(o.prefill_step, lo.ctx_size), max_seqs), max_seqs);
  const auto& s = l.model->spec();
  if (spec.mtp) {
    std::vector<int32_t> p = spec_prompt(l.tok, s.vocab_size);
    prompt = std::move(p);
  }
  if (replay) {
    replay->map = std::make_unique<experts::TraceMap>(replay->trace, moe_layers_of(s), s.moe.n_experts);
    Replay* r = replay.get();
    l.model->hooks.route_override = [r](int layer, int64_t row, std::span<int> ids, std::span<float> w) {
      if (row < 0 || row >= static_cast<int64_t>(r->rows.size())) fail("--routing-trace: step row %lld has no trace token", (long long)row);
      r->map->route(layer, r->rows[static_cast<size_t>(row)], ids, w);
    };
    if (o.model.prefetch_next > 0) {
      if (replay->trace.shape.guesses > 0) {
        l.model->hooks.guess_override = [r](int layer, int64_t row, std::span<int> g) {
          if (row < 0 || row >= static_cast<int64_t>(r->rows.size())) fail("--routing-trace: step row %lld has no trace token", (long long)row);
          return r->map->guess(layer, r->rows[static_cast<size_t>(row)], g);
        };
        log_info("--prefetch-next replays the trace's guesses (%d per token, made by the %s)", replay->trace.shape.guesses,
                 replay->trace.shape.guess_source.c_str());
      } else {
        log_warn("--prefetch-next with a trace without guesses (calibrate --trace-guesses): the guesses come from this checkpoint's "
                 "router, which has nothing to do with the replayed routing");
      }
    }
    const experts::TraceShape& ts = replay->trace.shape;
    log_info("routing replayed from %s: %lld tokens of %s (%zu MoE layers, %d experts, top-%d) onto %d MoE layers of %d experts, top-%d",
             o.routing_trace.c_str(), (long long)replay->trace.n_tokens, ts.model_type.c_str(), ts.moe_layers.size(), ts.n_experts,
             ts.top_k, static_cast<int>(replay->map->target_moe_layers().size()), s.moe.n_experts, s.moe.top_k);
  }
  std::vector<Result> results;
  // One row per --lora-distinct value of each test (one row without it), run interleaved.
  const std::vector<float> lora_defaults = l.model->lora ? l.model->lora->scales() : std::vector<float>{};
  const std::vector<int> distinct = o.lora_distinct.empty() ? std::vector<int>{-1} : o.lora_distinct;
  auto rows_of = [&](int n_prompt, int n_gen, int n_seqs) {
    std::vector<Row> rows;
    for (int d : distinct) {
      rows.push_back(make_row(n_prompt, n_gen, n_seqs, d, lora_defaults, o.n_depth));
      if (!text_ids.empty()) rows.back().text = &text_ids;
    }
    for (Result& r : run_rows(l, std::move(rows), o.reps, o.prefill_step, replay.get())) results.push_back(std::move(r));
  };
  if (o.n_prompt > 0) rows_of(o.n_prompt, 0, 1);
  if (o.n_gen > 0)
    for (int n : o.parallel) {
      if (spec.mtp && n == 1) {
        auto [plain, mtp] = run_spec_pair(l, prompt, o.n_gen, o.reps, o.prefill_step, lo.ctx_size, spec);
        results.push_back(std::move(plain));
        results.push_back(std::move(mtp));
      } else {
        rows_of(0, o.n_gen, n);
      }
    }
  engine::save_expert_profile(l);
  // The plain row of the --spec pair (the mtp row's speedup is over it).
  const Result* base = nullptr;
  for (const auto& r : results)
    if (spec.mtp && r.n_gen > 0 && r.n_seqs == 1 && r.spec == "none") base = &r;
  auto speedup = [&](const Result& r) { return base && r.spec != "none" && base->mean() > 0 ? r.mean() / base->mean() : 0.0; };
  const uint64_t size = l.ckpt->total_bytes();
  const std::string model = strfmt("%s %.1fB", s.model_type.c_str(), s.params_total / 1e9);
  const std::string backend =
      l.device == "cpu" ? strfmt("CPU (%s)%s", ops::simd_target_name(), l.streaming ? " +stream" : "")
                        : strfmt("CUDA (%s, %s)%s%s", l.device_name.c_str(), l.device.c_str(), l.experts_on_device ? " experts in VRAM"
                                 : l.experts_static ? strfmt(" experts static %.0f%% VRAM", 100.0 * l.vram_expert_share).c_str()
                                                    : " host experts",
                                 l.streaming ? " +stream" : "");
  // The host->device link of the GPU (pinned and pageable copies of 256 MiB), measured here.
  double h2d_pinned = 0, h2d_pageable = 0;
  if (l.device != "cpu") {
    const int idx = std::atoi(l.device.c_str() + 5);
    h2d_pinned = engine::h2d_gbps(idx, size_t{256} << 20, true);
    h2d_pageable = engine::h2d_gbps(idx, size_t{256} << 20, false);
  }
  const int threads = lo.threads;
  if (o.output == "json") {
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    for (const auto& r : results) {
      arr.push_back({{"model_type", model},
                     {"model_size", size},
                     {"model_n_params", s.params_total},
                     {"backend", backend},
                     {"n_threads", threads},
                     {"n_prompt", r.n_prompt},
                     {"n_gen", r.n_gen},
                     {"n_depth", r.n_depth},
                     {"test", r.test},
                     {"n_parallel", r.n_seqs},
                     {"avg_ts", r.mean()},
                     {"stddev_ts", r.sd()},
                     {"samples_ts", r.ts},
                     {"streaming", l.streaming != nullptr},
                     {"cache_hit_rate", r.hit_rate},
                     {"bytes_read_per_token", r.bytes_per_token},
                     {"experts_acquired_per_token", r.experts_per_token},
                     {"peak_rss_bytes", peak_rss_bytes()},
                     {"device", l.device},
                     {"h2d_pinned_gbps", h2d_pinned},
                     {"h2d_pageable_gbps", h2d_pageable}});
      if (replay) arr.back()["routing_trace"] = o.routing_trace;
      if (!o.model.lora.empty()) arr.back()["n_lora"] = o.model.lora.size();
      if (r.lora_distinct >= 0) arr.back()["lora_distinct"] = r.lora_distinct;
      if (l.streaming) arr.back()["stall_s"] = r.stall_s;
      if (o.model.prefetch_next > 0 || o.model.route_by_predictor) {
        arr.back()["prefetch_next_reads_per_token"] = r.staged_per_token;
        arr.back()["prefetch_next_wasted_per_token"] = r.staged_wasted_per_token;  // experts read early that no layer used
        arr.back()["prefetch_next_served_share"] = r.staged_used_share;  // of the misses
      }
      if (spec.mtp && r.n_prompt == 0 && r.n_seqs == 1) {
        // The --spec pair: both rows say which they are; the mtp row carries the verify counts.
        auto& j = arr.back();
        j["spec"] = r.spec;
        j["n_prompt_tokens"] = prompt.size();  // the generations' prompt (not timed)
        j["same_output"] = r.same_output;
        if (r.spec != "none") {
          j["draft_max"] = r.draft_max;
          j["acceptance"] = r.acceptance();
          j["tokens_per_step"] = r.tokens_per_step();
          j["steps"] = r.steps;
          j["drafted"] = r.drafted;
          j["accepted"] = r.accepted;
          j["auto_off_runs"] = r.auto_off_runs;
          j["speedup"] = speedup(r);
        }
      }
      if (r.vram_tier) {
        arr.back()["vram_hit_rate"] = r.vram_hit_rate;
        arr.back()["h2d_bytes_per_token"] = r.h2d_bytes_per_token;
        arr.back()["vram_stall_s"] = r.vram_stall_s;
      }
    }
    std::printf("%s\n", arr.dump(2).c_str());
    return;
  }
  // --spec mtp: acceptance, tokens per verify step and speedup over the plain tg row ("-" where
  // they do not apply).
  const char* spec_head = spec.mtp ? " acceptance | tokens/step | speedup |" : "";
  const char* spec_rule = spec.mtp ? " ---------: | ----------: | ------: |" : "";
  std::printf("| model | size | params | backend | threads | test | t/s | expert hit rate | read/token | experts/token |%s\n", spec_head);
  std::printf("| ----- | ---: | -----: | ------- | ------: | ---: | --: | --------------: | ---------: | ------------: |%s\n", spec_rule);
  for (const auto& r : results) {
    std::string extra;
    if (spec.mtp)
      extra = r.spec == "none" ? " - | - | - |" : strfmt(" %.3f | %.2f | %.2fx |", r.acceptance(), r.tokens_per_step(), speedup(r));
    std::printf("| %s | %s | %.2f M | %s | %d | %s | %.2f ± %.2f | %.1f%% | %s | %.1f |%s\n", model.c_str(), format_bytes(size).c_str(),
                s.params_total / 1e6, backend.c_str(), threads, r.test.c_str(), r.mean(), r.sd(), 100.0 * r.hit_rate,
                format_bytes(static_cast<uint64_t>(r.bytes_per_token)).c_str(), r.experts_per_token, extra.c_str());
  }
  std::printf("\npeak RSS %s\n", format_bytes(peak_rss_bytes()).c_str());
  if (dist::launched_by_mpi())
    print_comm_line(l.expert_parallel.comm != nullptr ? *l.expert_parallel.comm : dist::world(), now_seconds() - t_run);
  if (!o.lora_distinct.empty())
    std::printf("loraD rows: D of the %zu --lora adapters active, sequence i of a batch running adapter i mod D at its scale "
                "(pp: adapter 0; lora0: every adapter loaded, all off); repetitions interleaved across D\n",
                o.model.lora.size());
  else if (!o.model.lora.empty())
    std::printf("every row runs the %zu --lora adapter(s) at their scales\n", o.model.lora.size());
  if (replay)
    std::printf("routing replayed from %s (%lld tokens, %d experts top-%d onto %d top-%d; docs/routing-trace.md)\n",
                o.routing_trace.c_str(), (long long)replay->trace.n_tokens, replay->trace.shape.n_experts, replay->trace.shape.top_k,
                s.moe.n_experts, s.moe.top_k);
  if (l.device != "cpu")
    std::printf("%s: %s uploaded; host->device %.1f GB/s pinned, %.1f GB/s pageable (cudaMemcpy of 256 MiB)\n", l.device.c_str(),
                format_bytes(l.vram_used).c_str(), h2d_pinned, h2d_pageable);
  for (const auto& r : results)
    if (r.spec != "none")
      std::printf("%s: %d draft(s) per step, acceptance %.3f (%lld of %lld), %.2f tokens per verify step, %.2fx the plain tg%d "
                  "row (greedy, same %zu-token prompt, repetitions interleaved)%s%s\n",
                  r.test.c_str(), r.draft_max, r.acceptance(), (long long)r.accepted, (long long)r.drafted, r.tokens_per_step(),
                  speedup(r), r.n_gen, prompt.size(),
                  r.auto_off_runs ? strfmt("; auto-off (acceptance below %.2f) in %d of %zu runs", spec.min_acceptance,
                                           r.auto_off_runs, r.ts.size()).c_str() : "",
                  r.same_output ? "; output identical to the plain row's" : "; OUTPUT DIFFERS from the plain row's");
  for (const auto& r : results)
    if (r.vram_tier)
      std::printf("%s VRAM slots: hit rate %.1f%%, host->device %s/token, compute waited %.3f s for slot copies\n", r.test.c_str(),
                  100.0 * r.vram_hit_rate, format_bytes(static_cast<uint64_t>(r.h2d_bytes_per_token)).c_str(), r.vram_stall_s);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* c = app.add_subcommand("bench", "Throughput in llama-bench format: pp (prompt) and tg (generation) t/s, expert-cache columns");
  o->model.add_to(c);
  o->model.add_spec_to(c);
  o->model.add_warm_start_to(c);
  c->add_option("-p,--n-prompt", o->n_prompt, "Prompt tokens of the pp test (default 512; 0 = skip)");
  c->add_option("-n,--n-gen", o->n_gen, "Generated tokens of the tg test (default 128; 0 = skip)");
  c->add_option("-d,--n-depth", o->n_depth, "Tokens of context each test runs after (random ids, untimed; default 0)");
  c->add_option("-r,--repetitions", o->reps, "Timed repetitions per test (default 5; one warm-up run first)");
  c->add_option("-o,--output", o->output, "Output format: md or json (default md)");
  c->add_option("-c,--ctx-size", o->ctx_size, "Context the expert-cache budget leaves KV room for (default 0 = the longer test + 1)");
  c->add_option("--prefill-step-size", o->prefill_step, "Prompt tokens per forward pass of the pp test (default 512)");
  c->add_option("--parallel", o->parallel,
                "Concurrent sequences of the tg test, comma-separated (e.g. 1,2,4,8): each N adds a 'tgNNN xN' row, "
                "t/s summed over the N sequences decoded together (default 1)")
      ->delimiter(',');
  o->model.add_lora_to(c);
  c->add_option("--lora-distinct", o->lora_distinct,
                "With --lora: run every pp/tg row once per D in this comma-separated list (e.g. 0,1,4), with D distinct "
                "adapters active: sequence i of a batch runs adapter i mod D at its --lora scale, the others 0 (pp: "
                "adapter 0; D = 0: all off, the base cost with the adapters loaded); rows 'tgNNN xN loraD', "
                "repetitions interleaved across D. D must be <= the number of --lora adapters")
      ->delimiter(',');
  c->add_option("--text", o->text,
                "Token ids from this text (through the model's tokenizer) instead of random ids: the pp prompt and each tg "
                "sequence's forced tokens are consecutive text, so a trained model routes as on real traffic");
  c->add_option("--routing-trace", o->routing_trace,
                "Force every MoE layer's routing to this trace's (spool calibrate --trace-out), mapped onto the model's "
                "layers and experts (docs/routing-trace.md); use -p 0 to compare with spool plan --trace");
  c->callback([o] { run(*o); });
}

}  // namespace spool::cli
