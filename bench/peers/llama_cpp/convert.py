#!/usr/bin/env python3
"""Writes one Hugging Face Llama checkpoint in the other forms the llama.cpp
comparison needs, with the same weight bits in each.

  convert.py gguf MODEL_DIR OUT.gguf --type bf16|f16 --gguf-py LLAMA_CPP/gguf-py
  convert.py f16 MODEL_DIR OUT_DIR

`gguf` writes a llama.cpp GGUF file: every matrix in the requested type
(bf16 copies the checkpoint's bits; f16 rounds them, as the `f16` form does,
so both engines see the same f16 values), norms in f32, the query and key
rows reordered from Hugging Face's rotate-half layout to the interleaved one
llama.cpp's rope expects, Llama 3's rope scaling as the `rope_freqs` factors,
and the checkpoint's byte-level BPE tokenizer (tokenizer.json) as a `gpt2`
vocabulary. It needs only numpy and llama.cpp's own gguf-py (not installed:
the checkout's directory is put on the path).

`f16` writes OUT_DIR as MODEL_DIR with every bf16 tensor of model.safetensors
rounded to f16 (norms too: Basalt reads either), the other files copied.

`gguf` also writes a DeepSeek-V3 checkpoint (the bundled model) as llama.cpp's
deepseek2 architecture (write_deepseek_gguf says what differs).

Only what the comparison writes is supported: a `llama` (or, for `gguf`,
`deepseek_v3`) config, bf16 tensors (f32 ones too for DeepSeek's router
biases), one model.safetensors or an index of shards. Anything else is
refused with a message.
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys

import numpy as np


def fail(message):
    sys.exit(f"convert.py: {message}")


def read_safetensors(path):
    """name -> (dtype string, shape, numpy view of the raw bytes)."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        tensors[name] = (info["dtype"], info["shape"], data[begin:end])
    return tensors


def bf16_to_f32(raw, shape):
    bits = raw.view(np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32).reshape(shape)


def load_model(model_dir, model_types=("llama",)):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    if config.get("model_type") not in model_types:
        fail(f"{model_dir}: model_type {config.get('model_type')!r}, expected one of {', '.join(model_types)}")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        path = os.path.join(model_dir, name)
        if not os.path.exists(path):
            fail(f"{path}: missing")
        tensors.update(read_safetensors(path))
    for name, (dtype, _, _) in tensors.items():
        if dtype not in ("BF16", "F32"):
            fail(f"{name}: dtype {dtype}, only BF16 (and F32) checkpoints are converted")
    return config, tensors


def require_bf16(tensors):
    for name, (dtype, _, _) in tensors.items():
        if dtype != "BF16":
            fail(f"{name}: dtype {dtype}, a Llama checkpoint is converted from BF16 tensors only")


def encode_matrix(gguf, values, kind):
    """f32 values (exactly bf16 ones) as a GGUF matrix of `kind` ("bf16" or
    "f16"): the data and the raw type to write it with."""
    if kind == "bf16":
        bits = np.ascontiguousarray((values.view(np.uint32) >> 16).astype(np.uint16))
        return bits, gguf.GGMLQuantizationType.BF16
    return values.astype(np.float16), gguf.GGMLQuantizationType.F16


def as_f32(entry):
    dtype, shape, raw = entry
    return bf16_to_f32(raw, shape) if dtype == "BF16" else raw.view(np.float32).reshape(shape)


