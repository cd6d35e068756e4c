#include "grammar/token_mask.h"

#include <algorithm>
#include <bit>
#include <bitset>
#include <optional>

#include "core/error.h"
#include "grammar/automaton.h"
#include "grammar/matcher_state.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace basalt {
namespace {

// Walks tokens in byte order from one set of stacks, keeping the sets after
// each byte of the current token so that the next token starts from the
// bytes it shares with this one.
//
// A level that holds one stack (a state on a parent) steps without a
// closure when the byte is the top state's alone: not a first byte of what
// the state's calls lead to, nor of what returning into the parent can read
// when the state may return. Inside a string, a word of a pattern, or a
// label, that is nearly every byte, and the step is one lookup in a table
// of the walker's own (a row per state met, a column per byte class of the
// grammar) with no stack node made.
class TrieWalker {
 public:
  TrieWalker(const CompiledGrammar& g, UnitReach& reach, StackArena& arena, StackWork& work,
             std::span<const int32_t> root)
      : g_(g), reach_(reach), arena_(arena), work_(work), base_(arena.size()),
        columns_(static_cast<size_t>(g.byte_classes)), row_of_(g.states.size(), -1) {
    levels_.resize(1);
    levels_[0].set.assign(root.begin(), root.end());
    levels_[0].set_ready = true;
    single(levels_[0]);
  }
  ~TrieWalker() { arena_.rewind(base_); }

  // Walks `bytes`, whose first `lcp` bytes are the last walked token's;
  // returns how many bytes some stack consumed (bytes.size(): all).
  size_t walk(std::string_view bytes, size_t lcp) {
    if (dead_ && lcp > depth_) return depth_;  // shares the byte that failed
    const size_t keep = std::min(lcp, depth_);
    if (keep < depth_ && arena_.size() > levels_[keep + 1].mark) arena_.rewind(levels_[keep + 1].mark);
    depth_ = keep;
    dead_ = false;
    if (levels_.size() <= bytes.size()) levels_.resize(bytes.size() + 1);
    for (size_t d = keep; d < bytes.size(); ++d) {
      Level& level = levels_[d];
      Level& next = levels_[d + 1];
      const auto byte = static_cast<uint8_t>(bytes[d]);
      const bool escaped_before = d > 0 && levels_[d - 1].escaped;
      if (level.row >= 0) {
        int32_t move = moves_[static_cast<size_t>(level.row) * columns_ + g_.byte_class[byte]];
        bool escaped = escaped_before;
        if (move != kNotAlone && level.returns) {
          const Return& back = return_of(level);
          if (back.first[byte]) move = kNotAlone;
          escaped = escaped || back.escaped;
        }
        if (move != kNotAlone) {
          // The byte is the top state's alone: its closure's other stacks
          // cannot read it, so the step is the state's own edge.
          level.escaped = escaped;
          next.mark = arena_.size();
          if (move == kDead) return fail(d);
          if (move == kUnresolved) move = resolve(level.row, byte);
          next.set_ready = false;
          next.closed_ready = false;
          next.parent = level.parent;
          next.back = level.back;  // the same parent
          if (move >= 0) {
            next.row = move >> 1;
            next.returns = (move & 1) != 0;
          } else {  // kReturns: a rule's end, which stands for its caller
            next.row = -1;
            next.top = g_.step(rows_[static_cast<size_t>(level.row)].state, byte);
            settle(next);
          }
          depth_ = d + 1;
          continue;
        }
        if (!level.set_ready) {
          // Made before next.mark, so it lives as long as this level.
          level.set.assign(1, arena_.intern(rows_[static_cast<size_t>(level.row)].state, level.parent));
          level.set_ready = true;
        }
      }
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
      next.set_ready = true;
      next.closed_ready = false;
      single(next);
      depth_ = d + 1;
    }
    return bytes.size();
  }

  // After a walk that stopped at `depth`: whether some stack could have
  // returned into an unknown caller with that byte still to consume.
  bool escaped_at(size_t depth) const { return levels_[depth].escaped; }

