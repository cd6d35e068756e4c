#include "grammar/matcher.h"

#include <algorithm>

#include "core/error.h"
#include "grammar/automaton.h"
#include "grammar/matcher_state.h"

namespace basalt {

const std::vector<int32_t>& GrammarMatcher::State::closure(const CompiledGrammar& g) {
  if (!closed_valid) {
    flags = work.close(g, arena, sets.back(), closed);
    closed_valid = true;
  }
  return closed;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), state_(std::make_shared<State>()) {
  const int32_t root = state_->arena.intern(grammar_->rule_start[static_cast<size_t>(grammar_->root)], kStackBottom);
  state_->sets.push_back({root});
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  State& s = *state_;
  const size_t mark = s.arena.size();
  std::vector<int32_t> cur = s.sets.back();
  std::vector<int32_t> closed, next;
  try {
    for (const char c : bytes) {
      s.work.close(*grammar_, s.arena, cur, closed);
      s.work.step(*grammar_, s.arena, closed, static_cast<uint8_t>(c), next);
      if (next.empty()) {
        s.arena.rewind(mark);
        s.closed_valid = false;
        return false;
      }
      cur.swap(next);
    }
  } catch (...) {  // past kMaxLiveStacks: the state stays as it was
    s.arena.rewind(mark);
    s.closed_valid = false;
    throw;
  }
  s.sets.push_back(std::move(cur));
  s.marks.push_back(mark);
  s.closed_valid = false;
  return true;
}

bool GrammarMatcher::can_end() const {
  state_->closure(*grammar_);
  return state_->flags.can_end;
}

bool GrammarMatcher::must_end() const {
  for (int32_t id : state_->closure(*grammar_))
    if (grammar_->has_bytes(state_->arena[id].state)) return false;
  return true;
}

void GrammarMatcher::next_bytes(std::bitset<256>& out) const {
  out.reset();
  for (int32_t id : state_->closure(*grammar_)) {
    const AutomatonState& s = grammar_->states[static_cast<size_t>(state_->arena[id].state)];
    for (uint32_t e = s.bytes_begin; e < s.bytes_end; ++e)
      for (int b = grammar_->byte_edges[e].lo; b <= grammar_->byte_edges[e].hi; ++b) out.set(static_cast<size_t>(b));
  }
}

GrammarMatcher::Distinct GrammarMatcher::opened_distinct() const {
  const std::vector<int32_t>& openers = grammar_->distinct_openers;
  const std::vector<int32_t>& open = grammar_->open_distinct_openers;
  if (openers.empty() || history() == 0) return Distinct::kNo;
  bool any = false, all_open = true;
  for (int32_t id : state_->sets.back()) {
    const int32_t s = state_->arena[id].state;
    if (std::binary_search(openers.begin(), openers.end(), s)) {
      any = true;
      all_open = all_open && std::binary_search(open.begin(), open.end(), s);
    } else {
      all_open = false;
    }
  }
  return !any ? Distinct::kNo : all_open ? Distinct::kOpen : Distinct::kYes;
}

bool GrammarMatcher::has_distinct_rules() const { return !grammar_->distinct_openers.empty(); }

const BoundedRegion* GrammarMatcher::opened_bounded() const {
  const std::vector<BoundedRegion>& regions = grammar_->bounded_regions;
  if (regions.empty() || history() == 0) return nullptr;
  const BoundedRegion* first = nullptr;
  for (int32_t id : state_->sets.back()) {
    const int32_t s = state_->arena[id].state;
    const auto it = std::lower_bound(regions.begin(), regions.end(), s,
                                     [](const BoundedRegion& r, int32_t state) { return r.opener < state; });
    if (it != regions.end() && it->opener == s && (first == nullptr || it->opener < first->opener)) first = &*it;
  }
  return first;
}

bool GrammarMatcher::has_bounded_rules() const { return !grammar_->bounded_regions.empty(); }

std::string GrammarMatcher::forced_bytes(size_t max_bytes) {
  std::string forced;
  while (forced.size() < max_bytes && !can_end()) {
    // The one byte value every stack can take next, if there is one.
    int only = -1;
    for (int32_t id : state_->closure(*grammar_)) {
      const AutomatonState& s = grammar_->states[static_cast<size_t>(state_->arena[id].state)];
      for (uint32_t e = s.bytes_begin; e < s.bytes_end; ++e) {
        const ByteEdge& edge = grammar_->byte_edges[e];
        if (edge.lo != edge.hi || (only >= 0 && only != edge.lo)) return finish_forced(forced);
        only = edge.lo;
      }
    }
    if (only < 0) break;
    const char c = static_cast<char>(only);
    BASALT_ASSERT(accept_bytes(std::string_view(&c, 1)));
    forced.push_back(c);
  }
  return finish_forced(forced);
}

std::string GrammarMatcher::finish_forced(std::string forced) {
  rollback(static_cast<int>(forced.size()));
  return forced;
}

void GrammarMatcher::rollback(int n) {
  State& s = *state_;
  BASALT_CHECK(n >= 0 && n <= history(), "grammar: cannot roll back {} steps of {}", n, history());
  if (n == 0) return;
  const size_t keep = s.sets.size() - static_cast<size_t>(n);
  s.arena.rewind(s.marks[keep - 1]);
  s.sets.resize(keep);
  s.marks.resize(keep - 1);
  s.closed_valid = false;
}

int GrammarMatcher::history() const { return static_cast<int>(state_->sets.size()) - 1; }

bool grammar_matches(const Grammar& grammar, std::string_view text) {
  GrammarMatcher m(compile_grammar(grammar));
  return m.accept_bytes(text) && m.can_end();
}

}  // namespace basalt
