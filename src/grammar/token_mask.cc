#include "grammar/token_mask.h"

#include <algorithm>
#include <bitset>

#include "core/error.h"
#include "grammar/automaton.h"
#include "grammar/matcher_state.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

// Walks tokens in byte order from one set of stacks, keeping the sets after
// each byte of the current token so that the next token starts from the
// bytes it shares with this one.
class TrieWalker {
 public:
  TrieWalker(const CompiledGrammar& g, StackArena& arena, StackWork& work, std::span<const int32_t> root)
      : g_(g), arena_(arena), work_(work), base_(arena.size()) {
    levels_.resize(1);
    levels_[0].set.assign(root.begin(), root.end());
    lexicalize(levels_[0]);
  }
  ~TrieWalker() { arena_.rewind(base_); }

  // Walks `bytes`, whose first `lcp` bytes are the last walked token's;
  // returns how many bytes some stack consumed (bytes.size(): all).
  size_t walk(std::string_view bytes, size_t lcp) {
    if (dead_ && lcp > depth_) return depth_;  // shares the byte that failed
    const size_t keep = std::min(lcp, depth_);
    if (keep < depth_) arena_.rewind(levels_[keep + 1].mark);
    depth_ = keep;
    dead_ = false;
    for (size_t d = keep; d < bytes.size(); ++d) {
      if (levels_.size() <= d + 1) levels_.resize(d + 2);  // before taking references into it
      Level& level = levels_[d];
      Level& next = levels_[d + 1];
      const auto byte = static_cast<uint8_t>(bytes[d]);
      const bool escaped_before = d > 0 && levels_[d - 1].escaped;
      if (level.lex_state >= 0 && g_.states[static_cast<size_t>(level.lex_state)].accepting) {
        // A state that reads bytes and may end its rule (a hostname label
        // after its first character): a byte that nothing after the return
        // can read is the state's alone, and steps as in a lexical state;
        // any other takes the general path below.
        const Return& back = return_of(level);
        if (back.first[byte]) {
          level.set.assign(1, arena_.intern(level.lex_state, level.lex_parent));
          level.lex_state = -1;
          level.closed_ready = false;
        } else {
          level.escaped = escaped_before || back.escaped;
          next.mark = arena_.size();
          const int32_t t = g_.step(level.lex_state, byte);
          if (t < 0) return fail(d);
          take_single(next, t, level);
          depth_ = d + 1;
          continue;
        }
      }
      if (level.lex_state >= 0) {
        // Inside a rule's own bytes (a string's contents): the closure is
        // the stack itself, the step one edge lookup, and no stack node is
        // made until the run leaves such states.
        level.escaped = escaped_before;
        next.mark = arena_.size();
        const int32_t t = g_.step(level.lex_state, byte);
        if (t < 0) return fail(d);
        take_single(next, t, level);
      } else {
        if (!level.closed_ready) {
          const ClosureFlags flags = work_.close(g_, arena_, level.set, level.closed);
          level.closure_escaped = flags.escaped;
          level.closed_ready = true;
        }
        level.escaped = escaped_before || level.closure_escaped;
        // After the closure: its nodes stay while the walk is at or past
        // this level; what steps on from here is dropped with `mark`.
        next.mark = arena_.size();
        work_.step(g_, arena_, level.closed, byte, next.set);
        if (next.set.empty()) return fail(d);
        next.lex_state = -1;
        next.closed_ready = false;
        lexicalize(next);
      }
      depth_ = d + 1;
    }
    return bytes.size();
  }

  // After a walk that stopped at `depth`: whether some stack could have
  // returned into an unknown caller with that byte still to consume.
  bool escaped_at(size_t depth) const { return levels_[depth].escaped; }

 private:
  // What returning into a parent can read next: the first bytes of the
  // closure of that return, and whether it reached an unknown caller.
  struct Return {
    std::bitset<256> first;
    bool escaped = false;
  };
  struct Level {
    // The stacks after this many bytes: one stack held as its top state and
    // parent node when that state calls nothing (lex_state >= 0), else
    // `set`.
    int32_t lex_state = -1;
    int32_t lex_parent = kStackBottom;
    Return back;             // for lex_parent, once back_ready
    bool back_ready = false;
    std::vector<int32_t> set;
    std::vector<int32_t> closed;  // the closure of `set`, once closed_ready
    bool closed_ready = false;
    bool closure_escaped = false;  // that closure returned into kStackUnknown
    bool escaped = false;          // a closure up to here returned into kStackUnknown
    size_t mark = 0;               // the arena's size before this level was made
  };

