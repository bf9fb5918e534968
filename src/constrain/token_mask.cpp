#include "constrain/token_mask.h"

#include <algorithm>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

namespace spool::constrain {

TokenIndex::TokenIndex(std::vector<std::string> bytes, std::vector<char> special) : bytes_(std::move(bytes)), special_(std::move(special)) {
  special_.resize(bytes_.size(), 0);
  // Sorted token order makes every node's subtree a contiguous range; build the CSR trie
  // breadth-first so a node's children are adjacent.
  std::vector<int32_t> ids;
  for (size_t i = 0; i < bytes_.size(); ++i)
    if (!bytes_[i].empty() && !special_[i]) ids.push_back(static_cast<int32_t>(i));
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)]; });
  struct Pending {
    size_t lo, hi, depth;  // ids[lo, hi) share the node's prefix of length depth
  };
  std::vector<Pending> q{{0, ids.size(), 0}};
  for (size_t qi = 0; qi < q.size(); ++qi) {
    const Pending p = q[qi];
    first_child_.push_back(static_cast<uint32_t>(child_byte_.size()));
    first_token_.push_back(static_cast<uint32_t>(token_ids_.size()));
    size_t i = p.lo;
    while (i < p.hi && bytes_[static_cast<size_t>(ids[i])].size() == p.depth) token_ids_.push_back(ids[i++]);
    while (i < p.hi) {
      const auto b = static_cast<uint8_t>(bytes_[static_cast<size_t>(ids[i])][p.depth]);
      size_t j = i;
      while (j < p.hi && static_cast<uint8_t>(bytes_[static_cast<size_t>(ids[j])][p.depth]) == b) ++j;
      child_byte_.push_back(b);
      child_node_.push_back(static_cast<uint32_t>(q.size()));
      q.push_back({i, j, p.depth + 1});
      i = j;
    }
  }
  first_child_.push_back(static_cast<uint32_t>(child_byte_.size()));
  first_token_.push_back(static_cast<uint32_t>(token_ids_.size()));
}

std::shared_ptr<const TokenIndex> TokenIndex::from_tokenizer(const tokenizer::Tokenizer& tok, int64_t vocab_size) {
  std::vector<std::string> bytes(static_cast<size_t>(vocab_size));
  std::vector<char> special(static_cast<size_t>(vocab_size), 0);
  const int32_t n = std::min<int32_t>(tok.vocab_size(), static_cast<int32_t>(vocab_size));
  for (int32_t id = 0; id < n; ++id) {
    bytes[static_cast<size_t>(id)] = tok.id_to_bytes(id);
    special[static_cast<size_t>(id)] = tok.is_special(id);
  }
  return std::make_shared<const TokenIndex>(std::move(bytes), std::move(special));
}

std::shared_ptr<const TokenIndex> LazyTokenIndex::get() {
  std::call_once(once_, [&] { ix_ = TokenIndex::from_tokenizer(tok_, vocab_); });
  return ix_;
}

const std::string& TokenIndex::bytes(int32_t id) const {
  static const std::string kEmpty;
  return id >= 0 && id < vocab_size() ? bytes_[static_cast<size_t>(id)] : kEmpty;
}

ConstraintState::ConstraintState(std::shared_ptr<const Constraint> c, std::shared_ptr<const TokenIndex> index, std::vector<int32_t> end_ids)
    : c_(std::move(c)), ix_(std::move(index)), end_ids_(std::move(end_ids)), m_(c_->grammar) {
  if (m_.dead()) fail("constrained decoding: the %s grammar admits no output", c_->what.c_str());
  for (int32_t id = 0; id < ix_->vocab_size(); ++id)
    if (ix_->special(id) && std::find(c_->special_texts.begin(), c_->special_texts.end(), ix_->bytes(id)) != c_->special_texts.end())
      special_ok_.push_back(id);
}

// True when `bytes` can follow the current state (the state is not changed).
bool ConstraintState::walk(const std::string& bytes, std::vector<int32_t>& tmp) {
  std::vector<int32_t> cur = m_.tops();
  for (unsigned char b : bytes) {
    tmp.clear();
    for (int32_t t : cur) m_.step(t, b, tmp);
    if (tmp.empty()) return false;
    std::sort(tmp.begin(), tmp.end());
    tmp.erase(std::unique(tmp.begin(), tmp.end()), tmp.end());
    cur.swap(tmp);
  }
  return !bytes.empty();
}

void ConstraintState::visit(uint32_t node, size_t begin, size_t end, uint64_t* mask, int64_t& count) {
  const TokenIndex& ix = *ix_;
  for (uint32_t c = ix.first_child_[node]; c < ix.first_child_[node + 1]; ++c) {
    const uint8_t b = ix.child_byte_[c];
    const size_t nb = pool_.size();
    for (size_t i = begin; i < end; ++i) m_.step(pool_[i], b, pool_);
    if (pool_.size() == nb) continue;
    if (pool_.size() - nb > 1) {
      std::sort(pool_.begin() + static_cast<std::ptrdiff_t>(nb), pool_.end());
      pool_.erase(std::unique(pool_.begin() + static_cast<std::ptrdiff_t>(nb), pool_.end()), pool_.end());
    }
    const uint32_t child = ix.child_node_[c];
    for (uint32_t t = ix.first_token_[child]; t < ix.first_token_[child + 1]; ++t) {
      const auto id = static_cast<uint32_t>(ix.token_ids_[t]);
      mask[id >> 6] |= uint64_t{1} << (id & 63);
      ++count;
    }
    if (ix.first_child_[child] < ix.first_child_[child + 1]) visit(child, nb, pool_.size(), mask, count);
    pool_.resize(nb);
  }
}

int64_t ConstraintState::fill_mask(std::vector<uint64_t>& mask) {
  const size_t words = static_cast<size_t>((ix_->vocab_size() + 63) / 64);
  if (auto it = cache_.find(m_.tops()); it != cache_.end()) {
    mask = it->second.first;
    return it->second.second;
  }
  mask.assign(words, 0);
  int64_t count = 0;
  pool_ = m_.tops();
  visit(0, 0, pool_.size(), mask.data(), count);
  std::vector<int32_t> tmp;
  for (int32_t id : special_ok_)
    if (walk(ix_->bytes(id), tmp)) {
      mask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
      ++count;
    }
  if (m_.accepting())
    for (int32_t id : end_ids_)
      if (id >= 0 && id < ix_->vocab_size() && !(mask[static_cast<size_t>(id) >> 6] >> (id & 63) & 1)) {
        mask[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
        ++count;
      }
  if (cache_.size() >= 64) cache_.clear();
  cache_.emplace(m_.tops(), std::make_pair(mask, count));
  return count;
}

bool ConstraintState::accept(int32_t id) {
  if (std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end()) return m_.accepting();
  if (ix_->special(id) && std::find(special_ok_.begin(), special_ok_.end(), id) == special_ok_.end()) return false;
  const std::string& b = ix_->bytes(id);
  return !b.empty() && m_.advance(b);
}

}  // namespace spool::constrain
