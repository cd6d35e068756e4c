// The parser is a resumable state machine over the text not yet given out
// (`buf`): `pos` is how far the current phase has read. Nothing before
// pos is given out until the phase decides it: as content (plain text, or
// a call that failed) or as a call (its markup then disappears). Only
// decisions shorten buf from the front, so positions inside an undecided
// call stay valid while it is read. JSON is checked by an incremental
// scanner as it arrives, so a malformed call fails at its first bad byte
// rather than when its closing marker never comes; only complete values
// are parsed (by nlohmann) and validated.
#include "chat_output/tool_call_parser.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "chat_output/json_scanner.h"

namespace basalt {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::string_view kDeepSeekCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDeepSeekCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDeepSeekCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDeepSeekCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDeepSeekSep = "<｜tool▁sep｜>";
constexpr std::string_view kDeepSeekFunctionSep = "function<｜tool▁sep｜>";  // V3's call type, then the name

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alnum(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
// Bytes of a function name written outside JSON (Mistral, DeepSeek).
bool is_name_byte(char c) { return is_alnum(c) || c == '_' || c == '-' || c == '.' || c == ':'; }

enum class Match { kYes, kNo, kMaybe };

// Where the text of the output stands. Each format uses some of these.
enum class Phase {
  kStart,               // the output's leading whitespace (llama3_json, mistral's bare array)
  kText,                // text, looking for the format's opening marker
  kPassThrough,         // llama3_json once the output is not (or no longer) calls: content
  kJson,                // in a call's JSON, then json_next
  kHermesOpen,          // after <tool_call>: whitespace, then the object
  kHermesClose,         // after the object: whitespace, then </tool_call>
  kLlamaAfterTag,       // after <|python_tag|>: whitespace, then the object
  kLlamaAfterCall,      // after a call: whitespace, then ";" or the end
  kLlamaNext,           // after ";": whitespace, then the next object
  kMistralAfterMarker,  // after [TOOL_CALLS]: whitespace, then an array or a name
  kMistralName,         // the name, then [CALL_ID] or [ARGS]
  kMistralCallId,       // the call's id, then [ARGS]
  kMistralArgs,         // whitespace, then the arguments object
  kMistralCallDone,     // the arguments object ended
  kMistralArrayDone,    // the array of calls ended
  kDeepSeekBlock,       // in the calls block: whitespace, then a call or the block's end
  kDeepSeekType,        // v3: "function", then the separator
  kDeepSeekName,        // the name, then "\n" (v3) or the separator (v31)
  kDeepSeekFence,       // v3: whitespace, then ```json
  kDeepSeekArgs,        // whitespace, then the arguments object
  kDeepSeekAfterArgs,   // v3: whitespace, then ```
  kDeepSeekCallEnd,     // whitespace, then the call's end marker
};

// The arguments of a call object (name checked by the caller), compact.
std::optional<std::string> arguments_of(const Json& call) {
  const bool has_arguments = call.contains("arguments"), has_parameters = call.contains("parameters");
  if (has_arguments && has_parameters) return std::nullopt;
  if (!has_arguments && !has_parameters) return "{}";
  const Json& args = call.at(has_arguments ? "arguments" : "parameters");
  if (args.is_object()) return args.dump();
  if (!args.is_string()) return std::nullopt;
  Json inner = Json::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
  if (!inner.is_object()) return std::nullopt;
  return inner.dump();
}

}  // namespace

struct ToolCallParser::State {
  State(ToolCallFormat format, const nlohmann::json& tools) : format(format), rng(std::random_device{}()) {
    if (tools.is_array()) {
      for (const auto& tool : tools) {
        if (!tool.is_object() || !tool.contains("function")) continue;
        const auto& function = tool.at("function");
        if (function.is_object() && function.contains("name") && function.at("name").is_string())
          names.insert(function.at("name").get<std::string>());
      }
    }
    phase = format == ToolCallFormat::kLlama3Json || format == ToolCallFormat::kMistral ? Phase::kStart : Phase::kText;
  }