  bool lexical_state(int32_t state) const {
    const AutomatonState& s = g_.states[static_cast<size_t>(state)];
    return s.calls_begin == s.calls_end;
  }
  void lexicalize(Level& level) const {
    level.back_ready = false;
    if (level.set.size() != 1 || !lexical_state(arena_[level.set[0]].state)) return;
    level.lex_state = arena_[level.set[0]].state;
    level.lex_parent = arena_[level.set[0]].parent;
  }
  // The single stack `t` on `from`'s parent, as the next level.
  void take_single(Level& next, int32_t t, const Level& from) {
    next.closed_ready = false;
    if (lexical_state(t)) {
      next.lex_state = t;
      next.lex_parent = from.lex_parent;
      next.back = from.back;  // the same parent
      next.back_ready = from.back_ready;
    } else {
      next.lex_state = -1;
      next.back_ready = false;
      next.set.assign(1, arena_.intern(t, from.lex_parent));
    }
  }
  const Return& return_of(Level& level) {
    if (level.back_ready) return level.back;
    Return back;
    roots_.clear();
    const auto add = [&](int32_t parent) {
      if (parent == kStackUnknown) {
        back.escaped = true;
      } else if (parent != kStackBottom) {
        roots_.push_back(parent);
      }
    };
    if (arena_.is_join(level.lex_parent)) {
      for (int32_t p : arena_.join_members(level.lex_parent)) add(p);
    } else {
      add(level.lex_parent);
    }
    if (!roots_.empty()) {
      const size_t mark = arena_.size();
      back.escaped = work_.close(g_, arena_, roots_, closed_).escaped || back.escaped;
      for (int32_t id : closed_) {
        const AutomatonState& s = g_.states[static_cast<size_t>(arena_[id].state)];
        for (uint32_t e = s.bytes_begin; e < s.bytes_end; ++e)
          for (int b = g_.byte_edges[e].lo; b <= g_.byte_edges[e].hi; ++b) back.first.set(static_cast<size_t>(b));
      }
      arena_.rewind(mark);
    }
    level.back = back;
    level.back_ready = true;
    return level.back;
  }
  size_t fail(size_t d) {
    arena_.rewind(levels_[d + 1].mark);
    dead_ = true;
    return d;
  }

  const CompiledGrammar& g_;
  StackArena& arena_;
  StackWork& work_;
  size_t base_;
  std::vector<Level> levels_;
  size_t depth_ = 0;  // levels_[0..depth_] hold the current token's prefix
  bool dead_ = false;
  std::vector<int32_t> roots_, closed_;  // return_of's scratch
};

void set_bit(std::span<uint32_t> words, int32_t id) {
  words[static_cast<size_t>(id) / 32] |= 1u << (static_cast<uint32_t>(id) % 32);
}
bool has_bit(std::span<const uint32_t> words, int32_t id) {
  return (words[static_cast<size_t>(id) / 32] >> (static_cast<uint32_t>(id) % 32)) & 1u;
}

size_t common_prefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

// --- TokenVocabulary ---------------------------------------------------------

