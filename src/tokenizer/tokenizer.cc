#include "tokenizer/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/unicode.h"

namespace basalt {

namespace tokenizer_detail {

using nlohmann::json;

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  // What decode() reads for this id: the normalized content when the token is
  // matched in normalized text and normalization changes it.
  std::string decoded;
};

// Leftmost-longest matching of a set of strings, as the Aho-Corasick
// automaton of `tokenizers`' AddedVocabulary (MatchKind::LeftmostLongest).
class TokenTrie {
 public:
  void insert(const std::string& pattern, int value) {
    if (pattern.empty()) return;
    int node = 0;
    for (unsigned char c : pattern) {
      auto it = nodes_[node].next.find(c);
      if (it == nodes_[node].next.end()) {
        nodes_.push_back(Node{});
        it = nodes_[node].next.emplace(c, static_cast<int>(nodes_.size()) - 1).first;
      }
      node = it->second;
    }
    if (nodes_[node].value < 0) nodes_[node].value = value;
  }
  bool empty() const { return nodes_.size() == 1; }

  struct Found {
    size_t begin, end;
    int value;
  };
  // The longest pattern that starts at `at`, if any.
  std::optional<Found> longest_at(std::string_view text, size_t at) const {
    std::optional<Found> best;
    int node = 0;
    for (size_t i = at; i < text.size(); ++i) {
      auto it = nodes_[node].next.find(static_cast<unsigned char>(text[i]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      if (nodes_[node].value >= 0) best = Found{at, i + 1, nodes_[node].value};
    }
    return best;
  }

 private:
  struct Node {
    std::unordered_map<unsigned char, int> next;
    int value = -1;
  };
  std::vector<Node> nodes_{Node{}};
};

struct TokenizerData {
  std::string label;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  PostProcessor post_processor;

  std::vector<AddedToken> added;                    // indexed by trie value
  std::unordered_map<int32_t, size_t> added_by_id;  // id -> index in added
  TokenMap added_by_content;
  std::unordered_set<std::string> special_contents;
  TokenTrie raw_trie;         // tokens matched before normalization
  TokenTrie normalized_trie;  // tokens matched in normalized text
  int32_t vocab_size = 0;

  const AddedToken* added_token(int32_t id) const {
    auto it = added_by_id.find(id);
    return it == added_by_id.end() ? nullptr : &added[it->second];
  }
};

namespace {

// Rust regex's \w: alphabetic, marks, decimal digits, connector punctuation
// and the joiners. Alphabetic is approximated by letters and letter numbers.
bool is_word_char(char32_t c) {
  return unicode::in_categories(c, unicode::kLetterMask | unicode::kMarkMask |
                                       unicode::category_bit(unicode::Category::kNd) |
                                       unicode::category_bit(unicode::Category::kNl) |
                                       unicode::category_bit(unicode::Category::kPc)) ||
         c == 0x200C || c == 0x200D;
}

char32_t last_char(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
  if (i > 0) --i;
  size_t pos = i;
  char32_t c = 0;
  if (!unicode::decode_utf8(s, pos, c)) c = unicode::kReplacementChar;
  return c;
}

char32_t first_char(std::string_view s) {
  size_t pos = 0;
  char32_t c = 0;
  if (!unicode::decode_utf8(s, pos, c)) c = unicode::kReplacementChar;
  return c;
}

// Start of the run of white space that ends `s` (s.size() when there is none).
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t i = end - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    size_t pos = i;
    char32_t c;
    if (!unicode::decode_utf8(s, pos, c) || pos != end || !unicode::is_white_space(c)) break;
    end = i;
  }
  return end;
}

size_t leading_space_end(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    char32_t c;
    if (!unicode::decode_utf8(s, next, c) || !unicode::is_white_space(c)) break;
    pos = next;
  }
  return pos;
}

// AddedVocabulary::find_matches + split_with_indices for one piece.
void split_added(const TokenizerData& d, const TokenTrie& trie, const Piece& piece,
                 std::vector<Piece>& out) {
  const std::string& s = piece.text;
  size_t start_offset = 0;
  auto emit = [&](size_t b, size_t e, std::optional<int32_t> id) {
    out.push_back(Piece{s.substr(b, e - b), id, piece.at_input_start && b == 0});
  };
  size_t at = 0;
  while (at < s.size()) {
    std::optional<TokenTrie::Found> found;
    for (size_t i = at; i < s.size() && !found; ++i) found = trie.longest_at(s, i);
    if (!found) break;
    at = found->end;
    const AddedToken& tok = d.added[found->value];
    size_t start = found->begin, stop = found->end;
    if (tok.single_word) {
      bool start_space =
          start == 0 || !is_word_char(last_char(std::string_view(s).substr(0, start)));
      bool stop_space =
          stop == s.size() || !is_word_char(first_char(std::string_view(s).substr(stop)));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip)
      start = std::max(trailing_space_start(std::string_view(s).substr(0, start)), start_offset);
    if (tok.rstrip) stop += leading_space_end(std::string_view(s).substr(stop));
    if (start_offset < start) emit(start_offset, start, std::nullopt);
    emit(start, stop, tok.id);
    start_offset = stop;
  }
  if (start_offset < s.size()) emit(start_offset, s.size(), std::nullopt);
}

void split_by_trie(const TokenizerData& d, const TokenTrie& trie, std::vector<Piece>& pieces,
                   bool normalize) {
  std::vector<Piece> out;
  for (Piece& p : pieces) {
    if (p.added_id) {
      out.push_back(std::move(p));
      continue;
    }
    if (normalize && d.normalizer) d.normalizer->normalize(p.text);
    if (p.text.empty()) continue;
    if (trie.empty()) {
      out.push_back(std::move(p));
      continue;
    }
    split_added(d, trie, p, out);
  }
  pieces.swap(out);
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {} {}", what, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("cannot read {} {}", what, path);
  return ss.str();
}

json parse_json(std::string_view text, const std::string& label) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", label, e.what());
  }
}