  // A stack that reads the rest of a token unwalked: at `depth` bytes
  // into it the walk holds one stack, and what follows is `family` bytes,
  // which that stack reads, any of them alike, for `reach` bytes on
  // (family_reach: a string's characters, a word's, a label's).
  struct TailReach {
    size_t depth = 0;
    int family = 0;
    size_t reach = 0;
  };
  // The reach that accepts the token at sorted position i of `v`, which
  // shares `shared` bytes with the last token walked, without a walk; none
  // when no level it shares (of the deepest few) is such a stack. The
  // states of a word-count pattern or of a hostname label's positions are
  // walked whole once each; this leaves to such a walk mostly the tokens'
  // first bytes, and the tokens that follow the one it accepts are checked
  // against the same reach (accepts()).
  std::optional<TailReach> tail_reach(const TokenVocabulary& v, size_t i, size_t shared) {
    const size_t top = std::min(shared, depth_);
    // The deepest levels only: a walk is what finds the rest.
    const size_t lowest = top >= kTailLevels ? top + 1 - kTailLevels : 0;
    for (size_t d = top + 1; d-- > lowest;) {
      const int32_t row = levels_[d].row;
      if (row < 0) continue;
      Row& r = rows_[static_cast<size_t>(row)];
      if (r.reaching < 0) {
        r.reaching = 0;
        for (int f = 0; f < TokenVocabulary::kUnitFamilies; ++f) {
          r.reach[f] = static_cast<int32_t>(family_reach(r.state, f));
          if (r.reach[f] > 0) r.reaching = static_cast<int8_t>(r.reaching | (1 << f));
        }
      }
      for (int f = 0; f < TokenVocabulary::kUnitFamilies; ++f) {
        if (!((r.reaching >> f) & 1) || v.family_tail(f, i) > d) continue;
        const TailReach found{d, f, static_cast<size_t>(r.reach[f])};
        if (accepts(found, v, i)) return found;
      }
    }
    return std::nullopt;
  }
  // Whether `r` reads the rest of token i, which shares r.depth bytes with
  // the token r was found for.
  static bool accepts(const TailReach& r, const TokenVocabulary& v, size_t i) {
    const size_t units = v.family_units(r.family, i, r.depth);
    return units != std::string_view::npos && units <= r.reach;
  }
  static constexpr size_t kTailLevels = 3;

  // How many plain bytes (TokenVocabulary::is_plain_byte) in a row one
  // stack of the root's closure takes by its own edges, every plain byte
  // alike at each step (a string's characters: a state that loops, or a
  // bounded run's positions, also where the root calls the string's rule):
  // a plain token no longer than that is accepted without a walk, since
  // that stack alone reads all of it. kMaxPlainReach for a loop.
  static constexpr size_t kMaxPlainReach = 1 << 16;
  size_t plain_reach() {
    std::vector<uint8_t> representatives;  // a plain byte of each class that has one
    std::vector<bool> seen(static_cast<size_t>(g_.byte_classes), false);
    for (int b = 0; b < 256; ++b) {
      const auto byte = static_cast<uint8_t>(b);
      if (!TokenVocabulary::is_plain_byte(byte) || seen[g_.byte_class[byte]]) continue;
      seen[g_.byte_class[byte]] = true;
      representatives.push_back(byte);
    }
    const Level& root = levels_[0];
    const size_t mark = arena_.size();
    std::vector<int32_t> roots = root.set;
    if (!root.set_ready) roots.assign(1, arena_.intern(rows_[static_cast<size_t>(root.row)].state, root.parent));
    work_.close(g_, arena_, roots, closed_);
    size_t best = 0;
    for (const int32_t id : closed_) best = std::max(best, own_plain_reach(arena_[id].state, representatives));
    arena_.rewind(mark);
    return best;
  }
  size_t own_plain_reach(int32_t state, const std::vector<uint8_t>& representatives) const {
    size_t reach = 0;
    for (; reach < 256; ++reach) {
      int32_t next = -1;
      for (const uint8_t b : representatives) {
        const int32_t t = g_.step(state, b);
        if (t < 0 || (next >= 0 && t != next)) return reach;
        next = t;
      }
      if (next < 0) return reach;
      next = through_tail_calls(next);  // a tail call goes on in its callee
      if (next == state) return kMaxPlainReach;
      state = next;
    }
    return reach;
  }

