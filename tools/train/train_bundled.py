#!/usr/bin/env python3
"""Trains the models that ship with Basalt: the tokenizer, basalt-mini (a small
DeepSeek-V3) and basalt-draft (a small dense Llama), from the corpus that
tools/corpus/build_corpus.sh builds.

  python3 tools/train/train_bundled.py --corpus CORPUS_DIR --out OUT_DIR [options]

(--help lists the options; models/MODELS.md gives the two commands that
produced the shipped models.)

Needs torch with a CUDA GPU, tokenizers, safetensors, and transformers (only to
check the written checkpoints). Steps, each bounded in wall-clock time:

 1. A byte-level BPE tokenizer (8192 entries) with DeepSeek-V3's pre-tokenizer,
    trained on CORPUS_DIR/train.txt; special tokens <｜begin▁of▁sentence｜>,
    <｜end▁of▁sentence｜>, <｜▁pad▁｜>, <｜User｜>, <｜Assistant｜>.
 2. The corpus tokenized as [BOS] document [EOS] ...
 3. Both models are built in plain PyTorch with the Hugging Face parameter
    layout, trained briefly, written, and loaded back by transformers to check
    that the two compute the same logits, before any long training starts.
 4. basalt-mini: DeepSeek-V3 architecture (MLA with q_lora_rank, a dense first
    layer, MoE with sigmoid group-limited routing, auxiliary-loss-free load
    balancing through e_score_correction_bias, one shared expert, YaRN rope)
    plus one multi-token-prediction (MTP) layer trained with weight 0.3 to
    predict token t+2 from the main model's final normed hidden state at t
    and the embedding of token t+1, as DeepSeek-V3 does.
 5. basalt-draft: Llama architecture, tied embeddings, about 2M parameters.
 6. The weights of the best validation step are written in bf16 in the
    published Hugging Face layout (per-expert tensors, the MTP layer at index
    num_hidden_layers), sharded below 15 MB per file, with tokenizer.json,
    tokenizer_config.json and generation_config.json.
 7. Evaluation: validation perplexity from this code and from transformers
    (float32, eager attention) loading the written directory; the MTP head's
    top-1 accuracy on validation; greedy samples through transformers.
    Everything goes to OUT_DIR/report.json.
"""
import argparse
import copy
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

T0 = time.time()
DEV = "cuda" if torch.cuda.is_available() else "cpu"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
RS = "\x1e"

BOS, EOS, PAD, USER, ASSISTANT = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>",
                                  "<｜User｜>", "<｜Assistant｜>")
SPECIALS = [BOS, EOS, PAD, USER, ASSISTANT]
VOCAB = 8192
SEQ = 512

CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}"
    "{% if tools %}{{ 'Tools:' }}{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}{{ '\\n\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% set content = message['content'] if message['content'] is string else '' %}"
    "{% if message['role'] == 'system' %}{{ content }}"
    "{% elif message['role'] == 'user' %}{{ '<｜User｜>' + content }}"
    "{% elif message['role'] == 'assistant' %}{{ '<｜Assistant｜>' + content }}"
    "{% for call in message['tool_calls'] or [] %}"
    # Hermes' tool-call format, which basalt serve's tool-call parser detects.
    "{{ '<tool_call>\\n' + ({'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson)"
    " + '\\n</tool_call>' }}"
    "{% endfor %}{{ '<｜end▁of▁sentence｜>' }}"
    "{% elif message['role'] == 'tool' %}{{ '<｜User｜><tool_result>' + content + '</tool_result>' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}")

MAIN_CONFIG = dict(
    model_type="deepseek_v3", hidden_size=256, intermediate_size=768, moe_intermediate_size=192,
    num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=8, q_lora_rank=128,
    kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=16,
    n_shared_experts=1, num_experts_per_tok=4, n_group=4, topk_group=2, first_k_dense_replace=1,
    routed_scaling_factor=2.5, norm_topk_prob=True, scoring_func="sigmoid", topk_method="noaux_tc",
    num_nextn_predict_layers=1, rms_norm_eps=1e-6, max_position_embeddings=2048, rope_theta=10000.0,
    rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})

DRAFT_CONFIG = dict(
    model_type="llama", hidden_size=128, intermediate_size=384, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
    rope_theta=10000.0, max_position_embeddings=2048, tie_word_embeddings=True)

PROMPTS = ["The Debian project", "Python is a programming language that",
           "To install a package,", "Once upon a time"]


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


# ----------------------------------------------------------------------------- tokenizer

