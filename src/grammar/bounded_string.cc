#include "grammar/bounded_string.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "core/error.h"
#include "grammar/ebnf.h"
#include "grammar/token_mask.h"

namespace basalt {

BoundedText::BoundedText(const Grammar& grammar, int32_t rule, int64_t max_length)
    : text_(RegexLanguage::of_rule(grammar, rule)), max_length_(max_length) {
  const std::string& name = grammar.rules[static_cast<size_t>(rule)].name;
  BASALT_CHECK(max_length >= 0, "grammar: bounded rule \"{}\" has a negative bound", name);
  const size_t states = text_.state_count();
  // Fewest code points to the closing quote, by a breadth-first search
  // backwards from it whose moves cost 0 (escape letters, the quote) or 1.
  needed_.assign(states * kPhases, kNever);
  std::vector<std::vector<std::pair<uint32_t, bool>>> sources(states * kPhases);  // (node, costs one)
  std::deque<uint32_t> work;
  const auto node = [](uint32_t state, uint8_t phase) { return state * kPhases + phase; };
  for (uint32_t s = 0; s < states; ++s) {
    for (const RegexLanguage::Edge& e : text_.edges(s)) {
      const auto has = [&](uint32_t c) { return e.lo <= c && c <= e.hi; };
      // Plain text: a quote that ends the rule's text closes the string.
      if (has('"') && text_.accepting(e.target)) {
        if (needed_[node(s, kPlain)] != 0) {
          needed_[node(s, kPlain)] = 0;
          work.push_back(node(s, kPlain));
        }
      }
      const bool others = e.hi - e.lo + 1 > static_cast<uint32_t>(has('"')) + static_cast<uint32_t>(has('\\'));
      if (others || (has('"') && !text_.accepting(e.target)))
        sources[node(e.target, kPlain)].emplace_back(node(s, kPlain), true);
      if (has('\\')) sources[node(e.target, kBackslash)].emplace_back(node(s, kPlain), true);
      // Inside an escape nothing more is counted.
      if (has('u')) sources[node(e.target, kHex0)].emplace_back(node(s, kBackslash), false);
      if (e.lo != 'u' || e.hi != 'u') sources[node(e.target, kPlain)].emplace_back(node(s, kBackslash), false);
      for (uint8_t p = kHex0; p < kHex3; ++p)
        sources[node(e.target, static_cast<uint8_t>(p + 1))].emplace_back(node(s, p), false);
      sources[node(e.target, kPlain)].emplace_back(node(s, kHex3), false);
    }
  }
  while (!work.empty()) {
    const uint32_t n = work.front();
    work.pop_front();
    for (const auto& [from, costs_one] : sources[n]) {
      const int64_t d = needed_[n] + (costs_one ? 1 : 0);
      if (d >= needed_[from]) continue;
      needed_[from] = d;
      if (costs_one) {
        work.push_back(from);
      } else {
        work.push_front(from);
      }
    }
  }
  start_ = text_.next(0, '"');
  const int64_t least = needed(start_, kPlain);
  BASALT_CHECK(least != kNever, "grammar: bounded rule \"{}\" never closes its string", name);
  BASALT_CHECK(least <= max_length, "grammar: bounded rule \"{}\" needs {} code points, above its bound {}", name,
               least, max_length);
  // Rounds of "the most of my successors'": after k of them, the most over
  // the states k code points on or fewer (states that cannot close count
  // nothing: a token that leads there is another parse's, kept unjudged).
  // Only the nodes a string can be in are worked on: most escape phases of
  // most states are never entered.
  std::vector<std::vector<uint32_t>> successors(needed_.size());
  for (size_t to = 0; to < sources.size(); ++to)
    for (const auto& [from, costs_one] : sources[to]) successors[from].push_back(static_cast<uint32_t>(to));
  std::vector<uint32_t> reachable{node(start_, kPlain)};
  std::vector<bool> seen(needed_.size(), false);
  seen[reachable[0]] = true;
  for (size_t i = 0; i < reachable.size(); ++i) {
    for (const uint32_t to : successors[reachable[i]]) {
      if (seen[to]) continue;
      seen[to] = true;
      reachable.push_back(to);
    }
  }
  most_near_.resize(needed_.size());
  for (size_t v = 0; v < needed_.size(); ++v) {
    most_near_[v] = needed_[v] == kNever ? 0 : needed_[v];
    if (seen[v]) most_needed_ = std::max(most_needed_, most_near_[v]);
  }
  for (int round = 0; round < kNear; ++round) {
    std::vector<int64_t> next = most_near_;
    for (const uint32_t from : reachable)
      for (const uint32_t to : successors[from]) next[from] = std::max(next[from], most_near_[to]);
    most_near_ = std::move(next);
  }
}

BoundedText::Cursor BoundedText::start() const {
  Cursor c;
  c.state = start_;
  return c;
}

bool BoundedText::take(Cursor& c, uint32_t code_point) const {
  const uint32_t next = text_.next(c.state, code_point);
  switch (c.phase) {
    case kPlain:
      if (code_point == '"' && text_.accepting(next)) {
        c.closed = true;
      } else {
        if (code_point < 0x80) ++c.count;  // a longer one was counted at its first byte
        if (code_point == '\\') c.phase = kBackslash;
      }
      break;
    case kBackslash:
      c.phase = code_point == 'u' ? kHex0 : kPlain;
      break;
    case kHex3:
      c.phase = kPlain;
      break;
    default:
      ++c.phase;
      break;
  }
  c.state = next;
  return c.closed || needed(next, c.phase) != kNever;
}

bool BoundedText::advance(Cursor& c, uint8_t byte) const {
  if (c.closed) return false;
  if (c.need > 0) {
    if ((byte & 0xC0) != 0x80) return false;
    c.partial = (c.partial << 6) | (byte & 0x3Fu);
    if (--c.need > 0) return true;
    return c.partial <= 0x10FFFF && take(c, c.partial);
  }
  if (byte < 0x80) return take(c, byte);
  if (c.phase != kPlain) return false;  // escapes are ASCII
  if (byte >= 0xC2 && byte <= 0xDF) {
    c.need = 1;
    c.partial = byte & 0x1Fu;
  } else if (byte >= 0xE0 && byte <= 0xEF) {
    c.need = 2;
    c.partial = byte & 0x0Fu;
  } else if (byte >= 0xF0 && byte <= 0xF4) {
    c.need = 3;
    c.partial = byte & 0x07u;
  } else {
    return false;
  }
  c.length = static_cast<uint8_t>(c.need + 1);
  ++c.count;
  return true;
}

bool BoundedText::fits(const Cursor& c) const {
  if (c.closed) return c.count <= max_length_;
  int64_t least = kNever;
  if (c.need == 0) {
    least = needed(c.state, c.phase);
  } else {
    // The pending code point is one of [lo, hi]; UTF-8 gives each length
    // its own range, so no shorter form's code point is counted in.
    static constexpr uint32_t kFirstOfLength[] = {0, 0, 0x80, 0x800, 0x10000};
    const int shift = 6 * c.need;
    const uint32_t lo = std::max(c.partial << shift, kFirstOfLength[c.length]);
    const uint32_t hi = std::min<uint32_t>(((c.partial + 1) << shift) - 1, 0x10FFFF);
    for (const RegexLanguage::Edge& e : text_.edges(c.state))
      if (e.hi >= lo && e.lo <= hi) least = std::min(least, needed(e.target, kPlain));
  }
  return least != kNever && c.count + least <= max_length_;
}

void BoundedStrings::begin(const BoundedRegion& region) {
  text_ = region.text.get();
  cursor_ = text_->start();
}

void BoundedStrings::accept(uint8_t byte) {
  if (text_ == nullptr) return;
  // A byte the rule's text cannot take is another parse's (the string is
  // no longer followed); the closing quote ends it.
  if (!text_->advance(cursor_, byte) || cursor_.closed) text_ = nullptr;
}

void BoundedStrings::filter(const TokenVocabulary& vocabulary, std::span<uint32_t> words) const {
  if (text_ == nullptr) return;
  // A token of n bytes adds at most n code points and leads to a state at
  // most n code points on: a token fits when its length and the most any
  // state needs are within the room left, or (no longer than kNear) its
  // length and the most those states need; so do all shorter ones.
  const int64_t room = text_->max_length() - cursor_.count;
  const int64_t near = text_->most_needed_near(cursor_);
  for (const int32_t id : vocabulary.longest_first()) {
    const std::string& bytes = vocabulary.bytes(id);
    const auto length = static_cast<int64_t>(bytes.size());
    if (length + text_->most_needed() <= room || (length <= BoundedText::kNear && length + near <= room)) break;
    uint32_t& word = words[static_cast<size_t>(id) / 32];
    const uint32_t bit = 1u << (static_cast<uint32_t>(id) % 32);
    if ((word & bit) == 0) continue;
    BoundedText::Cursor c = cursor_;
    bool alive = true;
    for (const char b : bytes) {
      if (c.closed) break;
      if (!text_->advance(c, static_cast<uint8_t>(b))) {
        alive = false;  // another parse's text: kept, as accept() stops there
        break;
      }
    }
    if (alive && !text_->fits(c)) word &= ~bit;
  }
}

}  // namespace basalt
