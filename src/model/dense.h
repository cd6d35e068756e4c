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
//
// Tensor parallelism (`tp` given, world N > 1; Megatron's layout, as vLLM and
// SGLang shard these models): rank r holds query heads [r*Hq/N, (r+1)*Hq/N)
// with the key/value heads they read (num_kv_heads/N of them, or, with fewer
// key/value heads than ranks, the one head its queries share: replicated on
// N/num_kv_heads ranks), the matching input columns of o_proj, a 1/N slice of
// gate, up (rows) and down (columns), and vocabulary rows [r*V/N, (r+1)*V/N)
// of the embedding and lm_head. o_proj and down_proj give partial sums that
// an all-reduce adds up (their biases added by rank 0 alone); the embedding's
// lookups are summed the same way (ids outside a rank's rows read zeros); the
// lm_head's column blocks are all-gathered. Every rank runs forward on the
// same batch and ends with the full logits; its KV holds only its own heads.
// Norm weights are replicated. The divisibility a layout needs is checked at
// load with the config field named. Ranks on the CPU backend for now.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"

namespace basalt {

class Checkpoint;
class Communicator;

std::unique_ptr<Model> load_dense_model(const ModelConfig& config, const Checkpoint& checkpoint,
                                        Backend& backend, Communicator* tp = nullptr);

}  // namespace basalt
