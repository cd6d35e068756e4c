// The inside of a GrammarMatcher, shared by the matcher and the token masker
// (grammar/token_mask.h): the stack arena, the sets of stacks after each
// accepted piece of text, and the closure of the current set.
#pragma once

#include <vector>

#include "grammar/automaton.h"
#include "grammar/matcher.h"

namespace basalt {

struct GrammarMatcher::State {
  StackArena arena;
  StackWork work;
  // sets[0]: the start; sets[i]: the stacks after the i-th accept_bytes()
  // (as stepped, not closed). marks[i - 1]: the arena's size before it.
  std::vector<std::vector<int32_t>> sets;
  std::vector<size_t> marks;

  // The closure of sets.back() and its flags, computed on demand.
  const std::vector<int32_t>& closure(const CompiledGrammar& g);
  std::vector<int32_t> closed;
  ClosureFlags flags;
  bool closed_valid = false;
};

}  // namespace basalt
