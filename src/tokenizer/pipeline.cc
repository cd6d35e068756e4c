#include "tokenizer/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <functional>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace basalt::tokenizer_detail {

using nlohmann::json;

// ---------------------------------------------------------------------------
// JSON access with errors that name the file and the field.

void JsonContext::error(const std::string& path, const std::string& what) const {
  fail("{}: {}: {}", label, path.empty() ? std::string("(top level)") : path, what);
}

const json& JsonContext::member(const json& obj, const std::string& path, const char* key) const {
  if (!obj.is_object()) error(path, "expected a JSON object");
  auto it = obj.find(key);
  if (it == obj.end()) error(path, fmt::format("missing field \"{}\"", key));
  return *it;
}

std::string JsonContext::string_field(const json& obj, const std::string& path,
                                      const char* key) const {
  const json& v = member(obj, path, key);
  if (!v.is_string()) error(path + "." + key, "expected a string");
  return v.get<std::string>();
}

bool JsonContext::bool_field(const json& obj, const std::string& path, const char* key,
                             std::optional<bool> fallback) const {
  if (!obj.is_object()) error(path, "expected a JSON object");
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    if (fallback) return *fallback;
    error(path, fmt::format("missing field \"{}\"", key));
  }
  if (!it->is_boolean()) error(path + "." + key, "expected true or false");
  return it->get<bool>();
}

std::string JsonContext::type_of(const json& obj, const std::string& path) const {
  return string_field(obj, path, "type");
}

namespace {

const json& array_field(const JsonContext& ctx, const json& obj, const std::string& path,
                        const char* key) {
  const json& v = ctx.member(obj, path, key);
  if (!v.is_array()) ctx.error(path + "." + key, "expected an array");
  return v;
}

std::string indexed(const std::string& path, const char* key, size_t i) {
  return fmt::format("{}.{}[{}]", path, key, i);
}

// A single character given as a JSON string (Metaspace replacement, Strip content).
char32_t char_field(const JsonContext& ctx, const json& obj, const std::string& path,
                    const char* key) {
  std::string s = ctx.string_field(obj, path, key);
  size_t pos = 0;
  char32_t cp;
  if (!unicode::decode_utf8(s, pos, cp) || pos != s.size()) {
    ctx.error(path + "." + key, "expected exactly one character");
  }
  return cp;
}

size_t count_field(const JsonContext& ctx, const json& obj, const std::string& path,
                   const char* key) {
  const json& v = ctx.member(obj, path, key);
  if (!v.is_number_unsigned() || v.get<uint64_t>() > (1u << 30)) {
    ctx.error(path + "." + key, "expected a non-negative integer");
  }
  return v.get<size_t>();
}

int32_t id_value(const JsonContext& ctx, const json& v, const std::string& path) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
    ctx.error(path, "expected a token id (a non-negative integer)");
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

// {"String": "..."} or {"Regex": "..."}, as Split and Replace write patterns.
Regex pattern_field(const JsonContext& ctx, const json& obj, const std::string& path) {
  const json& p = ctx.member(obj, path, "pattern");
  std::string ppath = path + ".pattern";
  if (!p.is_object() || p.size() != 1)
    ctx.error(ppath, "expected {\"String\": ...} or {\"Regex\": ...}");
  try {
    if (p.contains("String")) {
      std::string s = ctx.string_field(p, ppath, "String");
      if (s.empty()) ctx.error(ppath + ".String", "empty pattern");
      return Regex::literal(s);
    }
    if (p.contains("Regex")) return Regex::compile(ctx.string_field(p, ppath, "Regex"));
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with(ctx.label + ":")) throw;
    ctx.error(ppath, e.what());
  }
  ctx.error(ppath, "expected {\"String\": ...} or {\"Regex\": ...}");
}

// --- splitting, as NormalizedString::split does ----------------------------

struct Match {
  size_t begin, end;
  bool is_match;
};

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior behavior_field(const JsonContext& ctx, const json& obj, const std::string& path) {
  std::string b = ctx.string_field(obj, path, "behavior");
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  ctx.error(path + ".behavior", fmt::format("unknown split behavior \"{}\"", b));
}

std::vector<Match> regex_matches(const Regex& re, std::string_view s) {
  std::vector<Match> out;
  if (s.empty()) return {{0, 0, false}};
  size_t prev = 0;
  for (const Regex::Span& m : re.find_all(s)) {
    if (prev != m.begin) out.push_back({prev, m.begin, false});
    out.push_back({m.begin, m.end, true});
    prev = m.end;
  }
  if (prev != s.size()) out.push_back({prev, s.size(), false});
  return out;
}

