// CompiledGrammar: a Grammar (grammar/ebnf.h) as one deterministic automaton
// per rule, and the pushdown run over them that matchers and token masks
// share (the stack arena, closure and byte step).
//
// Each rule's body is compiled into states whose edges consume a byte range
// or call a rule (the callee runs, then the caller continues at the edge's
// target). Within a rule, byte edges are deterministic (subset
// construction); calls are not, and neither is the choice between calling,
// consuming and returning: that is what the set of stacks carries. The
// automaton is trimmed: every state can still reach the end of its rule, so
// a stack that consumed a byte can always be completed.
//
// Stacks are nodes in a StackArena: (state, parent), where the parent's state
// is where the caller continues. Nodes are interned, so equal stacks are one
// node, sets of stacks dedupe by id, and the breadth-first run cannot grow
// without bound except through left recursion, which compile_grammar()
// refuses. A parent may also be a join: a set of parents, made when a step
// leaves several stacks with the same top state (the graph-structured stack
// of GLR parsers, in its simplest form). Without it, alternatives that parse
// the same text in different ways and nest (anyOf branches that begin alike,
// inside each other) would keep a stack per way, 2^depth of them; with it
// the stacks after a step have distinct top states.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "grammar/bounded_string.h"
#include "grammar/ebnf.h"

namespace basalt {

struct ByteEdge {
  uint8_t lo = 0, hi = 0;  // inclusive
  int32_t target = -1;
};

struct RuleCall {
  int32_t rule = -1;
  int32_t target = -1;  // where the caller continues after the rule
};

struct AutomatonState {
  int32_t rule = -1;
  bool accepting = false;  // the rule may end here
  uint32_t bytes_begin = 0, bytes_end = 0;  // ByteEdges, sorted, disjoint
  uint32_t calls_begin = 0, calls_end = 0;
};

class CompiledGrammar {
 public:
  std::vector<AutomatonState> states;
  std::vector<ByteEdge> byte_edges;
  std::vector<RuleCall> calls;
  std::vector<int32_t> rule_start;
  std::vector<std::string> rule_names;
  int32_t root = 0;
  // Sorted: the states a distinct rule (grammar/ebnf.h) is in right after
  // its first byte, `[` or `{`.
  std::vector<int32_t> distinct_openers;
  std::vector<int32_t> open_distinct_openers;  // those of kOpenDistinctRulePrefix rules
  // The bounded rules (grammar/ebnf.h), by the state their opening quote
  // leads to, sorted.
  std::vector<BoundedRegion> bounded_regions;
  // Bytes no edge tells apart share a class (0 to byte_classes - 1): every
  // state steps them alike, so per-state tables have a column per class.
  std::array<uint8_t, 256> byte_class{};
  int byte_classes = 1;

  // The state `byte` leads to from `state`, -1 if none.
  int32_t step(int32_t state, uint8_t byte) const {
    const AutomatonState& s = states[static_cast<size_t>(state)];
    for (uint32_t e = s.bytes_begin; e < s.bytes_end; ++e) {
      const ByteEdge& edge = byte_edges[e];
      if (byte < edge.lo) return -1;
      if (byte <= edge.hi) return edge.target;
    }
    return -1;
  }
  bool has_bytes(int32_t state) const {
    const AutomatonState& s = states[static_cast<size_t>(state)];
    return s.bytes_begin != s.bytes_end;
  }
};

// A stack: `state` on top of `parent` (a node id, or kStackBottom). A join
// node has state kJoinState and is only ever a parent.
struct StackNode {
  int32_t state;
  int32_t parent;  // a join: its index among the arena's joins
};
inline constexpr int32_t kJoinState = -1;
// The bottom of a real stack: returning into it ends the grammar.
inline constexpr int32_t kStackBottom = -1;
// An unknown caller (token-mask precomputation): returning into it leaves
// what the precomputation can decide.
inline constexpr int32_t kStackUnknown = -2;

class StackArena {
 public:
  StackArena();
  int32_t intern(int32_t state, int32_t parent);
  // The join of `parents` (node ids or kStackBottom / kStackUnknown, none a
  // join): sorted and deduplicated here; one parent is returned as it is.
  int32_t join(std::vector<int32_t>& parents);
  const StackNode& operator[](int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  bool is_join(int32_t id) const { return id >= 0 && nodes_[static_cast<size_t>(id)].state == kJoinState; }
  // The parents a join stands for.
  std::span<const int32_t> join_members(int32_t id) const {
    const auto [begin, end] = joins_[static_cast<size_t>(nodes_[static_cast<size_t>(id)].parent)];
    return {members_.data() + begin, end - begin};
  }
  size_t size() const { return nodes_.size(); }
  // Drops every node made since size() was `n` (nodes are dropped last
  // made first, so each is the head of its hash chain).
  void rewind(size_t n);

 private:
  uint32_t hash_of(size_t id) const;
  void link(size_t id, uint32_t hash);  // into its hash chain; rehashes when full
  void rehash(size_t buckets);
  std::vector<StackNode> nodes_;
  std::vector<int32_t> next_;   // hash chain, per node
  std::vector<int32_t> heads_;  // per bucket
  std::vector<std::pair<size_t, size_t>> joins_;  // member ranges, per join
  std::vector<int32_t> members_;
};

// What a closure met besides its nodes.
struct ClosureFlags {
  bool can_end = false;  // a stack may return into kStackBottom
  bool escaped = false;  // a stack may return into kStackUnknown
};

// The most stacks one closure may hold: with joins a closure holds about
// as many stacks as the grammar has states reachable there, so this is a
// backstop against a grammar (or a bug) that defeats them, not a limit an
// ordinary grammar meets. Past it the closure throws basalt::Error.
inline constexpr size_t kMaxLiveStacks = 8192;

// Scratch space for closures and steps (one per thread of use).
class StackWork {
 public:
  // Every stack reachable from `roots` by calls and returns, without
  // consuming a byte (roots included), into `out`. Throws basalt::Error
  // past kMaxLiveStacks.
  ClosureFlags close(const CompiledGrammar& g, StackArena& arena, std::span<const int32_t> roots,
                     std::vector<int32_t>& out);
  // The stacks that consume `byte` from `closed`, deduplicated, into `out`;
  // stacks left with the same top state become one, on the join of their
  // parents.
  void step(const CompiledGrammar& g, StackArena& arena, std::span<const int32_t> closed, uint8_t byte,
            std::vector<int32_t>& out);

 private:
  bool mark(int32_t id);  // true when first seen since the last new_pass()
  void new_pass();
  void merge_tops(StackArena& arena, std::vector<int32_t>& set);
  std::vector<uint32_t> seen_;
  uint32_t pass_ = 0;
  std::vector<int32_t> work_;
  std::vector<uint32_t> state_seen_;  // per automaton state: the pass it was last a top in
  std::vector<std::pair<int32_t, int32_t>> tops_;  // (state, node) while merging
  std::vector<int32_t> parents_;
};

}  // namespace basalt
