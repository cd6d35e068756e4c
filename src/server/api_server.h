// ApiServer: the OpenAI-compatible HTTP API over one Engine — routes,
// authentication, admission control, responses (whole or streamed as
// server-sent events), request logs and the Prometheus /metrics text.
//
// Contract:
//  * handle() is an HttpHandler (server/http_server.h): it never blocks on
//    the model. Generation requests become engine submissions (one per
//    prompt and sample) answered by a ResponseProducer woken by the engine's
//    stream listeners; everything else is answered at once.
//  * Every failure is an OpenAI-style error body: 400 for malformed or
//    out-of-range input (including prompts past the context length and chat
//    templates that raise, unsupported fields), 401 without a valid API key
//    (when keys are set), 404 for unknown models and paths, 405 for wrong
//    methods, 429 with Retry-After when the queue is full, 503 while
//    draining and for requests cut at the drain deadline.
//  * A client that disconnects cancels its engine requests (their KV is
//    freed at the next step boundary).
//  * Request logs (one line per request, core/log.h) carry ids, sizes,
//    timings, status and how the request ended; prompt and completion text
//    only when log_text is set. A client's X-Request-Id is echoed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/startup.h"
#include "runtime/engine.h"
#include "server/chat_output_stream.h"
#include "server/http_server.h"
#include "server/openai_protocol.h"
#include "tokenizer/tokenizer.h"

namespace basalt {

struct ApiServerOptions {
  std::string served_model_name = "basalt";
  std::vector<std::string> api_keys;  // empty: no authentication
  // Engine requests allowed to wait beyond max_running before 429.
  int max_queue = 1024;
  int max_running = 64;
  // Samples (n times prompts) one request may ask for; 0: half of
  // max_running (at least 1), so one request never takes every slot.
  int max_n = 0;
  // 0: the model's max_position_embeddings; above it is refused at start.
  int64_t max_model_len = 0;
  bool log_requests = true;
  bool log_text = false;
  ProtocolLimits limits;
  // Tool calls in chat output (vLLM's --tool-call-parser): a format name
  // (chat_output/tool_call_format.h), "auto" to detect it from the chat
  // template, or "none" to return calls as text. Unknown names, and "auto"
  // when nothing is detected, leave tool calls as text; tool_choice
  // "required" or a named function then gets a 400.
  std::string tool_call_parser = "auto";
  // Reasoning text (vLLM's --reasoning-parser): empty for none, or a format
  // name (chat_output/reasoning_parser.h).
  std::string reasoning_parser;
};

class ApiServer {
 public:
  // Borrows everything; they must outlive the server.
  ApiServer(EngineClient& engine, const Tokenizer& tokenizer, const TokenizerConfig& tokenizer_config,
            ApiServerOptions options);
  ~ApiServer();

  HandlerResult handle(HttpRequest& request);

  // /ready answers 503 until set_ready(true), and again once draining.
  void set_ready(bool ready) { ready_ = ready; }
  // Stops admitting generation requests (503); running ones carry on.
  void start_draining() { draining_ = true; }
  // The drain deadline: every unfinished generation response ends at once,
  // a whole one as 503 and a stream with an error event, logged as cut by
  // the server; their engine requests are cancelled.
  void cut_in_flight();
  uint64_t server_cuts() const;
  // A request the transport answered without calling handle() (413, 431,
  // a malformed request, too many connections): logged and counted.
  void note_rejection(int status, const std::string& remote, const std::string& method, const std::string& path,
                      const std::string& reason);
  // Engine requests submitted and not yet finished.
  int64_t in_flight() const;
  // The transport's open connections, reported in /metrics.
  void set_connection_counter(std::function<size_t()> counter) { connections_ = std::move(counter); }
  // When each phase of the process's start ended (core/startup.h), reported
  // in /metrics; set before the server takes requests.
  void set_startup_phases(std::vector<StartupPhase> phases) { startup_phases_ = std::move(phases); }
  std::string metrics_text() const;
  int64_t max_model_len() const { return max_model_len_; }
  // The tool-call format in use ("none" when calls stay text).
  std::string tool_call_parser() const { return tool_format_ ? std::string(to_string(*tool_format_)) : "none"; }

  // Internal: shared by the response producers.
  struct Shared;

 private:
  HandlerResult generate(HttpRequest& request, bool chat, const std::string& header_id);
  HttpResponse tokenize(const HttpRequest& request);
  HttpResponse detokenize(const HttpRequest& request);
  HttpResponse models() const;
  HttpResponse model(const std::string& id) const;
  nlohmann::json model_object() const;
  std::string render_chat(const ParsedRequest& r) const;
  // The choice's output parsers for a chat request; `prompt` is the rendered prompt.
  ChatOutputOptions chat_output_options(const ParsedRequest& r, const std::string& prompt) const;
  bool authorized(const HttpRequest& request) const;
  GrammarCache& grammars();

  EngineClient& engine_;
  const Tokenizer& tokenizer_;
  const TokenizerConfig& tokenizer_config_;
  ApiServerOptions options_;
  int64_t max_model_len_ = 0;
  int64_t max_choices_per_request_ = 1;
  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  std::function<size_t()> connections_;
  std::vector<StartupPhase> startup_phases_;
  std::shared_ptr<Shared> shared_;
  int64_t created_ = 0;
  std::once_flag grammars_once_;
  std::unique_ptr<GrammarCache> grammars_;  // compiled structured-output grammars
  std::optional<ToolCallFormat> tool_format_;  // from --tool-call-parser or the model's template
  std::optional<ToolCallFormat> tool_format_for(const ParsedRequest& r) const;
  std::optional<ReasoningFormat> reasoning_format_;
};

}  // namespace basalt
