// The API server in process, over a real socket, on the bundled model:
// completions and chat produce exactly what the engine produces for the same
// ids (chat through the model's own template), n > 1 samples equal single
// requests with the derived seeds and share the prompt's KV, streamed text
// equals whole text, and a client that vanishes mid-stream leaves the pool
// whole.
#include "server/api_server.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "grammar/ebnf.h"
#include "grammar/matcher.h"
#include "grammar/structured_output.h"
#include "model/model.h"
#include "server/http_server.h"
#include "testing/http_test_client.h"
#include "template/jinja.h"

namespace basalt {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using testing::Client;

const std::string kModel = std::string(BASALT_TESTDATA) + "/../models/basalt-mini";

struct Served {
  explicit Served(ApiServerOptions api = {}, EngineOptions engine_options = {}) {
    model = load_model(kModel, backend);
    bundle = std::make_unique<TokenizerBundle>(load_tokenizer_dir(kModel));
    engine_options.kv_slots = 8192;
    engine = std::make_unique<Engine>(*model, backend, &bundle->tokenizer, engine_options);
    api.served_model_name = "basalt-mini";
    api.log_requests = false;
    server = std::make_unique<ApiServer>(*engine, bundle->tokenizer, bundle->config, api);
    server->set_ready(true);
    HttpServerOptions o;
    o.port = 0;
    http = std::make_unique<HttpServer>(o, [this](HttpRequest& r) { return server->handle(r); });
    http->start();
  }
  ~Served() { http->stop(); }

  json call(const std::string& path, const json& body, int* status = nullptr) {
    Client c(http->port());
    c.send(testing::post_request(path, body.dump()));
    const std::string response = c.response(60000ms);
    if (status) *status = std::stoi(response.substr(9, 3));
    return json::parse(testing::body_of(response));
  }

  // What the engine itself gives for these ids.
  RequestOutput direct(const std::vector<int32_t>& ids, SamplingParams p) {
    EngineRequest r;
    r.prompt = ids;
    r.params = p;
    return collect(*engine->submit(r));
  }

  CpuBackend backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<TokenizerBundle> bundle;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<ApiServer> server;
  std::unique_ptr<HttpServer> http;
};

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

TEST(ApiServer, CompletionsAndChatMatchTheEngine) {
  Served s;
  const json r = s.call("/v1/completions", {{"prompt", "The Debian project"}, {"max_tokens", 12}, {"temperature", 0}});
  const std::vector<int32_t> ids = s.bundle->tokenizer.encode("The Debian project", true);
  const RequestOutput want = s.direct(ids, greedy(12));
  EXPECT_EQ(r["choices"][0]["text"].get<std::string>(), want.text);
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<size_t>(), ids.size());
  EXPECT_EQ(r["usage"]["completion_tokens"].get<size_t>(), want.output_ids.size());

  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "What is apt?"}}});
  const json chat = s.call("/v1/chat/completions", {{"messages", messages}, {"max_tokens", 10}, {"temperature", 0}});
  const std::string rendered =
      render_chat_template(s.bundle->config.chat_template, messages, true,
                           {{"bos_token", *s.bundle->config.bos_token}, {"eos_token", *s.bundle->config.eos_token}});
  EXPECT_EQ(rendered.rfind(*s.bundle->config.bos_token, 0), 0u) << rendered;
  const std::vector<int32_t> chat_ids = s.bundle->tokenizer.encode(rendered, false);
  EXPECT_EQ(chat["usage"]["prompt_tokens"].get<size_t>(), chat_ids.size());
  EXPECT_EQ(chat["choices"][0]["message"]["content"].get<std::string>(), s.direct(chat_ids, greedy(10)).text);
  const json tokenized = s.call("/tokenize", {{"messages", messages}});
  EXPECT_EQ(tokenized["tokens"].get<std::vector<int32_t>>(), chat_ids);

  // A request's own template sees tools with their keys in the order sent.
  const std::string body = R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}],
      "chat_template": "{{ tools | tojson }}"})";
  Client c(s.http->port());
  c.send(testing::post_request("/tokenize", body));
  const json tool_ids = json::parse(testing::body_of(c.response()));
  EXPECT_EQ(s.bundle->tokenizer.decode(tool_ids["tokens"].get<std::vector<int32_t>>(), false),
            R"([{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}])");
}

// bad_words through the server: a word of the plain greedy output, banned,
// is tokenized alone and after a space (vLLM's rule), so the output is the
// engine's with those sequences banned, never holds them, and differs.
TEST(ApiServer, BadWordsAreTokenizedAsVllmDoesAndNeverCompleted) {
  Served s;
  const Tokenizer& tok = s.bundle->tokenizer;
  const std::vector<int32_t> ids = tok.encode("The Debian project", true);
  const RequestOutput plain = s.direct(ids, greedy(12));
  std::string word;
  for (int32_t id : plain.output_ids) {
    const std::string text = tok.decode(std::vector<int32_t>{id}, false);
    const size_t at = text.find_first_not_of(' ');
    if (at != std::string::npos && text.find_first_of(" \n\t", at) == std::string::npos) {
      word = text.substr(at);
      break;
    }
  }
  ASSERT_FALSE(word.empty()) << plain.text;
  const json r = s.call("/v1/completions",
                        {{"prompt", "The Debian project"}, {"max_tokens", 12}, {"temperature", 0}, {"bad_words", {word}}});
  std::vector<std::vector<int32_t>> banned = {tok.encode(word, false)};
  const std::vector<int32_t> spaced = tok.encode(" " + word, false);
  if (spaced.front() != banned[0].front() && spaced.size() == banned[0].size()) banned.push_back(spaced);
  SamplingParams p = greedy(12);
  p.bad_words_ids = banned;
  const RequestOutput want = s.direct(ids, p);
  EXPECT_EQ(r["choices"][0]["text"].get<std::string>(), want.text) << "banned '" << word << "'";
  EXPECT_NE(want.text, plain.text) << "banned '" << word << "'";
  for (const std::vector<int32_t>& seq : banned)
    EXPECT_EQ(std::search(want.output_ids.begin(), want.output_ids.end(), seq.begin(), seq.end()),
              want.output_ids.end())
        << "'" << word << "' completed";
}