def read_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in f.read().split("\n" + RS + "\n") if d.strip()]


def train_tokenizer(train_docs, out_path):
    from tokenizers import Tokenizer, Regex, decoders, models, pre_tokenizers, processors, trainers
    with open(os.path.join(REPO, "testdata", "tokenizers", "deepseek_v3", "tokenizer.json"),
              encoding="utf-8") as f:
        ds_pre = json.load(f)["pre_tokenizer"]
    splits = []
    for p in ds_pre["pretokenizers"]:
        if p["type"] == "Split":
            splits.append(pre_tokenizers.Split(Regex(p["pattern"]["Regex"]), behavior="isolated",
                                               invert=False))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(train_docs, trainer=trainer)
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B:1", special_tokens=[(BOS, bos)])
    # The written pre-tokenizer must be DeepSeek-V3's block exactly.
    d = json.loads(tok.to_str())
    if d["pre_tokenizer"] != ds_pre:
        log("pre-tokenizer differs from DeepSeek-V3's; writing DeepSeek-V3's block",
            json.dumps(d["pre_tokenizer"])[:300])
        d["pre_tokenizer"] = ds_pre
        tok = Tokenizer.from_str(json.dumps(d, ensure_ascii=False))
    tok.save(out_path)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    ids = [tok.token_to_id(s) for s in SPECIALS]
    assert ids == list(range(len(SPECIALS))), ids
    return tok


def tokenizer_config(max_len):
    return {"add_bos_token": True, "add_eos_token": False, "bos_token": BOS, "eos_token": EOS,
            "pad_token": PAD, "clean_up_tokenization_spaces": False, "legacy": True,
            "model_max_length": max_len, "tokenizer_class": "PreTrainedTokenizerFast",
            "chat_template": CHAT_TEMPLATE}


def encode_stream(tok, docs):
    out = []
    for i in range(0, len(docs), 512):
        for enc in tok.encode_batch(docs[i:i + 512], add_special_tokens=False):
            out.append([0])
            out.append(enc.ids)
            out.append([1])
    return np.concatenate([np.asarray(x, dtype=np.int32) for x in out])


# ----------------------------------------------------------------------------- modules