TokenVocabulary::TokenVocabulary(std::vector<std::string> bytes, std::vector<bool> usable, int32_t size,
                                 std::vector<int32_t> end_ids)
    : bytes_(std::move(bytes)), size_(size), end_ids_(std::move(end_ids)) {
  BASALT_CHECK(usable.size() == bytes_.size(), "token vocabulary: {} usable flags for {} tokens", usable.size(),
               bytes_.size());
  BASALT_CHECK(static_cast<int64_t>(bytes_.size()) <= size_, "token vocabulary: {} tokens past the model's {}",
               bytes_.size(), size_);
  for (int32_t id : end_ids_)
    BASALT_CHECK(id >= 0 && id < size_, "token vocabulary: end id {} outside the vocabulary of {}", id, size_);
  usable_.assign(bytes_.size(), false);
  for (size_t id = 0; id < bytes_.size(); ++id) {
    if (!usable[id] || bytes_[id].empty() || is_end(static_cast<int32_t>(id))) continue;
    usable_[id] = true;
    sorted_.push_back(static_cast<int32_t>(id));
  }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) {
    return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)];
  });
  lcp_.assign(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); ++i)
    lcp_[i] = static_cast<int32_t>(common_prefix(bytes_[static_cast<size_t>(sorted_[i - 1])], bytes_[static_cast<size_t>(sorted_[i])]));
  sorted_offsets_.reserve(sorted_.size() + 1);
  for (int32_t id : sorted_) {
    sorted_offsets_.push_back(static_cast<uint32_t>(sorted_text_.size()));
    sorted_text_ += bytes_[static_cast<size_t>(id)];
  }
  sorted_offsets_.push_back(static_cast<uint32_t>(sorted_text_.size()));
  for (size_t id = 0; id < bytes_.size(); ++id) {
    if (!usable_[id]) continue;
    const std::string& b = bytes_[id];
    if (b.find('"') != std::string::npos) with_quote_.push_back(static_cast<int32_t>(id));
    if (b.find_first_of("\",]}") != std::string::npos) with_closer_.push_back(static_cast<int32_t>(id));
  }
  longest_first_ = sorted_;
  std::stable_sort(longest_first_.begin(), longest_first_.end(), [&](int32_t a, int32_t b) {
    return bytes_[static_cast<size_t>(a)].size() > bytes_[static_cast<size_t>(b)].size();
  });
}

std::span<const int32_t> TokenVocabulary::spelled(std::string_view bytes) const {
  size_t lo = 0, hi = sorted_.size();
  while (lo < hi) {  // the first position whose bytes are not below `bytes`
    const size_t mid = (lo + hi) / 2;
    if (sorted_bytes(mid) < bytes) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  size_t end = lo;
  while (end < sorted_.size() && sorted_bytes(end) == bytes) ++end;
  return {sorted_.data() + lo, end - lo};
}

size_t TokenVocabulary::skip(size_t i, size_t depth) const {
  size_t j = i + 1;
  while (j < lcp_.size() && static_cast<size_t>(lcp_[j]) > depth) ++j;
  return j;
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tokenizer,
                                                                       int32_t model_vocab_size,
                                                                       std::vector<int32_t> end_ids) {
  const int32_t n = std::min(tokenizer.vocab_size(), model_vocab_size);
  std::vector<std::string> bytes(static_cast<size_t>(n));
  std::vector<bool> usable(static_cast<size_t>(n), false);
  for (int32_t id = 0; id < n; ++id) {
    std::optional<std::string> b = tokenizer.token_bytes(id);
    if (!b || tokenizer.is_special(id)) continue;
    bytes[static_cast<size_t>(id)] = std::move(*b);
    usable[static_cast<size_t>(id)] = true;
  }
  return std::make_shared<TokenVocabulary>(std::move(bytes), std::move(usable), model_vocab_size,
                                           std::move(end_ids));
}

bool TokenVocabulary::is_end(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

// --- TokenMasker -------------------------------------------------------------

TokenMasker::TokenMasker(std::shared_ptr<const CompiledGrammar> grammar,
                         std::shared_ptr<const TokenVocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {}

size_t TokenMasker::cached_entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.size();
}

TokenMasker::Entry TokenMasker::compute(const std::vector<int32_t>& chain, bool bottom) const {
  const TokenVocabulary& v = *vocabulary_;
  StackArena arena;
  StackWork work;
  // The stack the chain describes, its deepest caller on an unknown one (or
  // on the real bottom).
  int32_t node = bottom ? kStackBottom : kStackUnknown;
  for (size_t i = chain.size(); i-- > 0;) node = arena.intern(chain[i], node);
  TrieWalker walker(*grammar_, arena, work, std::span<const int32_t>(&node, 1));
  const std::vector<int32_t>& sorted = v.sorted();
  const Entry* shorter = nullptr;
  if (chain.size() > 1 || bottom) {
    std::vector<int32_t> less(chain.begin(), chain.end() - (bottom ? 0 : 1));
    shorter = &entry(less, /*bottom=*/false);
  }
  Entry e;
  e.accepted = shorter != nullptr ? shorter->accepted : std::vector<uint32_t>(static_cast<size_t>((v.size() + 31) / 32), 0u);
  if (shorter == nullptr) {
    // The whole vocabulary in byte order. A token the walk fails on decides
    // every token after it that shares the failing byte, so those are
    // skipped (left out, or undecided with it when the failure escaped).
    for (size_t i = 0; i < sorted.size();) {
      const std::string_view b = v.sorted_bytes(i);
      const size_t reached = walker.walk(b, static_cast<size_t>(v.lcp(i)));
      if (reached == b.size()) {
        set_bit(e.accepted, sorted[i]);
        ++i;
        continue;
      }
      const size_t next = v.skip(i, reached);
      if (walker.escaped_at(reached))
        for (size_t j = i; j < next; ++j) e.undecided.push_back(static_cast<int32_t>(j));
      i = next;
    }
  } else {
    // The context one caller shorter decided everything but its undecided
    // tokens; those are walked again here, with one more caller known.
    std::string_view last;
    for (int32_t pos : shorter->undecided) {
      const std::string_view b = v.sorted_bytes(static_cast<size_t>(pos));
      const size_t reached = walker.walk(b, common_prefix(last, b));
      if (reached == b.size()) {
        set_bit(e.accepted, sorted[static_cast<size_t>(pos)]);
      } else if (walker.escaped_at(reached)) {
        e.undecided.push_back(pos);
      }
      last = b;
    }
  }
  return e;
}

const TokenMasker::Entry& TokenMasker::entry(const std::vector<int32_t>& chain, bool bottom) const {
  std::string key(reinterpret_cast<const char*>(chain.data()), chain.size() * sizeof(int32_t));
  key.push_back(bottom ? 'b' : 'u');
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) return *it->second;
  }
  // Computed unlocked: two threads may both compute a new key; the first
  // stored wins and the results are equal.
  auto computed = std::make_unique<Entry>(compute(chain, bottom));
  std::lock_guard<std::mutex> lock(mu_);
  return *cache_.try_emplace(std::move(key), std::move(computed)).first->second;
}

