#include "grammar/automaton.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include "core/error.h"
#include "grammar/matcher.h"

namespace basalt {
namespace {

// Limits that keep a hostile grammar from exhausting memory or time.
constexpr size_t kMaxNfaStates = 2'000'000;
constexpr size_t kMaxDfaStates = 200'000;
// Subset construction can take time quadratic in a bound where a repetition
// overlaps what precedes it (".* [^\n]{800}"): its sets' total size is
// capped so such a grammar is refused in about a second, not minutes.
constexpr size_t kMaxSubsetElements = 250'000;

// --- Code point classes as UTF-8 byte sequences ------------------------------

using Range = std::pair<uint32_t, uint32_t>;

// Sorted, merged, surrogates removed; negation over all scalar values.
std::vector<Range> normalize(std::vector<Range> ranges, bool negated) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<Range> merged;
  for (const Range& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  if (negated) {
    std::vector<Range> complement;
    uint32_t next = 0;
    for (const Range& r : merged) {
      if (r.first > next) complement.emplace_back(next, r.first - 1);
      next = r.second + 1;
    }
    if (next <= 0x10FFFF) complement.emplace_back(next, 0x10FFFF);
    merged = std::move(complement);
  }
  std::vector<Range> out;
  for (const Range& r : merged) {
    if (r.second < 0xD800 || r.first > 0xDFFF) {
      out.push_back(r);
      continue;
    }
    if (r.first < 0xD800) out.emplace_back(r.first, 0xD7FF);
    if (r.second > 0xDFFF) out.emplace_back(0xE000, r.second);
  }
  return out;
}

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void utf8_bytes(uint32_t cp, int n, uint8_t* out) {
  if (n == 1) {
    out[0] = static_cast<uint8_t>(cp);
    return;
  }
  for (int i = n - 1; i > 0; --i) {
    out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  static constexpr uint8_t kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  out[0] = static_cast<uint8_t>(kLead[n] | cp);
}

using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;

// Splits [lo, hi] (same UTF-8 length) into byte-range sequences: a range
// is one sequence when, past the first differing byte, the tails cover
// every continuation byte.
void split_same_length(uint32_t lo, uint32_t hi, int n, std::vector<ByteSeq>& out) {
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;  // the low 6*i bits
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_same_length(lo, lo | m, n, out);
        split_same_length((lo | m) + 1, hi, n, out);
        return;
      }
      if ((hi & m) != m) {
        split_same_length(lo, (hi & ~m) - 1, n, out);
        split_same_length(hi & ~m, hi, n, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  utf8_bytes(lo, n, a);
  utf8_bytes(hi, n, b);
  ByteSeq seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out.push_back(std::move(seq));
}

std::vector<ByteSeq> utf8_sequences(const std::vector<Range>& ranges) {
  static constexpr uint32_t kLengthEnd[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  std::vector<ByteSeq> out;
  for (Range r : ranges) {
    while (r.first <= r.second) {
      const int n = utf8_length(r.first);
      const uint32_t end = std::min(r.second, kLengthEnd[n - 1]);
      split_same_length(r.first, end, n, out);
      if (end == r.second) break;
      r.first = end + 1;
    }
  }
  return out;
}

// --- Thompson NFA per rule ---------------------------------------------------

struct NfaEdge {
  enum Kind : uint8_t { kEpsilon, kByte, kCall } kind;
  uint8_t lo = 0, hi = 0;
  int32_t rule = -1;
  int32_t to = -1;
};

// Which rules a call inside a repetition compiles inline (their body copied
// into the caller's automaton instead of a call edge): a rule on no cycle of
// references whose body, with what it inlines in turn, weighs at most
// kInlineWeight. One character of a string (`json-char`, its escapes) then
// costs the run one byte edge instead of a call and a return per byte.
// Calls outside repetitions stay calls (but for rules of about one
// character, kInlineOnce), so a rule used once per value (a whole string)
// keeps one set of states that every caller shares, and with them the
// token masks computed for them.
constexpr int64_t kInlineWeight = 1024;
// A call outside repetitions compiles inline when the rule refers to no
// rule and weighs no more than one character of a pattern (a class with
// its JSON escapes, about 30): a pattern's automaton state, written as a
// rule that reads a character then calls the next state, then has no call
// of its own where its bytes could be the callee's too (a space that is
// also the first byte of a non-ASCII word character), so a walk through it
// takes no closure. Only where the grammar's such calls weigh at most
// kInlineOnceTotal together: a schema with three patterns of 1,700 states
// each (at most 200 words, three times) would copy its two classes into
// every state, past the grammar's state limit; it keeps them all calls.
constexpr int64_t kInlineOnce = 64;
constexpr int64_t kInlineOnceTotal = 32768;
// What one rule may take inline in all: a rule with hundreds of repeated
// call sites keeps calls past it rather than grow its automaton past the
// state limit.
constexpr int64_t kInlinePerRule = 8192;

class InlinePlan {
 public:
  explicit InlinePlan(const Grammar& g) : g_(g) {
    const size_t n = g.rules.size();
    index_.assign(n, -1);
    low_.assign(n, 0);
    on_stack_.assign(n, false);
    recursive_.assign(n, false);
    for (size_t r = 0; r < n; ++r)
      if (index_[r] < 0) strongly_connect(static_cast<int32_t>(r));
    weight_.assign(n, -2);  // -2: not computed
  }

  // The rule's weight when it may be inlined, -1 when it may not. `depth`
  // counts the rules being weighed inside each other: past kMaxInlineDepth
  // a rule is not inlined (a chain of thousands of rules would otherwise
  // recurse as deep).
  // Whether a call of `rule` outside repetitions compiles inline: the
  // rule is a leaf (refers to no rule) within kInlineOnce, and the
  // grammar's calls of such rules outside repetitions weigh at most
  // kInlineOnceTotal together.
  bool inline_once(int32_t rule) {
    if (once_demand_ < 0) {
      once_demand_ = 0;
      for (const GrammarRule& r : g_.rules) once_demand_ += once_sites(r.body);
    }
    const int64_t w = weight(rule);
    return once_demand_ <= kInlineOnceTotal && w >= 0 && w <= kInlineOnce && is_leaf(rule);
  }

  int64_t weight(int32_t rule, int depth = 0) {
    int64_t& w = weight_[static_cast<size_t>(rule)];
    if (w != -2) return w;
    if (depth > kMaxInlineDepth || recursive_[static_cast<size_t>(rule)] ||
        is_distinct_rule(g_.rules[static_cast<size_t>(rule)].name) ||
        bounded_rule_limit(g_.rules[static_cast<size_t>(rule)].name))
      return -1;
    const int64_t body = weight_of(g_.rules[static_cast<size_t>(rule)].body, depth);
    // (Recursive rules never get here, so no cycle reads w while it is computed.)
    weight_[static_cast<size_t>(rule)] = body <= kInlineWeight ? body : -1;
    return weight_[static_cast<size_t>(rule)];
  }

 private:
  static constexpr int kMaxInlineDepth = 16;

  int64_t weight_of(const GrammarExpr& e, int depth) {
    using K = GrammarExpr::Kind;
    switch (e.kind) {
      case K::kBytes: return std::max<int64_t>(1, static_cast<int64_t>(e.bytes.size()));
      case K::kClass: return 4;
      case K::kRuleRef: {
        const int64_t w = weight(e.rule, depth + 1);
        return w < 0 ? 1 : w;
      }
      case K::kSequence:
      case K::kChoice: {
        int64_t sum = 1;
        for (const GrammarExpr& c : e.children)
          sum = std::min<int64_t>(sum + weight_of(c, depth), kInlineWeight + 1);
        return sum;
      }
      case K::kRepeat: {
        const int64_t copies = e.max < 0 ? int64_t{e.min} + 1 : std::max<int64_t>(1, e.max);
        return std::min<int64_t>(weight_of(e.children[0], depth) * copies, kInlineWeight + 1);
      }
    }
    return kInlineWeight + 1;
  }

  // Tarjan's strongly connected components over rule references, with an
  // explicit stack (a grammar may chain thousands of rules): a rule is
  // recursive when its component has several rules or it refers to itself.
  void strongly_connect(int32_t root) {
    struct Frame {
      int32_t rule;
      std::vector<int32_t> refs;
      size_t next = 0;
    };
    std::vector<Frame> frames;
    const auto open = [&](int32_t r) {
      index_[static_cast<size_t>(r)] = low_[static_cast<size_t>(r)] = next_index_++;
      stack_.push_back(r);
      on_stack_[static_cast<size_t>(r)] = true;
      Frame f{r, {}, 0};
      references(g_.rules[static_cast<size_t>(r)].body, f.refs);
      frames.push_back(std::move(f));
    };
    open(root);
    while (!frames.empty()) {
      Frame& f = frames.back();
      const auto r = static_cast<size_t>(f.rule);
      if (f.next < f.refs.size()) {
        const int32_t t = f.refs[f.next++];
        if (static_cast<size_t>(t) == r) recursive_[r] = true;
        if (index_[static_cast<size_t>(t)] < 0) {
          open(t);  // invalidates f
        } else if (on_stack_[static_cast<size_t>(t)]) {
          low_[r] = std::min(low_[r], index_[static_cast<size_t>(t)]);
        }
        continue;
      }
      // Every reference done: close the rule, then hand its low to its caller.
      if (low_[r] == index_[r]) {
        std::vector<int32_t> component;
        int32_t t;
        do {
          t = stack_.back();
          stack_.pop_back();
          on_stack_[static_cast<size_t>(t)] = false;
          component.push_back(t);
        } while (static_cast<size_t>(t) != r);
        if (component.size() > 1)
          for (int32_t c : component) recursive_[static_cast<size_t>(c)] = true;
      }
      const int32_t low = low_[r];
      frames.pop_back();
      if (!frames.empty()) {
        const auto caller = static_cast<size_t>(frames.back().rule);
        low_[caller] = std::min(low_[caller], low);
      }
    }
  }
  bool is_leaf(int32_t rule) {
    if (leaf_.empty()) {
      leaf_.resize(g_.rules.size());
      std::vector<int32_t> refs;
      for (size_t r = 0; r < g_.rules.size(); ++r) {
        refs.clear();
        references(g_.rules[r].body, refs);
        leaf_[r] = refs.empty();
      }
    }
    return leaf_[static_cast<size_t>(rule)];
  }
  // The weight of the calls in `e`, outside repetitions, of leaf rules
  // within kInlineOnce.
  int64_t once_sites(const GrammarExpr& e) {
    if (e.kind == GrammarExpr::Kind::kRepeat) return 0;
    if (e.kind == GrammarExpr::Kind::kRuleRef) {
      const int64_t w = weight(e.rule);
      return w >= 0 && w <= kInlineOnce && is_leaf(e.rule) ? w : 0;
    }
    int64_t sum = 0;
    for (const GrammarExpr& c : e.children) sum += once_sites(c);
    return sum;
  }
  static void references(const GrammarExpr& e, std::vector<int32_t>& out) {
    if (e.kind == GrammarExpr::Kind::kRuleRef) out.push_back(e.rule);
    for (const GrammarExpr& c : e.children) references(c, out);
  }

  const Grammar& g_;
  std::vector<int32_t> index_, low_, stack_;
  std::vector<bool> on_stack_, recursive_;
  int32_t next_index_ = 0;
  std::vector<int64_t> weight_;
  int64_t once_demand_ = -1;  // once_sites() over the grammar, once computed
  std::vector<bool> leaf_;    // per rule, once computed
};

class Nfa {
 public:
  Nfa(const Grammar& grammar, InlinePlan& plan) : grammar_(grammar), plan_(plan) {}

  int32_t add() {
    BASALT_CHECK(out_.size() < kMaxNfaStates, "grammar: too large (more than {} automaton states before "
                 "determinization); lower the repetition bounds", kMaxNfaStates);
    out_.emplace_back();
    return static_cast<int32_t>(out_.size() - 1);
  }
  void edge(int32_t from, NfaEdge e) { out_[static_cast<size_t>(from)].push_back(e); }
  const std::vector<NfaEdge>& out(int32_t s) const { return out_[static_cast<size_t>(s)]; }
  size_t size() const { return out_.size(); }

  // Adds paths from `from` to `to` that match `e`; `copies` is how many
  // times the repetitions around `e` repeat it (0 outside any).
  void compile(const GrammarExpr& e, int32_t from, int32_t to, int64_t copies = 0) {
    using K = GrammarExpr::Kind;
    switch (e.kind) {
      case K::kBytes: {
        int32_t cur = from;
        for (size_t i = 0; i < e.bytes.size(); ++i) {
          const int32_t next = i + 1 == e.bytes.size() ? to : add();
          const auto b = static_cast<uint8_t>(e.bytes[i]);
          edge(cur, {NfaEdge::kByte, b, b, -1, next});
          cur = next;
        }
        if (e.bytes.empty()) edge(from, {NfaEdge::kEpsilon, 0, 0, -1, to});
        return;
      }
      case K::kClass: {
        for (const ByteSeq& seq : utf8_sequences(normalize(e.ranges, e.negated))) {
          int32_t cur = from;
          for (size_t i = 0; i < seq.size(); ++i) {
            const int32_t next = i + 1 == seq.size() ? to : add();
            edge(cur, {NfaEdge::kByte, seq[i].first, seq[i].second, -1, next});
            cur = next;
          }
        }
        return;
      }
      case K::kRuleRef: {
        const int64_t w = plan_.weight(e.rule);
        // The site's copies together within kInlineWeight; each copy (one
        // call of compile: a repetition compiles its body once per copy)
        // charged once to the rule's budget. Outside repetitions only a
        // character's worth (kInlineOnce).
        const bool fits = copies > 0 ? w * copies <= kInlineWeight : plan_.inline_once(e.rule);
        if (w >= 0 && fits && inlined_ + w <= kInlinePerRule) {
          inlined_ += w;
          compile(grammar_.rules[static_cast<size_t>(e.rule)].body, from, to, copies);
        } else {
          edge(from, {NfaEdge::kCall, 0, 0, e.rule, to});
        }
        return;
      }
      case K::kSequence: {
        int32_t cur = from;
        for (size_t i = 0; i < e.children.size(); ++i) {
          const int32_t next = i + 1 == e.children.size() ? to : add();
          compile(e.children[i], cur, next, copies);
          cur = next;
        }
        if (e.children.empty()) edge(from, {NfaEdge::kEpsilon, 0, 0, -1, to});
        return;
      }
      case K::kChoice:
        for (const GrammarExpr& c : e.children) {
          // A state of its own per branch keeps one branch's loops out of
          // the others.
          const int32_t start = add();
          edge(from, {NfaEdge::kEpsilon, 0, 0, -1, start});
          compile(c, start, to, copies);
        }
        return;
      case K::kRepeat: {
        BASALT_CHECK(e.min <= kMaxRepetition && e.max <= kMaxRepetition,
                     "grammar: repetition bound past the limit of {}", kMaxRepetition);
        // (Capped: past the inline budget no call inside is inlined anyway,
        // and nested repetitions would overflow.)
        const int64_t inner = std::min<int64_t>(
            std::max<int64_t>(copies, 1) * (e.max < 0 ? int64_t{e.min} + 1 : std::max<int64_t>(1, e.max)),
            kInlineWeight + 1);
        int32_t cur = from;
        for (int32_t i = 0; i < e.min; ++i) {
          const int32_t next = add();
          compile(e.children[0], cur, next, inner);
          cur = next;
        }
        if (e.max < 0) {
          const int32_t loop = add();
          edge(cur, {NfaEdge::kEpsilon, 0, 0, -1, loop});
          const int32_t body_end = add();
          compile(e.children[0], loop, body_end, inner);
          edge(body_end, {NfaEdge::kEpsilon, 0, 0, -1, loop});
          edge(loop, {NfaEdge::kEpsilon, 0, 0, -1, to});
          return;
        }
        for (int32_t i = e.min; i < e.max; ++i) {
          const int32_t next = add();
          edge(cur, {NfaEdge::kEpsilon, 0, 0, -1, to});
          compile(e.children[0], cur, next, inner);
          cur = next;
        }
        edge(cur, {NfaEdge::kEpsilon, 0, 0, -1, to});
        return;
      }
    }
  }

 private:
  const Grammar& grammar_;
  InlinePlan& plan_;
  int64_t inlined_ = 0;  // the weight inlined into this rule so far
  std::vector<std::vector<NfaEdge>> out_;
};

// --- Subset construction -----------------------------------------------------

struct DfaState {
  bool accepting = false;
  std::vector<ByteEdge> bytes;
  std::vector<RuleCall> calls;  // rule -> local target (per rule, one)
};

class Determinizer {
 public:
  Determinizer(const Nfa& nfa, int32_t start, int32_t end, size_t& total) : nfa_(nfa), end_(end), total_(total) {
    intern(closure({start}));
  }

  std::vector<DfaState> run() {
    for (size_t i = 0; i < sets_.size(); ++i) expand(i);
    return std::move(dfa_);
  }

 private:
  std::vector<int32_t> closure(std::vector<int32_t> seeds) {
    if (seen_.size() < nfa_.size()) seen_.resize(nfa_.size(), 0);
    ++stamp_;
    std::vector<int32_t> out;
    std::vector<int32_t>& work = seeds;
    for (size_t i = 0; i < work.size();) {  // drop repeated seeds
      if (seen_[static_cast<size_t>(work[i])] == stamp_) {
        work[i] = work.back();
        work.pop_back();
      } else {
        seen_[static_cast<size_t>(work[i++])] = stamp_;
      }
    }
    while (!work.empty()) {
      const int32_t s = work.back();
      work.pop_back();
      out.push_back(s);
      for (const NfaEdge& e : nfa_.out(s)) {
        if (e.kind != NfaEdge::kEpsilon || seen_[static_cast<size_t>(e.to)] == stamp_) continue;
        seen_[static_cast<size_t>(e.to)] = stamp_;
        work.push_back(e.to);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  int32_t intern(std::vector<int32_t> set) {
    const auto it = index_.find(set);
    if (it != index_.end()) return it->second;
    BASALT_CHECK(++total_ <= kMaxDfaStates, "grammar: too large (more than {} automaton states)", kMaxDfaStates);
    elements_ += set.size();
    BASALT_CHECK(elements_ <= kMaxSubsetElements,
                 "grammar: too costly to compile (a repetition bound overlapping what comes before it); lower the "
                 "bound or anchor the pattern");
    const auto id = static_cast<int32_t>(sets_.size());
    DfaState d;
    d.accepting = std::binary_search(set.begin(), set.end(), end_);
    dfa_.push_back(std::move(d));
    index_.emplace(set, id);
    sets_.push_back(std::move(set));
    return id;
  }

  void expand(size_t i) {
    const std::vector<int32_t> set = sets_[i];
    std::vector<uint32_t> cuts;
    std::map<int32_t, std::vector<int32_t>> calls;
    for (int32_t s : set) {
      for (const NfaEdge& e : nfa_.out(s)) {
        if (e.kind == NfaEdge::kByte) {
          cuts.push_back(e.lo);
          cuts.push_back(static_cast<uint32_t>(e.hi) + 1);
        } else if (e.kind == NfaEdge::kCall) {
          calls[e.rule].push_back(e.to);
        }
      }
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    // Each edge's targets go to the elementary intervals it covers.
    std::vector<std::vector<int32_t>> targets_of(cuts.empty() ? 0 : cuts.size() - 1);
    for (int32_t s : set) {
      for (const NfaEdge& e : nfa_.out(s)) {
        if (e.kind != NfaEdge::kByte) continue;
        const auto first = static_cast<size_t>(std::lower_bound(cuts.begin(), cuts.end(), e.lo) - cuts.begin());
        for (size_t c = first; c + 1 < cuts.size() && cuts[c] <= e.hi; ++c) targets_of[c].push_back(e.to);
      }
    }
    work_ += set.size() + targets_of.size();
    BASALT_CHECK(work_ <= kMaxSubsetElements * 4,
                 "grammar: too costly to compile (a repetition overlapping what comes before it); lower the "
                 "bound or anchor the pattern");
    std::vector<ByteEdge> bytes;
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const uint32_t lo = cuts[c], hi = cuts[c + 1] - 1;
      if (targets_of[c].empty()) continue;
      const int32_t t = intern(closure(std::move(targets_of[c])));
      if (!bytes.empty() && bytes.back().target == t && bytes.back().hi + 1u == lo) {
        bytes.back().hi = static_cast<uint8_t>(hi);
      } else {
        bytes.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), t});
      }
    }
    std::vector<RuleCall> out_calls;
    for (auto& [rule, targets] : calls) out_calls.push_back({rule, intern(closure(std::move(targets)))});
    dfa_[i].bytes = std::move(bytes);
    dfa_[i].calls = std::move(out_calls);
  }

  const Nfa& nfa_;
  int32_t end_;
  size_t& total_;
  size_t elements_ = 0;  // NFA states over every set so far
  size_t work_ = 0;      // sets expanded and intervals split, summed
  struct SetHash {
    size_t operator()(const std::vector<int32_t>& set) const {
      uint64_t h = 1469598103934665603ull;
      for (int32_t x : set) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
      return static_cast<size_t>(h ^ (h >> 29));
    }
  };
  std::unordered_map<std::vector<int32_t>, int32_t, SetHash> index_;
  std::vector<uint32_t> seen_;  // per NFA state: the closure that last met it
  uint32_t stamp_ = 0;
  std::vector<std::vector<int32_t>> sets_;
  std::vector<DfaState> dfa_;
};

// --- Analyses on the per-rule automata ---------------------------------------

// Rules whose language is not empty (`productive`) or holds "" (`nullable`):
// a rule qualifies when a path from its start to an accepting state uses only
// calls of qualifying rules (and, for productive, any byte edge). One search
// per rule, stopped at the calls of rules not (yet) known to qualify and
// resumed from there when they do: each state is visited once, so the cost is
// linear in the automata (a pass over every rule until nothing changes is
// quadratic on a long chain of rules, which a request can send).
std::vector<bool> rules_where(const std::vector<std::vector<DfaState>>& rules, bool bytes_allowed) {
  const size_t n = rules.size();
  std::vector<bool> ok(n, false);
  std::vector<std::vector<bool>> seen(n);
  // Per rule: the searches (caller, the state after the call) waiting for it.
  std::vector<std::vector<std::pair<size_t, int32_t>>> waiting(n);
  std::vector<size_t> qualified;  // rules whose waiting searches are not resumed yet
  std::vector<int32_t> work;
  // Whether rule r reaches an accepting state from state `from`, past what
  // its earlier searches saw.
  const auto search = [&](size_t r, int32_t from) {
    const auto& dfa = rules[r];
    std::vector<bool>& met = seen[r];
    work.clear();
    const auto visit = [&](int32_t t) {
      if (!met[static_cast<size_t>(t)]) {
        met[static_cast<size_t>(t)] = true;
        work.push_back(t);
      }
    };
    visit(from);
    while (!work.empty()) {
      const auto s = static_cast<size_t>(work.back());
      work.pop_back();
      if (dfa[s].accepting) return true;
      if (bytes_allowed)
        for (const ByteEdge& e : dfa[s].bytes) visit(e.target);
      for (const RuleCall& c : dfa[s].calls) {
        if (ok[static_cast<size_t>(c.rule)]) {
          visit(c.target);
        } else {
          waiting[static_cast<size_t>(c.rule)].emplace_back(r, c.target);
        }
      }
    }
    return false;
  };
  for (size_t r = 0; r < n; ++r) {
    seen[r].assign(rules[r].size(), false);
    if (search(r, 0)) {
      ok[r] = true;
      qualified.push_back(r);
    }
  }
  while (!qualified.empty()) {
    const size_t q = qualified.back();
    qualified.pop_back();
    const std::vector<std::pair<size_t, int32_t>> resumed = std::move(waiting[q]);
    for (const auto& [caller, target] : resumed) {
      if (!ok[caller] && search(caller, target)) {
        ok[caller] = true;
        qualified.push_back(caller);
      }
    }
  }
  return ok;
}

// Drops calls of rules that match nothing and edges into states that can no
// longer reach the end of their rule.
void trim(std::vector<std::vector<DfaState>>& rules, const std::vector<bool>& productive) {
  for (auto& dfa : rules) {
    for (DfaState& s : dfa)
      std::erase_if(s.calls, [&](const RuleCall& c) { return !productive[static_cast<size_t>(c.rule)]; });
    // Live: an accepting state, or one with an edge into a live state; found
    // backwards from the accepting states.
    std::vector<std::vector<int32_t>> into(dfa.size());
    for (size_t s = 0; s < dfa.size(); ++s) {
      for (const ByteEdge& e : dfa[s].bytes) into[static_cast<size_t>(e.target)].push_back(static_cast<int32_t>(s));
      for (const RuleCall& c : dfa[s].calls) into[static_cast<size_t>(c.target)].push_back(static_cast<int32_t>(s));
    }
    std::vector<bool> live(dfa.size(), false);
    std::vector<int32_t> work;
    for (size_t s = 0; s < dfa.size(); ++s) {
      if (dfa[s].accepting) {
        live[s] = true;
        work.push_back(static_cast<int32_t>(s));
      }
    }
    while (!work.empty()) {
      const auto t = static_cast<size_t>(work.back());
      work.pop_back();
      for (const int32_t s : into[t]) {
        if (!live[static_cast<size_t>(s)]) {
          live[static_cast<size_t>(s)] = true;
          work.push_back(s);
        }
      }
    }
    for (DfaState& s : dfa) {
      std::erase_if(s.bytes, [&](const ByteEdge& e) { return !live[static_cast<size_t>(e.target)]; });
      std::erase_if(s.calls, [&](const RuleCall& c) { return !live[static_cast<size_t>(c.target)]; });
    }
  }
}

// A rule that can call itself before consuming a byte would make the
// breadth-first run push forever.
void refuse_left_recursion(const std::vector<std::vector<DfaState>>& rules, const std::vector<bool>& nullable,
                           const std::vector<std::string>& names) {
  const size_t n = rules.size();
  std::vector<std::vector<int32_t>> first_calls(n);
  for (size_t r = 0; r < n; ++r) {
    const auto& dfa = rules[r];
    std::vector<bool> seen(dfa.size(), false);
    std::vector<int32_t> work{0};
    seen[0] = true;
    std::set<int32_t> callees;
    while (!work.empty()) {
      const auto s = static_cast<size_t>(work.back());
      work.pop_back();
      for (const RuleCall& c : dfa[s].calls) {
        callees.insert(c.rule);
        if (nullable[static_cast<size_t>(c.rule)] && !seen[static_cast<size_t>(c.target)]) {
          seen[static_cast<size_t>(c.target)] = true;
          work.push_back(c.target);
        }
      }
    }
    first_calls[r].assign(callees.begin(), callees.end());
  }
  // Depth-first search for a cycle, with an explicit stack (a chain of
  // rules may be as long as a request makes it); the path names it.
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<int32_t, size_t>> path;  // (rule, its next callee to try)
  for (size_t root = 0; root < n; ++root) {
    if (color[root] != 0) continue;
    color[root] = 1;
    path.emplace_back(static_cast<int32_t>(root), 0);
    while (!path.empty()) {
      auto& [r, next] = path.back();
      const std::vector<int32_t>& callees = first_calls[static_cast<size_t>(r)];
      if (next == callees.size()) {
        color[static_cast<size_t>(r)] = 2;
        path.pop_back();
        continue;
      }
      const int32_t c = callees[next++];
      if (color[static_cast<size_t>(c)] == 1) {
        // The cycle's rules, the first dozen of them where it is longer.
        std::string cycle;
        auto it = std::find_if(path.begin(), path.end(), [&](const auto& entry) { return entry.first == c; });
        const auto length = static_cast<size_t>(path.end() - it);
        for (size_t i = 0; it != path.end() && i < 12; ++it, ++i) cycle += names[static_cast<size_t>(it->first)] + " -> ";
        if (length > 12) cycle += fmt::format("({} more) -> ", length - 12);
        fail("grammar: rule \"{}\" is left-recursive ({}{}); rewrite it to consume text before recursing",
             names[static_cast<size_t>(c)], cycle, names[static_cast<size_t>(c)]);
      }
      if (color[static_cast<size_t>(c)] == 0) {
        color[static_cast<size_t>(c)] = 1;
        path.emplace_back(c, 0);
      }
    }
  }
}

}  // namespace

std::shared_ptr<const CompiledGrammar> compile_grammar(const Grammar& grammar) {
  BASALT_CHECK(!grammar.rules.empty(), "grammar: no rules");
  std::vector<std::vector<DfaState>> rules;
  std::vector<std::string> names;
  size_t total = 0;
  InlinePlan plan(grammar);
  for (const GrammarRule& rule : grammar.rules) {
    Nfa nfa(grammar, plan);
    const int32_t start = nfa.add(), end = nfa.add();
    nfa.compile(rule.body, start, end);
    rules.push_back(Determinizer(nfa, start, end, total).run());
    names.push_back(rule.name);
  }
  const std::vector<bool> productive = rules_where(rules, /*bytes_allowed=*/true);
  BASALT_CHECK(productive[static_cast<size_t>(grammar.root)], "grammar: rule \"{}\" matches no text at all",
               names[static_cast<size_t>(grammar.root)]);
  trim(rules, productive);
  refuse_left_recursion(rules, rules_where(rules, /*bytes_allowed=*/false), names);

  auto g = std::make_shared<CompiledGrammar>();
  g->rule_names = names;
  g->root = grammar.root;
  for (const auto& dfa : rules) {
    g->rule_start.push_back(static_cast<int32_t>(g->states.size()));
    g->states.resize(g->states.size() + dfa.size());
  }
  for (size_t r = 0; r < rules.size(); ++r) {
    const int32_t base = g->rule_start[r];
    for (size_t s = 0; s < rules[r].size(); ++s) {
      const DfaState& d = rules[r][s];
      AutomatonState& out = g->states[static_cast<size_t>(base) + s];
      out.rule = static_cast<int32_t>(r);
      out.accepting = d.accepting;
      out.bytes_begin = static_cast<uint32_t>(g->byte_edges.size());
      for (ByteEdge e : d.bytes) {
        e.target += base;
        g->byte_edges.push_back(e);
      }
      out.bytes_end = static_cast<uint32_t>(g->byte_edges.size());
      out.calls_begin = static_cast<uint32_t>(g->calls.size());
      for (RuleCall c : d.calls) g->calls.push_back({c.rule, c.target + base});
      out.calls_end = static_cast<uint32_t>(g->calls.size());
    }
  }
  for (size_t r = 0; r < rules.size(); ++r) {
    if (!is_distinct_rule(names[r])) continue;
    for (const uint8_t opener : {uint8_t{'['}, uint8_t{'{'}}) {
      const int32_t s = g->step(g->rule_start[r], opener);
      if (s < 0) continue;
      g->distinct_openers.push_back(s);
      if (is_open_distinct_rule(names[r])) g->open_distinct_openers.push_back(s);
    }
  }
  std::sort(g->distinct_openers.begin(), g->distinct_openers.end());
  std::sort(g->open_distinct_openers.begin(), g->open_distinct_openers.end());
  for (size_t r = 0; r < rules.size(); ++r) {
    const std::optional<int64_t> limit = bounded_rule_limit(names[r]);
    if (!limit) continue;
    const int32_t opener = g->step(g->rule_start[r], '"');
    BASALT_CHECK(opener >= 0, "grammar: bounded rule \"{}\" must begin with a quote", names[r]);
    g->bounded_regions.push_back({opener, std::make_shared<BoundedText>(grammar, static_cast<int32_t>(r), *limit)});
  }
  std::sort(g->bounded_regions.begin(), g->bounded_regions.end(),
            [](const BoundedRegion& a, const BoundedRegion& b) { return a.opener < b.opener; });
  std::array<bool, 257> starts{};  // a class begins at this byte
  starts[0] = true;
  for (const ByteEdge& e : g->byte_edges) {
    starts[e.lo] = true;
    starts[static_cast<size_t>(e.hi) + 1] = true;
  }
  int cls = -1;
  for (size_t b = 0; b < 256; ++b) {
    if (starts[b]) ++cls;
    g->byte_class[b] = static_cast<uint8_t>(cls);
  }
  g->byte_classes = cls + 1;
  return g;
}

// --- StackArena --------------------------------------------------------------

namespace {
uint32_t mix(uint64_t h) {
  h *= 0x9E3779B97F4A7C15ull;
  return static_cast<uint32_t>(h >> 32);
}
uint32_t node_hash(int32_t state, int32_t parent) {
  return mix((static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(parent));
}
uint32_t join_hash(std::span<const int32_t> members) {
  uint64_t h = 0x6A09E667F3BCC909ull;
  for (int32_t m : members) h = (h ^ static_cast<uint32_t>(m)) * 0x100000001B3ull + mix(h);
  return mix(h);
}
}  // namespace

StackArena::StackArena() { heads_.assign(64, -1); }

uint32_t StackArena::hash_of(size_t id) const {
  const StackNode& n = nodes_[id];
  return n.state == kJoinState ? join_hash(join_members(static_cast<int32_t>(id))) : node_hash(n.state, n.parent);
}

void StackArena::link(size_t id, uint32_t hash) {
  const uint32_t b = hash & static_cast<uint32_t>(heads_.size() - 1);
  next_.push_back(heads_[b]);
  heads_[b] = static_cast<int32_t>(id);
  if (nodes_.size() > heads_.size()) rehash(heads_.size() * 2);
}

void StackArena::rehash(size_t buckets) {
  heads_.assign(buckets, -1);
  const uint32_t mask = static_cast<uint32_t>(buckets - 1);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const uint32_t b = hash_of(i) & mask;
    next_[i] = heads_[b];
    heads_[b] = static_cast<int32_t>(i);
  }
}

int32_t StackArena::intern(int32_t state, int32_t parent) {
  const uint32_t hash = node_hash(state, parent);
  const uint32_t b = hash & static_cast<uint32_t>(heads_.size() - 1);
  for (int32_t i = heads_[b]; i >= 0; i = next_[static_cast<size_t>(i)]) {
    const StackNode& n = nodes_[static_cast<size_t>(i)];
    if (n.state == state && n.parent == parent) return i;
  }
  const auto id = static_cast<int32_t>(nodes_.size());
  nodes_.push_back({state, parent});
  link(static_cast<size_t>(id), hash);
  return id;
}

int32_t StackArena::join(std::vector<int32_t>& parents) {
  std::sort(parents.begin(), parents.end());
  parents.erase(std::unique(parents.begin(), parents.end()), parents.end());
  BASALT_ASSERT(!parents.empty());
  if (parents.size() == 1) return parents[0];
  const uint32_t hash = join_hash(parents);
  const uint32_t b = hash & static_cast<uint32_t>(heads_.size() - 1);
  for (int32_t i = heads_[b]; i >= 0; i = next_[static_cast<size_t>(i)]) {
    if (nodes_[static_cast<size_t>(i)].state != kJoinState) continue;
    const std::span<const int32_t> m = join_members(i);
    if (std::equal(m.begin(), m.end(), parents.begin(), parents.end())) return i;
  }
  const auto id = static_cast<int32_t>(nodes_.size());
  nodes_.push_back({kJoinState, static_cast<int32_t>(joins_.size())});
  joins_.emplace_back(members_.size(), members_.size() + parents.size());
  members_.insert(members_.end(), parents.begin(), parents.end());
  link(static_cast<size_t>(id), hash);
  return id;
}

void StackArena::rewind(size_t n) {
  const uint32_t mask = static_cast<uint32_t>(heads_.size() - 1);
  while (nodes_.size() > n) {
    const uint32_t b = hash_of(nodes_.size() - 1) & mask;
    BASALT_ASSERT(heads_[b] == static_cast<int32_t>(nodes_.size() - 1));
    heads_[b] = next_.back();
    if (nodes_.back().state == kJoinState) {
      members_.resize(joins_.back().first);
      joins_.pop_back();
    }
    nodes_.pop_back();
    next_.pop_back();
  }
}

// --- StackWork ---------------------------------------------------------------

void StackWork::new_pass() {
  if (++pass_ == 0) {
    std::fill(seen_.begin(), seen_.end(), 0u);
    pass_ = 1;
  }
}

bool StackWork::mark(int32_t id) {
  const auto i = static_cast<size_t>(id);
  if (i >= seen_.size()) seen_.resize(std::max(i + 1, seen_.size() * 2), 0u);
  if (seen_[i] == pass_) return false;
  seen_[i] = pass_;
  return true;
}

ClosureFlags StackWork::close(const CompiledGrammar& g, StackArena& arena, std::span<const int32_t> roots,
                              std::vector<int32_t>& out) {
  ClosureFlags flags;
  new_pass();
  out.clear();
  work_.clear();
  for (int32_t r : roots)
    if (mark(r)) work_.push_back(r);
  while (!work_.empty()) {
    const int32_t id = work_.back();
    work_.pop_back();
    out.push_back(id);
    const StackNode node = arena[id];
    const AutomatonState& s = g.states[static_cast<size_t>(node.state)];
    for (uint32_t c = s.calls_begin; c < s.calls_end; ++c) {
      const RuleCall& call = g.calls[c];
      // A call in tail position pushes nothing: where the caller would
      // continue it can only return, so the callee returns for it. Rules
      // that end by calling the next (a regular language written as one
      // rule per state) then read any length of text on a stack of one.
      const AutomatonState& after = g.states[static_cast<size_t>(call.target)];
      const bool tail = after.accepting && after.bytes_begin == after.bytes_end && after.calls_begin == after.calls_end;
      const int32_t ret = tail ? node.parent : arena.intern(call.target, node.parent);
      const int32_t callee = arena.intern(g.rule_start[static_cast<size_t>(call.rule)], ret);
      if (mark(callee)) work_.push_back(callee);
    }
    BASALT_CHECK(out.size() <= kMaxLiveStacks,
                 "structured output: the grammar is too ambiguous here (more than {} parses of the text are alive "
                 "at once, as when anyOf branches that begin alike nest); make the alternatives differ early",
                 kMaxLiveStacks);
    if (s.accepting) {
      auto return_into = [&](int32_t parent) {
        if (parent == kStackBottom) {
          flags.can_end = true;
        } else if (parent == kStackUnknown) {
          flags.escaped = true;
        } else if (mark(parent)) {
          work_.push_back(parent);
        }
      };
      if (arena.is_join(node.parent)) {
        for (int32_t p : arena.join_members(node.parent)) return_into(p);
      } else {
        return_into(node.parent);
      }
    }
  }
  return flags;
}

void StackWork::step(const CompiledGrammar& g, StackArena& arena, std::span<const int32_t> closed, uint8_t byte,
                     std::vector<int32_t>& out) {
  new_pass();
  out.clear();
  for (int32_t id : closed) {
    const StackNode node = arena[id];
    const int32_t t = g.step(node.state, byte);
    if (t < 0) continue;
    const int32_t next = arena.intern(t, node.parent);
    if (mark(next)) out.push_back(next);
  }
  if (out.size() > 1) merge_tops(arena, out);
}

void StackWork::merge_tops(StackArena& arena, std::vector<int32_t>& set) {
  // Most steps leave distinct top states: find out in one pass.
  uint32_t max_state = 0;
  for (int32_t id : set) max_state = std::max(max_state, static_cast<uint32_t>(arena[id].state));
  if (state_seen_.size() <= max_state) state_seen_.resize(max_state + 1, 0u);
  bool repeated = false;
  for (int32_t id : set) {
    uint32_t& seen = state_seen_[static_cast<size_t>(arena[id].state)];
    repeated |= seen == pass_;
    seen = pass_;
  }
  if (!repeated) return;
  tops_.clear();
  for (int32_t id : set) tops_.emplace_back(arena[id].state, id);
  std::sort(tops_.begin(), tops_.end());
  set.clear();
  for (size_t i = 0; i < tops_.size();) {
    size_t j = i + 1;
    while (j < tops_.size() && tops_[j].first == tops_[i].first) ++j;
    if (j == i + 1) {
      set.push_back(tops_[i].second);
    } else {
      parents_.clear();
      for (size_t k = i; k < j; ++k) {
        const int32_t p = arena[tops_[k].second].parent;
        if (arena.is_join(p)) {
          const std::span<const int32_t> m = arena.join_members(p);
          parents_.insert(parents_.end(), m.begin(), m.end());
        } else {
          parents_.push_back(p);
        }
      }
      set.push_back(arena.intern(tops_[i].first, arena.join(parents_)));
    }
    i = j;
  }
}

}  // namespace basalt
