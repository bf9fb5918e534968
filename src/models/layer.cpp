#include "models/layer.h"

#include "models/attention.h"
#include "models/ffn.h"
#include "models/gated_deltanet.h"
#include "models/mla.h"

namespace spool::models {

std::unique_ptr<TokenMixer> make_token_mixer(const ModelSpec& spec, int layer, GdnLayout gdn_layout) {
  switch (spec.mixers.at(static_cast<size_t>(layer))) {
    case MixerKind::kAttention: return std::make_unique<AttentionLayer>();
    case MixerKind::kMLA: return std::make_unique<MlaLayer>();
    case MixerKind::kGatedDeltaNet: break;
  }
  return std::make_unique<GatedDeltaNetLayer>(gdn_layout);
}

std::unique_ptr<Ffn> make_ffn(const ModelSpec& spec, int layer) {
  if (spec.ffns.at(static_cast<size_t>(layer)) == FfnKind::kDense) return std::make_unique<DenseFfn>();
  if (spec.parallel_dense_ffn) return std::make_unique<ParallelDenseMoeFfn>();
  return std::make_unique<MoeFfn>();
}

std::vector<AttnSeg> attn_segments(std::span<const SeqRows> seqs, int layer) {
  std::vector<AttnSeg> segs;
  segs.reserve(seqs.size());
  for (const SeqRows& q : seqs) segs.push_back({q.row0, q.T, q.pos0, &q.state->attn[layer]});
  return segs;
}

}  // namespace spool::models