class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def yarn_inv_freq(dim, base, sc):
    factor, orig = sc["factor"], sc["original_max_position_embeddings"]
    beta_fast, beta_slow = sc["beta_fast"], sc["beta_slow"]

    def corr_dim(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extra = 1.0 / pos_freqs
    inter = 1.0 / (factor * pos_freqs)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extra_factor = 1 - ramp
    return inter * (1 - extra_factor) + extra * extra_factor


def yarn_get_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_cos_sin(inv_freq, positions, scaling=1.0):
    freqs = positions[:, None].float() * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def rope_interleaved(x, cos, sin):
    b, h, s, d = x.shape
    x = x.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    return x * cos + rotate_half(x) * sin


def attention(q, k, v, scale):
    """Causal attention; k and v may have fewer heads than q (grouped queries)."""
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    S = q.shape[2]
    a = (q @ k.transpose(-1, -2)).float() * scale
    a = a.masked_fill(torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return (a.softmax(-1).to(v.dtype) @ v)


class MLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MLA(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, nh = c["hidden_size"], c["num_attention_heads"]
        self.nh, self.nope, self.rope, self.vd = nh, c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.kv_rank = c["kv_lora_rank"]
        self.qk = self.nope + self.rope
        self.q_a_proj = nn.Linear(H, c["q_lora_rank"], bias=False)
        self.q_a_layernorm = RMSNorm(c["q_lora_rank"], c["rms_norm_eps"])
        self.q_b_proj = nn.Linear(c["q_lora_rank"], nh * self.qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(H, self.kv_rank + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_rank, c["rms_norm_eps"])
        self.kv_b_proj = nn.Linear(self.kv_rank, nh * (self.nope + self.vd), bias=False)
        self.o_proj = nn.Linear(nh * self.vd, H, bias=False)
        self.scaling = self.qk ** -0.5
        sc = c.get("rope_scaling")
        if sc and sc.get("mscale_all_dim"):
            m = yarn_get_mscale(sc["factor"], sc["mscale_all_dim"])
            self.scaling *= m * m

    def forward(self, x, cos, sin):
        B, S, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, S, self.nh, self.qk).transpose(1, 2)
        q_pass, q_rot = q.split([self.nope, self.rope], dim=-1)
        ckv = self.kv_a_proj_with_mqa(x)
        k_pass, k_rot = ckv.split([self.kv_rank, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(k_pass)).view(B, S, self.nh, self.nope + self.vd).transpose(1, 2)
        k_pass, v = kv.split([self.nope, self.vd], dim=-1)
        k_rot = k_rot.view(B, 1, S, self.rope)
        q_rot = rope_interleaved(q_rot, cos, sin)
        k_rot = rope_interleaved(k_rot, cos, sin)
        k_rot = k_rot.expand(B, self.nh, S, self.rope)
        q = torch.cat([q_pass, q_rot.to(q_pass.dtype)], dim=-1)
        k = torch.cat([k_pass, k_rot.to(k_pass.dtype)], dim=-1)
        v = F.pad(v, (0, self.qk - self.vd))  # equal head sizes allow the flash kernel
        o = attention(q, k, v, self.scaling)
        o = o[..., :self.vd].transpose(1, 2).reshape(B, S, self.nh * self.vd)
        return self.o_proj(o)


class Gate(nn.Module):
    def __init__(self, c):
        super().__init__()
        E = c["n_routed_experts"]
        self.weight = nn.Parameter(torch.empty(E, c["hidden_size"]))
        self.register_buffer("e_score_correction_bias", torch.zeros(E))


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, I, E = c["hidden_size"], c["moe_intermediate_size"], c["n_routed_experts"]
        self.E, self.K = E, c["num_experts_per_tok"]
        self.G, self.topk_group = c["n_group"], c["topk_group"]
        self.rsf, self.norm = c["routed_scaling_factor"], c["norm_topk_prob"]
        self.gate = Gate(c)
        self.experts_gate = nn.Parameter(torch.empty(E, I, H))
        self.experts_up = nn.Parameter(torch.empty(E, I, H))
        self.experts_down = nn.Parameter(torch.empty(E, H, I))
        self.shared_experts = MLP(H, I * c["n_shared_experts"])
        self.last_load = None

    def route(self, x):
        with torch.autocast(DEV, enabled=False):
            scores = F.linear(x.float(), self.gate.weight.float()).sigmoid()
        T = x.shape[0]
        choice = scores.detach() + self.gate.e_score_correction_bias
        gs = choice.view(T, self.G, self.E // self.G).topk(2, dim=-1).values.sum(-1)
        gidx = gs.topk(self.topk_group, dim=-1).indices
        gmask = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gidx, True)
        smask = gmask.unsqueeze(-1).expand(T, self.G, self.E // self.G).reshape(T, self.E)
        choice = choice.masked_fill(~smask, float("-inf"))
        idx = choice.topk(self.K, dim=-1).indices
        w = scores.gather(1, idx)
        if self.norm:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * self.rsf

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        idx, w = self.route(x)
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.E)
        self.last_load = counts.detach()
        tok = order // self.K
        xs = x[tok]
        outs, start = [], 0
        for e, c in enumerate(counts.tolist()):
            if c == 0:
                continue
            xe = xs[start:start + c]
            h = F.silu(xe @ self.experts_gate[e].t()) * (xe @ self.experts_up[e].t())
            outs.append(h @ self.experts_down[e].t())
            start += c
        ys = torch.cat(outs, dim=0)
        ys = ys.float() * w.reshape(-1)[order].unsqueeze(-1)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device).index_add_(0, tok, ys)
        out = out.to(x.dtype) + self.shared_experts(x)
        return out.view(shape)


class DSLayer(nn.Module):
    def __init__(self, c, moe, dropout):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = MLA(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MoE(c) if moe else MLP(c["hidden_size"], c["intermediate_size"])
        self.dropout = dropout

    def forward(self, x, cos, sin):
        a = self.self_attn(self.input_layernorm(x), cos, sin)
        x = x + F.dropout(a, self.dropout, self.training)
        m = self.mlp(self.post_attention_layernorm(x))
        return x + F.dropout(m, self.dropout, self.training)


class Inner(nn.Module):
    pass


class MTP(nn.Module):
    def __init__(self, c, dropout):
        super().__init__()
        H = c["hidden_size"]
        self.enorm = RMSNorm(H, c["rms_norm_eps"])
        self.hnorm = RMSNorm(H, c["rms_norm_eps"])
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.block = DSLayer(c, moe=True, dropout=dropout)
        self.shared_head_norm = RMSNorm(H, c["rms_norm_eps"])


class DeepseekV3(nn.Module):
    def __init__(self, c, dropout=0.0):
        super().__init__()
        self.c = c
        H = c["hidden_size"]
        self.model = Inner()
        self.model.embed_tokens = nn.Embedding(VOCAB, H)
        self.model.layers = nn.ModuleList(
            [DSLayer(c, moe=i >= c["first_k_dense_replace"], dropout=dropout) for i in range(c["num_hidden_layers"])])
        self.model.norm = RMSNorm(H, c["rms_norm_eps"])
        self.lm_head = nn.Linear(H, VOCAB, bias=False)
        self.mtp = MTP(c, dropout)
        self.register_buffer("inv_freq", yarn_inv_freq(c["qk_rope_head_dim"], c["rope_theta"], c["rope_scaling"]),
                             persistent=False)
        sc = c["rope_scaling"]
        self.rope_scaling = yarn_get_mscale(sc["factor"], sc["mscale"]) / yarn_get_mscale(sc["factor"], sc["mscale_all_dim"])

    def moe_layers(self):
        return [m for m in self.modules() if isinstance(m, MoE)]

    def trunk(self, ids):
        S = ids.shape[1]
        cos, sin = rope_cos_sin(self.inv_freq, torch.arange(S, device=ids.device), self.rope_scaling)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x), cos, sin

    def forward(self, ids):
        h, _, _ = self.trunk(ids)
        return self.lm_head(h)

    def mtp_logits(self, h, next_ids, cos, sin):
        """h: main final normed hidden [B, S, H] at positions 0..S-1; next_ids:
        the tokens at positions 1..S. Returns logits for tokens 2..S+1."""
        m = self.mtp
        e = self.model.embed_tokens(next_ids)
        x = m.eh_proj(torch.cat([m.enorm(e), m.hnorm(h)], dim=-1))
        S = x.shape[1]
        x = m.block(x, cos[:S], sin[:S])
        return self.lm_head(m.shared_head_norm(x))

    def losses(self, window):
        """window [B, S+1]: main loss on tokens 1..S, MTP loss on tokens 2..S."""
        ids, tgt = window[:, :-1], window[:, 1:]
        h, cos, sin = self.trunk(ids)
        logits = self.lm_head(h)
        main = F.cross_entropy(logits.float().view(-1, VOCAB), tgt.reshape(-1))
        mlog = self.mtp_logits(h[:, :-1], ids[:, 1:], cos, sin)
        mtp = F.cross_entropy(mlog.float().view(-1, VOCAB), tgt[:, 1:].reshape(-1))
        return main, mtp, logits, mlog

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        nl = self.c["num_hidden_layers"] + 1
        with torch.no_grad():
            for name, p in self.named_parameters():
                if isinstance(p, nn.Parameter) and name.endswith("norm.weight"):
                    p.fill_(1.0)
                    continue
                std = 0.02
                if name.endswith(("o_proj.weight", "down_proj.weight", "experts_down")):
                    std = 0.02 / math.sqrt(2 * nl)
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def hf_state(self):
        """The published tensor names (MTP layer at index num_hidden_layers)."""
        L = self.c["num_hidden_layers"]
        out = {}
        for k, v in self.state_dict().items():
            v = v.detach()
            if k.startswith("mtp."):
                k = k[len("mtp."):]
                if k.startswith("block."):
                    k = k[len("block."):]
                k = k.replace("shared_head_norm.", "shared_head.norm.")
                k = f"model.layers.{L}.{k}"
            base = k.rsplit(".", 1)[0] + ".experts."
            if k.endswith("mlp.experts_gate"):
                for e in range(v.shape[0]):
                    out[f"{base}{e}.gate_proj.weight"] = v[e]
            elif k.endswith("mlp.experts_up"):
                for e in range(v.shape[0]):
                    out[f"{base}{e}.up_proj.weight"] = v[e]
            elif k.endswith("mlp.experts_down"):
                for e in range(v.shape[0]):
                    out[f"{base}{e}.down_proj.weight"] = v[e]
            else:
                out[k] = v
        return out


class LlamaLayer(nn.Module):
    def __init__(self, c, dropout):
        super().__init__()
        H, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.input_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.self_attn = Inner()
        self.self_attn.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.self_attn.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.post_attention_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.mlp = MLP(H, c["intermediate_size"])
        self.dropout = dropout

    def forward(self, x, cos, sin):
        B, S, _ = x.shape
        a = self.self_attn
        h = self.input_layernorm(x)
        q = a.q_proj(h).view(B, S, self.nh, self.hd).transpose(1, 2)
        k = a.k_proj(h).view(B, S, self.nkv, self.hd).transpose(1, 2)
        v = a.v_proj(h).view(B, S, self.nkv, self.hd).transpose(1, 2)
        q = (q * cos + rotate_half(q) * sin).to(v.dtype)
        k = (k * cos + rotate_half(k) * sin).to(v.dtype)
        o = attention(q, k, v, self.hd ** -0.5)
        o = a.o_proj(o.transpose(1, 2).reshape(B, S, self.nh * self.hd))
        x = x + F.dropout(o, self.dropout, self.training)
        m = self.mlp(self.post_attention_layernorm(x))
        return x + F.dropout(m, self.dropout, self.training)


class Llama(nn.Module):
    def __init__(self, c, dropout=0.0):
        super().__init__()
        self.c = c
        self.model = Inner()
        self.model.embed_tokens = nn.Embedding(VOCAB, c["hidden_size"])
        self.model.layers = nn.ModuleList([LlamaLayer(c, dropout) for _ in range(c["num_hidden_layers"])])
        self.model.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        hd = c["head_dim"]
        self.register_buffer("inv_freq", 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)),
                             persistent=False)

    def forward(self, ids):
        S = ids.shape[1]
        cos, sin = rope_cos_sin(self.inv_freq, torch.arange(S, device=ids.device))
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return F.linear(self.model.norm(x), self.model.embed_tokens.weight)

    def losses(self, window):
        logits = self(window[:, :-1])
        return F.cross_entropy(logits.float().view(-1, VOCAB), window[:, 1:].reshape(-1)), logits

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        nl = self.c["num_hidden_layers"]
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                    continue
                std = 0.02 / math.sqrt(2 * nl) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def hf_state(self):
        return {k: v.detach() for k, v in self.state_dict().items()}


# ----------------------------------------------------------------------------- checkpoints

def published_main_config():
    c = dict(MAIN_CONFIG)
    c.update(architectures=["DeepseekV3ForCausalLM"], vocab_size=VOCAB, bos_token_id=0, eos_token_id=1,
             hidden_act="silu", tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
             initializer_range=0.02, torch_dtype="bfloat16", moe_layer_freq=1, ep_size=1, use_cache=True)
    return c


def published_draft_config():
    c = dict(DRAFT_CONFIG)
    c.update(architectures=["LlamaForCausalLM"], vocab_size=VOCAB, bos_token_id=0, eos_token_id=1,
             hidden_act="silu", attention_bias=False, attention_dropout=0.0, mlp_bias=False,
             initializer_range=0.02, pretraining_tp=1, rope_scaling=None, torch_dtype="bfloat16",
             use_cache=True)
    return c


def write_checkpoint(out_dir, state, config, tok_path, max_shard=15_000_000):
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".json")):
            os.remove(os.path.join(out_dir, f))
    tensors = {}
    for k, v in state.items():
        v = v.float() if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)
        tensors[k] = v.contiguous().cpu()

    def order(name):
        if name.startswith("model.embed_tokens"):
            return (0, 0, name)
        if name.startswith("model.layers."):
            return (1, int(name.split(".")[2]), name)
        return (2, 0, name)

    names = sorted(tensors, key=order)
    shards, cur, size = [], {}, 0
    for n in names:
        b = tensors[n].numel() * tensors[n].element_size()
        if cur and size + b > max_shard:
            shards.append(cur)
            cur, size = {}, 0
        cur[n] = tensors[n]
        size += b
    shards.append(cur)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if len(shards) == 1:
        save_file(shards[0], os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, s in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(s, os.path.join(out_dir, fname), metadata={"format": "pt"})
            weight_map.update({n: fname for n in s})
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 1}, f, indent=2)
    shutil.copy(tok_path, os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(config["max_position_embeddings"]), f, indent=2, ensure_ascii=False)
    return total, len(shards)


