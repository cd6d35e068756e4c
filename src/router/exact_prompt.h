// ExactPrompt: a request's prompt as its replicas will tokenize it, for the
// exact mode of cache-aware routing (router/kv_index.h, docs/ROUTER.md §2):
// the body parsed as `basalt serve` parses it (server/openai_protocol.h),
// a chat's template rendered (server/chat_prompt.h), the text encoded with
// the model's tokenizer (the gateway's --tokenizer), a positive
// truncate_prompt_tokens applied. Of a completion with several prompts,
// the first; prompt ids are taken as they are.
//
// Contract: tokenize() runs once, off the I/O threads (TokenizingProducer
// runs it before the request's first pick); tokens() is empty until then,
// and for good when the body does not parse, the template raises or
// truncation depends on the replica's context length (a negative
// truncate_prompt_tokens): the request is then routed approximately. A
// text longer than max_text_bytes is cut there and its last
// kTailDropped ids dropped (ids near a cut may differ from the whole
// text's; routing compares prefixes only). hashes(block_size) are the
// ids' chained block hashes in the request's cache namespace
// (runtime/kv_events.h), computed once per block size. Safe from any
// thread.
//
// TokenizingProducer: the response of such a request: start() posts
// tokenize() to `pool`, then starts `inner` there; pull() and abort() go to
// `inner` once it has started (an abort before that means it never starts).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "server/http_server.h"
#include "tokenizer/tokenizer.h"

namespace boost::asio {
class thread_pool;
}

namespace basalt::router {

class ExactPrompt {
 public:
  static constexpr size_t kTailDropped = 64;

  // `body` is the body as forwarded, `cache_salt` its cache_salt.
  ExactPrompt(std::shared_ptr<const TokenizerBundle> tokenizer, std::string body, bool chat, std::string_view cache_salt,
              size_t max_text_bytes = size_t{64} << 10);

  void tokenize();
  std::vector<int32_t> tokens() const;
  const std::vector<uint64_t>& hashes(int32_t block_size);

 private:
  std::shared_ptr<const TokenizerBundle> tokenizer_;
  std::string body_;
  bool chat_;
  uint64_t namespace_;
  size_t max_text_bytes_;
  mutable std::mutex mu_;
  std::vector<int32_t> tokens_;
  std::map<int32_t, std::vector<uint64_t>> hashes_;  // per block size
};

class TokenizingProducer : public ResponseProducer {
 public:
  TokenizingProducer(boost::asio::thread_pool& pool, std::shared_ptr<ExactPrompt> prompt,
                     std::unique_ptr<ResponseProducer> inner);
  void start(std::function<void()> wake) override;
  void pull(Output& out) override;
  void abort() override;

  struct State;

 private:
  boost::asio::thread_pool& pool_;
  std::shared_ptr<ExactPrompt> prompt_;
  std::shared_ptr<State> state_;
};

}  // namespace basalt::router