def rope_factors(config):
    """Llama 3's per-frequency divisors (None without llama3 scaling)."""
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        return None
    dim = config["hidden_size"] // config["num_attention_heads"]
    base = config.get("rope_theta", 10000.0)
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = original / low, original / high
    factors = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * base ** (i / dim)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def to_interleaved_rope(rows, heads):
    """HF keeps each head's rotated pairs as (i, i + d/2); llama.cpp as (2i, 2i+1)."""
    out_dim = rows.shape[0]
    return rows.reshape(heads, 2, out_dim // heads // 2, -1).swapaxes(1, 2).reshape(rows.shape)


def add_vocabulary(gguf, writer, model_dir, config):
    """The checkpoint's byte-level BPE tokenizer as a gpt2 vocabulary."""
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    model = tokenizer["model"]
    if model.get("type") != "BPE":
        fail("tokenizer.json: only a byte-level BPE tokenizer is written")
    vocab = dict(model["vocab"])
    special = set()
    for added in tokenizer.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
        if added.get("special"):
            special.add(added["id"])
    size = max(config["vocab_size"], max(vocab.values()) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    for text, i in vocab.items():
        tokens[i] = text
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(size)]
    for i in range(size):
        if tokens[i] == f"[PAD{i}]":
            types[i] = gguf.TokenType.UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    if config.get("bos_token_id") is not None:
        writer.add_bos_token_id(config["bos_token_id"])
    if config.get("eos_token_id") is not None:
        eos = config["eos_token_id"]
        writer.add_eos_token_id(eos[0] if isinstance(eos, list) else eos)


def write_gguf(args):
    sys.path.insert(0, args.gguf_py)
    import gguf  # llama.cpp's gguf-py, from the checkout

    config, tensors = load_model(args.model, ("llama", "deepseek_v3"))
    if config["model_type"] == "deepseek_v3":
        write_deepseek_gguf(args, gguf, config, tensors)
        return
    require_bf16(tensors)
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config["hidden_size"] // heads
    writer = gguf.GGUFWriter(args.out, "llama")
    writer.add_name(os.path.basename(os.path.normpath(args.model)))
    writer.add_context_length(config.get("max_position_embeddings", 4096))
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-5))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if args.type == "bf16" else gguf.LlamaFileType.MOSTLY_F16)
    add_vocabulary(gguf, writer, args.model, config)

    def matrix(name, rows_permute_heads=None):
        _, shape, raw = tensors[name]
        if args.type == "bf16" and rows_permute_heads is None:
            return raw.view(np.uint16).reshape(shape), gguf.GGMLQuantizationType.BF16  # the bits as they are
        values = bf16_to_f32(raw, shape)
        if rows_permute_heads is not None:
            values = to_interleaved_rope(values, rows_permute_heads)
        return encode_matrix(gguf, values, args.type)

    def vector(name):
        _, shape, raw = tensors[name]
        return bf16_to_f32(raw, shape).astype(np.float32), None

    names = {
        "model.embed_tokens.weight": ("token_embd.weight", matrix),
        "model.norm.weight": ("output_norm.weight", vector),
    }
    if "lm_head.weight" in tensors:
        names["lm_head.weight"] = ("output.weight", matrix)
    per_layer = {
        "input_layernorm.weight": ("attn_norm.weight", vector),
        "post_attention_layernorm.weight": ("ffn_norm.weight", vector),
        "self_attn.q_proj.weight": ("attn_q.weight", lambda n: matrix(n, heads)),
        "self_attn.k_proj.weight": ("attn_k.weight", lambda n: matrix(n, kv_heads)),
        "self_attn.v_proj.weight": ("attn_v.weight", matrix),
        "self_attn.o_proj.weight": ("attn_output.weight", matrix),
        "mlp.gate_proj.weight": ("ffn_gate.weight", matrix),
        "mlp.up_proj.weight": ("ffn_up.weight", matrix),
        "mlp.down_proj.weight": ("ffn_down.weight", matrix),
    }
    for layer in range(config["num_hidden_layers"]):
        for suffix, (target, read) in per_layer.items():
            names[f"model.layers.{layer}.{suffix}"] = (f"blk.{layer}.{target}", read)
    unknown = sorted(set(tensors) - set(names))
    if unknown:
        fail(f"tensors with no GGUF name: {', '.join(unknown[:5])}")
    factors = rope_factors(config)
    if factors is not None:
        writer.add_tensor("rope_freqs.weight", factors)
    for source, (target, read) in names.items():
        if source not in tensors:
            fail(f"{source}: missing from model.safetensors")
        values, raw_dtype = read(source)
        writer.add_tensor(target, values, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_deepseek_gguf(args, gguf, config, tensors):
    """DeepSeek-V3 as llama.cpp's deepseek2 architecture: the decoder layers
    (the MTP layer past num_hidden_layers is left out: llama.cpp does not run
    it), routed experts stacked into one tensor per projection, routers and
    norms in f32. llama.cpp of this era routes without DeepSeek's expert
    groups (n_group/topk_group), so its expert choices can differ from the
    checkpoint's; the work per token is the same."""
    layers = config["num_hidden_layers"]
    writer = gguf.GGUFWriter(args.out, "deepseek2")
    writer.add_name(os.path.basename(os.path.normpath(args.model)))
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_attention_heads"])
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_leading_dense_block_count(config["first_k_dense_replace"])
    writer.add_vocab_size(config["vocab_size"])
    if config.get("q_lora_rank"):
        writer.add_q_lora_rank(config["q_lora_rank"])
    writer.add_kv_lora_rank(config["kv_lora_rank"])
    writer.add_key_length(config["qk_nope_head_dim"] + config["qk_rope_head_dim"])
    writer.add_value_length(config["v_head_dim"])
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_expert_count(config["n_routed_experts"])
    writer.add_expert_shared_count(config["n_shared_experts"])
    writer.add_expert_weights_scale(config["routed_scaling_factor"])
    writer.add_expert_weights_norm(config["norm_topk_prob"])
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if config.get("scoring_func") == "sigmoid"
                                  else gguf.ExpertGatingFuncType.SOFTMAX)
    writer.add_rope_dimension_count(config["qk_rope_head_dim"])
    scaling = config.get("rope_scaling") or {}
    if scaling.get("type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(scaling["factor"])
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_log_mul(0.1 * scaling["mscale_all_dim"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if args.type == "bf16" else gguf.LlamaFileType.MOSTLY_F16)
    add_vocabulary(gguf, writer, args.model, config)

    def put(target, values, raw=True):
        data, dtype = (encode_matrix(gguf, values, args.type) if raw
                       else (np.ascontiguousarray(values, dtype=np.float32), None))
        writer.add_tensor(target, data, raw_dtype=dtype)

    get = lambda name: as_f32(tensors[name])
    put("token_embd.weight", get("model.embed_tokens.weight"))
    put("output_norm.weight", get("model.norm.weight"), raw=False)
    put("output.weight", get("lm_head.weight"))
    attention = {"q_a_proj": "attn_q_a", "q_b_proj": "attn_q_b", "kv_a_proj_with_mqa": "attn_kv_a_mqa",
                 "kv_b_proj": "attn_kv_b", "o_proj": "attn_output"}
    for i in range(layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        put(b + "attn_norm.weight", get(p + "input_layernorm.weight"), raw=False)
        put(b + "ffn_norm.weight", get(p + "post_attention_layernorm.weight"), raw=False)
        put(b + "attn_kv_a_norm.weight", get(p + "self_attn.kv_a_layernorm.weight"), raw=False)
        if config.get("q_lora_rank"):
            put(b + "attn_q_a_norm.weight", get(p + "self_attn.q_a_layernorm.weight"), raw=False)
        for source, target in attention.items():
            if p + f"self_attn.{source}.weight" in tensors:
                put(b + target + ".weight", get(p + f"self_attn.{source}.weight"))
        if i < config["first_k_dense_replace"]:
            for proj in ("gate", "up", "down"):
                put(b + f"ffn_{proj}.weight", get(p + f"mlp.{proj}_proj.weight"))
            continue
        put(b + "ffn_gate_inp.weight", get(p + "mlp.gate.weight"), raw=False)
        if p + "mlp.gate.e_score_correction_bias" in tensors:
            put(b + "exp_probs_b.bias", get(p + "mlp.gate.e_score_correction_bias"), raw=False)
        for proj in ("gate", "up", "down"):
            stacked = np.stack([get(p + f"mlp.experts.{e}.{proj}_proj.weight")
                                for e in range(config["n_routed_experts"])])
            put(b + f"ffn_{proj}_exps.weight", stacked)
            put(b + f"ffn_{proj}_shexp.weight", get(p + f"mlp.shared_experts.{proj}_proj.weight"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_f16(args):
    config, tensors = load_model(args.model)
    require_bf16(tensors)
    os.makedirs(args.out, exist_ok=False)
    for name in os.listdir(args.model):
        if name not in ("model.safetensors", "config.json"):
            shutil.copy2(os.path.join(args.model, name), os.path.join(args.out, name))
    config["torch_dtype"] = "float16"
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    header, offset = {}, 0
    for name, (_, shape, raw) in tensors.items():
        size = raw.size  # bf16 and f16 take the same bytes
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(os.path.join(args.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, (_, shape, raw) in tensors.items():
            f.write(bf16_to_f32(raw, shape).astype(np.float16).tobytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gguf")
    g.add_argument("model")
    g.add_argument("out")
    g.add_argument("--type", choices=["bf16", "f16"], required=True)
    g.add_argument("--gguf-py", required=True, help="the gguf-py directory of a llama.cpp checkout")
    h = sub.add_parser("f16")
    h.add_argument("model")
    h.add_argument("out")
    args = parser.parse_args()
    write_gguf(args) if args.command == "gguf" else write_f16(args)


if __name__ == "__main__":
    main()
