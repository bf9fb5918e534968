// The expert-provider seam: the model asks for the routed experts of a layer and gets
// WeightViews, never knowing whether they are resident, streamed from disk or quantized.
#pragma once

#include <algorithm>
#include <cstdint>
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
  /// A guess that experts `ids` of `layer` will be asked for soon (the next MoE layer's router
  /// applied early: models::DecoderModel::set_next_layer_prefetch), best first. A provider that
  /// reads from disk may start reading those it does not hold, in that order, into a staging area that never evicts
  /// cached experts; a wrong guess costs bandwidth only. Never blocks on I/O, never throws for
  /// a read. Default: nothing.
  virtual void hint(int layer, std::span<const int> ids) {
    (void)layer;
    (void)ids;
  }
  /// Undoes a prepare(layer, ids) whose acquire() will not come (an error in between).
  virtual void unprepare(int layer, std::span<const int> ids) {
    (void)layer;
    (void)ids;
  }
  /// acquire() for those of `ids` that are available without waiting for I/O (in memory now):
  /// out[i] and got[i] = 1 for each of them (valid until release(layer), like acquire()'s),
  /// got[i] = 0 for the others, which are left alone. Never blocks on I/O; returns how many it
  /// acquired. A tier in front of this provider uses it to start copies early (DeviceExpertCache
  /// ::prepare). Default: acquires nothing.
  virtual size_t acquire_available(int layer, std::span<const int> ids, std::span<ExpertWeights> out, std::span<uint8_t> got) {
    (void)layer, (void)out;
    std::fill(got.begin(), got.end(), uint8_t{0});
    (void)ids;
    return 0;
  }
  /// The views handed out by the last acquire(layer) are no longer used.
  virtual void release(int layer) = 0;
  /// One-line description for startup logs.
  virtual std::string describe() const = 0;
  /// A backend table of every routed expert of `layer` (ops::Backend::make_expert_table) when
  /// they all stay where that backend's kernels can read them for as long as this provider
  /// lives (experts uploaded to a GPU once): the MoE block then routes and runs the experts on
  /// the device (Backend::expert_ffn_routed) without acquire() / release() and without taking
  /// the routing ids to the host. nullptr (the default): experts go through acquire().
  virtual const void* device_table(int layer) const {
    (void)layer;
    return nullptr;
  }
  /// True when the MoE block should acquire in two halves (begin_acquire, finish_acquire) and
  /// compute the experts the first half hands out while the rest are read. Default: false.
  virtual bool compute_while_reading() const { return false; }
  /// The first half of acquire(layer, ids, out): the same bookkeeping as acquire() for every id,
  /// in order (so hit rates and evictions are acquire()'s), and the reads of the missing experts
  /// started; out[i] and got[i] = 1 for the experts whose bytes are in memory now, got[i] = 0 for
  /// the others. Never waits for I/O. finish_acquire() must follow before release(layer).
  /// Default: acquire() of every id, all got.
  virtual void begin_acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out, std::span<uint8_t> got) {
    acquire(layer, ids, out);
    std::fill(got.begin(), got.end(), uint8_t{1});
  }
  /// The second half: waits for the experts with got[i] == 0 and fills their out[i]. `ids` and
  /// `got` are begin_acquire()'s. Throws spool::Error as acquire() does (a failed read), having
  /// undone the call's pins; release(layer) is still called after. Default: nothing.
  virtual void finish_acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out, std::span<const uint8_t> got) {
    (void)layer, (void)ids, (void)out, (void)got;
  }
  /// True when acquire() never waits: every expert stays in memory for this provider's life
  /// (ResidentExperts), so nothing needs to run between prepare() and acquire() to hide reads.
  /// Default: false.
  virtual bool in_memory() const { return false; }
  /// Most experts that may be acquired at once (callers split larger sets into batches,
  /// releasing each batch before acquiring the next).
  virtual int max_batch() const { return 1 << 30; }
};

}  // namespace spool::experts