 private:
  // What returning into a parent can read next: the first bytes of the
  // closure of that return, and whether it reached an unknown caller.
  struct Return {
    std::bitset<256> first;
    bool escaped = false;
  };
  // A state met alone on top of a stack, with its row of moves_: per byte
  // class (its moves whichever the parent is)
  //   row of the state the edge leads to (as settle() leaves it) * 2 + 1
  //     when that state's closure may return into the parent, whose
  //     first bytes then need checking too;
  //   kDead: no edge; kNotAlone: a stack the state's calls lead to may read
  //   the byte too (a closure decides); kReturns: the edge ends the rule
  //   (settle() pops the parent); kUnresolved: an edge not yet followed.
  struct Row {
    int32_t state = -1;
    bool returns = false;  // the state's closure may return into its parent
    // family_reach() per unit family, and a bit for each family it is
    // above 0 for (-1 until a walk asks).
    int32_t reach[TokenVocabulary::kUnitFamilies] = {};
    int8_t reaching = -1;
  };
  static constexpr int32_t kDead = -1, kNotAlone = -2, kReturns = -3, kUnresolved = -4;
  struct Level {
    // The stacks after this many bytes. One stack is held as its top
    // state's row (row >= 0, top state rows_[row].state) and its parent;
    // `set` holds the stacks as nodes once set_ready (for one stack, made
    // the first time a byte needs the closure).
    int32_t row = -1;
    bool returns = false;    // rows_[row].returns
    int32_t top = -1;        // settle()'s scratch
    int32_t parent = kStackBottom;
    int32_t back = -1;       // `parent`'s Return in backs_, once known
    std::vector<int32_t> set;
    bool set_ready = false;
    std::vector<int32_t> closed;  // the closure of `set`, once closed_ready
    bool closed_ready = false;
    bool closure_escaped = false;  // that closure returned into kStackUnknown
    bool escaped = false;          // a closure up to here returned into kStackUnknown
    size_t mark = 0;               // the arena's size before this level was made
  };

