#include "tokenizer/bpe.h"

#include <fmt/format.h>

#include <algorithm>
#include <queue>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace basalt::tokenizer_detail {

using nlohmann::json;

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

std::optional<std::string> optional_string(const JsonContext& ctx, const json& j,
                                           const std::string& path, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) ctx.error(path + "." + key, "expected a string or null");
  return it->get<std::string>();
}

}  // namespace

std::unique_ptr<BpeModel> BpeModel::parse(const json& j, const std::string& path,
                                          const JsonContext& ctx) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  std::string type = ctx.type_of(j, path);
  if (type != "BPE")
    ctx.error(path + ".type",
              fmt::format("unsupported model \"{}\" (only BPE is supported)", type));

  auto dropout = j.find("dropout");
  if (dropout != j.end() && !dropout->is_null()) {
    if (!dropout->is_number()) ctx.error(path + ".dropout", "expected a number or null");
    double p = dropout->get<double>();
    if (p < 0.0 || p > 1.0) ctx.error(path + ".dropout", "dropout must be within [0, 1]");
    if (p != 0.0)
      ctx.error(path + ".dropout", "BPE dropout is random and not supported for inference");
  }
  m->unk_token_ = optional_string(ctx, j, path, "unk_token");
  m->continuing_subword_prefix_ = optional_string(ctx, j, path, "continuing_subword_prefix");
  m->end_of_word_suffix_ = optional_string(ctx, j, path, "end_of_word_suffix");
  m->fuse_unk_ = ctx.bool_field(j, path, "fuse_unk", false);
  m->byte_fallback_ = ctx.bool_field(j, path, "byte_fallback", false);
  m->ignore_merges_ = ctx.bool_field(j, path, "ignore_merges", false);

  const json& vocab = ctx.member(j, path, "vocab");
  if (!vocab.is_object()) ctx.error(path + ".vocab", "expected an object of token: id");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
        it->get<int64_t>() >= (int64_t{1} << 30)) {
      ctx.error(fmt::format("{}.vocab[\"{}\"]", path, it.key()),
                "expected a non-negative integer id below 2^30");
    }
    int32_t id = static_cast<int32_t>(it->get<int64_t>());
    m->vocab_[it.key()] = id;
    m->max_id_ = std::max(m->max_id_, id);
  }
  for (const auto& [token, id] : m->vocab_) m->vocab_r_.emplace(id, &token);

  const json& merges = ctx.member(j, path, "merges");
  if (!merges.is_array()) ctx.error(path + ".merges", "expected an array");
  size_t prefix_len = m->continuing_subword_prefix_ ? m->continuing_subword_prefix_->size() : 0;
  uint32_t rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    std::string mpath = fmt::format("{}.merges[{}]", path, i);
    const json& e = merges[i];
    std::string a, b;
    if (e.is_string()) {
      const std::string& line = e.get_ref<const std::string&>();
      if (line.starts_with("#version")) continue;
      size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        ctx.error(mpath, "expected \"left right\" with exactly one space");
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      ctx.error(mpath, "expected \"left right\" or [\"left\", \"right\"]");
    }
    auto ia = m->vocab_.find(a);
    if (ia == m->vocab_.end())
      ctx.error(mpath, fmt::format("merge names \"{}\", which is not in the vocab", a));
    auto ib = m->vocab_.find(b);
    if (ib == m->vocab_.end())
      ctx.error(mpath, fmt::format("merge names \"{}\", which is not in the vocab", b));
    if (b.size() < prefix_len)
      ctx.error(mpath, "right side is shorter than continuing_subword_prefix");
    std::string merged = a + b.substr(prefix_len);
    auto im = m->vocab_.find(merged);
    if (im == m->vocab_.end()) {
      ctx.error(mpath, fmt::format("merge result \"{}\" is not in the vocab", merged));
    }
    // A repeated pair keeps its last rank, as a HashMap built from the list does.
    m->merges_[pair_key(ia->second, ib->second)] = MergeTarget{rank, im->second};
    ++rank;
  }

  m->byte_ids_.fill(-1);
  if (m->byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      auto it = m->vocab_.find(fmt::format("<0x{:02X}>", b));
      if (it != m->vocab_.end()) m->byte_ids_[b] = it->second;
    }
  }
  return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  auto it = vocab_r_.find(id);
  return it == vocab_r_.end() ? nullptr : it->second;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  bool cacheable = word.size() < kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(ids));
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int prev;
    int next;
    size_t len;  // 0 once merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id, size_t len) {
    int index = static_cast<int>(symbols.size());
    symbols.push_back(Symbol{id, index - 1, index + 1, len});
  };

  std::optional<std::pair<int32_t, size_t>> unk;  // pending unk id and byte length
  auto unk_id = [&]() -> int32_t {
    auto id = token_to_id(*unk_token_);
    if (!id) fail("unk_token \"{}\" is not in the vocabulary", *unk_token_);
    return *id;
  };
  size_t pos = 0;
  std::string piece;
  while (pos < word.size()) {
    size_t start = pos;
    char32_t cp;
    if (!unicode::decode_utf8(word, pos, cp))
      pos = start + unicode::utf8_sequence_length(static_cast<unsigned char>(word[start]));
    pos = std::min(pos, word.size());
    size_t byte_len = pos - start;
    piece.assign(word.substr(start, byte_len));
    if (start != 0 && continuing_subword_prefix_) piece = *continuing_subword_prefix_ + piece;
    if (pos == word.size() && end_of_word_suffix_) piece += *end_of_word_suffix_;

    if (auto it = vocab_.find(piece); it != vocab_.end()) {
      if (unk) {
        add(unk->first, unk->second);
        unk.reset();
      }
      add(it->second, byte_len);
      continue;
    }
    if (byte_fallback_) {
      bool all = std::all_of(piece.begin(), piece.end(),
                             [&](char c) { return byte_ids_[static_cast<uint8_t>(c)] >= 0; });
      if (all) {
        // Like `tokenizers`, a pending unk is not flushed here.
        for (char c : piece) add(byte_ids_[static_cast<uint8_t>(c)], 1);
        continue;
      }
    }
    if (unk_token_) {
      if (unk && fuse_unk_) {
        unk->second += byte_len;
      } else {
        if (unk) add(unk->first, unk->second);
        unk.emplace(unk_id(), byte_len);
      }
    }
  }
  if (unk) add(unk->first, unk->second);
  if (!symbols.empty()) symbols.back().next = -1;

  struct Candidate {
    uint32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto lookup = [&](int32_t a, int32_t b) -> const MergeTarget* {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeTarget* m = lookup(symbols[i].id, symbols[i + 1].id)) {
      queue.push(Candidate{m->rank, static_cast<int>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    int next_pos = cur.next;
    Symbol right = symbols[next_pos];
    // Stale entries: the pair here must still merge into the same token.
    const MergeTarget* m = lookup(cur.id, right.id);
    if (!m || m->new_id != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0 && static_cast<size_t>(right.next) < symbols.size())
      symbols[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeTarget* pm = lookup(symbols[cur.prev].id, cur.id)) {
        queue.push(Candidate{pm->rank, cur.prev, pm->new_id});
      }
    }
    if (cur.next >= 0 && static_cast<size_t>(cur.next) < symbols.size()) {
      if (const MergeTarget* nm = lookup(cur.id, symbols[cur.next].id)) {
        queue.push(Candidate{nm->rank, top.pos, nm->new_id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) out.push_back(s.id);
  }
}

}  // namespace basalt::tokenizer_detail
