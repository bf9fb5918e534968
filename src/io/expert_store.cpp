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
      const std::vector<const TensorRef*> t = ckpt.expert_tensors(l, e);
      if (t.empty()) fail("%s: missing expert %d of layer %d", ckpt.dir().c_str(), e, l);
      // Sort the expert's tensors by (shard, offset) and merge touching ranges.
      std::vector<int> order(t.size());
      for (size_t k = 0; k < t.size(); ++k) order[k] = static_cast<int>(k);
      std::sort(order.begin(), order.end(), [&](int a, int b) {
        return t[a]->shard != t[b]->shard ? t[a]->shard < t[b]->shard : t[a]->offset < t[b]->offset;
      });
      ExpertLocation& loc = plans_[index(l, e)];
      for (auto& row : loc.part_offset)
        for (auto& x : row) x = UINT64_MAX;
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
        for (int k : r.members)
          loc.part_offset[static_cast<int>(t[k]->expert_proj)][static_cast<int>(t[k]->expert_part)] = buf + (t[k]->offset - ext.file_offset);
        loc.extents.push_back(ext);
        loc.read_bytes += ext.length;
        buf += direct ? ext.length : align_up(ext.length);  // keep every region 4096-aligned anyway
      }
      slot_bytes_ = std::max(slot_bytes_, align_up(buf));
      total_bytes_ += loc.payload_bytes;
      tensor_count_ += static_cast<int64_t>(t.size());
    }
  }
}

}  // namespace spool::io
