// Workloads: the conversations a load test sends.
//
// Contract:
//  * Every workload is a list of Conversations. A conversation has optional
//    fixed leading messages (a shared system prompt) and one or more turns;
//    turn k's request holds the leading messages, every earlier turn's
//    question and the answer the server streamed for it, then question k.
//    Single-turn workloads have one turn per conversation.
//  * Lengths are token counts under the given tokenizer. Random text is made
//    of tokens that decode to printable ASCII, re-encoded and trimmed or
//    extended until encode() gives the asked count (a few rounds; the
//    result's true count is stored in question_tokens, which differs from
//    the target only in rare re-merging cases).
//  * Length spreads: with range_ratio r in [0, 1) a length L is drawn
//    uniformly from [L(1-r), L(1+r)] (at least 1). All randomness comes from
//    the given seed, so a seed reproduces the workload.
//  * load_sharegpt reads a ShareGPT file: a JSON array of entries, or JSONL
//    (one entry per line), each {"conversations": [{"from", "value"}, ...]}
//    with from in human/user, gpt/assistant/chatgpt/bing/bard, system.
//    Anything else (not JSON, a missing or mistyped field, an unknown
//    "from") throws basalt::Error naming the file, the entry (index or line)
//    and the field. Each entry's first human turn followed by an answer
//    becomes one request; the answer's token count is its output length
//    unless an output length is forced. Entries without such a pair, or with
//    a prompt or answer under 4 tokens or a prompt over max_input_tokens, are
//    skipped; no usable entry at all is an error.
//  * Every generator validates its parameters (counts >= 1, lengths >= 1)
//    and throws basalt::Error naming the flag.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace basalt::loadgen {

struct Message {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct Turn {
  std::string question;
  int64_t question_tokens = 0;
  int64_t max_tokens = 0;  // output length asked for
};

struct Conversation {
  std::vector<Message> leading;  // e.g. the shared system prompt
  int64_t leading_tokens = 0;
  std::vector<Turn> turns;
};

// Random text of (about) a given number of tokens.
class TextMaker {
 public:
  explicit TextMaker(const Tokenizer& tokenizer);
  // Text whose encoding has `tokens` ids (see the contract); *actual gets the true count.
  std::string make(std::mt19937_64& rng, int64_t tokens, int64_t* actual) const;
  int64_t count(const std::string& text) const;

 private:
  const Tokenizer* tokenizer_;
  std::vector<int32_t> pool_;  // ids that decode to printable ASCII
};

// Draws a length around `length` (see range_ratio in the contract).
int64_t draw_length(std::mt19937_64& rng, int64_t length, double range_ratio);

struct RandomSpec {
  int64_t num_prompts = 100;
  int64_t input_len = 256;
  int64_t output_len = 128;
  double range_ratio = 0;
};
std::vector<Conversation> make_random(const TextMaker& maker, const RandomSpec& spec, uint64_t seed);

struct SharedPrefixSpec {
  int64_t groups = 4;
  int64_t prompts_per_group = 8;
  int64_t system_len = 512;
  int64_t question_len = 64;
  int64_t output_len = 128;
  double range_ratio = 0;  // applies to question and output lengths
};
// Groups are interleaved (g0q0, g1q0, ..., g0q1, ...) so each group's
// prompts are spread over the run, as real traffic would be.
std::vector<Conversation> make_shared_prefix(const TextMaker& maker, const SharedPrefixSpec& spec, uint64_t seed);

struct MultiTurnSpec {
  int64_t conversations = 16;
  int64_t turns = 4;
  int64_t question_len = 64;
  int64_t output_len = 64;
  double range_ratio = 0;
};
std::vector<Conversation> make_multi_turn(const TextMaker& maker, const MultiTurnSpec& spec, uint64_t seed);

struct ShareGptSpec {
  int64_t num_prompts = 100;
  int64_t output_len = 0;  // > 0: force this output length
  int64_t max_input_tokens = 1024;
};
struct ShareGptPair {
  std::string prompt;
  std::string answer;
};
// Parses the file's text (label names it in errors): the first human->answer pair of each entry.
std::vector<ShareGptPair> parse_sharegpt(const std::string& text, const std::string& label, int64_t* skipped);
std::vector<Conversation> load_sharegpt(const std::string& path, const TextMaker& maker, const ShareGptSpec& spec,
                                        uint64_t seed);

}  // namespace basalt::loadgen
