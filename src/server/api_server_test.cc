// The API server in process, over a real socket, on the bundled model:
// completions and chat produce exactly what the engine produces for the same
// ids (chat through the model's own template), n > 1 samples equal single
// requests with the derived seeds and share the prompt's KV, streamed text
// equals whole text, and a client that vanishes mid-stream leaves the pool
// whole.
#include "server/api_server.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "backend/cpu/cpu_backend.h"
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