TEST(ApiServer, SamplesEqualSingleRequestsAndShareThePrompt) {
  Served s;
  const std::string prompt = std::string("Shared context about packages and licenses. ") + std::string(200, '.');
  const json r = s.call("/v1/completions",
                        {{"prompt", prompt}, {"max_tokens", 6}, {"n", 3}, {"seed", 99}, {"temperature", 1.0}});
  ASSERT_EQ(r["choices"].size(), 3u);
  const std::vector<int32_t> ids = s.bundle->tokenizer.encode(prompt, true);
  // The prompt was computed once: the other samples found it in the cache
  // (they compute only its last token, give or take a chunk).
  const EngineMetrics m = s.engine->metrics();
  EXPECT_LE(m.prefill_tokens, ids.size() + 2 * 64);
  EXPECT_GE(m.cached_prompt_tokens, 2 * (ids.size() - 1) - 64);
  for (int i = 0; i < 3; ++i) {
    SamplingParams p;
    p.max_tokens = 6;
    p.seed = sample_seed(99, i);
    EXPECT_EQ(r["choices"][i]["text"].get<std::string>(), s.direct(ids, p).text) << i;
  }
  // Usage counts the prompt once, and its cached tokens once: what the sample
  // that computed it found (nothing, on a fresh server), never more than
  // prompt_tokens.
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<size_t>(), ids.size());
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
}

// OpenAI's predicted outputs: the prediction's tokens are verified drafts,
// so the text is what it is without one (greedy and seeded), a prediction
// of the very text is accepted almost whole, and usage says so; a chat
// takes content parts; bad shapes are 400s that name the field.
TEST(ApiServer, PredictedOutputsLeaveTheTextAsItIs) {
  Served s;
  for (const double temperature : {0.0, 1.0}) {
    const json plain_body = {{"prompt", "To install a package, run"}, {"max_tokens", 40}, {"temperature", temperature},
                             {"seed", 7}, {"ignore_eos", true}};
    const json plain = s.call("/v1/completions", plain_body);
    const std::string text = plain["choices"][0]["text"].get<std::string>();
    EXPECT_FALSE(plain["usage"].contains("completion_tokens_details"));
    const uint64_t steps_before = s.engine->metrics().steps;
    json body = plain_body;
    body["prediction"] = {{"type", "content"}, {"content", text}};
    const json predicted = s.call("/v1/completions", body);
    const uint64_t steps = s.engine->metrics().steps - steps_before;
    EXPECT_EQ(predicted["choices"][0]["text"].get<std::string>(), text) << temperature;
    const json& details = predicted["usage"]["completion_tokens_details"];
    EXPECT_GE(details["accepted_prediction_tokens"].get<int64_t>(), 30) << details;
    // The text is tokenized afresh, and where the tokenizer spells a piece
    // otherwise than the model wrote it a draft is rejected and the place
    // found again.
    EXPECT_LT(details["rejected_prediction_tokens"].get<int64_t>(), 10) << details;
    EXPECT_LT(steps, 10u) << "40 tokens from a prediction of them";
    // A prediction that is wrong from the middle on: the same text.
    body["prediction"] = {{"type", "content"}, {"content", text.substr(0, text.size() / 2) + " something else entirely."}};
    const json edited = s.call("/v1/completions", body);
    EXPECT_EQ(edited["choices"][0]["text"].get<std::string>(), text) << temperature;
    EXPECT_GT(edited["usage"]["completion_tokens_details"]["rejected_prediction_tokens"].get<int64_t>(), 0);
  }
  // Chat, with the prediction as text parts.
  const json chat_body = {{"messages", {{{"role", "user"}, {"content", "Name three colors."}}}},
                          {"max_tokens", 24}, {"temperature", 0}};
  const json chat = s.call("/v1/chat/completions", chat_body);
  const std::string answer = chat["choices"][0]["message"]["content"].get<std::string>();
  json predicted_chat = chat_body;
  predicted_chat["prediction"] = {
      {"type", "content"},
      {"content", {{{"type", "text"}, {"text", answer.substr(0, 5)}}, {{"type", "text"}, {"text", answer.substr(5)}}}}};
  const json chat_again = s.call("/v1/chat/completions", predicted_chat);
  EXPECT_EQ(chat_again["choices"][0]["message"]["content"].get<std::string>(), answer);
  EXPECT_GT(chat_again["usage"]["completion_tokens_details"]["accepted_prediction_tokens"].get<int64_t>(), 0);

  const std::vector<json> bad = {
      {{"prompt", "x"}, {"prediction", "text"}},
      {{"prompt", "x"}, {"prediction", {{"type", "text"}, {"content", "x"}}}},
      {{"prompt", "x"}, {"prediction", {{"type", "content"}}}},
      {{"prompt", "x"}, {"prediction", {{"type", "content"}, {"content", 3}}}},
      {{"prompt", "x"}, {"prediction", {{"type", "content"}, {"content", {{{"type", "image_url"}, {"text", "x"}}}}}}},
      {{"prompt", "x"}, {"prediction", {{"type", "content"}, {"content", "x"}, {"extra", 1}}}},
      {{"prompt", "x"}, {"prediction", {{"type", "content"}, {"content", std::string(300000, 'a')}}}},
  };
  for (const json& b : bad) {
    int status = 0;
    const json r = s.call("/v1/completions", b, &status);
    EXPECT_EQ(status, 400) << b.dump().substr(0, 200);
    EXPECT_EQ(r["error"]["param"], "prediction") << r;
  }
  EXPECT_EQ(s.server->in_flight(), 0);
  EXPECT_EQ(s.engine->drain_and_clear_cache(), s.engine->kv_capacity());
}