  ChatOutputDelta feed(std::string_view text, bool last) {
    if (finished) {
      out.content.append(text);
      return std::exchange(out, {});
    }
    buf.append(text);
    final = last;
    try {
      while (step()) {
      }
    } catch (const std::exception&) {
      // Only nlohmann can throw here (a value that parsed but does not dump):
      // the undecided text is content, as for any malformed call.
      pos = buf.size();
      fail();
    }
    if (final) {
      out.content += buf;
      buf.clear();
      pos = 0;
      finished = true;
    }
    return std::exchange(out, {});
  }

  // --- Decisions ---

  void give_content(size_t n) {
    out.content.append(buf, 0, n);
    buf.erase(0, n);
    pos = pos > n ? pos - n : 0;
  }
  // The call (or the phase) went wrong at pos: what it held is content, and
  // the text goes on from there.
  void fail() {
    give_content(pos);
    after_call = false;
    phase = format == ToolCallFormat::kLlama3Json ? Phase::kPassThrough : Phase::kText;
  }
  // Everything before pos was markup of these calls.
  void commit(std::vector<std::pair<std::string, std::string>> name_args) {
    for (auto& [name, args] : name_args) {
      ToolCall call{new_id(), std::move(name), std::move(args)};
      out.tool_calls.push_back({static_cast<int>(calls.size()), call.id, call.name, call.arguments});
      calls.push_back(std::move(call));
    }
    buf.erase(0, pos);
    pos = 0;
  }
  std::string new_id() {
    static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    for (;;) {
      std::string id = "call_";
      std::uniform_int_distribution<size_t> pick(0, kAlphabet.size() - 1);
      for (int i = 0; i < 24; ++i) id.push_back(kAlphabet[pick(rng)]);
      if (ids.insert(id).second) return id;
    }
  }

  // --- Reading ---

  Match literal(std::string_view text) {
    const size_t n = std::min(text.size(), buf.size() - pos);
    if (std::string_view(buf).substr(pos, n) != text.substr(0, n)) return Match::kNo;
    if (n < text.size()) return final ? Match::kNo : Match::kMaybe;
    pos += text.size();
    return Match::kYes;
  }
  // Skips whitespace; false when the text so far ends in it (more may follow).
  bool skip_space() {
    while (pos < buf.size() && is_space(buf[pos])) ++pos;
    return pos < buf.size() || final;
  }
  bool at(char c) const { return pos < buf.size() && buf[pos] == c; }
  bool at_end() const { return pos == buf.size(); }
  void start_json(Phase next) {
    scanner = JsonScanner();
    json_begin = pos;
    json_next = next;
    phase = Phase::kJson;
  }
  std::string_view json_text() const { return std::string_view(buf).substr(json_begin, json_end - json_begin); }
  // The call in the finished JSON object, if it is one of `names`.
  std::optional<std::pair<std::string, std::string>> call_of(const Json& value) const {
    if (!value.is_object() || !value.contains("name") || !value.at("name").is_string()) return std::nullopt;
    std::string name = value.at("name").get<std::string>();
    if (!names.contains(name)) return std::nullopt;
    std::optional<std::string> args = arguments_of(value);
    if (!args) return std::nullopt;
    return std::make_pair(std::move(name), std::move(*args));
  }
  std::optional<std::pair<std::string, std::string>> json_call() const {
    return call_of(Json::parse(json_text(), nullptr, /*allow_exceptions=*/false));
  }
  // Reads a name up to `terminator`; false to wait. Fails the call when the
  // name is unknown or not followed by the terminator.
  bool read_name(std::string_view terminator, Phase next) {
    while (pos < buf.size() && is_name_byte(buf[pos])) ++pos;
    if (at_end() && !final) return false;
    const size_t end = pos;
    const Match m = literal(terminator);
    if (m == Match::kMaybe) {
      pos = name_begin;  // read again with more text
      return false;
    }
    name = buf.substr(name_begin, end - name_begin);
    (m == Match::kYes && names.contains(name)) ? enter(next) : fail();
    return true;
  }
  // `text`, then phase `next`; false to wait.
  bool expect(std::string_view text, Phase next) {
    const Match m = literal(text);
    if (m == Match::kMaybe) return false;
    m == Match::kYes ? enter(next) : fail();
    return true;
  }
  // Whitespace, then a JSON object whose end leads to `next`; false to wait.
  bool expect_object(Phase next) {
    if (!skip_space()) return false;
    at('{') ? start_json(next) : fail();
    return true;
  }
  void enter(Phase next) {
    phase = next;
    if (next == Phase::kMistralName || next == Phase::kDeepSeekName) name_begin = pos;
  }

