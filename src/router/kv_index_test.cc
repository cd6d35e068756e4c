// The exact cache index (router/kv_index.h), the KV-event batches it reads
// (router/kv_events_subscriber.h) against a fake replica's stream, and the
// gateway's tokenization of a prompt as a replica does it
// (router/exact_prompt.h).
#include "router/kv_index.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <fmt/format.h>
#include <future>
#include <nlohmann/json.hpp>
#include <mutex>
#include <optional>
#include <thread>

#include "router/exact_prompt.h"
#include "router/kv_events_subscriber.h"
#include "runtime/kv_events.h"
#include "server/chat_prompt.h"
#include "server/http_server.h"
#include "server/openai_protocol.h"

namespace basalt::router {
namespace {

using namespace std::chrono_literals;

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

TEST(KvIndex, MatchesLeadingBlocksOfALiveReplicaOnly) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<uint64_t> h = kv_block_hashes(0, tokens, 4);
  ASSERT_EQ(h.size(), 2u);  // the ninth token is no whole block
  EXPECT_EQ(h[0], kv_block_hash(0, 0, std::span<const int32_t>(tokens).first(4)));
  EXPECT_EQ(h[1], kv_block_hash(h[0], 0, std::span<const int32_t>(tokens).subspan(4, 4)));
  EXPECT_NE(kv_block_hashes(kv_cache_namespace("t:acme"), tokens, 4)[0], h[0]);
  EXPECT_EQ(kv_cache_namespace(""), 0u);
  EXPECT_EQ(kv_cache_namespace("x") & 1, 1u);

  KvIndex index;
  EXPECT_FALSE(index.match("r", h).has_value());  // not live: the caller routes approximately
  EXPECT_EQ(index.block_size("r"), 0);
  index.stored("r", h);  // ignored before a snapshot
  index.reset("r", 4);
  EXPECT_EQ(index.match("r", h), std::optional<size_t>(0));
  index.stored("r", std::span<const uint64_t>(h).first(1));
  EXPECT_EQ(index.match("r", h), std::optional<size_t>(1));
  index.stored("r", std::span<const uint64_t>(h).subspan(1));
  EXPECT_EQ(index.match("r", h), std::optional<size_t>(2));
  index.removed("r", std::span<const uint64_t>(h).first(1));
  EXPECT_EQ(index.match("r", h), std::optional<size_t>(0));  // a prefix ends at its first missing block
  EXPECT_EQ(index.blocks("r"), 1u);
  index.reset("r", 4);
  EXPECT_EQ(index.blocks("r"), 0u);
  index.drop("r");
  EXPECT_FALSE(index.match("r", h).has_value());

  KvIndex small(3);
  small.reset("r", 4);
  const std::vector<uint64_t> four = {1, 2, 3, 4};
  EXPECT_FALSE(small.stored("r", four));  // past its bound: dropped
  EXPECT_EQ(small.block_size("r"), 0);
}

TEST(KvIndex, BatchesParseAsServeWritesThemAndNothingElse) {
  const std::string good =
      R"({"seq": 1, "snapshot": true, "block_size": 16, "events": [)"
      R"({"type": "stored", "namespace": "0000000000000000", "block_hashes": ["9b1c000000000001", "04e7ffffffffffff"],)"
      R"( "parent_block_hash": null, "token_ids": [1, 2]}, {"type": "removed", "namespace": "0000000000000000",)"
      R"( "block_hashes": ["9b1c000000000001"]}]})";
  const std::optional<KvBatch> b = parse_kv_batch(good);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->seq, 1u);
  EXPECT_TRUE(b->snapshot);
  EXPECT_EQ(b->block_size, 16);
  ASSERT_EQ(b->events.size(), 2u);
  EXPECT_TRUE(b->events[0].stored);
  EXPECT_EQ(b->events[0].hashes, (std::vector<uint64_t>{0x9b1c000000000001ull, 0x04e7ffffffffffffull}));
  EXPECT_FALSE(b->events[1].stored);
  for (const char* bad : {
           "", "[]", "{", R"({"error": {"message": "slow"}})",
           R"({"seq": -1, "snapshot": true, "block_size": 16, "events": []})",
           R"({"seq": 1, "snapshot": 1, "block_size": 16, "events": []})",
           R"({"seq": 1, "snapshot": true, "block_size": 0, "events": []})",
           R"({"seq": 1, "snapshot": true, "block_size": 16, "events": {}})",
           R"({"seq": 1, "snapshot": true, "block_size": 16, "events": [{"type": "moved", "block_hashes": []}]})",
           R"({"seq": 1, "snapshot": true, "block_size": 16, "events": [{"type": "stored", "block_hashes": ["12"]}]})",
           R"({"seq": 1, "snapshot": true, "block_size": 16, "events": [{"type": "stored", "block_hashes": ["zz1c000000000001"]}]})",
           R"({"seq": 1, "snapshot": true, "block_size": 16, "events": [{"type": "stored", "block_hashes": [5]}]})",
       })
    EXPECT_FALSE(parse_kv_batch(bad)) << bad;
}

