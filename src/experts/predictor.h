// Trained next-layer expert predictors (the seeds' edge0 "prerouter"; docs/predictor.md and
// ../docs/predictor-heads.md): one small head per MoE layer j reads the residual stream that
// enters the previous MoE layer's FFN — the point where the next-layer prefetch runs
// (models::DecoderModel) — and scores layer j's experts one layer ahead.
//
// A head's scores for a residual row h [H]:
//   u = h / sqrt(mean(h^2) + eps)                      (RMS norm without a weight)
//   s = W u + b  [+ W2 relu(W1 u + b1)]                (linear part, optional ReLU branch of width D)
// The linear part starts at the target layer's own router composed with its FFN norm
// (W = W_router diag(g), b = the router's bias), so an untrained head ranks experts as
// MoeBlock::predict does for softmax routers; the branch starts at zero. Training
// (train_head) fits the heads to a text's routing with softmax cross-entropy against the
// uniform distribution over each row's chosen experts (Adam), keeping the epoch with the best
// recall on a validation tail of the rows (epoch 0, the router itself, included).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spool::experts {

/// One predictor head (see the file comment). Matrices are row-major f32.
struct PredictorHead {
  int target_layer = -1;  // decoder layer whose experts it scores
  int source_layer = -1;  // decoder layer whose FFN input (residual stream) it reads
  int mlp = 0;            // D: width of the ReLU branch (0: linear head)
  std::vector<float> w;   // [E, H]
  std::vector<float> b;   // [E]
  std::vector<float> w1;  // [D, H]
  std::vector<float> b1;  // [D]
  std::vector<float> w2;  // [E, D]
};

/// The heads of one model, by target layer. Built by `spool calibrate --train-predictor`,
/// read by `--predictor FILE` (safetensors; docs/predictor.md gives the layout).
class ExpertPredictor {
 public:
  ExpertPredictor() = default;
  /// Empty predictor for a model of this shape (config.json model_type, decoder layers,
  /// hidden size H, routed experts E, experts per token, the model's rms_norm_eps).
  ExpertPredictor(std::string model_type, int n_layers, int hidden, int n_experts, int top_k, float eps);

  /// Adds (or replaces) the head of head.target_layer. Throws spool::Error when its layers are
  /// out of range, source >= target, or a matrix has the wrong size.
  void add(PredictorHead head);
  /// The head predicting `target_layer`, or nullptr.
  const PredictorHead* head(int target_layer) const;
  /// The head that reads `source_layer`'s FFN input, or nullptr.
  const PredictorHead* head_from(int source_layer) const;
  /// Scores of rows h [T, H] (the source layer's residual stream, not normalised) into out [T, E].
  void scores(const PredictorHead& head, const float* h, int64_t T, float* out) const;
  /// Scores of rows u [T, H] that are already normalised (normalise()).
  void scores_normed(const PredictorHead& head, const float* u, int64_t T, float* out) const;
  /// u = h / sqrt(mean(h^2) + eps), row by row: h, u [T, H] (may alias).
  void normalise(const float* h, int64_t T, float* u) const;
  /// The m best experts of each row of h [T, H], best first (ties: the lower id): out [T, m].
  /// m is clamped to E by the caller's contract: throws spool::Error for m < 1 or m > E.
  void top_m(const PredictorHead& head, const float* h, int64_t T, int m, int* out) const;

  /// Writes the predictor to `path` (safetensors, written to path.tmp then renamed).
  void save(const std::string& path) const;
  /// Reads a predictor file. Throws spool::Error naming the file for a missing or corrupt
  /// file, a foreign format or version, or a head whose tensors have the wrong shape.
  static ExpertPredictor load(const std::string& path);
  /// Throws spool::Error naming `label` unless the predictor was made for a model of this shape.
  void check_matches(const std::string& label, const std::string& model_type, int n_layers, int hidden, int n_experts) const;

  const std::string& model_type() const { return model_type_; }
  int n_layers() const { return n_layers_; }
  int hidden() const { return hidden_; }
  int n_experts() const { return n_experts_; }
  int top_k() const { return top_k_; }
  float eps() const { return eps_; }
  /// The heads, ascending by target layer.
  const std::vector<PredictorHead>& heads() const { return heads_; }

 private:
  std::string model_type_;
  int n_layers_ = 0, hidden_ = 0, n_experts_ = 0, top_k_ = 0;
  float eps_ = 1e-6f;
  std::vector<PredictorHead> heads_;
};

/// Training settings of train_head (spool calibrate --predictor-* flags).
struct PredictorTrainOptions {
  int epochs = 20;         // passes over the training rows
  int batch = 64;          // rows per Adam step
  float lr = 1e-3f;        // Adam step size
  float validation = 0.1f; // share of the rows (the last ones) kept for choosing the epoch
  uint64_t seed = 1;       // row shuffling and the branch's initial weights
};

/// What train_head measured on the validation rows: recall at m = k and m = 2k of the head at
/// epoch 0 (the router) and of the epoch kept.
struct PredictorTrainReport {
  double router_recall_k = 0, router_recall_2k = 0;
  double head_recall_k = 0, head_recall_2k = 0;
  int epoch = 0;  // the epoch kept (0: the initial head)
  int64_t train_rows = 0, validation_rows = 0;
};

/// Trains `head` (initialised: see the file comment; head.mlp > 0 gets its branch's initial
/// weights here) on rows u [N, H] (normalised inputs) with targets [N, K] (each row's chosen
/// experts); keeps the epoch whose validation recall@k + recall@2k is highest. Throws
/// spool::Error when no row is left for training or validation, a target is out of range, or
/// an option is out of range (batch < 1, epochs < 0, lr <= 0, validation outside (0, 1)).
PredictorTrainReport train_head(const ExpertPredictor& p, PredictorHead& head, const float* u, const int* targets, int64_t N, int K,
                                const PredictorTrainOptions& opt);

/// Mean over rows of |targets(row) ∩ best m of scores(row)| / K; scores [N, E], targets [N, K].
double recall_at(const float* scores, const int* targets, int64_t N, int E, int K, int m);

}  // namespace spool::experts