  // --- The machine ---

  // One step; false when it needs more text.
  bool step() {
    // Bounded memory: an undecided call read past the limit is content. (A
    // phase waits for more text only with pos at most a marker's length
    // before the end of buf.)
    if (phase != Phase::kText && phase != Phase::kPassThrough && pos > kMaxHeldBytes) {
      while (pos < buf.size() && (static_cast<unsigned char>(buf[pos]) & 0xC0) == 0x80) ++pos;  // whole code points
      fail();
      return true;
    }
    switch (phase) {
      case Phase::kText:
        return text();
      case Phase::kPassThrough:
        give_content(buf.size());
        return false;
      case Phase::kStart:
        return start();
      case Phase::kJson:
        return json();
      case Phase::kHermesOpen:
        return expect_object(Phase::kHermesClose);
      case Phase::kHermesClose:
        return hermes_close();
      case Phase::kLlamaAfterTag:
      case Phase::kLlamaNext:
        return expect_object(Phase::kLlamaAfterCall);
      case Phase::kLlamaAfterCall:
        return llama_after_call();
      case Phase::kMistralAfterMarker:
        if (!skip_space()) return false;
        at('[') ? start_json(Phase::kMistralArrayDone) : enter(Phase::kMistralName);
        return true;
      case Phase::kMistralName: {
        while (pos < buf.size() && is_name_byte(buf[pos])) ++pos;
        if (at_end() && !final) return false;
        const Match id = literal(kMistralCallId);
        if (id == Match::kMaybe) return false;
        if (id == Match::kNo) return read_name(kMistralArgs, Phase::kMistralArgs);
        pos -= kMistralCallId.size();
        return read_name(kMistralCallId, Phase::kMistralCallId);
      }
      case Phase::kMistralCallId:
        while (pos < buf.size() && is_alnum(buf[pos])) ++pos;
        if (at_end() && !final) return false;
        return expect(kMistralArgs, Phase::kMistralArgs);
      case Phase::kMistralArgs:
        return expect_object(Phase::kMistralCallDone);
      case Phase::kMistralCallDone:
        return finish_named_call(Phase::kText);
      case Phase::kMistralArrayDone:
        return mistral_array();
      case Phase::kDeepSeekBlock:
        return deepseek_block();
      case Phase::kDeepSeekType:
        return expect(kDeepSeekFunctionSep, Phase::kDeepSeekName);
      case Phase::kDeepSeekName:
        return format == ToolCallFormat::kDeepSeekV3 ? read_name("\n", Phase::kDeepSeekFence)
                                                     : read_name(kDeepSeekSep, Phase::kDeepSeekArgs);
      case Phase::kDeepSeekFence:
        return skip_space() && expect("```json", Phase::kDeepSeekArgs);
      case Phase::kDeepSeekArgs:
        return expect_object(format == ToolCallFormat::kDeepSeekV3 ? Phase::kDeepSeekAfterArgs
                                                                   : Phase::kDeepSeekCallEnd);
      case Phase::kDeepSeekAfterArgs:
        return skip_space() && expect("```", Phase::kDeepSeekCallEnd);
      case Phase::kDeepSeekCallEnd: {
        if (!skip_space()) return false;
        const Match m = literal(kDeepSeekCallEnd);
        if (m == Match::kMaybe) return false;
        if (m == Match::kNo) {
          fail();
          return true;
        }
        return finish_named_call(Phase::kDeepSeekBlock);
      }
    }
    return false;
  }

