// BpeModel: the BPE model of a tokenizer.json, a port of `tokenizers`'
// models::bpe::BPE without dropout.
//
// Contract: parse() validates the "model" object (vocab, merges in either
// the "a b" string form or the ["a", "b"] pair form, unk_token, fuse_unk,
// byte_fallback, ignore_merges, continuing_subword_prefix,
// end_of_word_suffix) and throws basalt::Error naming the field for any
// problem, including merges that name tokens absent from the vocabulary.
// tokenize() splits one pre-tokenized word into ids exactly as `tokenizers`
// does: merges applied lowest rank first (leftmost on ties), unknown
// characters through <0xNN> byte tokens when byte_fallback is set, else the
// unk token (fused when fuse_unk), else dropped. Results for words shorter
// than 256 bytes are cached; tokenize() is thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pipeline.h"

namespace basalt::tokenizer_detail {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  static std::unique_ptr<BpeModel> parse(const nlohmann::json& model, const std::string& path,
                                         const JsonContext& ctx);

  // Appends the ids of `word` (non-empty) to out.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // nullptr when no token has this id.
  const std::string* id_to_token(int32_t id) const;
  // Entries in the vocabulary (what `tokenizers` calls the model's vocab size).
  size_t vocab_entries() const { return vocab_.size(); }
  int32_t max_id() const { return max_id_; }

 private:
  BpeModel() = default;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  TokenMap vocab_;
  // id -> token; points at the keys of vocab_ (a hash map, so that a sparse
  // or hostile id range costs nothing).
  std::unordered_map<int32_t, const std::string*> vocab_r_;
  int32_t max_id_ = -1;
  struct MergeTarget {
    uint32_t rank;
    int32_t new_id;
  };
  std::unordered_map<uint64_t, MergeTarget> merges_;  // (left id, right id) packed
  std::optional<std::string> unk_token_;
  std::optional<std::string> continuing_subword_prefix_;
  std::optional<std::string> end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_{};  // id of "<0xNN>", or -1

  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kMaxCachedWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace basalt::tokenizer_detail
