// basalt_dump_hidden: runs a model over a text corpus and writes, for every
// position, the token and the model's final hidden state (after its final
// norm: what lm_head reads and what a draft head is given), the training
// data of tools/train/train_eagle.py.
//
//   basalt_dump_hidden --model DIR --text FILE --out FILE.safetensors
//                      [--sequences N] [--seq-len L] [--skip N] [--device cpu|cuda]
//
// The text is split into documents at lines holding only the record
// separator 0x1E (the corpus format of tools/corpus), or read as one
// document; each document is encoded with the tokenizer's special tokens
// (BOS where the tokenizer adds one) and followed by the first EOS id, and
// the token stream is cut into --sequences windows of --seq-len tokens (the
// first --skip windows left out, so that two dumps can hold disjoint text).
// Each window runs through the model as one sequence from position 0.
// Output: "tokens" i32 [N, L] and "hidden" bf16 [N, L, hidden_size], with
// the model directory in the metadata. Exit status 2 on bad flags, 1 on
// any other error (the message names it).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "app/device_choice.h"
#include "core/dtype.h"
#include "core/error.h"
#include "model/forward_batch.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace basalt;

std::vector<std::string> read_documents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  BASALT_CHECK(in.good(), "{}: cannot open", path);
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  std::vector<std::string> docs;
  const std::string separator = "\n\x1e\n";
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = text.find(separator, start);
    const std::string doc = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (doc.find_first_not_of(" \t\r\n") != std::string::npos) docs.push_back(doc);
    if (end == std::string::npos) break;
    start = end + separator.size();
  }
  return docs;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Dumps a model's final hidden states over a text corpus (training data for an EAGLE head)"};
  std::string model_dir, text_path, out_path, device = "cpu";
  int64_t sequences = 256, seq_len = 512, skip = 0;
  app.add_option("--model", model_dir, "Model directory")->required();
  app.add_option("--text", text_path, "Text corpus (documents separated by lines holding 0x1E)")->required();
  app.add_option("--out", out_path, "Output safetensors file")->required();
  app.add_option("--sequences", sequences, "Windows to dump (default 256)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--seq-len", seq_len, "Tokens per window (default 512)")->check(CLI::Range(2, 1 << 16));
  app.add_option("--skip", skip, "Windows to leave out first (default 0)")->check(CLI::NonNegativeNumber);
  app.add_option("--device", device, std::string("Device: ") + available_devices());
  CLI11_PARSE(app, argc, argv);
  try {
    std::unique_ptr<Backend> backend = make_backend(device);
    std::unique_ptr<Model> model = load_model(model_dir, *backend);
    const ModelConfig& config = model->config();
    BASALT_CHECK(seq_len <= config.max_position_embeddings, "--seq-len {} is past the model's {} positions", seq_len,
                 config.max_position_embeddings);
    const Tokenizer tokenizer = Tokenizer::from_file(model_dir + "/tokenizer.json");
    BASALT_CHECK(!config.eos_token_ids.empty(), "{}: the model names no EOS token", model_dir);

    // The token stream, as far as the windows need.
    const int64_t wanted = (skip + sequences) * seq_len;
    std::vector<int32_t> stream;
    for (const std::string& doc : read_documents(text_path)) {
      const std::vector<int32_t> ids = tokenizer.encode(doc, /*add_special_tokens=*/true);
      stream.insert(stream.end(), ids.begin(), ids.end());
      stream.push_back(config.eos_token_ids[0]);
      if (static_cast<int64_t>(stream.size()) >= wanted) break;
    }
    BASALT_CHECK(static_cast<int64_t>(stream.size()) >= wanted,
                 "{}: {} tokens, fewer than the {} that {} windows of {} after skipping {} need", text_path,
                 stream.size(), wanted, sequences, seq_len, skip);

    const int64_t H = config.hidden_size;
    Tensor tokens = Tensor::empty({sequences, seq_len}, DType::kI32);
    Tensor hidden = Tensor::empty({sequences, seq_len, H}, DType::kBF16);
    KvBuffers kv = model->allocate_kv(seq_len, DType::kF32);
    Tensor logits = backend->empty({1, config.vocab_size}, DType::kF32);
    Tensor states = backend->empty({seq_len, H}, DType::kF32);
    Tensor host_states = Tensor::empty({seq_len, H}, DType::kF32);
    for (int64_t s = 0; s < sequences; ++s) {
      const int32_t* window = stream.data() + (skip + s) * seq_len;
      std::copy_n(window, seq_len, tokens.data<int32_t>() + s * seq_len);
      const ForwardBatch batch = single_sequence_batch(std::span<const int32_t>(window, static_cast<size_t>(seq_len)), 0);
      model->forward(batch, kv, logits, &states);
      backend->copy(states, host_states);
      const float* from = host_states.data<const float>();
      uint16_t* to = hidden.data<uint16_t>() + s * seq_len * H;
      for (int64_t i = 0; i < seq_len * H; ++i) to[i] = f32_to_bf16(from[i]);
      if ((s + 1) % 64 == 0 || s + 1 == sequences)
        std::fprintf(stderr, "dumped %lld of %lld windows\n", static_cast<long long>(s + 1),
                     static_cast<long long>(sequences));
    }
    write_safetensors(out_path, {{"tokens", tokens}, {"hidden", hidden}},
                      {{"model", model_dir}, {"hidden", "final hidden state after the model's final norm"}});
    std::printf("wrote %s: %lld windows of %lld tokens, hidden size %lld\n", out_path.c_str(),
                static_cast<long long>(sequences), static_cast<long long>(seq_len), static_cast<long long>(H));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "basalt_dump_hidden: %s\n", e.what());
    return 1;
  }
}
