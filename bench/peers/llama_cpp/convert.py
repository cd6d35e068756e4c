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

Only what the comparison writes is supported: one model.safetensors, a
`llama` config, bf16 tensors. Anything else is refused with a message.
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


def load_model(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    if config.get("model_type") != "llama":
        fail(f"{model_dir}: model_type {config.get('model_type')!r}, only 'llama' is written")
    path = os.path.join(model_dir, "model.safetensors")
    if not os.path.exists(path):
        fail(f"{path}: missing (one model.safetensors is expected)")
    tensors = read_safetensors(path)
    for name, (dtype, _, _) in tensors.items():
        if dtype != "BF16":
            fail(f"{name}: dtype {dtype}, only BF16 checkpoints are converted")
    return config, tensors


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


def write_gguf(args):
    sys.path.insert(0, args.gguf_py)
    import gguf  # llama.cpp's gguf-py, from the checkout

    config, tensors = load_model(args.model)
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

    with open(os.path.join(args.model, "tokenizer.json")) as f:
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

    matrix_type = gguf.GGMLQuantizationType.BF16 if args.type == "bf16" else gguf.GGMLQuantizationType.F16

    def matrix(name, rows_permute_heads=None):
        _, shape, raw = tensors[name]
        if args.type == "bf16" and rows_permute_heads is None:
            return raw.view(np.uint16).reshape(shape), matrix_type
        values = bf16_to_f32(raw, shape)
        if rows_permute_heads is not None:
            values = to_interleaved_rope(values, rows_permute_heads)
        if args.type == "bf16":
            return np.ascontiguousarray((values.view(np.uint32) >> 16).astype(np.uint16)), matrix_type
        return values.astype(np.float16), matrix_type

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


def write_f16(args):
    config, tensors = load_model(args.model)
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
