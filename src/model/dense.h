// DenseModel: the Llama family of decoder-only transformers.
//
// Llama 1/2/3.x, Mistral, Qwen2/2.5 and Qwen3 share one forward pass: token
// embedding; per layer pre-norm attention (q/k/v projections with optional
// bias, optional per-head q/k RMSNorm, rotary embedding, GQA causal attention
// with an optional sliding window, output projection) and pre-norm SwiGLU MLP;
// final RMSNorm; a language-model head that may be tied to the embedding.
// The differences are config flags (model/config.h). Weights keep their
// checkpoint dtype; q, k and v projections are concatenated at load (one
// linear, then qkv_rope_store), and so are gate and up (one linear produces
// the [T, 2I] input of silu_and_mul).
#pragma once

#include <memory>
#include <string>

#include "model/model.h"

namespace basalt {

class Checkpoint;

std::unique_ptr<Model> load_dense_model(const ModelConfig& config, const Checkpoint& checkpoint,
                                        Backend& backend);

}  // namespace basalt