  // How many units of family f in a row one stack in `state` reads by its
  // own edges, whatever the units: at each step every unit of the family
  // leads to the same state (unit_step), or ends the rule there.
  // UnitReach::kMax for a loop (or past it). Shared by the masker's walks.
  size_t family_reach(int32_t state, int f) {
    if (const int32_t known = reach_.get(f, state); known >= 0) return static_cast<size_t>(known);
    // Follows the chain to a state whose reach is known, then counts back.
    if (on_chain_.empty()) on_chain_.assign(g_.states.size(), false);
    chain_.clear();
    int32_t s = state;
    size_t known = 0;
    while (true) {
      if (const int32_t m = reach_.get(f, s); m >= 0) {
        known = static_cast<size_t>(m);
        break;
      }
      if (on_chain_[static_cast<size_t>(s)] || chain_.size() >= UnitReach::kMax) {  // a loop
        known = UnitReach::kMax;
        break;
      }
      on_chain_[static_cast<size_t>(s)] = true;
      chain_.push_back(s);
      const int32_t next = unit_step(s, f);
      if (next < 0 || ends_rule(next)) {
        // None alike, or the unit ends the rule: what follows is the caller's.
        known = next < 0 ? 0 : 1;
        on_chain_[static_cast<size_t>(s)] = false;
        reach_.set(f, s, static_cast<int32_t>(known));
        chain_.pop_back();
        break;
      }
      s = next;
    }
    for (size_t k = chain_.size(); k-- > 0;) {
      known = std::min(known + 1, UnitReach::kMax);
      on_chain_[static_cast<size_t>(chain_[k])] = false;
      reach_.set(f, chain_[k], static_cast<int32_t>(known));
    }
    return static_cast<size_t>(reach_.get(f, state));
  }
  // The state (through tail calls) every unit of family f leads `state`
  // to by its own edges, -1 when they do not all lead to one. A UTF-8
  // character's bytes are followed class by class, each byte's state alive
  // and inside the rule, within a budget (patterns that tell many
  // characters apart get none).
  int32_t unit_step(int32_t state, int f) {
    const int bytes_family = f == TokenVocabulary::kTextFamily ? TokenVocabulary::kPlainFamily : f;
    std::vector<uint8_t>& bytes = family_bytes_[bytes_family];
    if (bytes.empty()) {  // a byte of each class in the family
      std::vector<bool> seen(columns_, false);
      for (int b = 0; b < 256; ++b) {
        const auto byte = static_cast<uint8_t>(b);
        if (!TokenVocabulary::in_family(bytes_family, byte) || seen[g_.byte_class[byte]]) continue;
        seen[g_.byte_class[byte]] = true;
        bytes.push_back(byte);
      }
    }
    int32_t to = -1;
    const auto agree = [&](int32_t t) {
      if (t < 0) return false;
      t = through_tail_calls(t);
      if (to >= 0 && t != to) return false;
      to = t;
      return true;
    };
    for (const uint8_t b : bytes)
      if (!agree(g_.step(state, b))) return -1;
    if (f != TokenVocabulary::kTextFamily) return to;
    // RFC 3629's well-formed sequences of two bytes or more.
    struct Sequence {
      int length;
      uint8_t lo[4], hi[4];
    };
    static constexpr Sequence kSequences[] = {
        {2, {0xC2, 0x80}, {0xDF, 0xBF}},
        {3, {0xE0, 0xA0, 0x80}, {0xE0, 0xBF, 0xBF}},
        {3, {0xE1, 0x80, 0x80}, {0xEC, 0xBF, 0xBF}},
        {3, {0xED, 0x80, 0x80}, {0xED, 0x9F, 0xBF}},
        {3, {0xEE, 0x80, 0x80}, {0xEF, 0xBF, 0xBF}},
        {4, {0xF0, 0x90, 0x80, 0x80}, {0xF0, 0xBF, 0xBF, 0xBF}},
        {4, {0xF1, 0x80, 0x80, 0x80}, {0xF3, 0xBF, 0xBF, 0xBF}},
        {4, {0xF4, 0x80, 0x80, 0x80}, {0xF4, 0x8F, 0xBF, 0xBF}},
    };
    size_t budget = kCharacterSteps;
    const auto follow = [&](auto&& self, int32_t at, const Sequence& seq, size_t k) -> bool {
      if (k >= 4) return false;  // (lengths are 2 to 4)
      for (int b = seq.lo[k]; b <= seq.hi[k];) {
        int end = b;  // the class of b ends at `end` within the range
        while (end < seq.hi[k] && g_.byte_class[end + 1] == g_.byte_class[b]) ++end;
        if (budget-- == 0) return false;
        const int32_t t = g_.step(at, static_cast<uint8_t>(b));
        if (k + 1 == static_cast<size_t>(seq.length)) {
          if (!agree(t)) return false;
        } else {
          if (t < 0) return false;
          const int32_t inside = through_tail_calls(t);
          if (ends_rule(inside) || !self(self, inside, seq, k + 1)) return false;
        }
        b = end + 1;
      }
      return true;
    };
    for (const Sequence& seq : kSequences)
      if (!follow(follow, state, seq, size_t{0})) return -1;
    return to;
  }
  static constexpr size_t kCharacterSteps = 1024;

