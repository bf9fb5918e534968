// The expert-provider seam: the model asks for the routed experts of a layer and gets
// WeightViews, never knowing whether they are resident, streamed from disk or quantized.
#pragma once

#include <span>
#include <string>

#include "ops/backend.h"

namespace spool::experts {

/// The three projections of one routed expert: gate/up [I, H], down [H, I] (ops/backend.h).
using ExpertWeights = ops::ExpertMats;

/// Supplies routed-expert weights to the MoE block.
class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;
  /// Makes experts `ids` of `layer` available; out[i] receives the views of ids[i], valid
  /// until release(layer). Throws spool::Error if an expert cannot be provided (e.g. read error).
  virtual void acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out) = 0;
  /// A hint that experts `ids` of `layer` will be acquired soon: a provider that reads from
  /// disk starts reading the missing ones in the background and returns at once, so the
  /// caller can compute something else (the shared expert, another group of sequences)
  /// while the reads run. Never blocks on I/O and never throws for a failed read (the
  /// acquire() that follows reads again and reports it). Default: nothing.
  virtual void prepare(int layer, std::span<const int> ids) {
    (void)layer;
    (void)ids;
  }
  /// The views handed out by the last acquire(layer) are no longer used.
  virtual void release(int layer) = 0;
  /// One-line description for startup logs.
  virtual std::string describe() const = 0;
  /// Most experts that may be acquired at once (callers split larger sets into batches,
  /// releasing each batch before acquiring the next).
  virtual int max_batch() const { return 1 << 30; }
};

}  // namespace spool::experts