def hf_load(path):
    from transformers import AutoModelForCausalLM
    m, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                                   output_loading_info=True)
    return m.to(DEV).eval(), {k: sorted(v) for k, v in info.items() if v}


def bf16_copy(model):
    m = copy.deepcopy(model).float().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return m


def check_against_transformers(model, config, tok_path, windows, tag):
    """Writes the model, loads it with transformers and compares float32 logits."""
    torch.backends.cuda.matmul.allow_tf32 = False
    with tempfile.TemporaryDirectory() as d:
        write_checkpoint(d, model.hf_state(), config, tok_path)
        hf, info = hf_load(d)
        ref = bf16_copy(model)
        ids = windows[:, :-1]
        with torch.no_grad():
            mine = ref(ids).float()
            theirs = hf(ids).logits.float()
        diff = (mine - theirs).abs()
        res = {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
               "logit_std": float(theirs.std()), "load_info": info,
               "argmax_agreement": float((mine.argmax(-1) == theirs.argmax(-1)).float().mean())}
        log(tag, "transformers check", json.dumps(res)[:600])
        del hf
    torch.backends.cuda.matmul.allow_tf32 = True
    return res


# ----------------------------------------------------------------------------- training

class Batches:
    def __init__(self, stream, batch, seed):
        self.stream = stream
        self.batch = batch
        self.g = torch.Generator(device=DEV).manual_seed(seed)
        self.ar = torch.arange(SEQ + 1, device=DEV)

    def next(self):
        starts = torch.randint(0, self.stream.numel() - SEQ - 1, (self.batch,), device=DEV, generator=self.g)
        return self.stream[starts[:, None] + self.ar]


