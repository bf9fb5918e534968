#include "io/expert_store.h"

#include <algorithm>

#include "common/error.h"

namespace spool::io {

namespace {
uint64_t align_down(uint64_t x) { return x / kDirectIoAlign * kDirectIoAlign; }
uint64_t align_up(uint64_t x) { return (x + kDirectIoAlign - 1) / kDirectIoAlign * kDirectIoAlign; }
}  // namespace

ExpertStore::ExpertStore(const Checkpoint& ckpt, const std::vector<bool>& moe_layers, int n_experts, bool direct)
    : moe_layers_(moe_layers), n_experts_(n_experts), direct_(direct) {
  plans_.resize(moe_layers.size() * static_cast<size_t>(n_experts));
  for (int l = 0; l < static_cast<int>(moe_layers.size()); ++l) {
    if (!moe_layers[l]) continue;
    for (int e = 0; e < n_experts; ++e) {
      const TensorRef* t[3] = {&ckpt.expert(l, e, ExpertProj::kGate), &ckpt.expert(l, e, ExpertProj::kUp),
                               &ckpt.expert(l, e, ExpertProj::kDown)};
      // Sort the three tensors by (shard, offset) and merge touching ranges.
      int order[3] = {0, 1, 2};
      std::sort(order, order + 3, [&](int a, int b) {
        return t[a]->shard != t[b]->shard ? t[a]->shard < t[b]->shard : t[a]->offset < t[b]->offset;
      });
      ExpertLocation& loc = plans_[index(l, e)];
      struct Range {
        int shard;
        uint64_t begin, end;
        std::vector<int> members;
      };
      std::vector<Range> ranges;
      for (int k : order) {
        const TensorRef& x = *t[k];
        if (!ranges.empty() && ranges.back().shard == x.shard && ranges.back().end == x.offset) {
          ranges.back().end = x.offset + x.nbytes;
          ranges.back().members.push_back(k);
        } else {
          ranges.push_back({x.shard, x.offset, x.offset + x.nbytes, {k}});
        }
        loc.payload_bytes += x.nbytes;
      }
      uint64_t buf = 0;
      for (const Range& r : ranges) {
        ExpertExtent ext;
        ext.shard = r.shard;
        ext.file_offset = direct ? align_down(r.begin) : r.begin;
        const uint64_t end = direct ? align_up(r.end) : r.end;
        ext.length = end - ext.file_offset;
        ext.buf_offset = buf;
        for (int k : r.members) loc.proj_offset[k] = buf + (t[k]->offset - ext.file_offset);
        loc.extents.push_back(ext);
        loc.read_bytes += ext.length;
        buf += direct ? ext.length : align_up(ext.length);  // keep every region 4096-aligned anyway
      }
      slot_bytes_ = std::max(slot_bytes_, align_up(buf));
      total_bytes_ += loc.payload_bytes;
      tensor_count_ += 3;
    }
  }
}

}  // namespace spool::io
