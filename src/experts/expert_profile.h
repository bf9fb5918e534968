// Expert profiles (--expert-profile FILE, docs/streaming.md#warm-starts): an exponentially
// decayed count of every routed (MoE layer, expert) decision of the traffic a model served,
// kept in a JSON file across restarts. At load the hottest experts of the file are read into
// the streaming cache (StreamingOptions::warm), so a restarted server starts near its steady
// hit rate instead of from an empty cache; the outputs do not change (only when bytes are read).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "experts/cache.h"

namespace spool::io {
class Checkpoint;
}

namespace spool::experts {

/// The model a profile belongs to (the file's header).
struct ProfileShape {
  std::string model_type;       // config.json model_type
  int n_layers = 0;             // decoder layers (MoE or not)
  std::vector<int> moe_layers;  // indices of the MoE layers, ascending
  int n_experts = 0;            // routed experts per MoE layer
  int top_k = 0;                // experts routed per token (informational)
  std::string router_hash;      // router_fingerprint() of the checkpoint: 16 hex digits
  uint64_t expert_bytes = 0;    // bytes of the routed experts in the checkpoint (informational)
  /// Why a profile of shape `file` is not this model's ("" when it is): the first of
  /// model_type, n_layers, moe_layers, n_experts and router_hash that differs, both values named.
  std::string mismatch(const ProfileShape& file) const;
};

/// A profile as stored: its shape, the half-life it was decayed with, the tokens recorded in
/// all runs, their decayed number (`weight`) and the decayed counts [ordinal * n_experts + e]
/// for MoE layer moe_layers[ordinal].
struct ProfileData {
  ProfileShape shape;
  double half_life = 0;      // tokens
  uint64_t tokens_total = 0;
  double weight = 0;
  std::vector<double> counts;
};

/// The profile file format version (the header's "version"); readers refuse others.
inline constexpr int kProfileVersion = 1;
/// --expert-profile-half-life's default, in tokens.
inline constexpr double kDefaultProfileHalfLife = 100000;

/// Reads a profile file. Throws spool::Error naming the file and the problem: unreadable, not
/// JSON (a truncated file), another format or version, a missing or mistyped header field,
/// moe_layers not ascending within n_layers, counts not one list of n_experts finite
/// non-negative numbers per MoE layer, a non-positive half-life.
ProfileData read_profile(const std::string& path);

/// Writes `d` to `path` atomically (a temporary file, fsync, rename: a crash leaves the old
/// file or the new one, never a partial one); counts with 6 significant digits. Throws
/// spool::Error naming the file.
void write_profile(const std::string& path, const ProfileData& d);

/// The (layer, expert) pairs of `d` with a count > 0, hottest first (ties: lower layer, then
/// lower expert).
std::vector<std::pair<int, int>> hottest(const ProfileData& d);

/// How often each routed expert of each layer was routed to, from `path`: an expert profile
/// (read_profile: its decayed counts) or a routing trace (docs/routing-trace.md: its records
/// counted), told apart by the first line's "format". [n_layers][n_experts] for a model of
/// `n_layers` layers (MTP layers after them included) and `n_experts` experts: the file's MoE
/// layers filled, the others empty. Throws spool::Error naming the file for a file of neither
/// format, one of another expert count, a MoE layer at or beyond n_layers, or no routing at all.
std::vector<std::vector<double>> routing_load(const std::string& path, int n_layers, int n_experts);
/// The (layer, expert) counts of `d` that are > 0, as prior request counts for the cache's
/// kLfu policy (ExpertCache::seed; docs/streaming.md#replacement-policy).
std::vector<ExpertCount> profile_counts(const ProfileData& d);

/// A fingerprint of the routing function: a 64-bit hash (16 hex digits) of the names, shapes
/// and bytes of the router tensors of `moe_layers` (tensors "layers.L.[...].{stem}.*" with
/// `router_stem` e.g. "mlp.gate" or "gate", the router weight name without ".weight"). A
/// repacked checkpoint (experts and router rows permuted) or another model has another; a
/// conversion that keeps the routers' bytes has the same. `*hashed` (optional) gets the number
/// of tensors hashed.
std::string router_fingerprint(const io::Checkpoint& ckpt, const std::vector<int>& moe_layers, const std::string& router_stem,
                               int* hashed = nullptr);

/// The decayed routing counts of a running model. record() is called for every (MoE layer,
/// token) routing decision; each token (a record of the first MoE layer) advances the clock by
/// one, and a count recorded `a` tokens ago weighs 2^(-a / half_life). Thread-safe.
class ExpertProfile {
 public:
  /// Empty counts for a model of `shape`. UsageError for a half-life that is not a positive
  /// finite number of tokens.
  ExpertProfile(ProfileShape shape, double half_life);
  /// Starts from a stored profile's counts, tokens and weight (which must have this shape's
  /// moe_layers and n_experts: spool::Error otherwise).
  void seed(const ProfileData& d);
  /// One token's experts at decoder layer `layer`. Layers that are not MoE layers and experts
  /// outside [0, n_experts) are ignored.
  void record(int layer, std::span<const int> experts);
  /// The counts decayed to now, with this profile's shape and half-life.
  ProfileData snapshot() const;
  /// Tokens recorded, in this run and the seeded ones (a save is due when it changed).
  uint64_t tokens_total() const;
  /// Tokens recorded since construction (not the seeded ones).
  uint64_t tokens_this_run() const;
  const ProfileShape& shape() const { return shape_; }
  double half_life() const { return half_life_; }

 private:
  void renormalize();  // under mu_: folds the growth factor into the counts
  ProfileShape shape_;
  double half_life_;
  mutable std::mutex mu_;
  // Counts in units of growth_: the real, decayed count is acc_ / growth_ (growth_ = 2^(clock /
  // half_life), clock = tokens since the last renormalize()).
  std::vector<double> acc_;
  std::vector<int> ordinal_;  // [decoder layer] -> MoE ordinal, or -1
  double weight_acc_ = 0;
  double growth_ = 1;
  int64_t clock_ = 0;
  uint64_t tokens_total_ = 0;
  uint64_t tokens_run_ = 0;
};

/// Saves a profile to its file every `interval_s` seconds (0: never periodically) when tokens
/// were recorded since the last save (the first: since the profile was seeded), and once more at
/// finish() / destruction. A failed write is logged (warning), never
/// thrown: serving goes on.
class ProfileSaver {
 public:
  ProfileSaver(std::shared_ptr<const ExpertProfile> profile, std::string path, double interval_s);
  ~ProfileSaver();
  ProfileSaver(const ProfileSaver&) = delete;
  ProfileSaver& operator=(const ProfileSaver&) = delete;
  /// Stops the periodic saves and writes the profile a last time (if anything was recorded
  /// since the last save). Idempotent.
  void finish();
  /// Writes now when tokens were recorded since the last save; true when it wrote. `announce`:
  /// log the save (the periodic ones are quiet).
  bool save_if_changed(bool announce = true);

 private:
  std::shared_ptr<const ExpertProfile> profile_;
  std::string path_;
  double interval_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t saved_tokens_ = 0;
  std::mutex save_mu_;
  std::thread thread_;
};

}  // namespace spool::experts