def valid_windows(stream, n=None):
    nw = (stream.numel() - 1) // SEQ
    if n is not None:
        nw = min(nw, n)
    idx = torch.arange(nw, device=stream.device)[:, None] * SEQ + torch.arange(SEQ + 1, device=stream.device)
    return stream[idx]


@torch.no_grad()
def evaluate(model, windows, is_main, bs=32):
    model.eval()
    tot = n = 0.0
    mtp_hit = mtp_agree = mtp_n = main_hit = 0.0
    for i in range(0, windows.shape[0], bs):
        w = windows[i:i + bs]
        with torch.autocast(DEV, dtype=torch.bfloat16):
            if is_main:
                main, _, logits, mlog = model.losses(w)
            else:
                main, logits = model.losses(w)
        tgt = w[:, 1:]
        tot += float(main) * tgt.numel()
        n += tgt.numel()
        main_hit += float((logits.argmax(-1) == tgt).sum())
        if is_main:
            pred = mlog.argmax(-1)
            mtp_hit += float((pred == tgt[:, 1:]).sum())
            mtp_agree += float((pred == logits[:, 1:].argmax(-1)).sum())
            mtp_n += pred.numel()
    model.train()
    r = {"loss": tot / n, "ppl": math.exp(tot / n), "top1": main_hit / n, "tokens": int(n)}
    if is_main:
        r["mtp_top1"] = mtp_hit / mtp_n
        r["mtp_agrees_with_main_greedy"] = mtp_agree / mtp_n
    return r


