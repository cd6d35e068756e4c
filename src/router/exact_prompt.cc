#include "router/exact_prompt.h"

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include "runtime/kv_events.h"
#include "server/chat_prompt.h"
#include "server/openai_protocol.h"

namespace basalt::router {

ExactPrompt::ExactPrompt(std::shared_ptr<const TokenizerBundle> tokenizer, std::string body, bool chat,
                         std::string_view cache_salt,
                         size_t max_text_bytes)
    : tokenizer_(std::move(tokenizer)),
      body_(std::move(body)),
      chat_(chat),
      namespace_(kv_cache_namespace(cache_salt)),
      max_text_bytes_(max_text_bytes) {}

void ExactPrompt::tokenize() {
  std::vector<int32_t> ids;
  try {
    const ParsedRequest r = chat_ ? parse_chat_request(body_) : parse_completion_request(body_);
    std::string text;
    bool is_text = true;
    if (chat_) {
      text = render_chat_prompt(r, tokenizer_->config);
    } else if (!r.prompts.empty()) {
      if (const auto* t = std::get_if<std::string>(&r.prompts.front())) {
        text = *t;
      } else {
        ids = std::get<std::vector<int32_t>>(r.prompts.front());
        is_text = false;
      }
    }
    if (is_text) {
      const bool cut = text.size() > max_text_bytes_;
      if (cut) text.resize(max_text_bytes_);
      ids = tokenizer_->tokenizer.encode(text, r.add_special_tokens);
      if (cut) ids.resize(ids.size() > kTailDropped ? ids.size() - kTailDropped : 0);
    }
    if (r.truncate_prompt_tokens < 0)
      ids.clear();  // the replica's context length decides
    else
      truncate_prompt(ids, r.truncate_prompt_tokens, 0);
  } catch (const std::exception&) {
    ids.clear();  // the replica will say what is wrong with it
  }
  std::lock_guard<std::mutex> lock(mu_);
  body_.clear();
  body_.shrink_to_fit();
  tokens_ = std::move(ids);
}

std::vector<int32_t> ExactPrompt::tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tokens_;
}

const std::vector<uint64_t>& ExactPrompt::hashes(int32_t block_size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = hashes_.find(block_size);
  if (it == hashes_.end())
    it = hashes_.emplace(block_size, kv_block_hashes(namespace_, tokens_, static_cast<size_t>(block_size))).first;
  return it->second;  // entries are never erased, so the reference stays valid
}

struct TokenizingProducer::State {
  std::mutex mu;
  bool aborted = false;
  std::atomic<bool> started{false};
  std::unique_ptr<ResponseProducer> inner;
};

TokenizingProducer::TokenizingProducer(boost::asio::thread_pool& pool, std::shared_ptr<ExactPrompt> prompt,
                                       std::unique_ptr<ResponseProducer> inner)
    : pool_(pool), prompt_(std::move(prompt)), state_(std::make_shared<State>()) {
  state_->inner = std::move(inner);
}

void TokenizingProducer::start(std::function<void()> wake) {
  boost::asio::post(pool_, [state = state_, prompt = prompt_, wake = std::move(wake)] {
    prompt->tokenize();
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->aborted) return;
    state->inner->start(wake);
    state->started.store(true, std::memory_order_release);
    wake();
  });
}

void TokenizingProducer::pull(Output& out) {
  if (state_->started.load(std::memory_order_acquire)) state_->inner->pull(out);
}

void TokenizingProducer::abort() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->aborted = true;
  if (state_->started.load()) state_->inner->abort();
}

}  // namespace basalt::router
