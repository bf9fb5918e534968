#include "tokenizer/bpe.h"

#include <algorithm>
#include <mutex>
#include <shared_mutex>

#include "common/error.h"
#include "common/log.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace spool::tokenizer {
namespace {

constexpr int64_t kMaxVocabId = int64_t{1} << 24;  // sanity bound on ids (real vocabs < 300k)
constexpr size_t kCacheCapacity = 1 << 16;         // words kept in the cache
constexpr size_t kMaxCachedWord = 256;             // longer words are not cached (bytes)

// Transparent string hashing so the cache can be probed with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Reads an optional string field; null and absent give nullopt.
std::optional<std::string> opt_string(const nlohmann::json& model, const char* key,
                                      const std::string& label) {
  const auto it = model.find(key);
  if (it == model.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) fail("%s: model.%s must be a string or null", label.c_str(), key);
  return it->get<std::string>();
}

bool opt_bool(const nlohmann::json& model, const char* key, const std::string& label) {
  const auto it = model.find(key);
  if (it == model.end() || it->is_null()) return false;
  if (!it->is_boolean()) fail("%s: model.%s must be a boolean", label.c_str(), key);
  return it->get<bool>();
}

// Printable, bounded rendering of a token for error messages.
std::string show(std::string_view s) { return utf8::clip(s); }

}  // namespace

struct Bpe::Cache {
  std::shared_mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
};

void Bpe::PairMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Slot{kEmpty, {0, 0}});
  mask_ = cap - 1;
  size_ = 0;
}

namespace {
inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
inline uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}
}  // namespace

void Bpe::PairMap::insert_or_assign(int32_t a, int32_t b, MergeRule rule) {
  if ((size_ + 1) * 2 > slots_.size()) {
    std::vector<Slot> old = std::move(slots_);
    reserve(std::max<size_t>(size_ + 1, old.size()));
    for (const Slot& s : old) {
      if (s.key != kEmpty) {
        insert_or_assign(static_cast<int32_t>(s.key >> 32),
                         static_cast<int32_t>(s.key & 0xffffffffu), s.rule);
      }
    }
  }
  const uint64_t key = pair_key(a, b);
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    if (slots_[i].key == kEmpty) {
      slots_[i] = {key, rule};
      ++size_;
      return;
    }
    if (slots_[i].key == key) {
      slots_[i].rule = rule;  // a later duplicate rule wins, as in HF's HashMap collect
      return;
    }
  }
}

const Bpe::MergeRule* Bpe::PairMap::find(int32_t a, int32_t b) const {
  if (slots_.empty()) return nullptr;
  const uint64_t key = pair_key(a, b);
  for (uint64_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
    if (slots_[i].key == key) return &slots_[i].rule;
    if (slots_[i].key == kEmpty) return nullptr;
  }
}

Bpe::Bpe() : cache_(std::make_unique<Cache>()) {
  byte_ids_.fill(-1);
  byte_fallback_ids_.fill(-1);
}
Bpe::~Bpe() = default;
Bpe::Bpe(Bpe&&) noexcept = default;
Bpe& Bpe::operator=(Bpe&&) noexcept = default;

