// Weight quantization of checkpoints: block FP8 in DeepSeek-V3's published
// format, and the integer formats of core/int_weights.h (below).
//
// Format: a 2-D linear weight [out, in] becomes float8_e4m3fn ("F8_E4M3")
// plus a float32 "<name>_scale_inv" [ceil(out/128), ceil(in/128)]. For each
// 128x128 block (partial at the right and bottom edges) scale_inv =
// amax(|block|) / 448, or 1 for an all-zero block, and each element is
// f32_to_fp8e4m3(w / scale_inv): round to nearest even, saturated at +-448.
// Dequantization is fp8e4m3_to_f32(q) * scale_inv, which is what the DeepSeek
// loader computes. The largest element of every non-zero block maps to +-448,
// and for every element |w - dequantized| <= max(|w| * 2^-4, scale_inv * 2^-10)
// (half an e4m3 ulp: 3 mantissa bits in the normal range, a fixed 2^-9 step
// among subnormals), up to float32 rounding of the division.
//
// quantize_checkpoint (block FP8) rewrites a DeepSeek-V2/V3 checkpoint directory
// tensor by tensor: every decoder (and MTP) linear weight is quantized; the
// embeddings, lm_head, norms, the router (mlp.gate) and its
// e_score_correction_bias, biases and anything else are copied unchanged.
// Output shards keep the input's file names and tensor-to-file assignment,
// with model.safetensors.index.json when the input had one or several files;
// config.json gains a quantization_config, and the tokenizer, generation
// config and remote-code files are copied. Memory use is one tensor's FP8
// image plus the scales of one shard; input shards stay memory-mapped.
// Dense (Llama-family) checkpoints are refused: their loader reads f32, bf16
// and f16 weights only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "model/config.h"

namespace basalt {

class Checkpoint;

inline constexpr int64_t kFp8QuantBlock = 128;
inline constexpr float kFp8E4M3Max = 448.0f;

struct Fp8BlockWeight {
  Tensor weight;     // f8_e4m3 [out, in]
  Tensor scale_inv;  // f32 [ceil(out/128), ceil(in/128)]
};

// The block scales of a host 2-D f32, bf16 or f16 tensor. Throws when an
// element is not finite; `label` (usually the tensor name) starts the message.
Tensor fp8_block_scales(const Tensor& weight, std::string_view label = "weight");
// Quantizes `weight` with the given scales (as fp8_block_scales computes them).
Tensor fp8_block_quantize(const Tensor& weight, const Tensor& scale_inv);
Fp8BlockWeight quantize_fp8_block(const Tensor& weight);
// f32 [out, in]: fp8e4m3_to_f32(q) * scale_inv of the element's block.
Tensor dequantize_fp8_block(const Tensor& weight, const Tensor& scale_inv);

// Whether a checkpoint tensor is a decoder or MTP linear weight that the
// block-FP8 format stores quantized: model.layers.<n>.(...).<proj>.weight of
// rank 2, where <proj> is q_proj, q_a_proj, q_b_proj, kv_a_proj_with_mqa,
// kv_b_proj, o_proj, gate_proj, up_proj or down_proj. The MTP layer's
// eh_proj stays as it is: DeepSeek-V3's published FP8 checkpoint keeps it in
// bf16 (it has no eh_proj.weight_scale_inv), and serving engines load it as
// an unquantized linear.
bool is_fp8_block_linear(std::string_view name, const Shape& shape);

// --- Integer formats (core/int_weights.h; config.h IntWeightsConfig) -------
//
// `basalt quantize --format int8|int4` stores a linear weight "X.weight"
// [N, K] as its codes under the same name (i8 [N, blocks * 32], or u8
// [N, blocks * 16] for int4) and its f16 group scales as "X.weight_scale"
// [N, ceil(K / group)]. Which weights: every decoder linear a model runs
// through a linear op (is_fp8_block_linear's names, except DeepSeek's
// kv_b_proj, which MLA attention reads row by row) and a dense model's
// lm_head (written from the embedding when the two are tied; config.json's
// tie_word_embeddings then becomes false).

// Whether `name` of `shape` in a checkpoint of `config` is stored in the
// integer format.
bool is_int_linear(std::string_view name, const Shape& shape, const ModelConfig& config);

// Reads "name" [n, k] in the integer format config.int_weights says, with
// its scales, as a host LinearWeight; throws basalt::Error naming the file
// and tensor when a dtype or shape is not the format's.
LinearWeight read_int_linear(const Checkpoint& ckpt, const std::string& name, int64_t n, int64_t k,
                             const ModelConfig& config);

enum class QuantFormat : uint8_t { kFp8Block, kInt8, kInt4 };

struct QuantizeOptions {
  bool force = false;  // write into an output directory that is not empty
  QuantFormat format = QuantFormat::kFp8Block;
  // Integer formats: input columns per scale, a multiple of 32, or -1 for
  // one scale per row.
  int64_t group_size = 32;
};

struct QuantizeReport {
  int64_t tensors_quantized = 0;
  int64_t tensors_copied = 0;
  uint64_t bytes_before = 0;  // tensor data of the input
  uint64_t bytes_after = 0;   // tensor data of the output, scales included
  std::vector<std::string> files;  // the safetensors files written
};

// progress(done, total): bytes of input tensor data processed so far, out
// of all; called with (0, total) first and last with done == total.
using QuantizeProgress = std::function<void(uint64_t done, uint64_t total)>;

// Writes a quantized copy of the checkpoint in `in_dir` in options.format:
// block FP8 (DeepSeek-V2/V3 only, as above) or an integer format (any
// architecture; is_int_linear says which weights). Throws basalt::Error
// (naming the directory, file or tensor) when the input is missing, is of
// an architecture the format does not take, is already quantized or holds a
// weight that is not f32/bf16/f16, when the group size is not valid, or when
// out_dir is the input, is a file, or is a non-empty directory and
// options.force is false. With force, stale *.safetensors files and the
// index in out_dir are removed first.
QuantizeReport quantize_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                   const QuantizeOptions& options = {}, const QuantizeProgress& progress = {});

}  // namespace basalt
