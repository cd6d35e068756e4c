// `basalt eval`: perplexity of a model on a text, and comparisons.
//
// The text is encoded as generate encodes a prompt (the tokenizer's special
// tokens, e.g. a BOS, included) and cut into windows of --context tokens that
// overlap by one token, so every token after the first is predicted exactly
// once, from the tokens before it in its window. Each window is one prefill
// step with the logits of all positions; the negative log-likelihoods of the
// next tokens (log-softmax in double precision) are averaged over the whole
// text, and perplexity = exp(mean NLL). top1 is the fraction of those
// positions whose argmax is the next token.
//
// --compare-model REF runs a second model over the same windows (the same
// vocabulary size, and for --text-file the same token ids from both
// tokenizers) and reports, over the same positions, the mean of
// KL(P_REF || P_MODEL) = sum_v p_ref(v) (log p_ref(v) - log p_model(v)) in
// nats, with --model the candidate and REF the reference, as llama.cpp's
// perplexity --kl-divergence does with the base model's logits; the
// fraction of positions where both argmaxes agree; and REF's perplexity.
// --compare-dtype runs REF with another --dtype (REF may be --model itself:
// what rounding the activations to bf16 costs).
//
// --mtp (DeepSeek checkpoints with a multi-token-prediction layer): for every
// position i with a token i + 2, the MTP layer takes the main model's final
// hidden state at i and the true token i + 1 and predicts token i + 2;
// mtp_top1 is the fraction of those predictions whose argmax is right. The
// MTP layer runs over each window's positions as one causal sequence with its
// own cache (the window's first position at position 0), the way it was
// trained; each position is counted in the window that scores its next token.
//
// --device runs both models on that backend; --fp8-compute chooses how an
// FP8 checkpoint's weights multiply there (device_choice.h).
//
// tokens_per_second is the rate of --model's own forward passes (all window
// tokens over their wall time); the reference model and the MTP layer are not
// timed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/commands.h"
#include "app/device_choice.h"
#include "app/model_dir.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/deepseek_v3.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace basalt {
namespace {

struct EvalFlags {
  std::string model;
  std::string compare_model;
  std::string compare_dtype;  // empty: --dtype
  std::string text_file;
  std::string ids;
  std::string ids_file;
  std::string logits_out;
  std::string device = "cpu";
  std::string fp8_compute = "auto";
  std::string dtype = "auto";
  int threads = 0;
  int64_t max_tokens = 0;
  int64_t context = 0;
  bool mtp = false;
  bool json = false;
};

std::vector<int32_t> encode_text(const std::string& model_dir, const std::string& text) {
  const auto tokenizer_path = std::filesystem::path(model_dir) / "tokenizer.json";
  BASALT_CHECK(std::filesystem::exists(tokenizer_path),
               "{}: no tokenizer.json, so --text-file cannot be encoded", model_dir);
  return Tokenizer::from_file(tokenizer_path.string()).encode(text, /*add_special_tokens=*/true);
}

std::string read_file(const std::string& path, const std::string& flag) {
  BASALT_CHECK(std::filesystem::is_regular_file(path), "{}: '{}' is not a readable file", flag, path);
  std::ifstream in(path, std::ios::binary);
  BASALT_CHECK(in.good(), "{}: cannot open '{}'", flag, path);
  std::ostringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  BASALT_CHECK(s.find_first_not_of(" \t\r\n") != std::string::npos, "{}: '{}' has no text", flag, path);
  return s;
}

// Ids separated by commas and/or whitespace.
std::vector<int32_t> read_ids_file(const std::string& path) {
  std::string s = read_file(path, "--ids-file");
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  std::string list;
  bool pending_separator = false;
  for (char c : s) {
    if (c == ' ' || c == ',') {
      pending_separator = !list.empty();
      continue;
    }
    if (pending_separator) list.push_back(',');
    pending_separator = false;
    list.push_back(c);
  }
  return parse_id_list(list, "--ids-file");
}

// The log-softmax of one row, in double precision.
void log_softmax(const float* row, int64_t vocab, std::vector<double>& out) {
  out.resize(static_cast<size_t>(vocab));
  double max = row[0];
  for (int64_t v = 1; v < vocab; ++v) max = std::max(max, static_cast<double>(row[v]));
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
  const double log_z = max + std::log(sum);
  for (int64_t v = 0; v < vocab; ++v) out[static_cast<size_t>(v)] = static_cast<double>(row[v]) - log_z;
}

// The first index of the largest value.
int64_t argmax(const float* row, int64_t vocab) {
  return std::max_element(row, row + vocab) - row;
}

void check_ids(const std::vector<int32_t>& ids, const ModelConfig& config) {
  for (int32_t id : ids)
    BASALT_CHECK(id < config.vocab_size, "token id {} is outside the vocabulary (0..{})", id,
                 config.vocab_size - 1);
}

void run_eval(const EvalFlags& f, bool text_given, bool ids_given, bool ids_file_given) {
  BASALT_CHECK(int{text_given} + int{ids_given} + int{ids_file_given} == 1,
               "give exactly one of --text-file, --ids and --ids-file");
  BASALT_CHECK(std::filesystem::is_directory(f.model), "--model: '{}' is not a directory", f.model);
  const bool compare = !f.compare_model.empty();
  BASALT_CHECK(!compare || std::filesystem::is_directory(f.compare_model),
               "--compare-model: '{}' is not a directory", f.compare_model);
  BASALT_CHECK(f.max_tokens >= 0, "--max-tokens must be non-negative (0: the whole text)");
  BASALT_CHECK(f.context == 0 || f.context >= 2, "--context must be at least 2 tokens");
  check_fp8_compute(f.fp8_compute, f.device);
  check_dtype(f.dtype, f.device);
  const std::string compare_dtype = f.compare_dtype.empty() ? f.dtype : f.compare_dtype;
  check_dtype(compare_dtype, f.device);
  BASALT_CHECK(compare || f.compare_dtype.empty(), "--compare-dtype needs --compare-model");

  std::vector<int32_t> ids;
  if (text_given) {
    const std::string text = read_file(f.text_file, "--text-file");
    ids = encode_text(f.model, text);
    if (compare)
      BASALT_CHECK(encode_text(f.compare_model, text) == ids,
                   "--compare-model: the two models' tokenizers encode the text differently");
  } else {
    ids = ids_given ? parse_id_list(f.ids, "--ids") : read_ids_file(f.ids_file);
  }
  if (f.max_tokens > 0 && static_cast<int64_t>(ids.size()) > f.max_tokens)
    ids.resize(static_cast<size_t>(f.max_tokens));
  BASALT_CHECK(ids.size() >= 2, "perplexity needs at least 2 tokens, the input has {}", ids.size());

  std::unique_ptr<Backend> backend_owner = make_backend(f.device, f.threads);
  Backend& backend = *backend_owner;
  apply_fp8_compute(f.fp8_compute, backend);
  apply_dtype(f.dtype, backend);
  ProgressPrinter progress;
  std::unique_ptr<Model> model = load_model(f.model, backend, std::ref(progress));
  if (const std::string summary = model->summary(); !summary.empty())
    std::fprintf(stderr, "%s\n", summary.c_str());
  const ModelConfig& config = model->config();
  check_ids(ids, config);
  std::unique_ptr<Backend> reference_backend_owner;  // declared before the model that uses it
  std::unique_ptr<Model> reference;
  if (compare) {
    Backend* reference_backend = &backend;
    if (compare_dtype != f.dtype) {
      reference_backend_owner = make_backend(f.device);
      apply_fp8_compute(f.fp8_compute, *reference_backend_owner);
      apply_dtype(compare_dtype, *reference_backend_owner);
      reference_backend = reference_backend_owner.get();
    }
    reference = load_model(f.compare_model, *reference_backend, std::ref(progress));
    BASALT_CHECK(reference->config().vocab_size == config.vocab_size,
                 "--compare-model: the vocabularies differ ({} and {} entries)", config.vocab_size,
                 reference->config().vocab_size);
  }
  DraftHead* mtp_model = nullptr;
  if (f.mtp) {
    mtp_model = model->draft_head();
    BASALT_CHECK(mtp_model != nullptr,
                 "--mtp: {} has no multi-token-prediction layer", f.model);
  }
  int64_t max_context = config.max_position_embeddings;
  if (compare) max_context = std::min<int64_t>(max_context, reference->config().max_position_embeddings);
  const int64_t context = f.context > 0 ? f.context : std::min<int64_t>(max_context, 512);
  BASALT_CHECK(context <= max_context, "--context {} exceeds the model's context length ({})", context,
               max_context);
  BASALT_CHECK(context >= 2, "the model's context length ({}) is too short to score tokens", context);

  std::FILE* logits_out = nullptr;
  if (!f.logits_out.empty()) {
    logits_out = std::fopen(f.logits_out.c_str(), "wb");
    BASALT_CHECK(logits_out != nullptr, "--logits-out: cannot write '{}'", f.logits_out);
  }
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> logits_out_closer(
      logits_out, [](std::FILE* file) { return file != nullptr ? std::fclose(file) : 0; });

  const int64_t n = static_cast<int64_t>(ids.size()), vocab = config.vocab_size;
  KvBuffers kv = model->allocate_kv(context);
  KvBuffers reference_kv = compare ? reference->allocate_kv(context) : KvBuffers{};
  KvBuffers mtp_kv = mtp_model != nullptr ? mtp_model->allocate_kv(context) : KvBuffers{};
  double nll_sum = 0, reference_nll_sum = 0, kl_sum = 0;
  int64_t scored = 0, forwarded = 0, top1_hits = 0, agreements = 0, mtp_hits = 0, mtp_scored = 0;
  std::vector<double> lp, lp_reference;
  std::chrono::steady_clock::duration forward_time{};
  for (int64_t start = 0; start + 1 < n; start += context - 1) {
    const int64_t end = std::min(start + context, n), len = end - start;
    const std::span<const int32_t> window(ids.data() + start, static_cast<size_t>(len));
    const ForwardBatch batch = single_sequence_batch(window, 0, /*all_logits=*/true);
    Tensor logits = backend.empty({len, vocab}, DType::kF32);
    Tensor host = Tensor::empty({len, vocab}, DType::kF32);
    Tensor hidden;
    const auto t0 = std::chrono::steady_clock::now();
    if (mtp_model != nullptr) {
      hidden = backend.empty({len, config.hidden_size}, DType::kF32);
      model->forward(batch, kv, logits, &hidden);
    } else {
      model->forward(batch, kv, logits);
    }
    backend.copy(logits, host);
    forward_time += std::chrono::steady_clock::now() - t0;
    forwarded += len;
    Tensor reference_host;
    if (compare) {
      Tensor reference_logits = backend.empty({len, vocab}, DType::kF32);
      reference_host = Tensor::empty({len, vocab}, DType::kF32);
      reference->forward(batch, reference_kv, reference_logits);
      backend.copy(reference_logits, reference_host);
    }
    for (int64_t i = 0; i + 1 < len; ++i) {
      const float* row = host.data<float>() + i * vocab;
      const int32_t target = window[static_cast<size_t>(i + 1)];
      log_softmax(row, vocab, lp);
      nll_sum -= lp[static_cast<size_t>(target)];
      const int64_t top = argmax(row, vocab);
      top1_hits += top == target;
      if (compare) {
        const float* reference_row = reference_host.data<float>() + i * vocab;
        log_softmax(reference_row, vocab, lp_reference);
        reference_nll_sum -= lp_reference[static_cast<size_t>(target)];
        double kl = 0;
        for (size_t v = 0; v < lp.size(); ++v)
          kl += std::exp(lp_reference[v]) * (lp_reference[v] - lp[v]);
        kl_sum += kl;
        agreements += argmax(reference_row, vocab) == top;
      }
    }
    if (logits_out != nullptr) {
      const size_t values = static_cast<size_t>((len - 1) * vocab);
      BASALT_CHECK(std::fwrite(host.data<float>(), sizeof(float), values, logits_out) == values,
                   "--logits-out: cannot write '{}'", f.logits_out);
    }
    scored += len - 1;
    // MTP rows: window position i (the positions scored above) with the true
    // token i + 1 predicts token i + 2, which may lie in the next window.
    const int64_t mtp_rows = std::min(len - 1, n - 2 - start);
    if (mtp_model != nullptr && mtp_rows > 0) {
      const std::span<const int32_t> next(ids.data() + start + 1, static_cast<size_t>(mtp_rows));
      Tensor mtp_logits = backend.empty({mtp_rows, vocab}, DType::kF32);
      Tensor mtp_host = Tensor::empty({mtp_rows, vocab}, DType::kF32);
      mtp_model->forward(single_sequence_batch(next, 0, /*all_logits=*/true), hidden.rows(0, mtp_rows), mtp_kv,
                         mtp_logits);
      backend.copy(mtp_logits, mtp_host);
      for (int64_t i = 0; i < mtp_rows; ++i)
        mtp_hits += argmax(mtp_host.data<float>() + i * vocab, vocab) == ids[static_cast<size_t>(start + i + 2)];
      mtp_scored += mtp_rows;
    }
  }
  const double count = static_cast<double>(scored);
  const double nll_mean = nll_sum / count;
  const double perplexity = std::exp(nll_mean);
  const double top1 = static_cast<double>(top1_hits) / count;
  const double seconds = std::chrono::duration<double>(forward_time).count();
  const double tokens_per_second = seconds > 0 ? static_cast<double>(forwarded) / seconds : 0.0;
  const double kl_mean = kl_sum / count, top1_agreement = static_cast<double>(agreements) / count;
  const double reference_perplexity = std::exp(reference_nll_sum / count);
  const double mtp_top1 = mtp_scored > 0 ? static_cast<double>(mtp_hits) / static_cast<double>(mtp_scored) : 0.0;
  if (f.json) {
    nlohmann::json out = {{"perplexity", perplexity},
                          {"tokens", scored},
                          {"tokens_per_second", tokens_per_second},
                          {"nll_mean", nll_mean},
                          {"top1", top1},
                          {"device", std::string(backend.name())},
                          {"fp8_compute", fp8_compute_name(backend.fp8_compute())},
                          {"dtype", f.dtype},
                          // what --dtype (auto included) made bf16 weights multiply with
                          {"activations", cpu_bf16_activations(backend) == cpu::Bf16Activations::kF32 ? "float32"
                                                                                                   : "bfloat16"}};
    if (compare) {
      out["compare_dtype"] = compare_dtype;
      out["kl_mean"] = kl_mean;
      out["top1_agreement"] = top1_agreement;
      out["reference_perplexity"] = reference_perplexity;
    }
    if (mtp_model != nullptr) {
      out["mtp_top1"] = mtp_top1;
      out["mtp_tokens"] = mtp_scored;
    }
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  std::printf("perplexity %.4f over %lld tokens (mean NLL %.6f nats; windows of %lld tokens)\n",
              perplexity, static_cast<long long>(scored), nll_mean, static_cast<long long>(context));
  std::printf("top-1 accuracy %.4f\n", top1);
  if (compare)
    std::printf("against %s: mean KL %.6g nats, top-1 agreement %.4f, its perplexity %.4f\n",
                f.compare_model.c_str(), kl_mean, top1_agreement, reference_perplexity);
  if (mtp_model != nullptr)
    std::printf("MTP top-1 accuracy %.4f over %lld tokens\n", mtp_top1, static_cast<long long>(mtp_scored));
  std::printf("%.1f tokens/s in forward passes (%lld tokens, %.3f s) on %s, FP8 weights computed %s\n",
              tokens_per_second, static_cast<long long>(forwarded), seconds, std::string(backend.name()).c_str(),
              fp8_compute_name(backend.fp8_compute()));
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto flags = std::make_shared<EvalFlags>();
  CLI::App* cmd = app.add_subcommand("eval", "Measure a model's perplexity on a text file");
  cmd->add_option("--model", flags->model, "Hugging Face model directory (default: the bundled model)");
  CLI::Option* text = cmd->add_option("--text-file", flags->text_file,
                                      "UTF-8 text to score (encoded with the tokenizer's special tokens, e.g. BOS)");
  // Token ids used exactly as given (for comparisons against reference logits).
  CLI::Option* ids = cmd->add_option("--ids", flags->ids, "Token ids, e.g. 1,2,3")->group("");
  CLI::Option* ids_file = cmd->add_option("--ids-file", flags->ids_file,
                                          "Token ids separated by commas or whitespace, scored exactly as given");
  // The logits of every scored position, f32 [tokens, vocab] in position order (for tests).
  cmd->add_option("--logits-out", flags->logits_out, "Write the scored logits to this file")->group("");
  cmd->add_option("--max-tokens", flags->max_tokens, "Score only the first N tokens (0: all, the default)");
  cmd->add_option("--context", flags->context,
                  "Window length in tokens (default: the model's context length, at most 512)");
  cmd->add_option("--compare-model", flags->compare_model,
                  "Reference model directory: also report the mean KL(reference || model), top-1 agreement "
                  "and the reference's perplexity");
  cmd->add_option("--compare-dtype", flags->compare_dtype,
                  "--dtype of the reference model (default: --dtype's), e.g. --compare-model of --model itself "
                  "with float32: what bf16 activations cost");
  cmd->add_flag("--mtp", flags->mtp, "Also report the MTP layer's top-1 accuracy for the token after next");
  cmd->add_option("--device", flags->device, std::string("Backend: ") + available_devices() + " (default cpu)");
  cmd->add_option("--threads", flags->threads,
                  "CPU backend threads (default 0: the BASALT_NUM_THREADS environment variable, else one per "
                  "hardware thread)");
  cmd->add_option("--dtype", flags->dtype,
                  kDtypeHelp);
  cmd->add_option("--fp8-compute", flags->fp8_compute,
                  "How block-FP8 weights multiply: w8a8 (activations quantized per 1x128 group, the GPU default), "
                  "w8a16 (weight-only, the CPU's only mode), auto");
  cmd->add_flag("--json", flags->json,
                "Print {\"perplexity\", \"tokens\", \"tokens_per_second\", \"nll_mean\", \"top1\", \"device\", "
                "\"fp8_compute\", \"dtype\"}, with "
                "\"kl_mean\", \"top1_agreement\", \"reference_perplexity\", \"compare_dtype\" (--compare-model) and "
                "\"mtp_top1\", \"mtp_tokens\" (--mtp)");
  cmd->callback([flags, text, ids, ids_file] {
    flags->model = model_dir_or_bundled(flags->model);
    run_eval(*flags, text->count() > 0, ids->count() > 0, ids_file->count() > 0);
  });
}

}  // namespace basalt