// A replica's /v1/kv_events: the SSE events its test gives, then held open
// (or ended, `close`); another path answers 404.
class EventStream : public ResponseProducer {
 public:
  EventStream(std::string events, bool close) : events_(std::move(events)), close_(close) {}
  void start(std::function<void()> wake) override { wake(); }
  void pull(Output& out) override {
    if (sent_) return;
    HttpResponse head;
    head.content_type = "text/event-stream";
    out.head = head;
    out.data = events_;
    out.done = close_;
    sent_ = true;
  }
  void abort() override {}

 private:
  std::string events_;
  bool close_;
  bool sent_ = false;
};

struct FakeEventsReplica {
  std::mutex mu;
  // What each subscription gets, in turn (the last again after), and
  // whether that stream then ends.
  std::vector<std::pair<std::string, bool>> streams;
  int status = 200;
  std::atomic<int> subscriptions{0};
  std::string authorization;
  std::unique_ptr<HttpServer> server;

  void start() {
    HttpServerOptions options;
    options.port = 0;
    server = std::make_unique<HttpServer>(options, [this](HttpRequest& r) {
      HandlerResult out;
      std::lock_guard<std::mutex> lock(mu);
      if (r.path != "/v1/kv_events" || status != 200) {
        out.response.status = r.path != "/v1/kv_events" ? 404 : status;
        return out;
      }
      authorization = std::string(r.header("authorization").value_or(""));
      const size_t n = static_cast<size_t>(subscriptions++);
      const auto& [events, close] = streams[std::min(n, streams.size() - 1)];
      out.producer = std::make_unique<EventStream>(events, close);
      return out;
    });
    server->start();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server->port()); }
};

std::string batch(uint64_t seq, bool snapshot, const std::string& type, const std::vector<uint64_t>& hashes) {
  std::string list;
  for (const uint64_t h : hashes) list += (list.empty() ? "\"" : ",\"") + hex(h) + "\"";
  return fmt::format(R"(data: {{"seq": {}, "snapshot": {}, "block_size": 16, "events": [{{"type": "{}", "block_hashes": [{}]}}]}})"
                     "\n\n",
                     seq, snapshot ? "true" : "false", type, list);
}