// Every character for which pred holds is its own match.
std::vector<Match> char_matches(std::string_view s, const std::function<bool(char32_t)>& pred) {
  if (s.empty()) return {{0, 0, false}};
  std::vector<Match> out;
  size_t last = 0, pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    char32_t c;
    if (!unicode::decode_utf8(s, pos, c)) {
      c = unicode::kReplacementChar;
      pos = start + 1;
    }
    if (pred(c)) {
      if (last < start) out.push_back({last, start, false});
      out.push_back({start, pos, true});
      last = pos;
    }
  }
  if (last < s.size()) out.push_back({last, s.size(), false});
  return out;
}

std::vector<std::pair<size_t, size_t>> apply_behavior(std::vector<Match> matches, Behavior b,
                                                      bool invert) {
  if (invert) {
    for (Match& m : matches) m.is_match = !m.is_match;
  }
  std::vector<std::pair<size_t, size_t>> out;
  switch (b) {
    case Behavior::kIsolated:
      for (const Match& m : matches) out.emplace_back(m.begin, m.end);
      break;
    case Behavior::kRemoved:
      for (const Match& m : matches) {
        if (!m.is_match) out.emplace_back(m.begin, m.end);
      }
      break;
    case Behavior::kContiguous: {
      bool previous = false;
      for (const Match& m : matches) {
        if (m.is_match == previous && !out.empty()) {
          out.back().second = m.end;
        } else {
          out.emplace_back(m.begin, m.end);
        }
        previous = m.is_match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const Match& m : matches) {
        if (m.is_match && !previous && !out.empty()) {
          out.back().second = m.end;
        } else {
          out.emplace_back(m.begin, m.end);
        }
        previous = m.is_match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->is_match && !previous && !out.empty()) {
          out.back().first = it->begin;
        } else {
          out.emplace_back(it->begin, it->end);
        }
        previous = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
  return out;
}

// Replaces each piece without an added id by the pieces fn makes of it;
// empty pieces are dropped, as PreTokenizedString::split does.
void split_pieces(std::vector<Piece>& pieces,
                  const std::function<void(const Piece&, std::vector<Piece>&)>& fn) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (Piece& p : pieces) {
    if (p.added_id) {
      out.push_back(std::move(p));
      continue;
    }
    size_t first = out.size();
    fn(p, out);
    out.erase(std::remove_if(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
                             [](const Piece& q) { return q.text.empty() && !q.added_id; }),
              out.end());
  }
  pieces.swap(out);
}

void emit_spans(const Piece& p, const std::vector<std::pair<size_t, size_t>>& spans,
                std::vector<Piece>& out) {
  for (const auto& [b, e] : spans) {
    out.push_back(Piece{p.text.substr(b, e - b), std::nullopt, p.at_input_start && b == 0});
  }
}

void append_char(char32_t c, std::string& out) { unicode::append_utf8(c, out); }

std::string utf8_of(char32_t c) {
  std::string s;
  append_char(c, s);
  return s;
}

// Applies fn to every code point of s, building a new string.
template <typename F>
std::string map_chars(std::string_view s, F&& fn) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t c;
    size_t start = pos;
    if (!unicode::decode_utf8(s, pos, c)) {
      c = unicode::kReplacementChar;
      pos = start + 1;
    }
    fn(c, out);
  }
  return out;
}

std::string replace_matches(const Regex& re, std::string_view s, std::string_view content) {
  std::string out;
  for (const Match& m : regex_matches(re, s)) {
    if (m.is_match) {
      out.append(content);
    } else {
      out.append(s.substr(m.begin, m.end - m.begin));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// Normalizers

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& p : parts_) p->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(unicode::NormalForm form) : form_(form) {}
  void normalize(std::string& text) const override { text = unicode::normalize(text, form_); }

 private:
  unicode::NormalForm form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    text = map_chars(text, [](char32_t c, std::string& out) { unicode::append_lowercase(c, out); });
  }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    std::vector<std::pair<size_t, char32_t>> cps;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t start = pos;
      char32_t c;
      if (!unicode::decode_utf8(text, pos, c)) {
        c = unicode::kReplacementChar;
        pos = start + 1;
      }
      cps.emplace_back(start, c);
    }
    size_t b = 0, e = cps.size();
    if (left_) {
      while (b < e && unicode::is_white_space(cps[b].second)) ++b;
    }
    if (right_) {
      while (e > b && unicode::is_white_space(cps[e - 1].second)) --e;
    }
    size_t begin = b < cps.size() ? cps[b].first : text.size();
    size_t end = e < cps.size() ? cps[e].first : text.size();
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class StripAccentsNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    text = map_chars(text, [](char32_t c, std::string& out) {
      if (!unicode::is_normalizer_mark(c)) append_char(c, out);
    });
  }
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text = prefix_ + text;
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    text = replace_matches(pattern_, text, content_);
  }

 private:
  Regex pattern_;
  std::string content_;
};