Bpe Bpe::from_json(const nlohmann::json& model, const std::string& label) {
  if (!model.is_object()) fail("%s: \"model\" must be an object", label.c_str());
  if (const auto t = model.find("type"); t != model.end()) {
    if (!t->is_string()) fail("%s: model.type must be a string", label.c_str());
    const std::string& type = t->get_ref<const std::string&>();
    if (type != "BPE") {
      fail("%s: unsupported model type '%s' (only BPE is supported)", label.c_str(),
           show(type).c_str());
    }
  }
  const auto vocab_it = model.find("vocab");
  const auto merges_it = model.find("merges");
  if (vocab_it == model.end() || merges_it == model.end()) {
    fail("%s: BPE model needs \"vocab\" and \"merges\"", label.c_str());
  }
  if (!vocab_it->is_object()) fail("%s: model.vocab must be an object", label.c_str());
  if (!merges_it->is_array()) fail("%s: model.merges must be an array", label.c_str());

  Bpe bpe;
  bpe.strings_.reserve(vocab_it->size());
  std::vector<int32_t> ids;  // ids[i] is the id of strings_[i]
  ids.reserve(vocab_it->size());
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab_it->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxVocabId) {
      fail("%s: model.vocab[\"%s\"] must be an integer id in [0, %lld)", label.c_str(),
           show(token).c_str(), static_cast<long long>(kMaxVocabId));
    }
    bpe.strings_.push_back(token);
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    max_id = std::max(max_id, id.get<int64_t>());
  }
  bpe.id_index_.assign(static_cast<size_t>(max_id + 1), -1);
  bpe.vocab_.reserve(bpe.strings_.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    bpe.vocab_[bpe.strings_[i]] = ids[i];
    bpe.id_index_[static_cast<size_t>(ids[i])] = static_cast<int32_t>(i);
  }

  bpe.unk_token_ = opt_string(model, "unk_token", label);
  bpe.prefix_ = opt_string(model, "continuing_subword_prefix", label);
  bpe.suffix_ = opt_string(model, "end_of_word_suffix", label);
  bpe.fuse_unk_ = opt_bool(model, "fuse_unk", label);
  bpe.byte_fallback_ = opt_bool(model, "byte_fallback", label);
  bpe.ignore_merges_ = opt_bool(model, "ignore_merges", label);
  if (const auto d = model.find("dropout"); d != model.end() && !d->is_null()) {
    if (!d->is_number()) fail("%s: model.dropout must be a number or null", label.c_str());
    if (d->get<double>() > 0.0) {
      log_warn("%s: BPE dropout %g ignored (deterministic encoding)", label.c_str(),
               d->get<double>());
    }
  }
  if (bpe.unk_token_) bpe.unk_id_ = bpe.lookup(*bpe.unk_token_);
  // An empty prefix/suffix is the same as none; keeping them empty enables the fast path.
  if (bpe.prefix_ && bpe.prefix_->empty()) bpe.prefix_.reset();
  if (bpe.suffix_ && bpe.suffix_->empty()) bpe.suffix_.reset();
  for (int b = 0; b < 256; ++b) {
    bpe.byte_ids_[b] = bpe.lookup(byte_level::byte_to_utf8(static_cast<uint8_t>(b)));
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    bpe.byte_fallback_ids_[b] = bpe.lookup(name);
  }

  // Merges: "a b" strings (legacy) or ["a", "b"] pairs; rank = position in the list.
  const size_t prefix_len = bpe.prefix_ ? bpe.prefix_->size() : 0;
  bpe.merges_.reserve(merges_it->size());
  uint32_t rank = 0;
  std::string merged;
  for (const auto& m : *merges_it) {
    std::string_view a, b;
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) {
        fail("%s: merge #%u \"%s\" must be two tokens separated by one space", label.c_str(),
             rank + 1, show(line).c_str());
      }
      a = std::string_view(line).substr(0, sp);
      b = std::string_view(line).substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get_ref<const std::string&>();
      b = m[1].get_ref<const std::string&>();
    } else {
      fail("%s: merge #%u must be a \"a b\" string or a [\"a\", \"b\"] pair", label.c_str(),
           rank + 1);
    }
    const int32_t a_id = bpe.lookup(a);
    const int32_t b_id = bpe.lookup(b);
    if (a_id < 0 || b_id < 0) {
      fail("%s: merge #%u ('%s', '%s') names a token that is not in the vocab: '%s'", label.c_str(),
           rank + 1, show(a).c_str(), show(b).c_str(), show(a_id < 0 ? a : b).c_str());
    }
    if (b.size() < prefix_len) {
      fail("%s: merge #%u: '%s' is shorter than continuing_subword_prefix", label.c_str(), rank + 1,
           show(b).c_str());
    }
    merged.assign(a);
    merged.append(b.substr(prefix_len));
    const int32_t new_id = bpe.lookup(merged);
    if (new_id < 0) {
      fail("%s: merge #%u ('%s', '%s') produces '%s', which is not in the vocab", label.c_str(),
           rank + 1, show(a).c_str(), show(b).c_str(), show(merged).c_str());
    }
    bpe.merges_.insert_or_assign(a_id, b_id, {rank, new_id});
    ++rank;
  }
  return bpe;
}

void Bpe::set_raw_byte_input(bool raw) { raw_bytes_ = raw; }

