#include "loadgen/client.h"

#include <boost/asio/io_context.hpp>
#include <utility>

#include "core/error.h"
#include "loadgen/chunk.h"
#include "server/sse.h"

namespace basalt::loadgen {

Url parse_url(const std::string& text) { return parse_base_url(text, "--base-url"); }

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kNone: return "none";
    case ErrorKind::kConnect: return "connect";
    case ErrorKind::kHttpStatus: return "http_status";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kStream: return "stream";
  }
  return "unknown";
}

namespace {

constexpr size_t kMaxErrorBody = 512;
constexpr size_t kMaxBody = size_t{64} << 20;

HttpClientOptions http_options(const ClientOptions& o) {
  BASALT_CHECK(o.timeout_s > 0 && o.timeout_s < 1e7, "--timeout must be positive seconds, got {}", o.timeout_s);
  HttpClientOptions h;
  h.timeout_s = o.timeout_s;
  h.insecure = o.insecure;
  h.max_body_bytes = kMaxBody;
  h.user_agent = "basalt-bench";
  return h;
}

// One exchange's reading: the status, then the body as SSE events (a 200
// stream) or as bytes kept (cut to kMaxErrorBody for an error's body).
class Reader {
 public:
  Reader(const ClientOptions& options, bool stream, bool keep_text, CompletionClient::Done done)
      : epoch_(options.epoch), stream_(stream), keep_text_(keep_text), done_(std::move(done)),
        sse_([this](std::string_view data) { on_event(data); }) {
    result_.sent_s = now_s();
  }

  void on_head(const IncomingHead& head) { result_.http_status = head.status; }

  void on_data(std::string_view body) {
    if (stream_ && result_.http_status == 200) {
      if (!sse_.feed(body) && !stream_failed_) {
        stream_failed_ = true;
        stream_message_ = sse_.error();
      }
      return;
    }
    const size_t limit = result_.http_status == 200 ? kMaxBody : kMaxErrorBody;
    if (body_.size() < limit) body_.append(body.substr(0, limit - body_.size()));
  }

  void on_done(HttpFailure failure, const std::string& message) {
    switch (failure) {
      case HttpFailure::kNone: return complete();
      case HttpFailure::kConnect: return finish(ErrorKind::kConnect, message);
      case HttpFailure::kTimeout: return finish(ErrorKind::kTimeout, message);
      case HttpFailure::kBroken:
      case HttpFailure::kCancelled: return finish(ErrorKind::kStream, message);
    }
  }

 private:
  double now_s() const { return std::chrono::duration<double>(Clock::now() - epoch_).count(); }

  void on_event(std::string_view data) {
    const ChunkInfo info = read_chunk(data);
    if (info.usage_completion_tokens >= 0) result_.usage_completion_tokens = info.usage_completion_tokens;
    if (info.usage_prompt_tokens >= 0) result_.usage_prompt_tokens = info.usage_prompt_tokens;
    switch (info.kind) {
      case ChunkInfo::Kind::kToken: {
        const double t = now_s();
        if (result_.first_token_s < 0) result_.first_token_s = t;
        result_.token_times.push_back(t);
        ++result_.chunk_tokens;
        if (keep_text_) result_.text += info.text;
        break;
      }
      case ChunkInfo::Kind::kDone: saw_done_ = true; break;
      case ChunkInfo::Kind::kError:
      case ChunkInfo::Kind::kMalformed:
        if (!stream_failed_) {
          stream_failed_ = true;
          stream_message_ = (info.kind == ChunkInfo::Kind::kError ? "error event: " : "") + info.text;
        }
        break;
      case ChunkInfo::Kind::kOther: break;
    }
  }

  void complete() {
    if (stream_ && result_.http_status == 200) sse_.finish();
    if (result_.http_status != 200) {
      result_.body = std::move(body_);
      return finish(ErrorKind::kHttpStatus,
                    "HTTP " + std::to_string(result_.http_status) + ": " + result_.body.substr(0, 200));
    }
    if (stream_failed_) return finish(ErrorKind::kStream, stream_message_);
    if (stream_ && !saw_done_) return finish(ErrorKind::kStream, "the stream ended without data: [DONE]");
    if (!stream_) result_.body = std::move(body_);
    finish(ErrorKind::kNone, "");
  }

  void finish(ErrorKind kind, std::string message) {
    result_.error = kind;
    result_.error_message = std::move(message);
    result_.end_s = now_s();
    CompletionClient::Done done = std::move(done_);
    done(std::move(result_));
  }

  Clock::time_point epoch_;
  bool stream_;
  bool keep_text_;
  CompletionClient::Done done_;
  SseParser sse_;
  ExchangeResult result_;
  std::string body_;
  bool saw_done_ = false;
  bool stream_failed_ = false;
  std::string stream_message_;
};

}  // namespace

CompletionClient::CompletionClient(boost::asio::io_context& io, Url url, ClientOptions options)
    : http_(io, std::move(url), http_options(options)), options_(std::move(options)) {}

CompletionClient::~CompletionClient() = default;

double CompletionClient::now_s() const {
  return std::chrono::duration<double>(Clock::now() - options_.epoch).count();
}
void CompletionClient::set_epoch(Clock::time_point epoch) { options_.epoch = epoch; }
void CompletionClient::close_idle() { http_.close_idle(); }

void CompletionClient::send(const std::string& method, const std::string& path, std::string body, bool stream,
                            bool keep_text, Done done) {
  OutgoingRequest req;
  req.method = method;
  req.path = path;
  if (!options_.api_key.empty()) req.headers.emplace_back("Authorization", "Bearer " + options_.api_key);
  if (stream) req.headers.emplace_back("Accept", "text/event-stream");
  if (!body.empty()) req.headers.emplace_back("Content-Type", "application/json");
  req.body = std::move(body);
  auto reader = std::make_shared<Reader>(options_, stream, keep_text, std::move(done));
  ExchangeCallbacks callbacks;
  callbacks.on_head = [reader](const IncomingHead& head) { reader->on_head(head); };
  callbacks.on_data = [reader](std::string_view data) { reader->on_data(data); };
  callbacks.on_done = [reader](HttpFailure failure, const std::string& message) { reader->on_done(failure, message); };
  http_.send(std::move(req), std::move(callbacks));
}

}  // namespace basalt::loadgen
