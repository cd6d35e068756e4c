#include "grammar/distinct_json.h"

#include <algorithm>

#include "grammar/matcher.h"
#include "grammar/token_mask.h"

namespace basalt {
namespace {

bool is_space(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && is_space(static_cast<uint8_t>(s.back()))) s.remove_suffix(1);
  return s;
}

// Whether some text of `texts` begins with `prefix`.
bool begins_one(const std::multiset<std::string>& texts, std::string_view prefix) {
  const auto it = texts.lower_bound(std::string(prefix));
  return it != texts.end() && std::string_view(*it).starts_with(prefix);
}

// An element's value. A string without escapes, the common case, is read
// without the parser (the filter reads thousands of candidate items a step).
nlohmann::json value_of(std::string_view text) {
  if (text.size() >= 2 && text.front() == '"' && text.back() == '"' &&
      text.find('\\') == std::string_view::npos)
    return nlohmann::json(std::string(text.substr(1, text.size() - 2)));
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// The order a search tries bytes in: the ones that end things first (a
// short value is found soonest), then the rest ascending.
constexpr uint8_t kClosers[] = {'"', ']', '}', ','};

}  // namespace

void DistinctJson::push_frame(bool array, Distinct opened, size_t at) {
  Frame f;
  f.array = array;
  f.distinct = opened != Distinct::kNo;
  f.open = opened == Distinct::kOpen;
  f.key_next = !array;
  frames_.push_back(std::move(f));
  undo_.emplace_back(Undo::kPushed, at);
}

DistinctJson::Outcome DistinctJson::complete(Frame& f, size_t end) {
  const size_t index = static_cast<size_t>(&f - frames_.data());
  const auto begin = static_cast<size_t>(f.start);
  f.start = -1;
  if (!f.distinct) return {};
  const std::string text(trimmed(std::string_view(text_).substr(begin, end - begin)));
  nlohmann::json value = value_of(text);
  // Text that does not parse (only a grammar that is no JSON writes it)
  // counts as new, compared by its text alone.
  const bool repeat = value.is_discarded() ? f.texts.contains(text)
                                           : std::find(f.values.begin(), f.values.end(), value) != f.values.end();
  f.texts.insert(text);
  f.values.push_back(std::move(value));
  Undo u(Undo::kAdded, text_.size() - 1);  // the byte that completed it
  u.text = text;
  undo_.push_back(std::move(u));
  return {repeat ? Outcome::kRepeat : Outcome::kNew, index};
}

DistinctJson::Outcome DistinctJson::push(uint8_t byte, Distinct opened) {
  const size_t at = text_.size();
  text_.push_back(static_cast<char>(byte));
  if (frames_.empty()) {
    // Outside distinct containers the text is only watched for their start.
    if (opened != Distinct::kNo) {
      push_frame(byte == '[', opened, at);
      in_string_ = escaped_ = key_string_ = false;
    }
    return {};
  }
  Frame& f = frames_.back();
  {
    Undo u(Undo::kScalars, at);
    u.in_string = in_string_;
    u.escaped = escaped_;
    u.key_string = key_string_;
    u.key_next = f.key_next;
    u.start = f.start;
    undo_.push_back(std::move(u));
  }
  if (in_string_) {
    if (escaped_) {
      escaped_ = false;
    } else if (byte == '\\') {
      escaped_ = true;
    } else if (byte == '"') {
      in_string_ = false;
      if (key_string_) {
        key_string_ = false;
        f.key_next = false;
        return complete(f, at + 1);
      }
    }
    return {};
  }
  switch (byte) {
    case '"':
      in_string_ = true;
      if (!f.array && f.key_next) {
        key_string_ = true;
        f.start = static_cast<int64_t>(at);
      } else if (f.array && f.start < 0) {
        f.start = static_cast<int64_t>(at);
      }
      return {};
    case '[':
    case '{':
      if (f.array && f.start < 0) f.start = static_cast<int64_t>(at);
      push_frame(byte == '[', opened, at);
      return {};
    case ']':
    case '}': {
      Outcome o;
      if (f.array && f.start >= 0) o = complete(f, at);
      Undo u(Undo::kPopped, at);
      u.frame = std::make_unique<Frame>(std::move(frames_.back()));
      frames_.pop_back();
      undo_.push_back(std::move(u));
      return o;
    }
    case ',':
      if (!f.array) {
        f.key_next = true;
        return {};
      }
      return f.start >= 0 ? complete(f, at) : Outcome{};
    case ':':
      return {};
    default:
      if (!is_space(byte) && f.array && f.start < 0) f.start = static_cast<int64_t>(at);
      return {};
  }
}

void DistinctJson::rewind(size_t n) {
  while (!undo_.empty() && undo_.back().at >= n) {
    Undo& u = undo_.back();
    switch (u.kind) {
      case Undo::kScalars:
        in_string_ = u.in_string;
        escaped_ = u.escaped;
        key_string_ = u.key_string;
        frames_.back().key_next = u.key_next;
        frames_.back().start = u.start;
        break;
      case Undo::kAdded: {
        Frame& f = frames_.back();
        f.texts.erase(f.texts.find(u.text));
        f.values.pop_back();
        break;
      }
      case Undo::kPushed:
        frames_.pop_back();
        if (frames_.empty()) in_string_ = escaped_ = key_string_ = false;
        break;
      case Undo::kPopped:
        frames_.push_back(std::move(*u.frame));
        break;
    }
    undo_.pop_back();
  }
  if (n < text_.size()) text_.resize(n);
}

std::optional<size_t> DistinctJson::risky_frame() const {
  for (size_t i = 0; i < frames_.size(); ++i) {
    const Frame& f = frames_[i];
    // An open object's names can always go on to a new one.
    if (!f.distinct || f.values.empty() || (f.open && !f.array)) continue;
    if (f.start < 0) {
      // After a comma: a new element must come (and always can, open).
      if ((f.array || f.key_next) && !f.open) return i;
      continue;
    }
    // An object's element is its name: once written, nothing is at risk.
    if (!f.array && !(key_string_ && i + 1 == frames_.size())) continue;
    const std::string_view so_far = trimmed(std::string_view(text_).substr(static_cast<size_t>(f.start)));
    if (begins_one(f.texts, so_far)) return i;
    // A whole value equal to an earlier one but spelled otherwise (1.0 for
    // 1, members in another order): it may not end here.
    if (!in_string_ && i + 1 == frames_.size()) {
      const nlohmann::json value = value_of(so_far);
      if (!value.is_discarded() && std::find(f.values.begin(), f.values.end(), value) != f.values.end()) return i;
    }
  }
  return std::nullopt;
}

bool DistinctJson::search(GrammarMatcher& matcher, size_t frame, int& budget, int depth) {
  std::bitset<256> allowed;
  matcher.next_bytes(allowed);
  std::vector<uint8_t> order;
  for (const uint8_t b : kClosers)
    if (allowed.test(b)) order.push_back(b);
  for (int b = 0; b < 256; ++b)
    if (allowed.test(static_cast<size_t>(b)) && std::find(std::begin(kClosers), std::end(kClosers), b) == std::end(kClosers))
      order.push_back(static_cast<uint8_t>(b));
  for (const uint8_t b : order) {
    if (--budget < 0) return true;  // not found in time: taken as possible
    if (!in_string_ && is_space(b)) continue;
    const char c = static_cast<char>(b);
    if (!matcher.accept_bytes(std::string_view(&c, 1))) continue;
    const bool opener = wants_opener(b);
    const size_t mark = size();
    const Outcome o = push(b, opener ? matcher.opened_distinct() : Distinct::kNo);
    path_.push_back(static_cast<char>(b));
    bool found;
    if (o.kind == Outcome::kRepeat) {
      found = false;
    } else if ((o.kind == Outcome::kNew && o.frame <= frame) || frames_.size() <= frame) {
      found = true;
      witness_ = path_;
    } else {
      found = depth >= 256 || search(matcher, frame, budget, depth + 1);
    }
    path_.pop_back();
    rewind(mark);
    matcher.rollback(1);
    if (found) return true;
  }
  return false;
}

bool DistinctJson::witness_holds(GrammarMatcher& matcher, size_t frame) {
  if (witness_.empty() || witness_.find_first_of("[{") != std::string::npos) return false;
  if (!matcher.accept_bytes(witness_)) return false;
  const size_t mark = size();
  bool holds = false;
  for (const char c : witness_) {
    const Outcome o = push(static_cast<uint8_t>(c), Distinct::kNo);
    if (o.kind == Outcome::kRepeat) break;
    if ((o.kind == Outcome::kNew && o.frame <= frame) || frames_.size() <= frame) {
      holds = true;
      break;
    }
  }
  rewind(mark);
  matcher.rollback(1);
  return holds;
}

void DistinctJson::filter(GrammarMatcher& matcher, const TokenVocabulary& vocabulary, std::span<uint32_t> words) {
  const bool any_earlier = std::any_of(frames_.begin(), frames_.end(),
                                       [](const Frame& f) { return f.distinct && !f.values.empty(); });
  if (!any_earlier) return;
  const auto allowed = [&](int32_t id) { return (words[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u; };
  // The tokens to look at: those that can end an element (inside a string
  // only a quote can), and those that spell more of an earlier element's
  // text where the current one begins it.
  std::vector<int32_t> candidates;
  for (int32_t id : in_string_ ? vocabulary.with_quote() : vocabulary.with_closer())
    if (allowed(id)) candidates.push_back(id);
  for (const Frame& f : frames_) {
    if (!f.distinct || f.values.empty() || (f.open && !f.array)) continue;
    if (f.start < 0 && !(f.array || f.key_next)) continue;
    const std::string so_far(f.start < 0 ? std::string_view() : std::string_view(text_).substr(static_cast<size_t>(f.start)));
    for (auto it = f.texts.lower_bound(so_far); it != f.texts.end() && it->starts_with(so_far); ++it) {
      const std::string_view rest = std::string_view(*it).substr(so_far.size());
      for (size_t k = 1; k <= rest.size(); ++k)
        for (int32_t id : vocabulary.spelled(rest.substr(0, k)))
          if (allowed(id)) candidates.push_back(id);
    }
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());

  std::vector<int32_t> cleared;
  for (int32_t id : candidates) {
    const std::string& bytes = vocabulary.bytes(id);
    const size_t mark = size();
    bool repeats = false;
    for (const char c : bytes) {
      const auto b = static_cast<uint8_t>(c);
      // Containers a token opens are taken as distinct when inside one
      // (the strictest reading; the matcher is not asked mid-token).
      if (push(b, wants_opener(b) && !frames_.empty() ? Distinct::kYes : Distinct::kNo).kind == Outcome::kRepeat) {
        repeats = true;
        break;
      }
    }
    if (!repeats) {
      if (const std::optional<size_t> frame = risky_frame(); frame && matcher.accept_bytes(bytes)) {
        int budget = kSearchBudget;
        repeats = !witness_holds(matcher, *frame) && !search(matcher, *frame, budget, 0);
        matcher.rollback(1);
      }
    }
    rewind(mark);
    if (repeats) cleared.push_back(id);
  }
  if (cleared.empty()) return;
  for (int32_t id : cleared) words[static_cast<size_t>(id) / 32] &= ~(1u << (id % 32));
  if (std::any_of(words.begin(), words.end(), [](uint32_t w) { return w != 0; })) return;
  for (int32_t id : cleared) words[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
}

}  // namespace basalt