class Subscriber : public ::testing::Test {
 protected:
  void SetUp() override {
    work_.emplace(boost::asio::make_work_guard(io_));
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    subscriber_.reset();
    if (replica_.server) replica_.server->stop();
    work_.reset();
    io_.stop();
    thread_.join();
  }
  void subscribe() {
    replica_.start();
    registry_.set({parse_replica(replica_.url(), "--replica")});
    KvEventsOptions o;
    o.interval = 50ms;
    o.absent_retry = 10s;
    o.api_key = "sk-upstream";
    subscriber_ = std::make_unique<KvEventSubscriber>(registry_, io_, index_, o);
    subscriber_->start();
  }
  template <class F>
  bool eventually(F done) {
    for (int i = 0; i < 200; ++i) {
      if (done()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  std::string id() const { return registry_.snapshot()->replicas.at(0).spec.id; }

  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::thread thread_;
  FakeEventsReplica replica_;
  ReplicaRegistry registry_;
  KvIndex index_;
  std::unique_ptr<KvEventSubscriber> subscriber_;
};

TEST_F(Subscriber, ASnapshotThenItsChangesMakeTheIndex) {
  const std::string first =
      batch(1, true, "stored", {11, 12}) + batch(2, false, "stored", {13}) + batch(3, false, "removed", {11});
  replica_.streams = {{first, false}};
  subscribe();
  // The stream stays open: its three batches make the index.
  ASSERT_TRUE(eventually([&] { return index_.blocks(id()) == 2; }));
  EXPECT_EQ(index_.match(id(), std::vector<uint64_t>{12, 13}), std::optional<size_t>(2));
  EXPECT_EQ(index_.match(id(), std::vector<uint64_t>{11}), std::optional<size_t>(0));
  EXPECT_EQ(replica_.authorization, "Bearer sk-upstream");
  EXPECT_EQ(replica_.subscriptions.load(), 1);
  EXPECT_EQ(index_.block_size(id()), 16);
  EXPECT_TRUE(subscriber_->resyncs().empty());
}

TEST_F(Subscriber, AnEndedStreamOrAGapDropsTheReplicaUntilAFreshSnapshot) {
  replica_.streams = {{batch(1, true, "stored", {11, 12}), true},  // ends: read again
                      {batch(1, true, "stored", {21}) + batch(3, false, "stored", {22}), false},  // a gap
                      {batch(1, true, "stored", {31, 32, 33}), false}};
  subscribe();
  ASSERT_TRUE(eventually([&] { return index_.blocks(id()) == 3; }));
  EXPECT_EQ(index_.match(id(), std::vector<uint64_t>{31, 32, 33}), std::optional<size_t>(3));
  EXPECT_EQ(index_.match(id(), std::vector<uint64_t>{11}), std::optional<size_t>(0));  // the old entries went
  EXPECT_EQ(replica_.subscriptions.load(), 3);
  EXPECT_EQ(subscriber_->resyncs().at(id()), 2u);
}

TEST_F(Subscriber, AReplicaWithoutKvEventsIsNeverLive) {
  replica_.status = 404;
  replica_.streams = {{"", false}};
  subscribe();
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(index_.block_size(id()), 0);
  EXPECT_FALSE(index_.match(id(), std::vector<uint64_t>{1}).has_value());
}

TEST_F(Subscriber, AStreamThatDoesNotStartWithASnapshotIsRefused) {
  replica_.streams = {{batch(2, false, "stored", {1}), false}};
  subscribe();
  ASSERT_TRUE(eventually([&] { return replica_.subscriptions.load() >= 3; }));  // refused, asked again
  EXPECT_EQ(index_.block_size(id()), 0);
}

// The gateway's tokenization is the replica's: the chat template rendered
// and the text encoded as serve does, for completions and chats.
TEST(ExactPrompt, TokenizesAsTheReplicaDoes) {
  const auto bundle = std::make_shared<const TokenizerBundle>(
      load_tokenizer_dir(std::string(BASALT_TESTDATA) + "/../models/basalt-mini"));
  const std::string chat_body =
      R"({"model": "m", "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there, how are you?"}]})";
  ExactPrompt chat(bundle, chat_body, /*chat=*/true, "t:acme");
  EXPECT_TRUE(chat.tokens().empty());  // until tokenize()
  chat.tokenize();
  const ParsedRequest r = parse_chat_request(chat_body);
  const std::vector<int32_t> want = bundle->tokenizer.encode(render_chat_prompt(r, bundle->config), r.add_special_tokens);
  EXPECT_EQ(chat.tokens(), want);
  EXPECT_EQ(chat.hashes(4), kv_block_hashes(kv_cache_namespace("t:acme"), want, 4));

  ExactPrompt text(bundle, R"({"model": "m", "prompt": "The quick brown fox jumps over the lazy dog."})", false, "");
  text.tokenize();
  EXPECT_EQ(text.tokens(), bundle->tokenizer.encode("The quick brown fox jumps over the lazy dog.", true));
  ExactPrompt ids(bundle, R"({"prompt": [5, 6, 7, 8, 9], "truncate_prompt_tokens": 3})", false, "");
  ids.tokenize();
  EXPECT_EQ(ids.tokens(), (std::vector<int32_t>{7, 8, 9}));
  ExactPrompt unknown(bundle, R"({"prompt": "abc", "truncate_prompt_tokens": -1})", false, "");
  unknown.tokenize();
  EXPECT_TRUE(unknown.tokens().empty());  // the replica's context length decides
  ExactPrompt broken(bundle, R"({"messages": "not a list"})", true, "");
  broken.tokenize();
  EXPECT_TRUE(broken.tokens().empty());

  // A long text is cut, and the ids near the cut dropped: a prefix of the whole.
  std::string long_text;
  for (int i = 0; i < 400; ++i) long_text += fmt::format("Sentence number {} says something. ", i);
  ExactPrompt cut(bundle, nlohmann::json{{"prompt", long_text}}.dump(), false, "", 4096);
  cut.tokenize();
  const std::vector<int32_t> whole = bundle->tokenizer.encode(long_text, true);
  const std::vector<int32_t> got = cut.tokens();
  ASSERT_GT(got.size(), 500u);
  ASSERT_LT(got.size(), whole.size());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), whole.begin()));
}