// ---------------------------------------------------------------------------
// Pre-tokenizers

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts_) p->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      emit_spans(p, apply_behavior(regex_matches(pattern_, p.text), behavior_, invert_), out);
    });
  }

 private:
  Regex pattern_;
  Behavior behavior_;
  bool invert_;
};

class CharSplitPreTokenizer : public PreTokenizer {
 public:
  CharSplitPreTokenizer(std::function<bool(char32_t)> pred, Behavior behavior)
      : pred_(std::move(pred)), behavior_(behavior) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      emit_spans(p, apply_behavior(char_matches(p.text, pred_), behavior_, false), out);
    });
  }

 private:
  std::function<bool(char32_t)> pred_;
  Behavior behavior_;
};

const char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {
    if (use_regex_) {
      static const Regex gpt2 = Regex::compile(kGpt2Pattern);
      regex_ = &gpt2;
    }
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      Piece q = p;
      if (add_prefix_space_ && !q.text.starts_with(' ')) q.text = " " + q.text;
      size_t first = out.size();
      if (use_regex_) {
        emit_spans(q, apply_behavior(regex_matches(*regex_, q.text), Behavior::kIsolated, false),
                   out);
      } else {
        out.push_back(std::move(q));
      }
      for (size_t i = first; i < out.size(); ++i) {
        std::string mapped;
        mapped.reserve(out[i].text.size() * 2);
        for (char c : out[i].text) mapped += byte_level_char(static_cast<uint8_t>(c));
        out[i].text = std::move(mapped);
      }
    });
  }

 private:
  bool add_prefix_space_, use_regex_;
  const Regex* regex_ = nullptr;
};

enum class PrependScheme { kFirst, kNever, kAlways };

PrependScheme prepend_scheme_field(const JsonContext& ctx, const json& j, const std::string& path) {
  PrependScheme scheme = PrependScheme::kAlways;
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    std::string s = ctx.string_field(j, path, "prepend_scheme");
    if (s == "first") {
      scheme = PrependScheme::kFirst;
    } else if (s == "never") {
      scheme = PrependScheme::kNever;
    } else if (s == "always") {
      scheme = PrependScheme::kAlways;
    } else {
      ctx.error(path + ".prepend_scheme", fmt::format("unknown prepend_scheme \"{}\"", s));
    }
  }
  // Old files say add_prefix_space instead; false must agree with "never".
  if (j.contains("add_prefix_space") && !j["add_prefix_space"].is_null()) {
    if (!ctx.bool_field(j, path, "add_prefix_space")) {
      if (j.contains("prepend_scheme") && scheme != PrependScheme::kNever) {
        ctx.error(path, "add_prefix_space does not match declared prepend_scheme");
      }
      scheme = PrependScheme::kNever;
    }
  }
  return scheme;
}

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(char32_t replacement, PrependScheme scheme, bool split)
      : replacement_(replacement), rep_(utf8_of(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      Piece q = p;
      std::string replaced;
      for (char c : p.text) {
        if (c == ' ') {
          replaced += rep_;
        } else {
          replaced.push_back(c);
        }
      }
      q.text = std::move(replaced);
      bool starts = q.text.starts_with(rep_);
      if (!q.text.empty() && !starts &&
          (scheme_ == PrependScheme::kAlways ||
           (scheme_ == PrependScheme::kFirst && q.at_input_start))) {
        q.text = rep_ + q.text;
      }
      if (split_) {
        char32_t r = replacement_;
        emit_spans(q,
                   apply_behavior(char_matches(q.text, [r](char32_t c) { return c == r; }),
                                  Behavior::kMergedWithNext, false),
                   out);
      } else {
        out.push_back(std::move(q));
      }
    });
  }

 private:
  char32_t replacement_;
  std::string rep_;
  PrependScheme scheme_;
  bool split_;
};