void load_added_tokens(TokenizerData& d, const json& list, const JsonContext& ctx) {
  if (list.is_null()) return;
  if (!list.is_array()) ctx.error("added_tokens", "expected an array");
  // Ids are assigned as AddedVocabulary::add_tokens does: a token already in
  // the model keeps the model's id, others count up from the model's size.
  int32_t next_id = static_cast<int32_t>(d.model->vocab_entries());
  for (size_t i = 0; i < list.size(); ++i) {
    std::string path = fmt::format("added_tokens[{}]", i);
    const json& t = list[i];
    AddedToken tok;
    tok.content = ctx.string_field(t, path, "content");
    tok.special = ctx.bool_field(t, path, "special", false);
    tok.single_word = ctx.bool_field(t, path, "single_word", false);
    tok.lstrip = ctx.bool_field(t, path, "lstrip", false);
    tok.rstrip = ctx.bool_field(t, path, "rstrip", false);
    tok.normalized = ctx.bool_field(t, path, "normalized", !tok.special);
    if (t.contains("id") && !(t["id"].is_number_integer() && t["id"].get<int64_t>() >= 0)) {
      ctx.error(path + ".id", "expected a non-negative integer id");
    }
    if (tok.content.empty()) continue;
    if (auto it = d.added_by_content.find(tok.content); it != d.added_by_content.end()) {
      tok.id = it->second;
    } else if (auto id = d.model->token_to_id(tok.content)) {
      tok.id = *id;
    } else {
      tok.id = next_id++;
    }
    tok.decoded = tok.content;
    if (tok.normalized && d.normalizer) d.normalizer->normalize(tok.decoded);
    d.added_by_content[tok.content] = tok.id;
    if (tok.special) d.special_contents.insert(tok.content);
    if (auto it = d.added_by_id.find(tok.id); it != d.added_by_id.end()) {
      d.added[it->second] = tok;
    } else {
      d.added_by_id[tok.id] = d.added.size();
      d.added.push_back(tok);
    }
  }
  // Tries are built from the final token of each id, in id order.
  std::vector<std::pair<int32_t, size_t>> order;
  for (const auto& [id, index] : d.added_by_id) order.emplace_back(id, index);
  std::sort(order.begin(), order.end());
  for (const auto& [id, index] : order) {
    const AddedToken& tok = d.added[index];
    if (tok.normalized) {
      d.normalized_trie.insert(tok.decoded, static_cast<int>(index));
    } else {
      d.raw_trie.insert(tok.content, static_cast<int>(index));
    }
  }
}

}  // namespace
}  // namespace tokenizer_detail

