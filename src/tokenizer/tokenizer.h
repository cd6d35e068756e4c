// Tokenizer: Hugging Face tokenizer.json BPE tokenizers, bit-exact with the
// `tokenizers` library.
//
// Contract: from_file/from_json load a tokenizer.json whose model is BPE
// (byte-level GPT-2 style, or SentencePiece style with byte_fallback), with
// the normalizers, pre-tokenizers, post-processors and decoders listed in
// tokenizer/pipeline.h. encode() and decode() return exactly what
// `tokenizers` 0.23 returns for the same file, with one deliberate difference:
// decode() throws basalt::Error for an id that names no token (`tokenizers`
// silently drops it). Anything malformed or unsupported in the file throws
// basalt::Error at load time naming the file and the JSON field; encode()
// throws for text that is not valid UTF-8. A Tokenizer is immutable after
// load (its internal BPE cache is synchronized), so one instance may serve
// many threads; copies share the loaded data.
//
// IncrementalDecoder turns a stream of ids into text pieces that are final:
// it never emits a broken UTF-8 sequence, and the concatenation of everything
// it returns (push()es plus flush()) equals decode() of all the ids. Each
// push() decodes a short window of recent ids (the prefix-offset technique),
// except for the rare decoders whose output depends on which token is last
// (BPEDecoder, Strip with start >= 2), where it decodes the whole stream.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace basalt {

namespace tokenizer_detail {
struct TokenizerData;
}

class Tokenizer {
 public:
  // `path` is a tokenizer.json file.
  static Tokenizer from_file(const std::string& path);
  // `label` names the source in error messages (usually the file path).
  static Tokenizer from_json(std::string_view json, const std::string& label);

  // Token ids of `text`. With add_special_tokens the post-processor adds its
  // special tokens (for example Llama 3's <|begin_of_text|>). Special tokens
  // written in the text are always recognised.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Text of `ids`; skip_special_tokens drops the added tokens marked special.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // One more than the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token's string ("Ġthe", "<0x0A>", "<|eot_id|>"); throws for unknown ids.
  std::string id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // The bytes token `id` adds to a decoded text in the middle of a stream
  // (Decoder::decode_mid_stream): raw bytes, so a token holding part of a
  // multi-byte character gives that part. Added tokens are decoded the same
  // way from their content.
  // nullopt for an id that names no token.
  std::optional<std::string> token_bytes(int32_t id) const;
  // The id the post-processor puts first when adding special tokens (the
  // BOS token of Llama-style templates), if it puts one there.
  std::optional<int32_t> bos_id() const;
  // Ids of all added tokens marked special, ascending.
  std::vector<int32_t> special_ids() const;
  const std::string& label() const;

 private:
  friend class IncrementalDecoder;
  // See tokenizer_detail::Decoder::window_safe.
  bool window_safe_decoding() const;

  explicit Tokenizer(std::shared_ptr<const tokenizer_detail::TokenizerData> data)
      : data_(std::move(data)) {}
  std::shared_ptr<const tokenizer_detail::TokenizerData> data_;
};

// The parts of tokenizer_config.json (and chat_template.jinja) that serving
// needs. Token strings are as written there (objects with a "content" field
// are reduced to that string).
struct TokenizerConfig {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> unk_token;
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  // The default chat template (a Jinja source), empty when there is none.
  std::string chat_template;
  // Named templates, when the config lists several ("tool_use", ...).
  std::map<std::string, std::string> named_chat_templates;
};

// Parses tokenizer_config.json text; `label` names it in errors.
TokenizerConfig parse_tokenizer_config(std::string_view json, const std::string& label);

struct TokenizerBundle {
  Tokenizer tokenizer;
  TokenizerConfig config;
};

// Loads dir/tokenizer.json (required), dir/tokenizer_config.json (optional)
// and dir/chat_template.jinja (optional, used when the config has no template).
TokenizerBundle load_tokenizer_dir(const std::string& dir);

class IncrementalDecoder {
 public:
  // `tokenizer` must outlive the decoder.
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Adds one id and returns the text that became final (often empty, for
  // example while a multi-byte character is still incomplete).
  std::string push(int32_t id);
  // Returns whatever is still held back (incomplete bytes decode as U+FFFD,
  // as decode() would), and resets the decoder for a new stream.
  std::string flush();

 private:
  std::string push_whole_stream();

  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  // Window mode (the usual case): text of ids_[prefix_offset_, read_offset_)
  // has been emitted; it is decoded again as context so that decoders which
  // treat the first token specially produce the same characters for the new
  // ids as a full decode would.
  bool window_mode_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
  // Whole-stream mode, for decoders that are not window-safe: everything is
  // decoded each step, and text is final once two successive decodes agree.
  std::string emitted_;
  std::string last_text_;
};

}  // namespace basalt