// ---------------------------------------------------------------------------
// Decoders

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }
  void decode_mid_stream(std::string& token) const override {
    for (const auto& p : parts_) p->decode_mid_stream(token);
  }
  bool window_safe() const override {
    return std::all_of(parts_.begin(), parts_.end(),
                       [](const auto& p) { return p->window_safe(); });
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      std::string mapped;
      bool all_mapped = true;
      size_t pos = 0;
      while (pos < t.size()) {
        char32_t c;
        if (!unicode::decode_utf8(t, pos, c)) {
          all_mapped = false;
          break;
        }
        int b = byte_level_byte(c);
        if (b < 0) {
          all_mapped = false;
          break;
        }
        mapped.push_back(static_cast<char>(b));
      }
      bytes += all_mapped ? mapped : t;
    }
    tokens.assign(1, unicode::utf8_lossy(bytes));
  }
  void decode_mid_stream(std::string& token) const override {
    std::string mapped;
    size_t pos = 0;
    while (pos < token.size()) {
      char32_t c;
      int b;
      if (!unicode::decode_utf8(token, pos, c) || (b = byte_level_byte(c)) < 0) return;  // kept as it is
      mapped.push_back(static_cast<char>(b));
    }
    token = std::move(mapped);
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, PrependScheme scheme)
      : replacement_(replacement), scheme_(scheme) {}
  void decode_mid_stream(std::string& token) const override {
    // A raw byte (ByteFallback's, before this stage) is final.
    if (unicode::find_invalid_utf8(token) != std::string::npos) return;
    token = map_chars(token, [&](char32_t c, std::string& out) {
      if (c == replacement_) {
        out.push_back(' ');
      } else {
        append_char(c, out);
      }
    });
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      bool drop = i == 0 && scheme_ != PrependScheme::kNever;
      tokens[i] = map_chars(tokens[i], [&](char32_t c, std::string& out) {
        if (c != replacement_) {
          append_char(c, out);
        } else if (!drop) {
          out.push_back(' ');
        }
      });
    }
  }

 private:
  char32_t replacement_;
  PrependScheme scheme_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) t = replace_matches(pattern_, t, content_);
  }
  void decode_mid_stream(std::string& token) const override {
    if (unicode::find_invalid_utf8(token) != std::string::npos) return;  // a raw byte is final
    token = replace_matches(pattern_, token, content_);
  }

 private:
  Regex pattern_;
  std::string content_;
};

// "<0xNN>" as `tokenizers` recognises it: six bytes, and u8::from_str_radix
// of the two in the middle (which also accepts a leading '+').
std::optional<uint8_t> byte_token_value(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t.back() != '>') return std::nullopt;
  std::string_view digits = t.substr(3, 2);
  if (digits[0] == '+') digits.remove_prefix(1);
  unsigned value = 0;
  for (char c : digits) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    value = value * 16 + static_cast<unsigned>(d);
  }
  return static_cast<uint8_t>(value);
}