using tokenizer_detail::JsonContext;
using tokenizer_detail::Piece;
using tokenizer_detail::TokenizerData;

Tokenizer Tokenizer::from_file(const std::string& path) {
  return from_json(tokenizer_detail::read_file(path, "tokenizer file"), path);
}

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& label) {
  nlohmann::json j = tokenizer_detail::parse_json(text, label);
  JsonContext ctx{label};
  if (!j.is_object()) ctx.error("", "expected a JSON object");
  auto data = std::make_shared<TokenizerData>();
  data->label = label;
  if (j.contains("version")) {
    const auto& v = j["version"];
    if (!v.is_string() || v.get<std::string>() != "1.0")
      ctx.error("version", "unknown tokenizer version (expected \"1.0\")");
  }
  auto field = [&](const char* key) -> const nlohmann::json& {
    static const nlohmann::json null_json;
    auto it = j.find(key);
    return it == j.end() ? null_json : *it;
  };
  data->model = tokenizer_detail::BpeModel::parse(ctx.member(j, "", "model"), "model", ctx);
  data->normalizer = tokenizer_detail::parse_normalizer(field("normalizer"), "normalizer", ctx);
  data->pre_tokenizer =
      tokenizer_detail::parse_pre_tokenizer(field("pre_tokenizer"), "pre_tokenizer", ctx);
  data->decoder = tokenizer_detail::parse_decoder(field("decoder"), "decoder", ctx);
  data->post_processor =
      tokenizer_detail::parse_post_processor(field("post_processor"), "post_processor", ctx);
  tokenizer_detail::load_added_tokens(*data, field("added_tokens"), ctx);

  int32_t max_id = data->model->max_id();
  for (const auto& tok : data->added) max_id = std::max(max_id, tok.id);
  data->vocab_size = max_id + 1;
  for (const auto* ids : {&data->post_processor.prefix, &data->post_processor.suffix}) {
    for (int32_t id : *ids) {
      if (id >= data->vocab_size) {
        ctx.error("post_processor",
                  fmt::format("special token id {} is outside the vocabulary", id));
      }
    }
  }
  return Tokenizer(std::move(data));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const TokenizerData& d = *data_;
  if (size_t bad = unicode::find_invalid_utf8(text); bad != std::string_view::npos) {
    fail("cannot tokenize text that is not valid UTF-8 (invalid byte at offset {})", bad);
  }
  std::vector<Piece> pieces;
  if (!text.empty()) pieces.push_back(Piece{std::string(text), std::nullopt, true});
  tokenizer_detail::split_by_trie(d, d.raw_trie, pieces, /*normalize=*/false);
  tokenizer_detail::split_by_trie(d, d.normalized_trie, pieces, /*normalize=*/true);
  if (d.pre_tokenizer) d.pre_tokenizer->pre_tokenize(pieces);

  std::vector<int32_t> ids;
  if (add_special_tokens) ids = d.post_processor.prefix;
  for (const Piece& p : pieces) {
    if (p.added_id) {
      ids.push_back(*p.added_id);
    } else {
      d.model->tokenize(p.text, ids);
    }
  }
  if (add_special_tokens)
    ids.insert(ids.end(), d.post_processor.suffix.begin(), d.post_processor.suffix.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const TokenizerData& d = *data_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* token;
    if (const auto* added = d.added_token(id)) {
      token = &added->decoded;
    } else {
      token = d.model->id_to_token(id);
      if (!token)
        fail("cannot decode token id {}: the vocabulary has no such id (size {})", id,
             d.vocab_size);
    }
    if (skip_special_tokens && d.special_contents.contains(*token)) continue;
    tokens.push_back(*token);
  }
  if (!d.decoder) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) joined.push_back(' ');
      joined += tokens[i];
    }
    return joined;
  }
  d.decoder->decode_chain(tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

int32_t Tokenizer::vocab_size() const { return data_->vocab_size; }

std::optional<std::string> Tokenizer::token_bytes(int32_t id) const {
  const TokenizerData& d = *data_;
  std::string bytes;
  if (const auto* added = d.added_token(id)) {
    bytes = added->decoded;  // decode() runs the decoder over added tokens too
  } else if (const std::string* token = d.model->id_to_token(id)) {
    bytes = *token;
  } else {
    return std::nullopt;
  }
  if (d.decoder) d.decoder->decode_mid_stream(bytes);
  return bytes;
}

bool Tokenizer::window_safe_decoding() const {
  return !data_->decoder || data_->decoder->window_safe();
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = data_->added_by_content.find(token); it != data_->added_by_content.end())
    return it->second;
  return data_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (const auto* added = data_->added_token(id)) return added->content;
  if (const std::string* t = data_->model->id_to_token(id)) return *t;
  fail("token id {} is not in the vocabulary of {}", id, data_->label);
}