  std::string_view opening_marker() const {
    switch (format) {
      case ToolCallFormat::kHermes:
        return kHermesOpen;
      case ToolCallFormat::kMistral:
        return kMistralCalls;
      case ToolCallFormat::kDeepSeekV3:
      case ToolCallFormat::kDeepSeekV31:
        return kDeepSeekCallsBegin;
      case ToolCallFormat::kLlama3Json:
        break;
    }
    return {};
  }
  void open_call() {
    switch (format) {
      case ToolCallFormat::kHermes:
        phase = Phase::kHermesOpen;
        break;
      case ToolCallFormat::kMistral:
        phase = Phase::kMistralAfterMarker;
        break;
      default:
        phase = Phase::kDeepSeekBlock;
        block_has_call = false;
        break;
    }
  }

  bool text() {
    const std::string_view marker = opening_marker();
    if (marker.empty()) {  // llama3_json has no marker to look for in text
      give_content(buf.size());
      return false;
    }
    if (after_call) {
      // Whitespace right after calls is markup when more calls or the end follow.
      pos = 0;
      if (!skip_space()) return pos <= kMaxHeldBytes ? false : (after_call = false, true);
      if (at_end()) {  // the end of the output
        buf.erase(0, pos);
        pos = 0;
        return false;
      }
      const Match m = literal(marker);
      if (m == Match::kMaybe) return false;
      after_call = false;
      if (m == Match::kYes) {
        buf.erase(0, pos - marker.size());
        pos = marker.size();
        open_call();
        return true;
      }
      pos = 0;
    }
    const size_t found = buf.find(marker);
    if (found != std::string::npos) {
      give_content(found);
      pos = marker.size();
      open_call();
      return true;
    }
    // Hold back the longest tail that a marker could start with.
    size_t keep = 0;
    if (!final) {
      for (size_t n = std::min(marker.size() - 1, buf.size()); n > 0; --n) {
        if (std::string_view(buf).substr(buf.size() - n) == marker.substr(0, n)) {
          keep = n;
          break;
        }
      }
    }
    give_content(buf.size() - keep);
    return false;
  }

  bool start() {
    if (!skip_space()) return false;
    if (format == ToolCallFormat::kLlama3Json) {
      const Match m = literal(kPythonTag);
      if (m == Match::kMaybe) return false;
      if (m == Match::kYes) {
        phase = Phase::kLlamaAfterTag;
      } else if (at('{')) {
        start_json(Phase::kLlamaAfterCall);
      } else {
        pos = 0;
        phase = Phase::kPassThrough;
      }
      return true;
    }
    // Mistral: a marker (whitespace before it is dropped), a bare array of calls, or text.
    const Match m = literal(kMistralCalls);
    if (m == Match::kMaybe) return false;
    if (m == Match::kYes) {
      phase = Phase::kMistralAfterMarker;
    } else if (at('[')) {
      start_json(Phase::kMistralArrayDone);
    } else {
      pos = 0;
      phase = Phase::kText;
    }
    return true;
  }

  bool json() {
    while (pos < buf.size()) {
      const JsonScanner::Status s = scanner.step(buf[pos]);
      if (s == JsonScanner::Status::kError) {
        fail();
        return true;
      }
      ++pos;
      if (s == JsonScanner::Status::kDone) {
        json_end = pos;
        phase = json_next;
        return true;
      }
      if (pos > kMaxHeldBytes) return true;  // step() gives the call up
    }
    if (final) fail();
    return final;
  }

  bool hermes_close() {
    if (!skip_space()) return false;
    const Match m = literal(kHermesClose);
    if (m == Match::kMaybe) return false;
    if (m == Match::kNo && !(final && at_end())) {
      fail();
      return true;
    }
    if (auto call = json_call()) {
      commit({std::move(*call)});
      after_call = true;
      phase = Phase::kText;
    } else {
      fail();
    }
    return true;
  }

