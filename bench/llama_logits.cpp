// llama.cpp's view of a token sequence, for bench/gguf_agree.sh (built there against a llama.cpp
// build; not part of spool's build). Runs the ids through llama.cpp on the CPU (no weight
// repacking: its AMX repack crashed on the dev VM) in one batch and prints, for every position i,
// "tf i next ID lp LOGPROB argmax ID margin NATS": the log-probability of the next id (teacher
// forcing), llama.cpp's own top-1 and its margin over the second; then N_GEN greedy steps
// ("step s id ID lp LOGPROB margin NATS second ID").
// usage: llama_logits MODEL.gguf ID,ID,... N_GEN [THREADS]   (exit 1: load / decode failed, 2: usage)
#include "llama.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

// The two largest entries of l[0, n) (a >= b) and log-sum-exp of all of them (for log-probabilities).
static void top2(const float* l, int n, int& a, int& b, double& lse) {
  a = 0; b = 1;
  if (l[b] > l[a]) std::swap(a, b);
  for (int i = 2; i < n; ++i) {
    if (l[i] > l[a]) { b = a; a = i; } else if (l[i] > l[b]) b = i;
  }
  double m = l[a], s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(double(l[i]) - m);
  lse = m + std::log(s);
}

int main(int argc, char** argv) {
  if (argc < 4) { std::fprintf(stderr, "usage: %s MODEL ids n_gen [threads]\n", argv[0]); return 2; }
  std::vector<llama_token> ids;
  { std::stringstream ss(argv[2]); std::string t; while (std::getline(ss, t, ',')) ids.push_back(std::atoi(t.c_str())); }
  if (ids.empty() || ids.size() > 500) { std::fprintf(stderr, "llama_logits: give 1 to 500 token ids\n"); return 2; }
  const int n_gen = std::atoi(argv[3]);
  if (n_gen < 0 || n_gen > 500) { std::fprintf(stderr, "llama_logits: N_GEN must be in [0, 500]\n"); return 2; }
  const int threads = argc > 4 ? std::atoi(argv[4]) : 2;
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.use_extra_bufts = false;  // no CPU repacking (AMX repack crashed on this VM)
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) { std::fprintf(stderr, "load failed\n"); return 1; }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 1024; cp.n_batch = 512; cp.n_ubatch = 512;
  cp.n_threads = threads; cp.n_threads_batch = threads;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) { std::fprintf(stderr, "context failed\n"); return 1; }
  const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
  for (llama_token t : ids)
    if (t < 0 || t >= nv) { std::fprintf(stderr, "llama_logits: token id %d outside [0, %d)\n", t, nv); return 2; }
  llama_batch batch = llama_batch_init(512, 0, 1);
  batch.n_tokens = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    batch.token[i] = ids[i]; batch.pos[i] = (llama_pos)i; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = 0; batch.logits[i] = 1;
    batch.n_tokens++;
  }
  if (llama_decode(ctx, batch)) { std::fprintf(stderr, "decode failed\n"); return 1; }
  std::printf("prompt_argmax");
  int a = 0, b = 0; double lse = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* l = llama_get_logits_ith(ctx, (int)i);
    top2(l, nv, a, b, lse);
    std::printf(" %d(lp=%.4f,margin=%.4f)", a, l[a] - lse, l[a] - l[b]);
  }
  std::printf("\n");
  for (size_t i = 0; i + 1 < ids.size(); ++i) {  // teacher forced: the log-probability of the next prompt id
    const float* l = llama_get_logits_ith(ctx, (int)i);
    top2(l, nv, a, b, lse);
    std::printf("tf %zu next %d lp %.5f argmax %d margin %.5f\n", i, ids[i + 1], l[ids[i + 1]] - lse, a, l[a] - l[b]);
  }
  const float* l = llama_get_logits_ith(ctx, (int)ids.size() - 1);
  std::printf("last_logits_first8");
  for (int i = 0; i < 8; ++i) std::printf(" %.5f", l[i]);
  std::printf("\n");
  std::vector<int> gen;
  llama_pos pos = (llama_pos)ids.size();
  for (int s = 0; s < n_gen; ++s) {
    l = llama_get_logits_ith(ctx, -1);
    top2(l, nv, a, b, lse);
    std::printf("step %d id %d lp %.5f margin %.5f second %d\n", s, a, l[a] - lse, l[a] - l[b], b);
    gen.push_back(a);
    batch.n_tokens = 1; batch.token[0] = a; batch.pos[0] = pos++; batch.n_seq_id[0] = 1; batch.seq_id[0][0] = 0; batch.logits[0] = 1;
    if (llama_decode(ctx, batch)) { std::fprintf(stderr, "decode failed\n"); return 1; }
  }
  std::printf("greedy");
  for (int g : gen) std::printf(" %d", g);
  std::printf("\n");
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