int32_t Bpe::lookup(std::string_view s) const {
  const auto it = vocab_.find(s);
  return it == vocab_.end() ? -1 : it->second;
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  const int32_t id = lookup(token);
  if (id < 0) return std::nullopt;
  return id;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_index_.size() || id_index_[id] < 0) return nullptr;
  return &strings_[static_cast<size_t>(id_index_[id])];
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kMaxCachedWord;
  if (cacheable) {
    std::shared_lock lock(cache_->mu);
    const auto it = cache_->words.find(word);
    if (it != cache_->words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  if (ignore_merges_) {
    // A word that is itself a vocab entry is emitted whole, without merging.
    int32_t id = -1;
    if (raw_bytes_) {
      std::string mapped;
      byte_level::map_bytes(word, mapped);
      id = lookup(mapped);
    } else {
      id = lookup(word);
    }
    if (id >= 0) out.push_back(id);
  }
  if (out.size() == first) merge_word(word, out);
  if (cacheable) {
    std::unique_lock lock(cache_->mu);
    if (cache_->words.size() < kCacheCapacity) {
      cache_->words.emplace(std::string(word),
                            std::vector<int32_t>(out.begin() + first, out.end()));
    }
  }
}

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  // Symbols form a doubly linked list over the initial characters; merged-away symbols
  // get id -1 (HF marks them with len 0).
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(sym.size());
    if (n > 0) sym.back().next = n;
    sym.push_back({id, n - 1, -1});
  };

  // Initial symbols: one per character (per byte for raw byte input), with HF's unknown
  // character handling: byte_fallback "<0xXX>" tokens, else unk (optionally fused), else
  // the character is dropped.
  int32_t pending_unk = -1;
  std::string buf;
  size_t i = 0;
  while (i < word.size()) {
    const size_t start = i;
    std::string_view ch;
    if (raw_bytes_) {
      ch = byte_level::byte_to_utf8(static_cast<uint8_t>(word[i]));
      i += 1;
    } else {
      i += std::min(utf8::char_len(static_cast<unsigned char>(word[i])), word.size() - i);
      ch = word.substr(start, i - start);
    }
    const bool is_first = start == 0;
    const bool is_last = i >= word.size();
    std::string_view s = ch;
    int32_t id;
    if (!prefix_ && !suffix_) {
      id = raw_bytes_ ? byte_ids_[static_cast<uint8_t>(word[start])] : lookup(ch);
    } else {
      buf.clear();
      if (!is_first && prefix_) buf.append(*prefix_);
      buf.append(ch);
      if (is_last && suffix_) buf.append(*suffix_);
      s = buf;
      id = lookup(s);
    }
    if (id >= 0) {
      if (pending_unk >= 0) {
        add(pending_unk);
        pending_unk = -1;
      }
      add(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (const char c : s) all = all && byte_fallback_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (const char c : s) add(byte_fallback_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_token_) {
      if (unk_id_ < 0) {
        fail("BPE unk_token '%s' is not in the vocab", show(*unk_token_).c_str());
      }
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk >= 0) add(pending_unk);

  // Merge loop: always apply the lowest-rank merge, leftmost first (HF Word::merge_all).
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  auto later = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  std::vector<Candidate> heap;
  heap.reserve(sym.size());
  for (size_t k = 0; k + 1 < sym.size(); ++k) {
    if (const MergeRule* r = merges_.find(sym[k].id, sym[k + 1].id)) {
      heap.push_back({r->rank, static_cast<int32_t>(k), r->new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& cur = sym[static_cast<size_t>(top.pos)];
    if (cur.id < 0 || cur.next < 0) continue;
    const Symbol right = sym[static_cast<size_t>(cur.next)];
    const MergeRule* r = merges_.find(cur.id, right.id);
    if (r == nullptr || r->new_id != top.new_id) continue;  // stale entry
    sym[static_cast<size_t>(cur.next)].id = -1;
    cur.id = top.new_id;
    cur.next = right.next;
    if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeRule* p = merges_.find(sym[static_cast<size_t>(cur.prev)].id, cur.id)) {
        heap.push_back({p->rank, cur.prev, p->new_id});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
    if (cur.next >= 0) {
      if (const MergeRule* n = merges_.find(cur.id, sym[static_cast<size_t>(cur.next)].id)) {
        heap.push_back({n->rank, top.pos, n->new_id});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
  }
  for (int32_t k = sym.empty() ? -1 : 0; k >= 0; k = sym[static_cast<size_t>(k)].next) {
    out.push_back(sym[static_cast<size_t>(k)].id);
  }
}

}  // namespace spool::tokenizer
