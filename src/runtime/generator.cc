#include "runtime/generator.h"

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "runtime/logits_processor.h"
#include "runtime/stop_checker.h"

namespace basalt {

std::vector<TokenLogprob> top_k_logprobs(std::span<const float> logprobs, int k) {
  std::vector<int32_t> order(logprobs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  const size_t n = std::min(order.size(), static_cast<size_t>(std::max(k, 0)));
  std::partial_sort(order.begin(), order.begin() + static_cast<ptrdiff_t>(n), order.end(),
                    [&](int32_t a, int32_t b) {
                      if (logprobs[static_cast<size_t>(a)] != logprobs[static_cast<size_t>(b)])
                        return logprobs[static_cast<size_t>(a)] > logprobs[static_cast<size_t>(b)];
                      return a < b;
                    });
  std::vector<TokenLogprob> out;
  for (size_t i = 0; i < n; ++i) out.push_back({order[i], logprobs[static_cast<size_t>(order[i])]});
  return out;
}

namespace {

bool contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Detokenizes the output as it streams and watches for stop strings.
class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, const GenerateOptions& options,
             const std::function<void(std::string_view)>& on_text, std::string& text)
      : tokenizer_(tokenizer),
        decoder_(tokenizer, options.skip_special_tokens),
        checker_(options.stop, options.include_stop_str_in_output),
        on_text_(on_text),
        text_(text) {}

  // Adds one token's text; returns the stop string if one matched.
  std::optional<std::string> push(int32_t id, bool check) {
    if (id >= tokenizer_.vocab_size()) return std::nullopt;
    return feed(decoder_.push(id), check);
  }

  // Ends the stream; returns the stop string if the last text completed one.
  std::optional<std::string> finish(bool check) {
    std::optional<std::string> stop = feed(decoder_.flush(), check);
    if (!stop) emit(checker_.flush());
    return stop;
  }

 private:
  std::optional<std::string> feed(const std::string& piece, bool check) {
    if (piece.empty()) return std::nullopt;
    StopChecker::Result r = checker_.feed(piece, check);
    emit(r.text);
    return r.stop;
  }
  void emit(const std::string& piece) {
    if (piece.empty()) return;
    text_.append(piece);
    if (on_text_) on_text_(piece);
  }

  const Tokenizer& tokenizer_;
  IncrementalDecoder decoder_;
  StopChecker checker_;
  const std::function<void(std::string_view)>& on_text_;
  std::string& text_;
};

}  // namespace

GenerateResult generate(Model& model, Backend& backend, const Tokenizer* tokenizer,
                        std::span<const int32_t> prompt, const GenerateOptions& options,
                        const GenerateCallbacks& callbacks) {
  const ModelConfig& config = model.config();
  const int32_t vocab = static_cast<int32_t>(config.vocab_size);
  BASALT_CHECK(!prompt.empty(), "the prompt is empty");
  options.validate(vocab, options.max_logprobs);
  BASALT_CHECK(options.n == 1, "n must be 1 here: the single-request generator runs one sequence, got {}", options.n);
  BASALT_CHECK(options.stop.empty() || tokenizer != nullptr,
               "stop strings need a tokenizer to match against the text");
  for (int32_t id : prompt)
    BASALT_CHECK(id >= 0 && id < vocab, "prompt token id {} is outside the vocabulary (0..{})", id, vocab - 1);
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + options.max_tokens;
  BASALT_CHECK(capacity <= config.max_position_embeddings,
               "prompt ({} tokens) plus max_tokens ({}) exceeds the model's context length ({})",
               prompt.size(), options.max_tokens, config.max_position_embeddings);

  GenerateResult result;
  result.finish_reason = "length";
  result.seed = options.seed ? *options.seed : random_seed();
  if (options.max_tokens == 0) return result;

  LogitsProcessor processor(options, vocab, options.eos_ids, prompt);
  std::optional<TextStream> text;
  if (tokenizer != nullptr) text.emplace(*tokenizer, options, callbacks.on_text, result.text);

  KvBuffers kv = model.allocate_kv(capacity);
  Tensor logits = backend.empty({1, vocab}, DType::kF32);
  Tensor logprobs = backend.empty({1, vocab}, DType::kF32);
  Tensor next = backend.empty({1}, DType::kI32);
  Tensor host_logits = Tensor::empty({1, vocab}, DType::kF32);
  Tensor host_next = Tensor::empty({1}, DType::kI32);

  std::vector<int32_t> step_tokens(prompt.begin(), prompt.end());
  int64_t position = 0;
  bool stopped_by_string = false;
  for (int step = 0; step < options.max_tokens; ++step) {
    ForwardBatch batch = single_sequence_batch(step_tokens, position);
    model.forward(batch, kv, logits);
    position += static_cast<int64_t>(step_tokens.size());

    if (options.logprobs > 0) {
      backend.log_softmax(logits, logprobs);
      backend.copy(logprobs, host_logits);
      result.top_logprobs.push_back(top_k_logprobs(
          std::span<const float>(host_logits.data<float>(), static_cast<size_t>(vocab)),
          options.logprobs));
    }
    if (processor.active()) {
      backend.copy(logits, host_logits);
      processor.apply(std::span<float>(host_logits.data<float>(), static_cast<size_t>(vocab)));
      backend.copy(host_logits, logits);
    }
    const SamplingRow row = options.row(result.seed, static_cast<uint64_t>(step));
    backend.sample(logits, std::span<const SamplingRow>(&row, 1), next);
    backend.copy(next, host_next);
    const int32_t token = host_next.data<int32_t>()[0];
    result.output_ids.push_back(token);
    processor.append(token);
    if (callbacks.on_token) callbacks.on_token(token);

    const int produced = static_cast<int>(result.output_ids.size());
    const bool past_min = produced >= options.min_tokens;
    const bool is_eos = past_min && !options.ignore_eos && contains(options.eos_ids, token);
    const bool is_stop_id = past_min && contains(options.stop_token_ids, token);
    if (is_eos || is_stop_id) {
      result.finish_reason = "stop";
      if (is_stop_id && !is_eos) result.stop_reason = token;
      if (text && options.include_stop_str_in_output) {
        if (auto stop = text->push(token, produced > options.min_tokens)) {
          result.stop_reason = std::move(*stop);
          stopped_by_string = true;
        }
      }
      break;
    }
    if (text) {
      if (auto stop = text->push(token, produced > options.min_tokens)) {
        result.finish_reason = "stop";
        result.stop_reason = std::move(*stop);
        stopped_by_string = true;
        break;
      }
    }
    step_tokens.assign(1, token);
  }
  if (text && !stopped_by_string) {
    const bool check = static_cast<int>(result.output_ids.size()) > options.min_tokens;
    if (auto stop = text->finish(check)) {
      result.finish_reason = "stop";
      result.stop_reason = std::move(*stop);
    }
  }
  return result;
}

GenerateResult generate(Model& model, Backend& backend, std::span<const int32_t> prompt,
                        const GenerateOptions& options,
                        const std::function<void(int32_t)>& on_token) {
  GenerateCallbacks callbacks;
  callbacks.on_token = on_token;
  return generate(model, backend, nullptr, prompt, options, callbacks);
}

}  // namespace basalt
