// DeepseekModel: the DeepSeek family (V2, V2-Lite, V3, R1) of MLA + MoE decoders.
//
// Forward pass, as DeepSeek's reference and transformers compute it: token
// embedding; per layer pre-norm multi-head latent attention and a pre-norm
// feed-forward block; final RMSNorm; lm_head.
//  * MLA: queries from q_proj, or q_a_proj -> q_a_layernorm -> q_b_proj
//    (q_lora_rank); kv_a_proj_with_mqa gives the latent (kv_lora_rank, then
//    kv_a_layernorm) and one shared rope key (qk_rope_head_dim). The KV cache
//    holds only [latent | rope key] per token and layer. Rope is DeepSeek's
//    interleaved (adjacent-pair) rotation of the last qk_rope_head_dim
//    features of each query head and of the shared key, with YaRN scaling;
//    the softmax scale is qk_head_dim^-0.5 times yarn_get_mscale(factor,
//    mscale_all_dim)^2. Prefill-sized steps use the expanded form (per-head
//    keys and values from kv_b_proj); decode and short steps (fewer than
//    about kv_lora_rank * (qk_nope + v_head_dim) / (2 * (kv_lora_rank +
//    qk_rope)) tokens per sequence) use the weight-absorbed form (one shared
//    latent key head). set_mla_form forces one.
//  * Feed-forward: a dense SwiGLU MLP in the first first_k_dense_replace
//    layers, MoE after: router logits in f32, sigmoid (V3) or softmax (V2)
//    scores, group-limited top-k with e_score_correction_bias used only for
//    selection, weights normalized when norm_topk_prob and times
//    routed_scaling_factor; experts run only on their tokens; plus the shared
//    experts. Groups not chosen are excluded outright (-inf), as DeepSeek's
//    inference code does since its "fix scores mask" change and as
//    transformers 5 does. Its first release multiplied the scores by the
//    group mask and the checkpoints' remote modeling code fills with 0.0;
//    that differs only when fewer than num_experts_per_tok experts of the
//    chosen groups have a positive biased score (then it may pick experts of
//    groups it did not choose, whichever the top-k's tie order gives).
//    Activations stay f32: DeepSeek's reference also quantizes activations
//    to e4m3 per 128 values for its FP8 GEMM (scale_fmt ue8m0 rounds those
//    scales to powers of two in V3.1); that is an approximation of the
//    dequantized-weight product computed here, and is not reproduced.
//  * Weights keep their checkpoint dtype and stay memory-mapped: bf16, or
//    float8_e4m3fn with float32 weight_scale_inv per 128x128 block
//    (quantization_config fp8), computed with on-the-fly dequantization.
//    Embedding, lm_head, norms and the router stay as published.
//  * The multi-token-prediction layer (model.layers.<num_hidden_layers>.*:
//    enorm, hnorm, eh_proj, a full decoder block, shared_head.norm and
//    shared_head.head, embed_tokens) is loaded when present and is the
//    model's draft_head() (model/draft_head.h): it computes
//      h = eh_proj([enorm(embed(token)) | hnorm(hidden)]),
//    runs its decoder block with its own one-layer latent cache, then
//    shared_head.norm and shared_head.head. This is vLLM's deepseek_mtp
//    order (embedding first in the concatenation, the main model's normed
//    final hidden state as vLLM and SGLang pass it); vLLM also zeroes the
//    embedding of a token at position 0, which is not done here. Plain
//    generation does not use it.
//  * Tensor parallelism (a Communicator given, N ranks): query heads split
//    (q_proj / q_b_proj and kv_b_proj rows, o_proj columns, all-reduced);
//    the latent projection and its cache on every rank; the dense and shared
//    MLPs split in 1/N slices; routed experts split whole, each rank running
//    its experts on the (token, choice) pairs routed to them, one all-reduce
//    per feed-forward; vocabulary rows of the embedding and lm_head
//    (model/tp_shard.h). FP8 weights split only at whole 128x128 blocks. The
//    MTP layer splits the same way (its own embedding and head, where the
//    checkpoint has them, by vocabulary rows; eh_proj whole); each rank's
//    draft_head() is its shard, and model/tensor_parallel.h runs them. This is
//    tensor parallelism with expert parallelism over tokens every rank has
//    (SGLang's EP MoE under TP).
//  * DP attention (RankRole::dp_attention, N ranks): every rank holds the
//    whole model (attention, its latent cache, dense layers, shared experts,
//    embedding and lm_head) but the routed experts, split whole over the
//    ranks as above, and runs a batch of its own. In each MoE layer a rank
//    sends every (token, choice) pair's hidden state to the rank of its
//    expert (all-to-all dispatch), runs its experts on the pairs it
//    receives, and sends the results back (combine), where each token sums
//    its choices in choice order; no all-reduce. Every rank of the group
//    must take part in every step: a rank without tokens calls
//    forward_idle(), which serves its experts to the others. A rank whose
//    forward fails after it began finishes the step's exchanges idle, so
//    the others do not wait, then throws (a failure inside an exchange, a
//    broken group, is not recovered). The MTP layer (draft_head()) is each
//    rank's whole but for its routed experts, and its passes meet like
//    steps: every rank takes part in each, a rank without tokens through
//    forward_mtp_idle(). With RankRole::dp_moe = DpMoe::kGather the tokens
//    reach the experts by gathering instead: each forward first agrees on
//    the step's largest batch (one all-gather of the ranks' counts, read on
//    the host, unless the caller, who sees every rank's batch, set it with
//    set_step_rows), then in each MoE layer every rank's rows, padded with
//    zeros to it, are all-gathered, every rank routes them all and runs its
//    own experts on the pairs routed to them, and one reduce-scatter sums
//    the ranks' parts, each rank receiving its own rows. Collectives of
//    fixed size within a step and no host read per layer (the exchange
//    reads its counts each layer); the sums are in another order than the
//    exchange's. By gathering, RankRole::dense_tp splits the dense layers'
//    MLPs and the shared experts over the ranks as tensor parallelism does
//    (gate/up rows, down columns): in an MoE layer each rank adds its slice
//    of the shared experts on the gathered rows into its part before the
//    reduce-scatter (no collective of its own); a dense layer gathers,
//    runs its slice and reduce-scatters the same way, so ranks without
//    tokens take part in dense layers too. A rank then holds 1/N of those
//    weights, and a decode step reads 1/N of them. With an attention group
//    (RankRole::attention, A ranks of one DP group sharing its batch) the
//    heads, vocabulary and, without dense_tp, the dense and shared MLPs
//    split over those A as tensor parallelism splits them (all-reduced over
//    the A), the latent cache on each; before each exchange or gathering,
//    each of the A takes its share of the rows (ceil(T / A) a rank, in rank
//    order), so no expert sees a row twice, the other rows of its output
//    zero, and the feed-forward's all-reduce over the A puts them together.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"