bool Tokenizer::is_special(int32_t id) const {
  const auto* added = data_->added_token(id);
  return added != nullptr && added->special;
}

std::optional<int32_t> Tokenizer::bos_id() const {
  if (data_->post_processor.prefix.empty()) return std::nullopt;
  return data_->post_processor.prefix.front();
}

std::vector<int32_t> Tokenizer::special_ids() const {
  std::vector<int32_t> ids;
  for (const auto& tok : data_->added) {
    if (tok.special) ids.push_back(tok.id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

const std::string& Tokenizer::label() const { return data_->label; }

// ---------------------------------------------------------------------------
// tokenizer_config.json

namespace {

// A token written as "text" or as {"content": "text", ...}.
std::optional<std::string> token_field(const nlohmann::json& j, const char* key,
                                       const JsonContext& ctx) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) return ctx.string_field(*it, key, "content");
  ctx.error(key, "expected a string, an object with \"content\", or null");
}

std::optional<bool> optional_bool(const nlohmann::json& j, const char* key,
                                  const JsonContext& ctx) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) ctx.error(key, "expected true or false");
  return it->get<bool>();
}

}  // namespace

TokenizerConfig parse_tokenizer_config(std::string_view text, const std::string& label) {
  nlohmann::json j = tokenizer_detail::parse_json(text, label);
  JsonContext ctx{label};
  if (!j.is_object()) ctx.error("", "expected a JSON object");
  TokenizerConfig c;
  c.bos_token = token_field(j, "bos_token", ctx);
  c.eos_token = token_field(j, "eos_token", ctx);
  c.pad_token = token_field(j, "pad_token", ctx);
  c.unk_token = token_field(j, "unk_token", ctx);
  c.add_bos_token = optional_bool(j, "add_bos_token", ctx);
  c.add_eos_token = optional_bool(j, "add_eos_token", ctx);
  if (auto it = j.find("chat_template"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      c.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
      for (size_t i = 0; i < it->size(); ++i) {
        std::string path = fmt::format("chat_template[{}]", i);
        std::string name = ctx.string_field((*it)[i], path, "name");
        std::string tmpl = ctx.string_field((*it)[i], path, "template");
        if (name == "default") c.chat_template = tmpl;
        c.named_chat_templates[name] = std::move(tmpl);
      }
    } else {
      ctx.error("chat_template", "expected a string or a list of {name, template}");
    }
  }
  return c;
}

TokenizerBundle load_tokenizer_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path base(dir);
  TokenizerBundle bundle{Tokenizer::from_file((base / "tokenizer.json").string()),
                         TokenizerConfig{}};
  fs::path config = base / "tokenizer_config.json";
  if (fs::exists(config)) {
    bundle.config = parse_tokenizer_config(
        tokenizer_detail::read_file(config.string(), "tokenizer config"), config.string());
  }
  fs::path jinja = base / "chat_template.jinja";
  if (bundle.config.chat_template.empty() && fs::exists(jinja)) {
    bundle.config.chat_template = tokenizer_detail::read_file(jinja.string(), "chat template");
  }
  return bundle;
}

