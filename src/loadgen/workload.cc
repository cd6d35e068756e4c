#include "loadgen/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace basalt::loadgen {

namespace {

bool printable_ascii(const std::string& s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

uint64_t below(std::mt19937_64& rng, uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); }

void check_len(int64_t v, const char* flag) { BASALT_CHECK(v >= 1, "{} must be >= 1, got {}", flag, v); }

void check_ratio(double r) {
  BASALT_CHECK(std::isfinite(r) && r >= 0 && r < 1, "--range-ratio must be in [0, 1), got {}", r);
}

}  // namespace

TextMaker::TextMaker(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {
  const int32_t vocab = tokenizer.vocab_size();
  for (int32_t id = 0; id < vocab; ++id) {
    if (tokenizer.is_special(id)) continue;
    std::string text;
    try {
      text = tokenizer.decode(std::span<const int32_t>(&id, 1), false);
    } catch (const Error&) {
      continue;  // an id that names no token
    }
    if (printable_ascii(text)) pool_.push_back(id);
  }
  BASALT_CHECK(pool_.size() >= 16, "tokenizer {}: too few tokens decode to printable text to make prompts",
               tokenizer.label());
}

int64_t TextMaker::count(const std::string& text) const {
  return static_cast<int64_t>(tokenizer_->encode(text, false).size());
}

std::string TextMaker::make(std::mt19937_64& rng, int64_t tokens, int64_t* actual) const {
  BASALT_CHECK(tokens >= 1, "a prompt length must be >= 1 token, got {}", tokens);
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) ids.push_back(pool_[below(rng, pool_.size())]);
  std::string text = tokenizer_->decode(ids, false);
  for (int round = 0; round < 16; ++round) {
    std::vector<int32_t> enc = tokenizer_->encode(text, false);
    const int64_t n = static_cast<int64_t>(enc.size());
    if (n == tokens) break;
    if (n > tokens) {
      enc.resize(static_cast<size_t>(tokens));
    } else {
      for (int64_t i = n; i < tokens; ++i) enc.push_back(pool_[below(rng, pool_.size())]);
    }
    text = tokenizer_->decode(enc, false);
  }
  if (actual != nullptr) *actual = count(text);
  return text;
}

int64_t draw_length(std::mt19937_64& rng, int64_t length, double range_ratio) {
  if (range_ratio <= 0) return length;
  const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(length * (1 - range_ratio))));
  const int64_t hi = std::max<int64_t>(lo, static_cast<int64_t>(std::ceil(length * (1 + range_ratio))));
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

namespace {

// A question of about question_len tokens and an answer budget of about
// output_len, both drawn within range_ratio (question first, then budget:
// the order the seeded workloads depend on).
Turn random_turn(const TextMaker& maker, std::mt19937_64& rng, int64_t question_len, int64_t output_len,
                 double range_ratio) {
  Turn t;
  t.question = maker.make(rng, draw_length(rng, question_len, range_ratio), &t.question_tokens);
  t.max_tokens = draw_length(rng, output_len, range_ratio);
  return t;
}

}  // namespace