namespace basalt {

class Checkpoint;

enum class MlaForm {
  kAuto,      // expanded for prefill-sized steps, absorbed for decode-sized ones
  kExpanded,  // per-head keys and values rebuilt from the latent cache
  kAbsorbed,  // queries projected into the latent space
};

class DeepseekModel : public Model {
 public:
  virtual void set_mla_form(MlaForm form) = 0;
  // DP attention: this rank's part in a step in which it has no tokens.
  virtual void forward_idle() = 0;
  // DP attention: this rank's part in a pass of the MTP layer (draft_head())
  // in which it has no tokens; throws without an MTP layer.
  virtual void forward_mtp_idle() = 0;
  // DP attention by gathering: the rows every rank pads to in this rank's
  // forwards, forward_idle calls and passes of the MTP layer from now on,
  // agreed by a caller that sees every rank's batch and sets the same value
  // on every rank before each step (at least each rank's token count); the
  // calls then skip their all-gather of the counts, so they can be recorded
  // into graphs. -1 (the default): each call agrees by itself;
  // kStepRowsOwnTokens: each call its own token count (the caller gives
  // every rank batches of one size, as when recording graphs). Ignored by a
  // model that does not run DP attention by gathering.
  static constexpr int64_t kStepRowsOwnTokens = -2;
  virtual void set_step_rows(int64_t rows) = 0;
  // Makes room now (on the calling thread, its device current) for the
  // per-step constants of steps of up to `rows` tokens on each rank, so that
  // no step recorded into a graph grows them (a graph cannot record that
  // host copy): by gathering with the dense MLPs split, a step runs them on
  // every rank's rows.
  virtual void reserve_step_rows(int64_t rows) = 0;
};

// `role`: the rank's part in a group (model/model.h); what a rank holds is
// written above DeepseekModelImpl::plan_shards.
std::unique_ptr<DeepseekModel> load_deepseek_model(const ModelConfig& config, const Checkpoint& checkpoint,
                                                   Backend& backend, const RankRole& role = {});

}  // namespace basalt