TEST(ApiServer, StreamedTextEqualsWholeText) {
  Served s;
  const json body = {{"prompt", "To install a package, run"}, {"max_tokens", 16}, {"temperature", 0},
                     {"stop", " command"}};
  const json whole = s.call("/v1/completions", body);
  json streamed_body = body;
  streamed_body["stream"] = true;
  Client c(s.http->port());
  c.send(testing::post_request("/v1/completions", streamed_body.dump()));
  const std::string raw =
      c.read_until([](const std::string& b) { return b.find("data: [DONE]") != std::string::npos; }, 5000ms);
  std::string text;
  std::string finish;
  size_t at = 0;
  while ((at = raw.find("data: {", at)) != std::string::npos) {
    const size_t end = raw.find('\n', at);
    const json chunk = json::parse(raw.substr(at + 6, end - at - 6));
    for (const json& c : chunk["choices"]) {
      text += c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
    at = end;
  }
  EXPECT_NE(raw.find("data: [DONE]"), std::string::npos) << raw.substr(raw.size() > 600 ? raw.size() - 600 : 0);
  EXPECT_EQ(text, whole["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(finish, whole["choices"][0]["finish_reason"].get<std::string>());
}

// A structural tag through the server, on a trigger the model writes: the
// plain greedy output holds " W" for a word W of it; with the trigger " W"
// and a structure " W=" integer ";", the output is a prefix of the tag's
// language (every " W" goes on with "="), and it is not the plain output.
TEST(ApiServer, StructuralTagsHoldOnTheModelsOwnWords) {
  Served s;
  const std::string prompt = "To install a package, run";
  const json plain = s.call("/v1/completions", {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}});
  const std::string plain_text = plain["choices"][0]["text"].get<std::string>();
  std::string word;
  for (size_t at = plain_text.find(' '); at != std::string::npos && word.empty(); at = plain_text.find(' ', at + 1)) {
    size_t end = at + 1;
    while (end < plain_text.size() && std::isalpha(static_cast<unsigned char>(plain_text[end]))) ++end;
    if (end - at >= 4) word = plain_text.substr(at, end - at);
  }
  ASSERT_FALSE(word.empty()) << plain_text;
  const json tag = {{"type", "structural_tag"},
                    {"structures", json::array({{{"begin", word + "="}, {"schema", {{"type", "integer"}}}, {"end", ";"}}})},
                    {"triggers", json::array({word})}};
  const json r = s.call("/v1/completions", {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0},
                                            {"response_format", tag}});
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  const std::string text = r["choices"][0]["text"].get<std::string>();
  EXPECT_NE(text, plain_text) << "trigger '" << word << "'";
  EXPECT_NE(text.find(word + "="), std::string::npos) << "'" << text << "': the structure never began";
  StructuredOutputSpec spec;
  spec.kind = StructuredOutputSpec::Kind::kStructuralTag;
  json inner = tag;
  inner.erase("type");
  spec.text = inner.dump();
  GrammarMatcher matcher(compile_grammar(parse_ebnf(to_ebnf(spec))));
  EXPECT_TRUE(matcher.accept_bytes(text)) << "'" << text << "' with trigger '" << word << "'";
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1))
    if (at + word.size() < text.size()) {
      EXPECT_EQ(text[at + word.size()], '=') << text;
    }
}

// The data chunks of a streamed response.
std::vector<json> stream_chunks(Served& s, const std::string& path, json body) {
  body["stream"] = true;
  Client c(s.http->port());
  c.send(testing::post_request(path, body.dump()));
  const std::string raw =
      c.read_until([](const std::string& b) { return b.find("data: [DONE]") != std::string::npos; }, 5000ms);
  std::vector<json> chunks;
  size_t at = 0;
  while ((at = raw.find("data: {", at)) != std::string::npos) {
    const size_t end = raw.find('\n', at);
    chunks.push_back(json::parse(raw.substr(at + 6, end - at - 6)));
    at = end;
  }
  return chunks;
}

// return_token_ids and return_tokens_as_token_ids (vLLM's): the prompt's
// ids and each choice's output ids beside the text, whole and streamed (the
// prompt's once, in the first chunk; the chunks' ids adding up to the
// whole), and logprobs naming tokens "token_id:N" with the text's offsets.
TEST(ApiServer, TokenIdsComeBesideTheText) {
  Served s;
  const Tokenizer& tok = s.bundle->tokenizer;
  const std::vector<int32_t> prompt = tok.encode("The Debian project", true);
  const RequestOutput want = s.direct(prompt, greedy(10));
  const json body = {{"prompt", "The Debian project"}, {"max_tokens", 10}, {"temperature", 0}, {"logprobs", 1},
                     {"return_token_ids", true}, {"return_tokens_as_token_ids", true}};
  const json whole = s.call("/v1/completions", body);
  const json& choice = whole["choices"][0];
  EXPECT_EQ(choice["prompt_token_ids"].get<std::vector<int32_t>>(), prompt);
  ASSERT_EQ(choice["token_ids"].get<std::vector<int32_t>>(), want.output_ids);
  const json& lp = choice["logprobs"];
  size_t offset = 0;
  for (size_t i = 0; i < want.output_ids.size(); ++i) {
    EXPECT_EQ(lp["tokens"][i].get<std::string>(), fmt::format("token_id:{}", want.output_ids[i]));
    EXPECT_TRUE(lp["top_logprobs"][i].contains(fmt::format("token_id:{}", want.output_ids[i]))) << lp.dump();
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), offset);
    offset += tok.decode(std::vector<int32_t>{want.output_ids[i]}, false).size();
  }
  // Without the fields, neither key.
  const json plain = s.call("/v1/completions", {{"prompt", "The Debian project"}, {"max_tokens", 3}});
  EXPECT_FALSE(plain["choices"][0].contains("token_ids"));
  EXPECT_FALSE(plain["choices"][0].contains("prompt_token_ids"));

  std::vector<int32_t> streamed;
  int prompt_chunks = 0;
  for (const json& chunk : stream_chunks(s, "/v1/completions", body)) {
    for (const json& c : chunk["choices"]) {
      if (c.contains("prompt_token_ids")) {
        ++prompt_chunks;
        EXPECT_EQ(c["prompt_token_ids"].get<std::vector<int32_t>>(), prompt);
      }
      for (const json& id : c["token_ids"]) streamed.push_back(id.get<int32_t>());
    }
  }
  EXPECT_EQ(prompt_chunks, 1);
  EXPECT_EQ(streamed, want.output_ids);

  const json messages = json::array({{{"role", "user"}, {"content", "What is apt?"}}});
  const std::string rendered =
      render_chat_template(s.bundle->config.chat_template, messages, true,
                           {{"bos_token", *s.bundle->config.bos_token}, {"eos_token", *s.bundle->config.eos_token}});
  const std::vector<int32_t> chat_prompt = tok.encode(rendered, false);
  const RequestOutput chat_want = s.direct(chat_prompt, greedy(8));
  const json chat_body = {{"messages", messages}, {"max_tokens", 8}, {"temperature", 0}, {"return_token_ids", true}};
  const json chat = s.call("/v1/chat/completions", chat_body);
  EXPECT_EQ(chat["prompt_token_ids"].get<std::vector<int32_t>>(), chat_prompt);
  EXPECT_EQ(chat["choices"][0]["token_ids"].get<std::vector<int32_t>>(), chat_want.output_ids);
  std::vector<int32_t> chat_streamed;
  const std::vector<json> chunks = stream_chunks(s, "/v1/chat/completions", chat_body);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks.front()["prompt_token_ids"].get<std::vector<int32_t>>(), chat_prompt);
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (i > 0) {
      EXPECT_FALSE(chunks[i].contains("prompt_token_ids")) << i;
    }
    for (const json& c : chunks[i]["choices"])
      for (const json& id : c["token_ids"]) chat_streamed.push_back(id.get<int32_t>());
  }
  EXPECT_EQ(chat_streamed, chat_want.output_ids);
}