void TokenMasker::fill(GrammarMatcher& matcher, std::span<uint32_t> words) const {
  BASALT_ASSERT(matcher.grammar_ == grammar_);
  const TokenVocabulary& v = *vocabulary_;
  BASALT_CHECK(static_cast<int64_t>(words.size()) == (v.size() + 31) / 32,
               "token mask: {} words for a vocabulary of {}", words.size(), v.size());
  std::fill(words.begin(), words.end(), 0u);
  GrammarMatcher::State& s = *matcher.state_;
  const std::vector<int32_t>& current = s.sets.back();
  std::vector<int32_t> undecided;
  std::vector<int32_t> chain;
  for (int32_t id : current) {
    // The stack's top state and its callers' states, up to kContextDepth.
    chain.clear();
    int32_t n = id;
    // A join ends the chain: past it the callers are several, and the
    // entry of the chain so far leaves undecided what depends on them.
    while (n >= 0 && chain.size() <= kContextDepth && !s.arena.is_join(n)) {
      chain.push_back(s.arena[n].state);
      n = s.arena[n].parent;
    }
    const Entry& e = entry(chain, /*bottom=*/n == kStackBottom);
    for (size_t w = 0; w < words.size(); ++w) words[w] |= e.accepted[w];
    undecided.insert(undecided.end(), e.undecided.begin(), e.undecided.end());
  }
  if (!undecided.empty()) {
    // Deeper than the cached contexts reach: against the real stacks.
    std::sort(undecided.begin(), undecided.end());
    undecided.erase(std::unique(undecided.begin(), undecided.end()), undecided.end());
    TrieWalker walker(*grammar_, s.arena, s.work, current);
    std::string_view last;
    for (int32_t pos : undecided) {
      const int32_t id = v.sorted()[static_cast<size_t>(pos)];
      if (has_bit(words, id)) continue;
      const std::string_view b = v.sorted_bytes(static_cast<size_t>(pos));
      if (walker.walk(b, common_prefix(last, b)) == b.size()) set_bit(words, id);
      last = b;
    }
  }
  s.closure(*grammar_);
  if (s.flags.can_end)
    for (int32_t id : v.end_ids()) set_bit(words, id);
}

}  // namespace basalt
