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
  // The moves between (state, escape phase) nodes, each once: a state's
  // edges cover every code point, mostly towards few targets, so they are
  // taken per target, with what the edges there read.
  struct Arc {
    uint32_t from, to;
    bool costs_one;
  };
  std::vector<Arc> arcs;
  needed_.assign(states * kPhases, kNever);
  std::deque<uint32_t> work;
  const auto node = [](uint32_t state, uint8_t phase) { return state * kPhases + phase; };
  enum : uint8_t { kOther = 1, kQuote = 2, kBackslashChar = 4, kU = 8, kNotOnlyU = 16 };
  std::vector<std::pair<uint32_t, uint8_t>> reads;  // (target, what edges there read)
  for (uint32_t s = 0; s < states; ++s) {
    reads.clear();
    for (const RegexLanguage::Edge& e : text_.edges(s)) {
      const auto has = [&](uint32_t c) { return e.lo <= c && c <= e.hi; };
      uint8_t what = 0;
      if (e.hi - e.lo + 1 > static_cast<uint32_t>(has('"')) + static_cast<uint32_t>(has('\\'))) what |= kOther;
      if (has('"')) what |= kQuote;
      if (has('\\')) what |= kBackslashChar;
      if (has('u')) what |= kU;
      if (e.lo != 'u' || e.hi != 'u') what |= kNotOnlyU;
      reads.emplace_back(e.target, what);
    }
    std::sort(reads.begin(), reads.end());
    for (size_t i = 0; i < reads.size();) {
      const uint32_t t = reads[i].first;
      uint8_t what = 0;
      for (; i < reads.size() && reads[i].first == t; ++i) what |= reads[i].second;
      // Plain text: a quote that ends the rule's text closes the string.
      if ((what & kQuote) && text_.accepting(t) && needed_[node(s, kPlain)] != 0) {
        needed_[node(s, kPlain)] = 0;
        work.push_back(node(s, kPlain));
      }
      if ((what & kOther) || ((what & kQuote) && !text_.accepting(t))) arcs.push_back({node(s, kPlain), node(t, kPlain), true});
      if (what & kBackslashChar) arcs.push_back({node(s, kPlain), node(t, kBackslash), true});
      // Inside an escape nothing more is counted.
      if (what & kU) arcs.push_back({node(s, kBackslash), node(t, kHex0), false});
      if (what & kNotOnlyU) arcs.push_back({node(s, kBackslash), node(t, kPlain), false});
      for (uint8_t p = kHex0; p < kHex3; ++p) arcs.push_back({node(s, p), node(t, static_cast<uint8_t>(p + 1)), false});
      arcs.push_back({node(s, kHex3), node(t, kPlain), false});
    }
  }
  const size_t nodes = needed_.size();
  // Sources by target, for the search below.
  std::vector<uint32_t> into(nodes + 1, 0);
  for (const Arc& a : arcs) ++into[a.to + 1];
  for (size_t v = 0; v < nodes; ++v) into[v + 1] += into[v];
  std::vector<uint32_t> sources(arcs.size());
  {
    std::vector<uint32_t> fill(into.begin(), into.end() - 1);
    for (uint32_t k = 0; k < arcs.size(); ++k) sources[fill[arcs[k].to]++] = k;
  }
  // Fewest code points to the closing quote, by a breadth-first search
  // backwards from it whose moves cost 0 (escape letters, the quote) or 1.
  while (!work.empty()) {
    const uint32_t n = work.front();
    work.pop_front();
    for (uint32_t k = into[n]; k < into[n + 1]; ++k) {
      const Arc& a = arcs[sources[k]];
      const int64_t d = needed_[n] + (a.costs_one ? 1 : 0);
      if (d >= needed_[a.from]) continue;
      needed_[a.from] = d;
      if (a.costs_one) {
        work.push_back(a.from);
      } else {
        work.push_front(a.from);
      }
    }
  }
  // Where each ASCII code point leads, per state: most of what filter()
  // walks near a bound.
  ascii_next_.resize(states * 0x80);
  for (uint32_t s = 0; s < states; ++s) {
    for (const RegexLanguage::Edge& e : text_.edges(s)) {
      if (e.lo >= 0x80) break;
      for (uint32_t c = e.lo; c <= std::min<uint32_t>(e.hi, 0x7F); ++c) ascii_next_[s * 0x80 + c] = e.target;
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
  std::vector<uint32_t> out_begin(nodes + 1, 0), successors(arcs.size());
  for (const Arc& a : arcs) ++out_begin[a.from + 1];
  for (size_t v = 0; v < nodes; ++v) out_begin[v + 1] += out_begin[v];
  {
    std::vector<uint32_t> fill(out_begin.begin(), out_begin.end() - 1);
    for (const Arc& a : arcs) successors[fill[a.from]++] = a.to;
  }
  std::vector<uint32_t> reachable{node(start_, kPlain)};
  std::vector<bool> seen(nodes, false);
  seen[reachable[0]] = true;
  for (size_t i = 0; i < reachable.size(); ++i) {
    for (uint32_t k = out_begin[reachable[i]]; k < out_begin[reachable[i] + 1]; ++k) {
      const uint32_t to = successors[k];
      if (seen[to]) continue;
      seen[to] = true;
      reachable.push_back(to);
    }
  }
  most_near_.resize(nodes);
  for (size_t v = 0; v < nodes; ++v) {
    most_near_[v] = needed_[v] == kNever ? 0 : needed_[v];
    if (seen[v]) most_needed_ = std::max(most_needed_, most_near_[v]);
  }
  std::vector<int64_t> next = most_near_;
  for (int round = 0; round < kNear; ++round) {
    for (const uint32_t from : reachable)
      for (uint32_t k = out_begin[from]; k < out_begin[from + 1]; ++k)
        next[from] = std::max(next[from], most_near_[successors[k]]);
    most_near_ = next;
  }
}

BoundedText::Cursor BoundedText::start() const {
  Cursor c;
  c.state = start_;
  return c;
}

bool BoundedText::take(Cursor& c, uint32_t code_point) const {
  const uint32_t next = code_point < 0x80 ? ascii_next_[c.state * 0x80 + code_point] : text_.next(c.state, code_point);
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
  const int64_t unjudged = std::max(room - text_->most_needed(), std::min<int64_t>(BoundedText::kNear, room - near));
  // The longer tokens the mask allows, in byte order, each walked from the
  // cursor after the bytes it shares with the last one walked (cursors[d]:
  // after d bytes of it, up to `valid`, where it closed or left the text).
  const std::vector<int32_t>& sorted = vocabulary.sorted();
  const auto allowed = [&](size_t pos) {
    const int32_t id = sorted[pos];
    return (words[static_cast<size_t>(id) / 32] >> (static_cast<uint32_t>(id) % 32)) & 1u;
  };
  const auto longer = [&](size_t pos) { return static_cast<int64_t>(vocabulary.sorted_bytes(pos).size()) > unjudged; };
  // The judged tokens are the first of longest_first(): few of them are
  // picked out and sorted, many are found by a pass in byte order.
  const std::vector<int32_t>& longest = vocabulary.longest_first();
  const size_t judged_count = static_cast<size_t>(
      std::partition_point(longest.begin(), longest.end(), [&](int32_t pos) { return longer(static_cast<size_t>(pos)); }) -
      longest.begin());
  std::vector<int32_t> judged;  // positions in sorted
  if (judged_count * 8 < sorted.size()) {
    for (size_t k = 0; k < judged_count; ++k)
      if (allowed(static_cast<size_t>(longest[k]))) judged.push_back(longest[k]);
    std::sort(judged.begin(), judged.end());
  } else {
    for (size_t pos = 0; pos < sorted.size(); ++pos)
      if (longer(pos) && allowed(pos)) judged.push_back(static_cast<int32_t>(pos));
  }
  std::vector<BoundedText::Cursor> cursors(1, cursor_);
  std::string_view last;
  size_t valid = 0;
  bool last_alive = true;
  for (const int32_t pos : judged) {
    const std::string_view bytes = vocabulary.sorted_bytes(static_cast<size_t>(pos));
    const int32_t id = sorted[static_cast<size_t>(pos)];
    size_t shared = 0;
    const size_t most = std::min(last.size(), bytes.size());
    while (shared < most && last[shared] == bytes[shared]) ++shared;
    bool alive = true;
    size_t d = std::min(shared, valid);
    if (d < shared && valid < last.size()) {
      // `last` stopped inside the shared bytes: so does this one.
      alive = last_alive;
    } else {
      if (cursors.size() < bytes.size() + 1) cursors.resize(bytes.size() + 1);
      for (; d < bytes.size() && !cursors[d].closed; ++d) {
        cursors[d + 1] = cursors[d];
        if (!text_->advance(cursors[d + 1], static_cast<uint8_t>(bytes[d]))) {
          alive = false;  // another parse's text: kept, as accept() stops there
          break;
        }
      }
      valid = d;
    }
    last = bytes;
    last_alive = alive;
    if (alive && !text_->fits(cursors[valid]))
      words[static_cast<size_t>(id) / 32] &= ~(1u << (static_cast<uint32_t>(id) % 32));
  }
}

}  // namespace basalt