def train(model, is_main, stream, vwin, seconds, batch, lr, seed, tag, steps_cap=None):
    opt_params = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(opt_params, lr=lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if DEV == "cuda" else {}))
    data = Batches(stream, batch, seed)
    warmup = 150
    start = time.time()
    step, best, best_state, history = 0, None, None, []
    last_eval = start
    tokens = 0
    moes = model.moe_layers() if is_main else []
    model.train()
    while True:
        el = time.time() - start
        if el >= seconds or (steps_cap is not None and step >= steps_cap):
            break
        frac = el / seconds
        cur = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gp in opt.param_groups:
            gp["lr"] = cur
        w = data.next()
        with torch.autocast(DEV, dtype=torch.bfloat16):
            if is_main:
                main, mtp, _, _ = model.losses(w)
                loss = main + 0.3 * mtp
            else:
                main, _ = model.losses(w)
                loss = main
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for m in moes:  # auxiliary-loss-free balancing (DeepSeek-V3 section 2.1.2)
                load = m.last_load.float()
                m.gate.e_score_correction_bias += 1e-3 * torch.sign(load.mean() - load)
        step += 1
        tokens += w.shape[0] * SEQ
        if step % 50 == 0:
            msg = f"{tag} step {step} lr {cur:.2e} loss {float(main.detach()):.4f}"
            if is_main:
                msg += f" mtp {float(mtp.detach()):.4f}"
            log(msg)
        now = time.time()
        if steps_cap is None and (now - last_eval >= 25 or now - start >= seconds):
            last_eval = now
            r = evaluate(model, vwin, is_main)
            r.update(step=step, seconds=round(now - start, 1), train_tokens=tokens)
            history.append(r)
            log(tag, "valid", json.dumps(r))
            if best is None or r["loss"] < best["loss"]:
                best = r
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if steps_cap is None:
        r = evaluate(model, vwin, is_main)
        r.update(step=step, seconds=round(time.time() - start, 1), train_tokens=tokens)
        history.append(r)
        log(tag, "valid final", json.dumps(r))
        if best is None or r["loss"] < best["loss"]:
            best, best_state = r, {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict(best_state)
    return {"steps": step, "train_tokens": tokens, "seconds": round(time.time() - start, 1),
            "batch": batch, "seq_len": SEQ, "peak_lr": lr, "best": best, "history": history}


def load_balance(model, windows):
    counts = None
    with torch.no_grad(), torch.autocast(DEV, dtype=torch.bfloat16):
        model.eval()
        loads = []
        for i in range(0, min(windows.shape[0], 64), 32):
            model.losses(windows[i:i + 32])
            loads.append(torch.stack([m.last_load.float() for m in model.moe_layers()]))
        model.train()
    counts = torch.stack(loads).sum(0)
    frac = counts / counts.sum(-1, keepdim=True)
    return {"max_expert_share": float(frac.max()), "min_expert_share": float(frac.min()),
            "uniform_share": 1.0 / frac.shape[-1]}


@torch.no_grad()
def hf_eval(path, vwin, tok, report_key, report):
    """Loads a written directory with transformers (float32, eager attention):
    validation perplexity and greedy samples."""
    try:
        hf, info = hf_load(path)
        tot = n = 0.0
        for i in range(0, vwin.shape[0], 16):
            w = vwin[i:i + 16]
            logits = hf(w[:, :-1]).logits.float()
            tot += float(F.cross_entropy(logits.view(-1, VOCAB), w[:, 1:].reshape(-1), reduction="sum"))
            n += w[:, 1:].numel()
        samples = []
        for p in PROMPTS:
            ids = torch.tensor([tok.encode(p).ids], device=DEV)
            out = hf.generate(ids, max_new_tokens=60, do_sample=False, eos_token_id=1, pad_token_id=1)
            samples.append({"prompt": p, "prompt_ids": ids[0].tolist(), "output_ids": out[0, ids.shape[1]:].tolist(),
                            "text": tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=False)})
        report[report_key] = {"load_info": info, "valid_loss": tot / n, "valid_ppl": math.exp(tot / n),
                              "valid_tokens": int(n), "samples": samples}
        log(report_key, json.dumps(report[report_key], ensure_ascii=False)[:3000])
        del hf
    except Exception as e:
        traceback.print_exc()
        report[report_key] = {"error": repr(e)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--main-seconds", type=float, default=300)
    ap.add_argument("--draft-seconds", type=float, default=75)
    ap.add_argument("--main-batch", type=int, default=64)
    ap.add_argument("--draft-batch", type=int, default=64)
    ap.add_argument("--total-seconds", type=float, default=540,
                    help="wall-clock budget of the whole run; the training phases shrink to fit")
    ap.add_argument("--main-lr", type=float, default=2e-3)
    ap.add_argument("--main-dropout", type=float, default=0.1)
    ap.add_argument("--tokenizer", help="use this tokenizer.json instead of training one")
    ap.add_argument("--skip-draft", action="store_true", help="train and write basalt-mini only")
    ap.add_argument("--skip-check", action="store_true", help="skip the early transformers check")
    ap.add_argument("--strict-check", action="store_true",
                    help="stop before the long training when this code and transformers disagree")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    os.makedirs(args.out, exist_ok=True)
    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu"}
    try:
        import transformers
        report["transformers"] = transformers.__version__
    except Exception as e:
        report["transformers"] = repr(e)
    rpath = os.path.join(args.out, "report.json")

    def save_report():
        with open(rpath, "w") as f:
            json.dump(report, f, indent=1, ensure_ascii=False)

    train_docs = read_docs(os.path.join(args.corpus, "train.txt"))
    valid_docs = read_docs(os.path.join(args.corpus, "valid.txt"))
    tok_path = os.path.join(args.out, "tokenizer.json")
    if args.tokenizer:
        from tokenizers import Tokenizer
        shutil.copy(args.tokenizer, tok_path)
        tok = Tokenizer.from_file(tok_path)
        log("tokenizer loaded", tok.get_vocab_size())
    else:
        tok = train_tokenizer(train_docs, tok_path)
        log("tokenizer trained", tok.get_vocab_size())
    tr = encode_stream(tok, train_docs)
    va = encode_stream(tok, valid_docs)
    vbytes = sum(len(d.encode()) for d in valid_docs)
    report["corpus"] = {"train_documents": len(train_docs), "valid_documents": len(valid_docs),
                        "train_tokens": int(tr.size), "valid_tokens": int(va.size),
                        "train_bytes": sum(len(d.encode()) for d in train_docs), "valid_bytes": vbytes}
    log("corpus", report["corpus"])
    stream = torch.from_numpy(tr.astype(np.int64)).to(DEV)
    vstream = torch.from_numpy(va.astype(np.int64)).to(DEV)
    vwin = valid_windows(vstream)
    save_report()

    main_dir = os.path.join(args.out, "basalt-mini")
    draft_dir = os.path.join(args.out, "basalt-draft")

    # Short runs, then the transformers check of both layouts.
    torch.manual_seed(0)
    draft = Llama(DRAFT_CONFIG, dropout=0.0).to(DEV)
    draft.init_weights(2)
    mini = DeepseekV3(MAIN_CONFIG, dropout=args.main_dropout).to(DEV)
    mini.init_weights(1)
    n_main = sum(p.numel() for n, p in mini.named_parameters() if not n.startswith("mtp."))
    n_mtp = sum(p.numel() for n, p in mini.named_parameters() if n.startswith("mtp."))
    E, K = MAIN_CONFIG["n_routed_experts"], MAIN_CONFIG["num_experts_per_tok"]
    per_expert = 3 * MAIN_CONFIG["hidden_size"] * MAIN_CONFIG["moe_intermediate_size"]
    n_moe = MAIN_CONFIG["num_hidden_layers"] - MAIN_CONFIG["first_k_dense_replace"]
    report["main_params"] = {"total_without_mtp": n_main, "mtp_layer": n_mtp,
                             "activated_per_token_without_mtp": n_main - n_moe * (E - K) * per_expert}
    report["draft_params"] = sum(p.numel() for p in draft.parameters())
    log("params", report["main_params"], "draft", report["draft_params"])
    checks = {}
    to_check = [] if args.skip_check else [("main", mini, published_main_config())]
    if not args.skip_draft and not args.skip_check:
        train(draft, False, stream, None, 1e9, args.draft_batch, 3e-3, 11, "draft-warm", steps_cap=30)
        to_check.insert(0, ("draft", draft, published_draft_config()))
    if to_check:
        train(mini, True, stream, None, 1e9, args.main_batch, args.main_lr, 12, "main-warm", steps_cap=60)
    for tag, m, cfg in to_check:
        try:
            checks[tag] = check_against_transformers(m, cfg, tok_path, vwin[:4, :129], tag)
        except Exception as e:
            traceback.print_exc()
            checks[tag] = {"error": repr(e)}
    report["early_transformers_check"] = checks
    save_report()
    bad = [t for t, r in checks.items() if "error" in r or r["mean_abs_diff"] > 0.01 * r["logit_std"]
           or r["argmax_agreement"] < 0.98
           or [k for k in r["load_info"].get("missing_keys", []) if k != "lm_head.weight"]]
    if bad and args.strict_check:
        log("transformers disagrees for", bad, "- stopping")
        sys.exit(3)

    # The long runs (dropout, --main-dropout, applies to the main model only).
    reserve = 45 if args.skip_draft else args.draft_seconds + 75
    main_seconds = min(args.main_seconds, args.total_seconds - (time.time() - T0) - reserve)
    log("main training for", round(main_seconds), "s")
    report["main_training"] = train(mini, True, stream, vwin, main_seconds, args.main_batch, args.main_lr, 21, "main")
    report["main_training"].update(dropout=args.main_dropout)
    mini.eval()
    report["main_load_balance"] = load_balance(mini, vwin)
    size, shards = write_checkpoint(main_dir, mini.hf_state(), published_main_config(), tok_path)
    report["main_checkpoint"] = {"bytes": size, "shards": shards}
    save_report()
    log("main written", size, shards)
    del mini
    if DEV == "cuda":
        torch.cuda.empty_cache()

    if not args.skip_draft:
        draft_seconds = max(20.0, min(args.draft_seconds, args.total_seconds - (time.time() - T0) - 50))
        log("draft training for", round(draft_seconds), "s")
        report["draft_training"] = train(draft, False, stream, vwin, draft_seconds, args.draft_batch, 3e-3, 22,
                                         "draft")
        size, shards = write_checkpoint(draft_dir, draft.hf_state(), published_draft_config(), tok_path)
        report["draft_checkpoint"] = {"bytes": size, "shards": shards}
        save_report()
        log("draft written", size, shards)

    report["valid_bytes_per_token"] = vbytes / max(1, int(va.size))
    hf_eval(main_dir, vwin, tok, "main_transformers", report)
    save_report()
    if not args.skip_draft:
        hf_eval(draft_dir, vwin, tok, "draft_transformers", report)
    report["total_seconds"] = round(time.time() - T0, 1)
    save_report()
    log("done", report["total_seconds"])


if __name__ == "__main__":
    main()