// The producer starts its inner one after tokenizing, off the caller's
// thread; an abort first means it never starts.
class Recorder : public ResponseProducer {
 public:
  explicit Recorder(std::atomic<int>& starts, std::atomic<int>& aborts) : starts_(starts), aborts_(aborts) {}
  void start(std::function<void()> wake) override {
    ++starts_;
    wake();
  }
  void pull(Output& out) override {
    HttpResponse head;
    out.head = head;
    out.done = true;
  }
  void abort() override { ++aborts_; }

 private:
  std::atomic<int>& starts_;
  std::atomic<int>& aborts_;
};

TEST(ExactPrompt, TheProducerTokenizesBeforeItsInnerOneStarts) {
  const auto bundle = std::make_shared<const TokenizerBundle>(
      load_tokenizer_dir(std::string(BASALT_TESTDATA) + "/../models/basalt-mini"));
  boost::asio::thread_pool pool(1);
  std::atomic<int> starts{0}, aborts{0}, wakes{0};
  auto prompt = std::make_shared<ExactPrompt>(bundle, R"({"prompt": "hello world"})", false, "");
  TokenizingProducer p(pool, prompt, std::make_unique<Recorder>(starts, aborts));
  ResponseProducer::Output out;
  p.pull(out);
  EXPECT_FALSE(out.head);  // nothing before it started
  p.start([&] { ++wakes; });
  pool.wait();
  EXPECT_EQ(starts.load(), 1);
  EXPECT_GE(wakes.load(), 1);
  EXPECT_FALSE(prompt->tokens().empty());
  p.pull(out);
  EXPECT_TRUE(out.done);

  boost::asio::thread_pool held(1);
  std::promise<void> release;
  boost::asio::post(held, [f = release.get_future().share()] { f.wait(); });
  auto second = std::make_shared<ExactPrompt>(bundle, R"({"prompt": "hello"})", false, "");
  TokenizingProducer aborted(held, second, std::make_unique<Recorder>(starts, aborts));
  aborted.start([] {});
  aborted.abort();
  release.set_value();
  held.wait();
  EXPECT_EQ(starts.load(), 1);  // never started
  EXPECT_EQ(aborts.load(), 0);
}

}  // namespace
}  // namespace basalt::router