  void single(Level& level) {
    level.back = -1;
    level.row = -1;
    if (level.set.size() != 1) return;
    level.top = arena_[level.set[0]].state;
    level.parent = arena_[level.set[0]].parent;
    settle(level);
  }
  // A level's one stack (`top` on `parent`) as the stack it stands for, so
  // that the byte after it can take the fast path: a rule's end, which can
  // only return, is its caller's continuation; a state that only calls a
  // rule in tail position (a regex's next state, written as a rule) is that
  // rule's start. Both leave the closure, and so the steps, as they were.
  // Sets the level's row.
  void settle(Level& level) {
    for (int hops = 0; hops < kMaxSettleHops; ++hops) {
      const AutomatonState& s = g_.states[static_cast<size_t>(level.top)];
      if (s.bytes_begin != s.bytes_end) break;
      if (s.calls_begin == s.calls_end) {
        if (!s.accepting || level.parent < 0 || arena_.is_join(level.parent)) break;
        const StackNode& caller = arena_[level.parent];
        level.top = caller.state;
        level.parent = caller.parent;
        level.back = -1;
      } else if (const int32_t callee = tail_callee(level.top); callee >= 0) {
        level.top = callee;
      } else {
        break;
      }
      level.set_ready = false;
      level.closed_ready = false;
    }
    level.row = row_of(level.top);
    level.returns = rows_[static_cast<size_t>(level.row)].returns;
  }
  // The start of the rule `state` only calls in tail position, -1 if it is
  // not such a state.
  int32_t tail_callee(int32_t state) const {
    const AutomatonState& s = g_.states[static_cast<size_t>(state)];
    if (s.accepting || s.bytes_begin != s.bytes_end || s.calls_end - s.calls_begin != 1) return -1;
    const RuleCall& call = g_.calls[s.calls_begin];
    return ends_rule(call.target) ? g_.rule_start[static_cast<size_t>(call.rule)] : -1;
  }
  // `state`, or where the calls it makes only in tail position lead.
  int32_t through_tail_calls(int32_t state) const {
    for (int hops = 0; hops < kMaxSettleHops; ++hops) {
      const int32_t callee = tail_callee(state);
      if (callee < 0) break;
      state = callee;
    }
    return state;
  }
  bool ends_rule(int32_t state) const {
    const AutomatonState& s = g_.states[static_cast<size_t>(state)];
    return s.accepting && s.bytes_begin == s.bytes_end && s.calls_begin == s.calls_end;
  }
  static constexpr int kMaxSettleHops = 64;

  int32_t row_of(int32_t state) {
    int32_t& row = row_of_[static_cast<size_t>(state)];
    if (row >= 0) return row;
    row = static_cast<int32_t>(rows_.size());
    Row r;
    r.state = state;
    const size_t base = moves_.size();
    moves_.resize(base + columns_, kDead);
    const AutomatonState& s = g_.states[static_cast<size_t>(state)];
    for (uint32_t e = s.bytes_begin; e < s.bytes_end; ++e)
      for (int b = g_.byte_edges[e].lo; b <= g_.byte_edges[e].hi; ++b) moves_[base + g_.byte_class[b]] = kUnresolved;
    if (s.calls_begin == s.calls_end) {
      r.returns = s.accepting;
    } else {
      std::bitset<256> others;
      const size_t mark = arena_.size();
      const int32_t root = arena_.intern(state, kStackUnknown);
      r.returns = work_.close(g_, arena_, std::span<const int32_t>(&root, 1), closed_).escaped;
      for (int32_t id : closed_)
        if (id != root) add_first_bytes(arena_[id].state, others);
      arena_.rewind(mark);
      for (size_t b = 0; b < 256; ++b)
        if (others[b]) moves_[base + g_.byte_class[b]] = kNotAlone;
    }
    rows_.push_back(r);
    return row;
  }
  // Follows row `row`'s edge on `byte` (and its class) for the first time.
  int32_t resolve(int32_t row, uint8_t byte) {
    const int32_t t = through_tail_calls(g_.step(rows_[static_cast<size_t>(row)].state, byte));
    int32_t move = kReturns;
    if (!ends_rule(t)) {
      const int32_t to = row_of(t);
      move = to * 2 + (rows_[static_cast<size_t>(to)].returns ? 1 : 0);
    }
    moves_[static_cast<size_t>(row) * columns_ + g_.byte_class[byte]] = move;
    return move;
  }
  void add_first_bytes(int32_t state, std::bitset<256>& bytes) const {
    const AutomatonState& s = g_.states[static_cast<size_t>(state)];
    for (uint32_t e = s.bytes_begin; e < s.bytes_end; ++e)
      for (int b = g_.byte_edges[e].lo; b <= g_.byte_edges[e].hi; ++b) bytes.set(static_cast<size_t>(b));
  }
  const Return& return_of(Level& level) {
    if (level.back >= 0) return backs_[static_cast<size_t>(level.back)];
    Return back;
    roots_.clear();
    const auto add = [&](int32_t parent) {
      if (parent == kStackUnknown) {
        back.escaped = true;
      } else if (parent != kStackBottom) {
        roots_.push_back(parent);
      }
    };
    if (arena_.is_join(level.parent)) {
      for (int32_t p : arena_.join_members(level.parent)) add(p);
    } else {
      add(level.parent);
    }
    if (!roots_.empty()) {
      const size_t mark = arena_.size();
      back.escaped = work_.close(g_, arena_, roots_, closed_).escaped || back.escaped;
      for (int32_t id : closed_) add_first_bytes(arena_[id].state, back.first);
      arena_.rewind(mark);
    }
    level.back = static_cast<int32_t>(backs_.size());
    backs_.push_back(back);
    return backs_.back();
  }
  size_t fail(size_t d) {
    arena_.rewind(levels_[d + 1].mark);
    dead_ = true;
    return d;
  }