  bool llama_after_call() {
    if (!llama_call_done) {
      // The object just ended: it is a call, or everything from it on is content.
      auto call = json_call();
      if (!call) {
        fail();
        return true;
      }
      pos = json_end;
      commit({std::move(*call)});
      llama_call_done = true;
    }
    if (!skip_space()) return false;
    if (at_end()) {  // trailing whitespace at the end of the output
      buf.erase(0, pos);
      pos = 0;
      return false;
    }
    llama_call_done = false;
    if (at(';')) {
      ++pos;
      phase = Phase::kLlamaNext;
    } else {
      pos = 0;  // text after the calls, with its whitespace
      phase = Phase::kPassThrough;
    }
    return true;
  }

  bool finish_named_call(Phase next) {
    Json args = Json::parse(json_text(), nullptr, /*allow_exceptions=*/false);
    if (!args.is_object()) {
      fail();
      return true;
    }
    commit({{name, args.dump()}});
    block_has_call = true;
    if (next == Phase::kText) after_call = true;
    phase = next;
    return true;
  }

  bool mistral_array() {
    const Json array = Json::parse(json_text(), nullptr, /*allow_exceptions=*/false);
    std::vector<std::pair<std::string, std::string>> found;
    if (array.is_array()) {
      for (const Json& element : array) {
        auto call = call_of(element);
        if (!call) break;
        found.push_back(std::move(*call));
      }
    }
    if (found.empty() || found.size() != array.size()) {
      fail();
      return true;
    }
    commit(std::move(found));
    after_call = true;
    phase = Phase::kText;
    return true;
  }

  bool deepseek_block() {
    if (!skip_space()) return false;
    if (final && at_end()) {  // the output ended after a call, without the block's end
      if (!block_has_call) {
        fail();
        return false;
      }
      buf.erase(0, pos);
      pos = 0;
      phase = Phase::kText;
      return false;
    }
    const Match call = literal(kDeepSeekCallBegin);
    if (call == Match::kYes) {
      enter(format == ToolCallFormat::kDeepSeekV3 ? Phase::kDeepSeekType : Phase::kDeepSeekName);
      return true;
    }
    const Match end = literal(kDeepSeekCallsEnd);
    if (call == Match::kMaybe || end == Match::kMaybe) return false;
    if (end == Match::kNo || !block_has_call) {  // an empty block is no markup of calls
      fail();
      return true;
    }
    buf.erase(0, pos);
    pos = 0;
    after_call = true;
    phase = Phase::kText;
    return true;
  }

  const ToolCallFormat format;
  std::set<std::string> names;
  std::set<std::string> ids;
  std::mt19937_64 rng;
  std::vector<ToolCall> calls;
  ChatOutputDelta out;

  std::string buf;  // text not yet given out
  size_t pos = 0;   // how far the phase has read in buf
  Phase phase;
  bool final = false;            // the output has ended: nothing more will come
  bool finished = false;         // finish() was called
  bool after_call = false;       // kText right after calls: whitespace is held
  bool llama_call_done = false;  // kLlamaAfterCall: its call is given out already
  bool block_has_call = false;   // deepseek: the open calls block has a valid call
  JsonScanner scanner;
  size_t json_begin = 0, json_end = 0;
  Phase json_next = Phase::kText;
  size_t name_begin = 0;
  std::string name;
};

ToolCallParser::ToolCallParser(ToolCallFormat format, const nlohmann::json& tools)
    : state_(std::make_unique<State>(format, tools)) {}
ToolCallParser::~ToolCallParser() = default;
ToolCallParser::ToolCallParser(ToolCallParser&&) noexcept = default;
ToolCallParser& ToolCallParser::operator=(ToolCallParser&&) noexcept = default;

ChatOutputDelta ToolCallParser::feed(std::string_view text) { return state_->feed(text, false); }
ChatOutputDelta ToolCallParser::finish() { return state_->feed({}, true); }
const std::vector<ToolCall>& ToolCallParser::calls() const { return state_->calls; }

}  // namespace basalt