class ByteFallbackDecoder : public Decoder {
 public:
  void decode_mid_stream(std::string& token) const override {
    if (auto b = byte_token_value(token)) token.assign(1, static_cast<char>(*b));
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (unicode::find_invalid_utf8(pending) == std::string::npos) {
        out.push_back(pending);
      } else {
        // Invalid bytes become one U+FFFD each (not from_utf8_lossy).
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      if (auto b = byte_token_value(t)) {
        pending.push_back(static_cast<char>(*b));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_mid_stream(std::string&) const override {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& t : tokens) joined += t;
    tokens.assign(1, std::move(joined));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  bool window_safe() const override { return start_ < 2; }
  // Strip follows Fuse in the tokenizers that use it, so it trims the
  // stream's ends only.
  void decode_mid_stream(std::string&) const override {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<char32_t> chars;
      map_chars(t, [&](char32_t c, std::string&) { chars.push_back(c); });
      size_t begin = 0;
      for (size_t i = 0; i < std::min(start_, chars.size()); ++i) {
        if (chars[i] != content_) break;
        begin = i + 1;
      }
      size_t end = chars.size();
      for (size_t i = 0; i < std::min(stop_, chars.size()); ++i) {
        size_t index = chars.size() - i - 1;
        if (chars[index] != content_) break;
        end = index;
      }
      std::string out;
      for (size_t i = begin; i < std::max(begin, end); ++i) append_char(chars[i], out);
      t = std::move(out);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class BpeSuffixDecoder : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  bool window_safe() const override { return false; }
  void decode_mid_stream(std::string& token) const override {
    if (suffix_.empty()) return;
    std::string out;
    std::string_view t = token;
    size_t pos;
    while ((pos = t.find(suffix_)) != std::string_view::npos) {
      out.append(t.substr(0, pos));
      out.push_back(' ');
      t.remove_prefix(pos + suffix_.size());
    }
    out.append(t);
    token = std::move(out);
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string_view replacement = i + 1 == tokens.size() ? "" : " ";
      std::string out;
      std::string_view t = tokens[i];
      size_t pos = 0;
      while (!suffix_.empty() && (pos = t.find(suffix_)) != std::string_view::npos) {
        out.append(t.substr(0, pos));
        out.append(replacement);
        t.remove_prefix(pos + suffix_.size());
      }
      out.append(t);
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

}  // namespace

// ---------------------------------------------------------------------------
// Byte-level alphabet

namespace {

struct ByteLevelTables {
  std::array<std::string, 256> byte_to_char;
  std::array<int16_t, 512> char_to_byte;  // every mapped character is below U+0200
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables = [] {
    ByteLevelTables t;
    t.char_to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      t.byte_to_char[b] = utf8_of(c);
      t.char_to_byte[c] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

const std::string& byte_level_char(uint8_t byte) { return byte_level_tables().byte_to_char[byte]; }

int byte_level_byte(char32_t c) { return c < 512 ? byte_level_tables().char_to_byte[c] : -1; }

// ---------------------------------------------------------------------------
// Parsing

std::unique_ptr<Normalizer> parse_normalizer(const json& j, const std::string& path,
                                             const JsonContext& ctx) {
  if (j.is_null()) return nullptr;
  std::string type = ctx.type_of(j, path);
  if (type == "Sequence") {
    const json& list = array_field(ctx, j, path, "normalizers");
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      std::string p = indexed(path, "normalizers", i);
      if (list[i].is_null()) ctx.error(p, "expected a normalizer");
      parts.push_back(parse_normalizer(list[i], p, ctx));
    }
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::kNFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(ctx.bool_field(j, path, "strip_left"),
                                             ctx.bool_field(j, path, "strip_right"));
  }
  if (type == "Prepend")
    return std::make_unique<PrependNormalizer>(ctx.string_field(j, path, "prepend"));
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(pattern_field(ctx, j, path),
                                               ctx.string_field(j, path, "content"));
  }
  ctx.error(path + ".type", fmt::format("unsupported normalizer \"{}\"", type));
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& j, const std::string& path,
                                                  const JsonContext& ctx) {
  if (j.is_null()) return nullptr;
  std::string type = ctx.type_of(j, path);
  if (type == "Sequence") {
    const json& list = array_field(ctx, j, path, "pretokenizers");
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      std::string p = indexed(path, "pretokenizers", i);
      if (list[i].is_null()) ctx.error(p, "expected a pre-tokenizer");
      parts.push_back(parse_pre_tokenizer(list[i], p, ctx));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(pattern_field(ctx, j, path),
                                               behavior_field(ctx, j, path),
                                               ctx.bool_field(j, path, "invert"));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(
        ctx.bool_field(j, path, "add_prefix_space", true),
        ctx.bool_field(j, path, "use_regex", true));
  }
  if (type == "Metaspace") {
    return std::make_unique<MetaspacePreTokenizer>(char_field(ctx, j, path, "replacement"),
                                                   prepend_scheme_field(ctx, j, path),
                                                   ctx.bool_field(j, path, "split", true));
  }
  if (type == "Digits") {
    bool individual = ctx.bool_field(j, path, "individual_digits", false);
    return std::make_unique<CharSplitPreTokenizer>(
        [](char32_t c) { return unicode::is_numeric(c); },
        individual ? Behavior::kIsolated : Behavior::kContiguous);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<CharSplitPreTokenizer>(
        [](char32_t c) { return unicode::is_white_space(c); }, Behavior::kRemoved);
  }
  ctx.error(path + ".type", fmt::format("unsupported pre-tokenizer \"{}\"", type));
}

std::unique_ptr<Decoder> parse_decoder(const json& j, const std::string& path,
                                       const JsonContext& ctx) {
  if (j.is_null()) return nullptr;
  std::string type = ctx.type_of(j, path);
  if (type == "Sequence") {
    const json& list = array_field(ctx, j, path, "decoders");
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      std::string p = indexed(path, "decoders", i);
      if (list[i].is_null()) ctx.error(p, "expected a decoder");
      parts.push_back(parse_decoder(list[i], p, ctx));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    return std::make_unique<MetaspaceDecoder>(char_field(ctx, j, path, "replacement"),
                                              prepend_scheme_field(ctx, j, path));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(pattern_field(ctx, j, path),
                                            ctx.string_field(j, path, "content"));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(char_field(ctx, j, path, "content"),
                                          count_field(ctx, j, path, "start"),
                                          count_field(ctx, j, path, "stop"));
  }
  if (type == "BPEDecoder") {
    std::string suffix = "</w>";
    if (j.contains("suffix")) suffix = ctx.string_field(j, path, "suffix");
    return std::make_unique<BpeSuffixDecoder>(std::move(suffix));
  }
  ctx.error(path + ".type", fmt::format("unsupported decoder \"{}\"", type));
}

namespace {

// ["[CLS]", 101] as Bert and Roberta processors write their tokens.
int32_t named_id(const JsonContext& ctx, const json& j, const std::string& path, const char* key) {
  const json& v = ctx.member(j, path, key);
  if (!v.is_array() || v.size() != 2 || !v[0].is_string()) {
    ctx.error(path + "." + key, "expected [token, id]");
  }
  return id_value(ctx, v[1], path + "." + key + "[1]");
}

PostProcessor parse_template(const json& j, const std::string& path, const JsonContext& ctx) {
  const json& single = array_field(ctx, j, path, "single");
  const json& specials = ctx.member(j, path, "special_tokens");
  std::string spath = path + ".special_tokens";
  if (!specials.is_object()) ctx.error(spath, "expected an object");
  PostProcessor out;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    std::string p = indexed(path, "single", i);
    const json& piece = single[i];
    if (!piece.is_object() || piece.size() != 1)
      ctx.error(p, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    if (piece.contains("Sequence")) {
      std::string id = ctx.string_field(piece["Sequence"], p + ".Sequence", "id");
      if (id != "A") ctx.error(p + ".Sequence.id", "the single template may only use sequence A");
      if (seen_sequence) ctx.error(p, "sequence A appears twice");
      seen_sequence = true;
      continue;
    }
    if (!piece.contains("SpecialToken"))
      ctx.error(p, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    std::string name = ctx.string_field(piece["SpecialToken"], p + ".SpecialToken", "id");
    auto it = specials.find(name);
    if (it == specials.end())
      ctx.error(p, fmt::format("special token \"{}\" is not in special_tokens", name));
    const json ids = array_field(ctx, *it, spath + "." + name, "ids");
    std::vector<int32_t>& target = seen_sequence ? out.suffix : out.prefix;
    for (size_t k = 0; k < ids.size(); ++k)
      target.push_back(id_value(ctx, ids[k], indexed(spath + "." + name, "ids", k)));
  }
  if (!seen_sequence) ctx.error(path + ".single", "the template has no sequence A");
  return out;
}

}  // namespace

PostProcessor parse_post_processor(const json& j, const std::string& path, const JsonContext& ctx) {
  if (j.is_null()) return {};
  std::string type = ctx.type_of(j, path);
  if (type == "TemplateProcessing") return parse_template(j, path, ctx);
  if (type == "ByteLevel") return {};
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    return PostProcessor{{named_id(ctx, j, path, "cls")}, {named_id(ctx, j, path, "sep")}};
  }
  if (type == "Sequence") {
    const json& list = array_field(ctx, j, path, "processors");
    PostProcessor out;
    for (size_t i = 0; i < list.size(); ++i) {
      PostProcessor inner = parse_post_processor(list[i], indexed(path, "processors", i), ctx);
      // A later processor wraps what the earlier ones produced.
      inner.prefix.insert(inner.prefix.end(), out.prefix.begin(), out.prefix.end());
      out.suffix.insert(out.suffix.end(), inner.suffix.begin(), inner.suffix.end());
      out.prefix = std::move(inner.prefix);
    }
    return out;
  }
  ctx.error(path + ".type", fmt::format("unsupported post-processor \"{}\"", type));
}

}  // namespace basalt::tokenizer_detail