  const CompiledGrammar& g_;
  UnitReach& reach_;
  StackArena& arena_;
  StackWork& work_;
  size_t base_;
  size_t columns_;  // the grammar's byte classes
  std::vector<Level> levels_;
  size_t depth_ = 0;  // levels_[0..depth_] hold the current token's prefix
  bool dead_ = false;
  std::vector<int32_t> roots_, closed_;  // return_of's and row_of's scratch
  std::vector<int32_t> row_of_;          // per state: its row, -1 until met
  std::vector<Row> rows_;
  std::vector<int32_t> moves_;  // columns_ per row
  std::vector<Return> backs_;   // each level's `back` indexes it
  // family_reach()'s: per family, a byte of each class; the chain it
  // follows, and which states are on it.
  std::vector<uint8_t> family_bytes_[TokenVocabulary::kUnitFamilies];
  std::vector<int32_t> chain_;
  std::vector<bool> on_chain_;  // per state, once needed
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

// Walks the tokens at `positions` of v.sorted() (ascending) from the
// walker's stacks, setting in `accepted` those some stack reads whole
// (passing over those already set) and adding to `undecided`, when given,
// those a stack leaves by returning into an unknown caller. A token that
// fails decides the tokens after it that share the failing byte, so those
// go with it unwalked.
void walk_positions(TrieWalker& walker, const TokenVocabulary& v, std::span<const int32_t> positions,
                    std::span<uint32_t> accepted, std::vector<int32_t>* undecided) {
  std::string_view last;  // the last token walked
  for (size_t k = 0; k < positions.size();) {
    const auto pos = static_cast<size_t>(positions[k]);
    const int32_t id = v.sorted()[pos];
    const std::string_view b = v.sorted_bytes(pos);
    const size_t shared = common_prefix(last, b);
    if (has_bit(accepted, id) || walker.tail_reach(v, pos, shared)) {
      set_bit(accepted, id);
      ++k;
      continue;
    }
    const size_t reached = walker.walk(b, shared);
    last = b;
    if (reached == b.size()) {
      set_bit(accepted, id);
      ++k;
      continue;
    }
    const std::string_view failed = b.substr(0, reached + 1);
    const bool escaped = walker.escaped_at(reached);
    do {
      if (escaped && undecided != nullptr) undecided->push_back(positions[k]);
      ++k;
    } while (k < positions.size() && v.sorted_bytes(static_cast<size_t>(positions[k])).starts_with(failed));
  }
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
  plain_.resize(sorted_.size());
  for (size_t i = 0; i < sorted_.size(); ++i) {
    const std::string_view b = sorted_bytes(i);
    plain_[i] = std::all_of(b.begin(), b.end(), [](char c) { return is_plain_byte(static_cast<uint8_t>(c)); });
  }
  for (int f = 0; f < kUnitFamilies; ++f) {
    family_tail_[f].resize(sorted_.size());
    for (size_t i = 0; i < sorted_.size(); ++i) {
      const std::string_view b = sorted_bytes(i);
      size_t tail = 0;
      if (f == kTextFamily) {  // read forwards: characters begin where the one before ends
        uint64_t starts = 0;
        for (size_t at = 0; at < b.size();) {
          const size_t length = is_plain_byte(static_cast<uint8_t>(b[at])) ? 1 : utf8_character(b, at);
          if (length == 0) {
            tail = at + 1;
            starts = 0;
          } else if (at < 64) {
            starts |= uint64_t{1} << at;
          }
          at += length > 0 ? length : 1;
        }
        text_starts_.push_back(starts);
      } else {
        tail = b.size();
        while (tail > 0 && in_family(f, static_cast<uint8_t>(b[tail - 1]))) --tail;
      }
      family_tail_[f][i] = static_cast<uint32_t>(tail);
    }
  }
  longest_first_.resize(sorted_.size());
  for (size_t i = 0; i < sorted_.size(); ++i) longest_first_[i] = static_cast<int32_t>(i);
  std::stable_sort(longest_first_.begin(), longest_first_.end(), [&](int32_t a, int32_t b) {
    return sorted_bytes(static_cast<size_t>(a)).size() > sorted_bytes(static_cast<size_t>(b)).size();
  });
}

size_t TokenVocabulary::utf8_character(std::string_view bytes, size_t at) {
  if (static_cast<uint8_t>(bytes[at]) < 0x80) return 0;
  bool complete = false;
  const size_t valid = unicode::utf8_valid_prefix(bytes, at, complete);
  return complete || at + valid == bytes.size() ? valid : 0;
}

size_t TokenVocabulary::text_units(size_t i, size_t from) const {
  const std::string_view b = sorted_bytes(i);
  if (b.size() <= 64) {
    const uint64_t starts = text_starts_[i];
    if (from < b.size() && !((starts >> from) & 1)) return std::string_view::npos;  // inside a character
    return static_cast<size_t>(std::popcount(from < 64 ? starts >> from : 0));
  }
  size_t at = family_tail(kTextFamily, i), units = 0;
  for (; at < from; ++units) at += is_plain_byte(static_cast<uint8_t>(b[at])) ? 1 : utf8_character(b, at);
  if (at != from) return std::string_view::npos;  // inside a character
  for (units = 0; at < b.size(); ++units) at += is_plain_byte(static_cast<uint8_t>(b[at])) ? 1 : utf8_character(b, at);
  return units;
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

UnitReach::UnitReach(size_t states) {
  for (auto& table : reach_) {
    table = std::make_unique<std::atomic<int32_t>[]>(states);
    for (size_t s = 0; s < states; ++s) table[s].store(-1, std::memory_order_relaxed);
  }
}

TokenMasker::TokenMasker(std::shared_ptr<const CompiledGrammar> grammar,
                         std::shared_ptr<const TokenVocabulary> vocabulary)
    : grammar_(std::move(grammar)),
      vocabulary_(std::move(vocabulary)),
      reach_(std::make_unique<UnitReach>(grammar_->states.size())) {}

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
  TrieWalker walker(*grammar_, *reach_, arena, work, std::span<const int32_t>(&node, 1));
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
    // Plain tokens the root state reads alone, and tokens whose tail a
    // shared level's stack reads (TrieWalker::tail_reach), are accepted
    // unwalked; the next walk starts from what it shares with the last
    // token walked.
    const size_t reach = walker.plain_reach();
    size_t shared = 0;  // bytes shared with the last token walked
    for (size_t i = 0; i < sorted.size();) {
      const std::string_view b = v.sorted_bytes(i);
      shared = std::min(shared, static_cast<size_t>(v.lcp(i)));
      if (b.size() <= reach && v.plain(i)) {
        set_bit(e.accepted, sorted[i]);
        ++i;
        continue;
      }
      if (const auto tail = walker.tail_reach(v, i, shared)) {
        // It and the tokens after it that share its stack and tail.
        do {
          set_bit(e.accepted, sorted[i]);
          ++i;
        } while (i < sorted.size() && static_cast<size_t>(v.lcp(i)) >= tail->depth &&
                 TrieWalker::accepts(*tail, v, i) && (shared = std::min(shared, static_cast<size_t>(v.lcp(i))), true));
        continue;
      }
      const size_t reached = walker.walk(b, shared);
      shared = b.size();
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
    walk_positions(walker, v, shorter->undecided, e.accepted, &e.undecided);
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
    TrieWalker walker(*grammar_, *reach_, s.arena, s.work, current);
    walk_positions(walker, v, undecided, words, nullptr);
  }
  s.closure(*grammar_);
  if (s.flags.can_end)
    for (int32_t id : v.end_ids()) set_bit(words, id);
}

}  // namespace basalt
