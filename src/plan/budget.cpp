#include "plan/budget.h"

#include <algorithm>

namespace spool::plan {

uint64_t reserve_bytes(uint64_t available) { return std::max<uint64_t>(512ull << 20, available / 20); }

bool must_stream(uint64_t available, const BaseNeeds& base, uint64_t experts) {
  return base.sum() + experts + reserve_bytes(available) > available;
}

uint64_t auto_cache_budget(uint64_t available, const BaseNeeds& base, uint64_t experts) {
  const uint64_t used = base.sum() + reserve_bytes(available);
  return std::min(available > used ? available - used : 0, experts);
}

uint64_t cache_peak_bytes(uint64_t budget, uint64_t slot_bytes, int top_k, uint64_t n_slots_total) {
  if (slot_bytes == 0) return 0;
  uint64_t slots = std::max<uint64_t>(budget / slot_bytes, 1);
  slots = std::max<uint64_t>(slots, static_cast<uint64_t>(std::max(top_k, 1)));
  return std::min(slots, n_slots_total) * slot_bytes;
}

bool default_page_cache(uint64_t file_bytes, uint64_t available) {
  return static_cast<double>(file_bytes) < 0.6 * static_cast<double>(available);
}

}  // namespace spool::plan
