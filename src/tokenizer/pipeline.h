// The stages of a tokenizer.json pipeline, each a faithful port of the
// `tokenizers` component of the same name. Internal to the tokenizer library.
//
// Supported (anything else throws basalt::Error at load naming the field):
//   normalizers:     Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip,
//                    StripAccents, Prepend, Replace (String or Regex pattern)
//   pre-tokenizers:  Sequence, Split (String or Regex, every behavior, invert),
//                    ByteLevel, Metaspace, Digits, WhitespaceSplit
//   post-processors: TemplateProcessing, ByteLevel, BertProcessing,
//                    RobertaProcessing, Sequence (ids only: offsets, type ids
//                    and pairs are not produced)
//   decoders:        Sequence, ByteLevel, Metaspace, Replace, ByteFallback,
//                    Fuse, Strip, BPEDecoder
// Not supported: the Unigram, WordPiece and WordLevel models, and the
// Precompiled, Bert, Nmt and ByteLevel normalizers, the Whitespace, Bert,
// Punctuation, CharDelimiterSplit, UnicodeScripts and FixedLength
// pre-tokenizers, and the WordPiece and CTC decoders.
//
// A stage is parsed by a parse_* function from its JSON object; `path` is the
// JSON location used in error messages ("pre_tokenizer.pretokenizers[0]").
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/regex.h"

namespace basalt::tokenizer_detail {

// Where errors point: the file label and the JSON path.
struct JsonContext {
  const std::string& label;
  [[noreturn]] void error(const std::string& path, const std::string& what) const;
  const nlohmann::json& member(const nlohmann::json& obj, const std::string& path,
                               const char* key) const;
  std::string string_field(const nlohmann::json& obj, const std::string& path,
                           const char* key) const;
  bool bool_field(const nlohmann::json& obj, const std::string& path, const char* key,
                  std::optional<bool> fallback = std::nullopt) const;
  std::string type_of(const nlohmann::json& obj, const std::string& path) const;
};

// A piece of the input on its way through the pipeline. Pieces carrying an
// added token's id are final and skipped by every later stage.
struct Piece {
  std::string text;
  std::optional<int32_t> added_id;
  // True when the piece begins at byte 0 of the original input (Metaspace's
  // prepend_scheme "first" only prepends there).
  bool at_input_start = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits (and may transform) each piece without an added id; keeps order.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // What one token adds to the text in the middle of a stream, as raw bytes:
  // a byte-level or <0xNN> byte stays a byte even where it is part of a
  // multi-byte character (no U+FFFD), and stages that act only on the
  // stream's first or last characters (Metaspace's prefix space, Strip after
  // Fuse, the BPE suffix of the last token) do not apply.
  virtual void decode_mid_stream(std::string& token) const = 0;
  // Whether decoding a window of ids that starts mid-stream yields, for the
  // ids after the window's first ones, the same text as decoding the whole
  // stream. False for decoders whose output depends on a token being last
  // (BPEDecoder) or on the first characters of the whole text beyond the
  // first one (Strip with start >= 2); IncrementalDecoder then decodes the
  // whole stream each step.
  virtual bool window_safe() const { return true; }
};

// The ids a post-processor puts before and after the encoded sequence.
struct PostProcessor {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

// Null JSON yields nullptr (the stage is absent).
std::unique_ptr<Normalizer> parse_normalizer(const nlohmann::json& j, const std::string& path,
                                             const JsonContext& ctx);
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const nlohmann::json& j, const std::string& path,
                                                  const JsonContext& ctx);
std::unique_ptr<Decoder> parse_decoder(const nlohmann::json& j, const std::string& path,
                                       const JsonContext& ctx);
PostProcessor parse_post_processor(const nlohmann::json& j, const std::string& path,
                                   const JsonContext& ctx);

// The GPT-2 byte-to-character table of the ByteLevel stages.
const std::string& byte_level_char(uint8_t byte);
// The byte a ByteLevel character stands for, or -1.
int byte_level_byte(char32_t c);

}  // namespace basalt::tokenizer_detail
