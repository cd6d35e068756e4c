// EAGLE-style draft heads: a small decoder trained on a model's own hidden
// states (tools/train/train_eagle.py trains one for any supported model),
// drafting through the DraftHead interface as DeepSeek's MTP layer does.
//
// Format: a directory with config.json in the Llama form (hidden_size,
// intermediate_size, num_hidden_layers (usually 1), num_attention_heads,
// num_key_value_heads, rms_norm_eps, rope_theta, rope_scaling,
// max_position_embeddings, vocab_size) plus "basalt_eagle_head": true, and
// safetensors holding a Llama checkpoint of that config (model.layers.N.*,
// model.norm.weight) and the input projection eagle.fc.weight [H, 2H],
// eagle.fc.bias [H]. The embedding and lm_head are the target model's
// (read from its checkpoint; the trainer keeps them frozen) unless the head
// stores its own model.embed_tokens.weight or lm_head.weight.
//
// The step (DraftHead's contract): for token i (the token that follows the
// target's position i) and the target's final hidden state h_i (after its
// final norm), x_i = fc([embed(token_i), h_i]) + bias; the decoder layers
// run over x at the batch's positions with the head's own KV cache; the
// last layer's output r_i (before the final norm) is the head's hidden
// state, which it is trained to make equal to h_{i+1} and which chained
// drafts feed back in place of h; logits = lm_head(norm(r_i)).
//
// load_eagle_head() reads the head from `dir` for the model in
// `target_dir`, checks that the head's hidden size and vocabulary equal the
// target's and that every tensor the head stores is used; errors name the
// directory. The target's embedding and lm_head are loaded again for the
// head (a second copy on the device). with_draft_head() makes a Model whose draft_head() is `head`
// (everything else is `model`'s), so a GraphedModel over it graphs the
// head's steps too.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"

namespace basalt {

std::unique_ptr<DraftHead> load_eagle_head(const std::string& dir, Backend& backend, const std::string& target_dir);
std::unique_ptr<Model> with_draft_head(std::unique_ptr<Model> model, std::unique_ptr<DraftHead> head);

}  // namespace basalt