std::vector<Conversation> make_random(const TextMaker& maker, const RandomSpec& spec, uint64_t seed) {
  check_len(spec.num_prompts, "--num-prompts");
  check_len(spec.input_len, "--input-len");
  check_len(spec.output_len, "--output-len");
  check_ratio(spec.range_ratio);
  std::mt19937_64 rng(seed);
  std::vector<Conversation> out;
  for (int64_t i = 0; i < spec.num_prompts; ++i) {
    Turn t = random_turn(maker, rng, spec.input_len, spec.output_len, spec.range_ratio);
    Conversation c;
    c.turns.push_back(std::move(t));
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<Conversation> make_shared_prefix(const TextMaker& maker, const SharedPrefixSpec& spec, uint64_t seed) {
  check_len(spec.groups, "--sp-groups");
  check_len(spec.prompts_per_group, "--sp-prompts-per-group");
  check_len(spec.system_len, "--sp-system-len");
  check_len(spec.question_len, "--sp-question-len");
  check_len(spec.output_len, "--output-len");
  check_ratio(spec.range_ratio);
  std::mt19937_64 rng(seed);
  std::vector<Message> systems;
  std::vector<int64_t> system_tokens;
  for (int64_t g = 0; g < spec.groups; ++g) {
    int64_t n = 0;
    systems.push_back({"system", maker.make(rng, spec.system_len, &n)});
    system_tokens.push_back(n);
  }
  std::vector<Conversation> out;
  for (int64_t q = 0; q < spec.prompts_per_group; ++q) {
    for (int64_t g = 0; g < spec.groups; ++g) {
      Conversation c;
      c.leading.push_back(systems[static_cast<size_t>(g)]);
      c.leading_tokens = system_tokens[static_cast<size_t>(g)];
      Turn t = random_turn(maker, rng, spec.question_len, spec.output_len, spec.range_ratio);
      c.turns.push_back(std::move(t));
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::vector<Conversation> make_multi_turn(const TextMaker& maker, const MultiTurnSpec& spec, uint64_t seed) {
  check_len(spec.conversations, "--num-prompts");
  check_len(spec.turns, "--mt-turns");
  check_len(spec.question_len, "--input-len");
  check_len(spec.output_len, "--output-len");
  check_ratio(spec.range_ratio);
  std::mt19937_64 rng(seed);
  std::vector<Conversation> out;
  for (int64_t i = 0; i < spec.conversations; ++i) {
    Conversation c;
    for (int64_t k = 0; k < spec.turns; ++k) {
      Turn t = random_turn(maker, rng, spec.question_len, spec.output_len, spec.range_ratio);
      c.turns.push_back(std::move(t));
    }
    out.push_back(std::move(c));
  }
  return out;
}

namespace {

using nlohmann::json;

// One entry: its first human turn with the answer after it, if any.
bool read_entry(const json& entry, const std::string& where, ShareGptPair& pair) {
  BASALT_CHECK(entry.is_object(), "{}: not a JSON object", where);
  auto conv = entry.find("conversations");
  BASALT_CHECK(conv != entry.end(), "{}: no \"conversations\" field", where);
  BASALT_CHECK(conv->is_array(), "{}: \"conversations\" is not an array", where);
  std::vector<std::pair<std::string, std::string>> turns;  // role, text
  for (size_t i = 0; i < conv->size(); ++i) {
    const json& t = (*conv)[i];
    BASALT_CHECK(t.is_object(), "{}: conversations[{}] is not an object", where, i);
    auto from = t.find("from");
    auto value = t.find("value");
    BASALT_CHECK(from != t.end() && from->is_string(), "{}: conversations[{}].from is missing or not a string", where, i);
    BASALT_CHECK(value != t.end() && value->is_string(), "{}: conversations[{}].value is missing or not a string", where,
                 i);
    const std::string& f = from->get_ref<const std::string&>();
    std::string role;
    if (f == "human" || f == "user") role = "user";
    else if (f == "gpt" || f == "assistant" || f == "chatgpt" || f == "bing" || f == "bard") role = "assistant";
    else if (f == "system") role = "system";
    else fail("{}: conversations[{}].from is \"{}\" (expected human, gpt or system)", where, i, f);
    turns.emplace_back(role, value->get<std::string>());
  }
  for (size_t i = 0; i + 1 < turns.size(); ++i) {
    if (turns[i].first == "user" && turns[i + 1].first == "assistant") {
      pair.prompt = turns[i].second;
      pair.answer = turns[i + 1].second;
      return true;
    }
  }
  return false;
}

}  // namespace

std::vector<ShareGptPair> parse_sharegpt(const std::string& text, const std::string& label, int64_t* skipped) {
  std::vector<ShareGptPair> out;
  int64_t skip = 0;
  const size_t first = text.find_first_not_of(" \t\r\n");
  BASALT_CHECK(first != std::string::npos, "{}: the file is empty", label);
  if (text[first] == '[') {
    json all = json::parse(text, nullptr, false);
    BASALT_CHECK(!all.is_discarded(), "{}: not valid JSON (a ShareGPT file is a JSON array or JSONL)", label);
    BASALT_CHECK(all.is_array(), "{}: not a JSON array", label);
    for (size_t i = 0; i < all.size(); ++i) {
      ShareGptPair p;
      if (read_entry(all[i], fmt::format("{}: entry {}", label, i), p)) out.push_back(std::move(p));
      else ++skip;
    }
  } else {
    std::istringstream in(text);
    std::string line;
    int64_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = fmt::format("{}:{}", label, number);
      json entry = json::parse(line, nullptr, false);
      BASALT_CHECK(!entry.is_discarded(), "{}: not valid JSON (a ShareGPT file is a JSON array or JSONL)", where);
      ShareGptPair p;
      if (read_entry(entry, where, p)) out.push_back(std::move(p));
      else ++skip;
    }
  }
  if (skipped != nullptr) *skipped = skip;
  return out;
}

std::vector<Conversation> load_sharegpt(const std::string& path, const TextMaker& maker, const ShareGptSpec& spec,
                                        uint64_t seed) {
  check_len(spec.num_prompts, "--num-prompts");
  BASALT_CHECK(spec.output_len >= 0, "--output-len must be >= 0, got {}", spec.output_len);
  check_len(spec.max_input_tokens, "--max-input-len");
  std::ifstream in(path, std::ios::binary);
  BASALT_CHECK(in.good(), "--dataset-path {}: cannot read it", path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  int64_t skipped = 0;
  std::vector<ShareGptPair> pairs = parse_sharegpt(buffer.str(), path, &skipped);
  std::mt19937_64 rng(seed);
  std::shuffle(pairs.begin(), pairs.end(), rng);
  std::vector<Conversation> out;
  for (const ShareGptPair& p : pairs) {
    if (static_cast<int64_t>(out.size()) == spec.num_prompts) break;
    Turn t;
    t.question = p.prompt;
    t.question_tokens = maker.count(p.prompt);
    const int64_t answer_tokens = maker.count(p.answer);
    t.max_tokens = spec.output_len > 0 ? spec.output_len : answer_tokens;
    if (t.question_tokens < 4 || t.question_tokens > spec.max_input_tokens || (spec.output_len == 0 && answer_tokens < 4))
      continue;
    Conversation c;
    c.turns.push_back(std::move(t));
    out.push_back(std::move(c));
  }
  BASALT_CHECK(!out.empty(), "{}: no usable conversation (each needs a human turn of 4 to {} tokens followed by an answer)",
               path, spec.max_input_tokens);
  // Fewer usable entries than asked: repeat them in order.
  for (size_t i = 0; static_cast<int64_t>(out.size()) < spec.num_prompts; ++i) out.push_back(out[i]);
  return out;
}

}  // namespace basalt::loadgen