// ---------------------------------------------------------------------------
// IncrementalDecoder

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer),
      skip_special_tokens_(skip_special_tokens),
      window_mode_(tokenizer.window_safe_decoding()) {}

namespace {

bool ends_with_replacement(std::string_view s) { return s.ends_with("\xEF\xBF\xBD"); }

bool is_byte_token(std::string_view t) {
  return t.size() == 6 && t.starts_with("<0x") && t.back() == '>';
}

}  // namespace

std::string IncrementalDecoder::push(int32_t id) {
  if (id < 0 || id >= tokenizer_->vocab_size()) {
    fail("cannot decode token id {}: the vocabulary has no such id (size {})", id,
         tokenizer_->vocab_size());
  }
  ids_.push_back(id);
  // A run of <0xNN> byte tokens is decoded as a group (ByteFallback): until a
  // token that is not a byte ends the run, bytes already valid can still turn
  // into U+FFFD, so nothing is final yet.
  for (size_t i = ids_.size(); i-- > read_offset_;) {
    if (skip_special_tokens_ && tokenizer_->is_special(ids_[i])) continue;
    if (is_byte_token(tokenizer_->id_to_token(ids_[i]))) return {};
    break;
  }
  if (!window_mode_) {
    // A skipped id leaves the text as it was; agreeing with the previous
    // decode then proves nothing about the last token's final form.
    if (skip_special_tokens_ && tokenizer_->is_special(id)) return {};
    return push_whole_stream();
  }
  std::span<const int32_t> all(ids_);
  std::string prefix = tokenizer_->decode(
      all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_tokens_);
  std::string text = tokenizer_->decode(all.subspan(prefix_offset_), skip_special_tokens_);
  // Hold back while the text may still change: a trailing U+FFFD is an
  // incomplete character that later byte tokens can complete.
  if (text.size() <= prefix.size() || ends_with_replacement(text) || !text.starts_with(prefix))
    return {};
  std::string delta = text.substr(prefix.size());
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  // Ids before the context window are never read again.
  if (prefix_offset_ > 64) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_));
    read_offset_ -= prefix_offset_;
    prefix_offset_ = 0;
  }
  return delta;
}

std::string IncrementalDecoder::push_whole_stream() {
  std::string text = tokenizer_->decode(ids_, skip_special_tokens_);
  // What two successive decodes agree on is final; a trailing U+FFFD and a
  // partial character are not.
  size_t common = 0;
  while (common < text.size() && common < last_text_.size() && text[common] == last_text_[common])
    ++common;
  while (common > 0 && common < text.size() &&
         (static_cast<unsigned char>(text[common]) & 0xC0) == 0x80)
    --common;
  std::string stable = text.substr(0, common);
  while (ends_with_replacement(stable)) stable.resize(stable.size() - 3);
  last_text_ = std::move(text);
  if (stable.size() <= emitted_.size() || !stable.starts_with(emitted_)) return {};
  std::string delta = stable.substr(emitted_.size());
  emitted_ = std::move(stable);
  return delta;
}

std::string IncrementalDecoder::flush() {
  if (!window_mode_) {
    std::string text = tokenizer_->decode(ids_, skip_special_tokens_);
    std::string delta = text.starts_with(emitted_) ? text.substr(emitted_.size()) : text;
    ids_.clear();
    emitted_.clear();
    last_text_.clear();
    return delta;
  }
  std::span<const int32_t> all(ids_);
  std::string prefix = tokenizer_->decode(
      all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_tokens_);
  std::string text = tokenizer_->decode(all.subspan(prefix_offset_), skip_special_tokens_);
  ids_.clear();
  prefix_offset_ = read_offset_ = 0;
  return text.starts_with(prefix) ? text.substr(prefix.size()) : text;
}

}  // namespace basalt