// Prompt logprobs through the server, against the engine's own scores:
// completions with echo and logprobs (what lm-evaluation-harness reads for
// loglikelihoods: the prompt's tokens first, the first one's logprob null,
// then the output's), whole and streamed (the echo chunk carries the
// prompt's); vLLM's prompt_logprobs field (completions per choice, chat
// beside the choices); and the refusals (a stream asking for alternatives,
// max_tokens 0, more than max_logprobs).
TEST(ApiServer, PromptLogprobsComeAsVllmAndLegacyEchoGiveThem) {
  Served s;
  const Tokenizer& tok = s.bundle->tokenizer;
  const std::string text = "The Debian project makes a free operating system";
  const std::vector<int32_t> prompt = tok.encode(text, true);
  SamplingParams p = greedy(2);
  p.logprobs = 2;
  p.prompt_logprobs = 2;
  const RequestOutput want = s.direct(prompt, p);
  ASSERT_EQ(want.prompt_logprobs.size(), prompt.size() - 1);
  const auto piece = [&](int32_t id) { return tok.decode(std::vector<int32_t>{id}, false); };

  const json body = {
      {"prompt", text}, {"max_tokens", 2}, {"temperature", 0}, {"logprobs", 2}, {"echo", true}};
  const json whole = s.call("/v1/completions", body);
  const json& choice = whole["choices"][0];
  EXPECT_EQ(choice["text"].get<std::string>(), text + want.text);
  EXPECT_FALSE(choice.contains("prompt_logprobs"));
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), prompt.size() + want.output_ids.size()) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  size_t offset = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    EXPECT_EQ(lp["tokens"][i].get<std::string>(), piece(prompt[i]));
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), offset);
    offset += piece(prompt[i]).size();
    if (i == 0) continue;
    const PromptLogprob& score = want.prompt_logprobs[i - 1];
    EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), score.logprob) << i;
    ASSERT_GE(lp["top_logprobs"][i].size(), 1u);  // two, unless both decode to one text
    for (const TokenLogprob& t : score.top)
      EXPECT_FLOAT_EQ(lp["top_logprobs"][i][piece(t.id)].get<float>(), t.logprob) << i;
  }
  EXPECT_EQ(lp["text_offset"][prompt.size()].get<size_t>(), text.size());
  EXPECT_EQ(lp["tokens"][prompt.size()].get<std::string>(), piece(want.output_ids[0]));

  // Streamed, the echo chunk carries the prompt's logprobs.
  json stream_body = body;
  stream_body["stream"] = true;
  const std::vector<json> chunks = stream_chunks(s, "/v1/completions", stream_body);
  ASSERT_FALSE(chunks.empty());
  const json& echo = chunks.front()["choices"][0];
  EXPECT_EQ(echo["text"].get<std::string>(), text);
  EXPECT_EQ(echo["logprobs"]["token_logprobs"],
            json(std::vector<json>(
                lp["token_logprobs"].begin(),
                lp["token_logprobs"].begin() + static_cast<std::ptrdiff_t>(prompt.size()))));

  // vLLM's field: null, then per token its own entry and the alternatives.
  const json field =
      s.call("/v1/completions", {{"prompt", text}, {"max_tokens", 2}, {"prompt_logprobs", 1}});
  const json& pl = field["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(pl.size(), prompt.size()) << pl.dump();
  EXPECT_TRUE(pl[0].is_null());
  for (size_t i = 1; i < prompt.size(); ++i) {
    const PromptLogprob& score = want.prompt_logprobs[i - 1];
    const json& own = pl[i][std::to_string(prompt[i])];
    EXPECT_FLOAT_EQ(own["logprob"].get<float>(), score.logprob) << i;
    EXPECT_EQ(own["rank"].get<int>(), score.rank) << i;
    EXPECT_EQ(own["decoded_token"].get<std::string>(), piece(prompt[i]));
    const json& best = pl[i][std::to_string(score.top[0].id)];
    EXPECT_EQ(best["rank"].get<int>(), 1);
    EXPECT_FLOAT_EQ(best["logprob"].get<float>(), score.top[0].logprob);
    EXPECT_LE(pl[i].size(), 2u);
  }
  EXPECT_FALSE(field["choices"][0]["logprobs"].is_object());

  const json messages = json::array({{{"role", "user"}, {"content", "What is apt?"}}});
  const json chat = s.call("/v1/chat/completions",
                           {{"messages", messages}, {"max_tokens", 2}, {"prompt_logprobs", 0}});
  const std::string rendered = render_chat_template(
      s.bundle->config.chat_template, messages, true,
      {{"bos_token", *s.bundle->config.bos_token}, {"eos_token", *s.bundle->config.eos_token}});
  ASSERT_EQ(chat["prompt_logprobs"].size(), tok.encode(rendered, false).size()) << chat.dump();
  EXPECT_EQ(chat["prompt_logprobs"][1].size(), 1u);

  int status = 0;
  const json streamed = s.call(
      "/v1/completions", {{"prompt", text}, {"stream", true}, {"prompt_logprobs", 1}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(streamed["error"]["param"], "prompt_logprobs") << streamed.dump();
  s.call("/v1/completions", {{"prompt", text}, {"max_tokens", 0}, {"prompt_logprobs", 1}}, &status);
  EXPECT_EQ(status, 400);
  s.call("/v1/completions", {{"prompt", text}, {"prompt_logprobs", 21}}, &status);
  EXPECT_EQ(status, 400);
}

// The reasoning fields with --reasoning-parser deepseek_r1 on the bundled
// model, whose output never closes a think block (so it is all reasoning):
// include_reasoning false leaves it out, separate_reasoning false gives it
// as the content, stream_reasoning false streams it as one delta.
TEST(ApiServer, ReasoningFieldsLeaveOutKeepInlineOrHoldTheReasoning) {
  ApiServerOptions api;
  api.reasoning_parser = "deepseek_r1";
  Served s(api);
  const json body = {{"messages", json::array({{{"role", "user"}, {"content", "Think: what is apt?"}}})},
                     {"max_tokens", 12},
                     {"temperature", 0}};
  const json plain = s.call("/v1/chat/completions", body)["choices"][0]["message"];
  const std::string reasoning = plain["reasoning_content"].get<std::string>();
  ASSERT_FALSE(reasoning.empty()) << plain;
  EXPECT_EQ(plain["content"], "");

  json without = body;
  without["include_reasoning"] = false;
  const json left_out = s.call("/v1/chat/completions", without)["choices"][0]["message"];
  EXPECT_FALSE(left_out.contains("reasoning_content")) << left_out;
  EXPECT_EQ(left_out["content"], "");

  json inline_body = body;
  inline_body["separate_reasoning"] = false;
  const json inline_message = s.call("/v1/chat/completions", inline_body)["choices"][0]["message"];
  EXPECT_EQ(inline_message["content"], reasoning);
  EXPECT_FALSE(inline_message.contains("reasoning_content"));

  json held = body;
  held["stream"] = true;
  held["stream_reasoning"] = false;
  int deltas = 0;
  for (const json& chunk : stream_chunks(s, "/v1/chat/completions", held))
    for (const json& c : chunk["choices"])
      if (c["delta"].contains("reasoning_content")) {
        ++deltas;
        EXPECT_EQ(c["delta"]["reasoning_content"], reasoning);
      }
  EXPECT_EQ(deltas, 1);
  held["stream_reasoning"] = true;
  deltas = 0;
  for (const json& chunk : stream_chunks(s, "/v1/chat/completions", held))
    for (const json& c : chunk["choices"]) deltas += c["delta"].contains("reasoning_content") ? 1 : 0;
  EXPECT_GT(deltas, 1);
}

TEST(ApiServer, AClientVanishingMidStreamLeavesThePoolWhole) {
  Served s;
  for (int i = 0; i < 4; ++i) {
    Client c(s.http->port());
    c.send(testing::post_request(
        "/v1/completions",
        json{{"prompt", "Forever " + std::to_string(i)}, {"max_tokens", 1500}, {"ignore_eos", true}, {"stream", true}}
            .dump()));
    (void)c.read_until([](const std::string& b) { return b.find("data: {") != std::string::npos; }, 60000ms);
  }  // each client closes here
  for (int i = 0; i < 500 && s.server->in_flight() > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(s.server->in_flight(), 0);
  EXPECT_EQ(s.engine->drain_and_clear_cache(), s.engine->kv_capacity());
  EXPECT_EQ(s.engine->metrics().requests_cancelled, 4u);
}

TEST(ApiServer, QueueLimitAnswers429AndDrainingAnswers503) {
  ApiServerOptions api;
  api.max_running = 1;
  api.max_queue = 0;
  Served s(api);
  Client holder(s.http->port());
  holder.send(testing::post_request(
      "/v1/completions", json{{"prompt", "Hold"}, {"max_tokens", 1500}, {"ignore_eos", true}, {"stream", true}}.dump()));
  (void)holder.read_until([](const std::string& b) { return b.find("data: {") != std::string::npos; }, 60000ms);
  int status = 0;
  const json busy = s.call("/v1/completions", {{"prompt", "x"}}, &status);
  EXPECT_EQ(status, 429);
  EXPECT_EQ(busy["error"]["type"].get<std::string>(), "rate_limit_error");
  s.server->start_draining();
  s.call("/v1/completions", {{"prompt", "x"}}, &status);
  EXPECT_EQ(status, 503);
  holder.close();
}

// X-Basalt-Resume-Info: 1 puts a comment before each event of a choice:
// the ids since the last one (together, the choice's whole output), the
// choice's text bytes so far, and whether it ends there.
TEST(ApiServer, ResumeInfoCommentsNameEveryTokenAndTheTextSoFar) {
  Served s;
  const std::string prompt = "Debian packages are";
  const json body = {{"prompt", prompt}, {"max_tokens", 20}, {"n", 2},      {"seed", 7},
                     {"stream", true},   {"stop", " the"},   {"temperature", 1.0}};
  Client c(s.http->port());
  c.send(testing::post_request("/v1/completions", body.dump(), "X-Basalt-Resume-Info: 1\r\n"));
  const std::string raw =
      c.read_until([](const std::string& b) { return b.find("data: [DONE]") != std::string::npos; }, 60000ms);
  std::vector<std::vector<int32_t>> told(2);
  std::vector<std::string> texts(2);
  std::vector<int> ends(2, 0);
  size_t comments = 0;
  for (size_t at = 0; (at = raw.find("\n: basalt ", at)) != std::string::npos;) {
    const size_t eol = raw.find('\n', at + 1);
    const json info = json::parse(raw.substr(at + 10, eol - at - 10));
    ++comments;
    // The event right after it, of the same choice.
    ASSERT_EQ(raw.compare(eol + 1, 6, "data: "), 0) << raw.substr(at, 200);
    const size_t event_end = raw.find('\n', eol + 1);
    const json chunk = json::parse(raw.substr(eol + 7, event_end - eol - 7));
    ASSERT_EQ(chunk["choices"].size(), 1u);
    const int i = info["i"].get<int>();
    ASSERT_EQ(chunk["choices"][0]["index"].get<int>(), i);
    for (const json& id : info["t"]) told[static_cast<size_t>(i)].push_back(id.get<int32_t>());
    texts[static_cast<size_t>(i)] += chunk["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(info["o"].get<size_t>(), texts[static_cast<size_t>(i)].size());
    EXPECT_EQ(info["f"].get<int>(), chunk["choices"][0]["finish_reason"].is_null() ? 0 : 1);
    ends[static_cast<size_t>(i)] += info["f"].get<int>();
    at = event_end;
  }
  EXPECT_GT(comments, 4u);
  const std::vector<int32_t> ids = s.bundle->tokenizer.encode(prompt, true);
  for (int i = 0; i < 2; ++i) {
    SamplingParams p;
    p.max_tokens = 20;
    p.seed = sample_seed(7, i);
    p.stop = {" the"};
    const RequestOutput want = s.direct(ids, p);
    EXPECT_EQ(told[static_cast<size_t>(i)], want.output_ids) << i;
    EXPECT_EQ(texts[static_cast<size_t>(i)], want.text) << i;
    EXPECT_EQ(ends[static_cast<size_t>(i)], 1) << i;
  }
  // Without the header, no comments.
  Client plain(s.http->port());
  plain.send(testing::post_request("/v1/completions", body.dump()));
  const std::string quiet =
      plain.read_until([](const std::string& b) { return b.find("data: [DONE]") != std::string::npos; }, 60000ms);
  EXPECT_EQ(quiet.find("\n: basalt "), std::string::npos);
}

// A stream's events as a gateway reads them: each data event with the
// X-Basalt-Resume-Info comment before it (null when there was none), and
// the usage chunk's usage (null without one).
struct StreamEvents {
  std::vector<json> infos, chunks;
  json usage;
};
StreamEvents stream_events(const std::string& raw) {
  StreamEvents out;
  json info;
  size_t at = 0;
  while (at < raw.size()) {
    size_t eol = raw.find('\n', at);
    if (eol == std::string::npos) eol = raw.size();
    std::string line = raw.substr(at, eol - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    at = eol + 1;
    if (line.rfind(": basalt ", 0) == 0) info = json::parse(line.substr(9));
    if (line.rfind("data: {", 0) != 0) continue;
    const json chunk = json::parse(line.substr(6));
    if (chunk.contains("choices") && chunk["choices"].empty()) {
      out.usage = chunk["usage"];
      continue;
    }
    out.infos.push_back(std::exchange(info, json()));
    out.chunks.push_back(chunk);
  }
  return out;
}

std::string stream_of(Served& s, const std::string& path, const json& body) {
  Client c(s.http->port());
  c.send(testing::post_request(path, body.dump(), "X-Basalt-Resume-Info: 1\r\nX-Request-Id: same-one\r\n"));
  return c.read_until([](const std::string& b) { return b.find("data: [DONE]") != std::string::npos; }, 60000ms);
}

// What one choice received: its ids (from the comments), its text, how it
// finished, and its role deltas.
struct Received {
  std::vector<int32_t> ids;
  std::string text, reasoning;
  int64_t offset = 0;
  bool finished = false;
  std::string finish_reason;
  int roles = 0;
};

void receive(const json& info, const json& chunk, bool chat, std::map<int, Received>& got) {
  for (const json& c : chunk["choices"]) {
    Received& r = got[c["index"].get<int>()];
    if (!info.is_null()) {
      for (const json& id : info["t"]) r.ids.push_back(id.get<int32_t>());
      r.offset = info["o"].get<int64_t>();
      r.finished = r.finished || info["f"].get<int>() == 1;
    }
    // A finish chunk's delta may be empty: look, don't index.
    const json& holder = chat ? c.value("delta", json::object()) : c;
    if (chat && holder.contains("role")) ++r.roles;
    const json text = holder.value(chat ? "content" : "text", json());
    if (text.is_string()) r.text += text.get<std::string>();
    const json reasoning = chat ? holder.value("reasoning_content", json()) : json();
    if (reasoning.is_string()) r.reasoning += reasoning.get<std::string>();
    if (!c["finish_reason"].is_null()) r.finish_reason = c["finish_reason"].get<std::string>();
  }
}

// basalt_resume after every event of a stream, built as a gateway builds
// it: the events before the cut and those of the resumed stream are, choice
// by choice, the whole stream's ids, text and finish; each choice has one
// role delta (or echo) in all, whether the cut came before its first chunk
// or after it; the resumed stream keeps the id and created time, and its
// usage is the whole stream's, cached tokens included once the comments
// before the cut said them (before that, the resumed run's own).
void check_resumes(Served& s, bool is_chat, const json& body) {
  {
    const std::string path = is_chat ? "/v1/chat/completions" : "/v1/completions";
    const StreamEvents whole = stream_events(stream_of(s, path, body));
    ASSERT_GT(whole.chunks.size(), 3u);
    size_t with_prior = 0;  // cuts after the comments said the cached tokens
    std::map<int, Received> want;
    for (size_t e = 0; e < whole.chunks.size(); ++e) receive(whole.infos[e], whole.chunks[e], is_chat, want);
    for (const auto& [i, r] : want) {
      EXPECT_TRUE(r.finished) << i;
      EXPECT_FALSE(r.ids.empty()) << i;
      EXPECT_FALSE(r.text.empty() && r.reasoning.empty()) << i;
    }
    // Cut after event k: the first k events were forwarded.
    for (size_t k = 0; k <= whole.chunks.size(); ++k) {
      SCOPED_TRACE("cut after event " + std::to_string(k));
      std::map<int, Received> got;
      json cached;  // the last `c` the client's events carried
      for (size_t e = 0; e < k; ++e) {
        receive(whole.infos[e], whole.chunks[e], is_chat, got);
        if (whole.infos[e].contains("c")) cached = whole.infos[e]["c"];
      }
      // Every choice: those the client has a chunk of as far as it got,
      // the others as never announced.
      json choices = json::array();
      for (const auto& [i, unused] : want) {
        const auto r = got.find(i);
        if (r == got.end()) {
          choices.push_back({{"index", i}, {"announced", false}});
          continue;
        }
        choices.push_back({{"index", i},
                           {"output_token_ids", r->second.ids},
                           {"text_offset", r->second.offset},
                           {"finished", r->second.finished}});
      }
      json resumed_body = body;
      resumed_body["basalt_resume"] = {{"choices", choices}, {"created", whole.chunks[0]["created"]}};
      if (!cached.is_null()) resumed_body["basalt_resume"]["prior_usage"] = {{"cached_tokens", cached}};
      const std::string raw = stream_of(s, path, resumed_body);
      ASSERT_EQ(raw.substr(0, 12), "HTTP/1.1 200") << raw;
      const StreamEvents rest = stream_events(raw);
      for (size_t e = 0; e < rest.chunks.size(); ++e) {
        EXPECT_EQ(rest.chunks[e]["id"], whole.chunks[0]["id"]);
        EXPECT_EQ(rest.chunks[e]["created"], whole.chunks[0]["created"]);
        receive(rest.infos[e], rest.chunks[e], is_chat, got);
      }
      for (const auto& [i, r] : want) {
        EXPECT_EQ(got[i].ids, r.ids) << i;
        EXPECT_EQ(got[i].text, r.text) << i;
        EXPECT_EQ(got[i].reasoning, r.reasoning) << i;
        EXPECT_EQ(got[i].finish_reason, r.finish_reason) << i;
        EXPECT_EQ(got[i].roles, is_chat ? 1 : 0) << i;
      }
      ASSERT_TRUE(whole.usage.is_object());
      ASSERT_TRUE(rest.usage.is_object()) << raw;
      for (const char* field : {"prompt_tokens", "completion_tokens", "total_tokens"})
        EXPECT_EQ(rest.usage[field], whole.usage[field]) << field;
      const json& own = rest.usage["prompt_tokens_details"]["cached_tokens"];
      if (!cached.is_null()) {
        ++with_prior;
        EXPECT_EQ(own, whole.usage["prompt_tokens_details"]["cached_tokens"]);
      } else if (k == 0) {
        // Nothing said: the resumed run's own count, which finds the
        // prompt the whole run left in the cache.
        EXPECT_GT(own.get<int64_t>(), whole.usage["prompt_tokens_details"]["cached_tokens"].get<int64_t>());
      }
    }
    EXPECT_GT(with_prior, whole.chunks.size() / 2);
  }
}

TEST(ApiServer, AStreamResumedAfterAnyEventIsTheWholeStream) {
  Served s;
  const json usage = {{"include_usage", true}};
  const json completion = {{"prompt", "Debian stable"}, {"max_tokens", 10}, {"n", 2}, {"seed", 11},
                           {"temperature", 1.0}, {"stream", true}, {"stop", " is"}, {"stream_options", usage}};
  const json chat = {{"messages", json::array({{{"role", "user"}, {"content", "What is apt?"}}})},
                     {"max_tokens", 8}, {"n", 2}, {"seed", 5}, {"temperature", 0.8}, {"stream", true},
                     {"stream_options", usage}};
  {
    SCOPED_TRACE("completions");
    check_resumes(s, false, completion);
  }
  {
    // The echo is a choice's first chunk, as a chat's role delta is.
    SCOPED_TRACE("completions with echo");
    json echo = completion;
    echo["prompt"] = "Debian testing takes its packages from unstable";
    echo["echo"] = true;
    check_resumes(s, false, echo);
  }
  {
    SCOPED_TRACE("chat");
    check_resumes(s, true, chat);
  }
  {
    // A reply parser in the way: the resumed stream's parser is fed the
    // text before the offset and holds back what the first one held back.
    SCOPED_TRACE("chat with a reasoning parser");
    ApiServerOptions api;
    api.reasoning_parser = "deepseek_r1";
    Served reasoning(api);
    json think = chat;
    think["messages"] = json::array({{{"role", "user"}, {"content", "Think: what is apt?"}}});
    think["max_tokens"] = 14;
    check_resumes(reasoning, true, think);
    EXPECT_EQ(reasoning.server->in_flight(), 0);
  }
  // A text_offset short of the text the ids make (a gateway that lost an
  // event's comment): the text past the offset comes first.
  {
    const StreamEvents whole = stream_events(stream_of(s, "/v1/completions", completion));
    std::map<int, Received> want, got;
    for (size_t e = 0; e < whole.chunks.size(); ++e) receive(whole.infos[e], whole.chunks[e], false, want);
    for (size_t e = 0; e < 3; ++e) receive(whole.infos[e], whole.chunks[e], false, got);
    json choices = json::array();
    for (auto& [i, r] : got) {
      choices.push_back({{"index", i}, {"output_token_ids", r.ids}, {"text_offset", 0}, {"finished", r.finished}});
      if (!r.finished) r.text.clear();  // the resumed stream sends it all again
    }
    json resumed_body = completion;
    resumed_body["basalt_resume"] = {{"choices", choices}};
    const StreamEvents rest = stream_events(stream_of(s, "/v1/completions", resumed_body));
    for (size_t e = 0; e < rest.chunks.size(); ++e) receive(rest.infos[e], rest.chunks[e], false, got);
    for (const auto& [i, r] : want) EXPECT_EQ(got[i].text, r.text) << i;
  }
  EXPECT_EQ(s.server->in_flight(), 0);
  // What a gateway cannot ask: no seed, no stream, an index past the
  // choices, ids outside the vocabulary, an offset past the text, a choice
  // finished but never announced.
  const json ids = json::array({5, 6});
  const json bad[] = {
      {{"prompt", "x"}, {"stream", true}, {"basalt_resume", {{"choices", json::array()}}}},
      {{"prompt", "x"}, {"seed", 1}, {"basalt_resume", {{"choices", json::array()}}}},
      {{"prompt", "x"}, {"seed", 1}, {"stream", true}, {"basalt_resume", {{"choices", {{{"index", 3}}}}}}},
      {{"prompt", "x"}, {"seed", 1}, {"stream", true},
       {"basalt_resume", {{"choices", {{{"index", 0}, {"output_token_ids", {99999999}}}}}}}},
      {{"prompt", "x"}, {"seed", 1}, {"stream", true},
       {"basalt_resume", {{"choices", {{{"index", 0}, {"output_token_ids", ids}, {"text_offset", 1000}}}}}}},
      {{"prompt", "x"}, {"seed", 1}, {"stream", true}, {"basalt_resume", {{"choices", json::array()}, {"extra", 1}}}},
      {{"prompt", "x"}, {"seed", 1}, {"stream", true},
       {"basalt_resume", {{"choices", {{{"index", 0}, {"finished", true}, {"announced", false}}}}}}},
  };
  for (const json& b : bad) {
    int status = 0;
    const json r = s.call("/v1/completions", b, &status);
    EXPECT_EQ(status, 400) << b;
    EXPECT_NE(r["error"]["message"].get<std::string>().find("basalt_resume"), std::string::npos) << r;
  }
  EXPECT_EQ(s.server->in_flight(), 0);
  EXPECT_EQ(s.engine->drain_and_clear_cache(), s.engine->kv_capacity());
}

// X-Basalt-Heartbeat: a stream with nothing to send (here, a request that
// waits in the queue behind another) starts at once and writes `: hb`
// comments at that interval, then its events as usual; a bad value is a
// 400. At the drain deadline a stream's error event says cut_by_server.
TEST(ApiServer, HeartbeatsKeepAWaitingStreamAliveAndCutsSaySo) {
  ApiServerOptions api;
  api.max_running = 1;
  api.max_queue = 1;
  EngineOptions engine_options;
  engine_options.max_running = 1;
  Served s(api, engine_options);
  Client holder(s.http->port());
  holder.send(testing::post_request(
      "/v1/completions", json{{"prompt", "Hold"}, {"max_tokens", 1500}, {"ignore_eos", true}, {"stream", true}}.dump()));
  (void)holder.read_until([](const std::string& b) { return b.find("data: {") != std::string::npos; }, 60000ms);

  Client waiting(s.http->port());
  waiting.send(testing::post_request(
      "/v1/completions", json{{"prompt", "Wait"}, {"max_tokens", 4}, {"stream", true}}.dump(),
      "X-Basalt-Heartbeat: 100\r\n"));
  const auto beats = [](const std::string& b) {
    size_t n = 0;
    for (size_t at = 0; (at = b.find(": hb\n\n", at)) != std::string::npos; at += 6) ++n;
    return n;
  };
  const std::string early =
      waiting.read_until([&](const std::string& b) { return beats(b) >= 3; }, 10000ms);
  EXPECT_EQ(early.substr(0, 12), "HTTP/1.1 200") << early;
  EXPECT_GE(beats(early), 3u) << early;
  EXPECT_EQ(early.find("data: {"), std::string::npos) << "still queued behind the holder: " << early;
  holder.close();  // the holder goes; the waiting request runs
  const std::string rest =
      waiting.read_until([](const std::string& b) { return b.find("data: [DONE]") != std::string::npos; }, 60000ms);
  EXPECT_NE(rest.find("data: {"), std::string::npos) << rest;
  EXPECT_NE(rest.find("data: [DONE]"), std::string::npos) << rest;

  for (const char* bad : {"50", "abc", "", "60001", "99999999999"}) {
    Client c(s.http->port());
    c.send(testing::post_request("/v1/completions", json{{"prompt", "x"}, {"stream", true}}.dump(),
                                 std::string("X-Basalt-Heartbeat: ") + bad + "\r\n"));
    const std::string r = c.response(10000ms);
    EXPECT_EQ(r.substr(0, 12), "HTTP/1.1 400") << bad << ": " << r;
    EXPECT_NE(r.find("X-Basalt-Heartbeat"), std::string::npos) << r;
  }

  Client cut(s.http->port());
  cut.send(testing::post_request(
      "/v1/completions", json{{"prompt", "Cut"}, {"max_tokens", 1500}, {"ignore_eos", true}, {"stream", true}}.dump()));
  (void)cut.read_until([](const std::string& b) { return b.find("data: {") != std::string::npos; }, 60000ms);
  s.server->cut_in_flight();
  const std::string end =
      cut.read_until([](const std::string& b) { return b.find("data: [DONE]") != std::string::npos; }, 60000ms);
  EXPECT_NE(end.find(R"("code":"cut_by_server")"), std::string::npos) << end.substr(end.size() > 400 ? end.size() - 400 : 0);
  EXPECT_EQ(s.server->server_cuts(), 1u);
}

}  // namespace
}  // namespace basalt
