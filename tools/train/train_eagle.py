#!/usr/bin/env python3
"""Trains an EAGLE-style draft head for a model Basalt serves, from the model's
own hidden states as the engine computes them, and writes it in the format
`--speculative-algorithm eagle --speculative-draft-model DIR` loads
(src/model/eagle_head.h).

  # 1. dump the target's final hidden states over a corpus (C++, any device)
  build/bench/basalt_dump_hidden --model MODEL --text train.txt --out train.safetensors \\
      --sequences 4000 --seq-len 512 --device cuda
  build/bench/basalt_dump_hidden --model MODEL --text valid.txt --out valid.safetensors \\
      --sequences 64 --seq-len 512 --device cuda
  # 2. train (PyTorch, a CUDA GPU)
  python3 tools/train/train_eagle.py --model MODEL --train train.safetensors \\
      --valid valid.safetensors --out HEAD_DIR [--minutes 5] [--layers 1]

The head (EAGLE-1's shape, Li et al. 2024): for the token that follows
position i and the target's final hidden state h_i (after its final norm),
x_i = fc([embed(token), h_i]); one Llama decoder layer (pre-norm attention
with rotary positions, SwiGLU MLP) over x with causal attention; its output
r_i is the head's hidden state and logits_i = lm_head(norm(r_i)). The
embedding and lm_head are the target's, copied and frozen. Loss, as EAGLE's:
a smooth-L1 regression of r_i onto h_{i+1} (weight --reg-weight, 1.0) plus
the cross-entropy of logits_i against the target's own next-token
distribution at i+1, softmax(lm_head(h_{i+1})) (weight --ce-weight, 0.1);
inputs get uniform noise of --noise (0.1) times their RMS, as EAGLE adds.

Reported (stdout, and OUT/report.json): on the validation dump, how often the
head's first draft is the target's greedy token (the acceptance of a
one-token greedy draft), and how often a chained second draft (the head fed
its own r_i and its own first draft) is; the training loss.

--fixture DIR writes instead a small random head for --model (no training, no
dumps needed; with its own copy of the embedding and lm_head) and
DIR_expected.safetensors beside it: inputs (tokens, positions, hidden) and
this script's logits and hidden output for them, which the C++ test
model/eagle_head_test.cc compares against (testdata/eagle holds the pair
written for testdata/models/llama).

The head written by training stores no embedding or lm_head: Basalt reads
the target's (--standalone writes copies).

Needs torch (with CUDA for training) and safetensors.
"""
import argparse
import glob
import json
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def target_tensors(model_dir, names):
    """Reads the named tensors from a checkpoint directory's safetensors files."""
    found = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                if name in names:
                    found[name] = f.get_tensor(name)
    return found


def load_target(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    t = target_tensors(model_dir, {"model.embed_tokens.weight", "lm_head.weight"})
    embed = t["model.embed_tokens.weight"]
    head = t.get("lm_head.weight", embed if cfg.get("tie_word_embeddings") else None)
    if head is None:
        raise SystemExit(f"{model_dir}: no lm_head.weight and tie_word_embeddings is not set")
    return cfg, embed, head


def rope_tables(positions, head_dim, theta):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ang = positions.double()[..., None] * inv.to(positions.device)
    return ang.cos().float(), ang.sin().float()


def rotate_half(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c = torch.cat([cos, cos], dim=-1)
    s = torch.cat([sin, sin], dim=-1)
    return x * c + torch.cat([-x2, x1], dim=-1) * s


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Layer(nn.Module):
    """A Llama decoder layer with the Hugging Face parameter names."""

    def __init__(self, c):
        super().__init__()
        H, D = c["hidden_size"], c["head_dim"]
        self.heads, self.kv_heads, self.head_dim = c["num_attention_heads"], c["num_key_value_heads"], D
        self.theta = c["rope_theta"]
        self.input_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(H, self.heads * D, bias=False)
        self.self_attn.k_proj = nn.Linear(H, self.kv_heads * D, bias=False)
        self.self_attn.v_proj = nn.Linear(H, self.kv_heads * D, bias=False)
        self.self_attn.o_proj = nn.Linear(self.heads * D, H, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(H, c["intermediate_size"], bias=False)
        self.mlp.up_proj = nn.Linear(H, c["intermediate_size"], bias=False)
        self.mlp.down_proj = nn.Linear(c["intermediate_size"], H, bias=False)

    def qkv(self, x, positions):
        """Queries, keys and values [B, heads, L, D], rotated; keys and values
        repeated to every query head."""
        B, L, _ = x.shape
        h = self.input_layernorm(x)
        a = self.self_attn
        q = a.q_proj(h).view(B, L, self.heads, self.head_dim)
        k = a.k_proj(h).view(B, L, self.kv_heads, self.head_dim)
        v = a.v_proj(h).view(B, L, self.kv_heads, self.head_dim)
        cos, sin = rope_tables(positions, self.head_dim, self.theta)
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
        q, k = rotate_half(q, cos, sin), rotate_half(k, cos, sin)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def finish(self, x, attn):
        """The residual after attention output attn [B, heads, L, D], then the MLP."""
        B, _, L, _ = attn.shape
        x = x + self.self_attn.o_proj(attn.transpose(1, 2).reshape(B, L, -1))
        h = self.post_attention_layernorm(x)
        m = self.mlp
        return x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))

    def forward(self, x, positions):
        q, k, v = self.qkv(x, positions)
        return self.finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))


class EagleHead(nn.Module):
    def __init__(self, c, embed, lm_head):
        super().__init__()
        H = c["hidden_size"]
        self.embed = nn.Embedding.from_pretrained(embed.float(), freeze=True)
        self.fc = nn.Linear(2 * H, H, bias=True)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(H, c["rms_norm_eps"])
        self.lm_head = nn.Linear(H, embed.shape[0], bias=False)
        self.lm_head.weight = nn.Parameter(lm_head.float(), requires_grad=False)

    def forward(self, tokens, hidden, positions):
        """tokens [B, L] (the token after each position), hidden [B, L, H] (the
        target's, or the head's own); returns (logits, r)."""
        x = self.fc(torch.cat([self.embed(tokens), hidden], dim=-1))
        for layer in self.layers:
            x = layer(x, positions)
        return self.lm_head(self.norm(x)), x

    def state_for_basalt(self):
        s = {"eagle.fc.weight": self.fc.weight, "eagle.fc.bias": self.fc.bias,
             "model.embed_tokens.weight": self.embed.weight, "model.norm.weight": self.norm.weight,
             "lm_head.weight": self.lm_head.weight}
        for i, layer in enumerate(self.layers):
            for name, p in layer.named_parameters():
                s[f"model.layers.{i}.{name}"] = p
        return s


def head_config(target_cfg, layers, vocab):
    H = target_cfg["hidden_size"]
    head_dim = 128 if H >= 2048 else min(64, H)
    heads = max(1, H // head_dim)
    kv_heads = heads if heads < 8 else heads // 4
    eos = target_cfg.get("eos_token_id")
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "basalt_eagle_head": True,
        "hidden_size": H, "intermediate_size": int(target_cfg.get("intermediate_size", 4 * H)),
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "rms_norm_eps": float(target_cfg.get("rms_norm_eps", 1e-6)),
        "rope_theta": 10000.0, "max_position_embeddings": int(target_cfg.get("max_position_embeddings", 4096)),
        "vocab_size": vocab, "tie_word_embeddings": False,
        "bos_token_id": target_cfg.get("bos_token_id"), "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    }


def write_head(head, cfg, out_dir, meta, standalone):
    os.makedirs(out_dir, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in head.state_for_basalt().items()
             if standalone or k not in ("model.embed_tokens.weight", "lm_head.weight")}
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


def rms(x):
    return x.float().pow(2).mean(-1, keepdim=True).sqrt()


@torch.no_grad()
def evaluate(head, tokens, hidden, target_head, device, batch=16):
    """First-draft and chained second-draft agreement with the target's greedy tokens."""
    head.eval()
    first = second = n1 = n2 = 0
    for s in range(0, tokens.shape[0], batch):
        tok = tokens[s:s + batch].to(device).long()
        hid = hidden[s:s + batch].to(device).float()
        B, L = tok.shape
        pos = torch.arange(L - 1, device=device).expand(B, L - 1)
        logits, r = head(tok[:, 1:], hid[:, :-1], pos)
        want = (hid[:, 1:] @ target_head.t()).argmax(-1)  # target's greedy token after position i + 1
        draft = logits.argmax(-1)
        first += (draft == want).sum().item()
        n1 += want.numel()
        # Chained: at position i + 1 the head reads its own r_i and draft; its
        # keys before that position are the teacher-forced ones (as in the
        # engine, where the previous step's pass wrote them).
        logits2 = chained_logits(head, tok[:, 1:], hid[:, :-1], pos, draft, r)
        want2 = want[:, 1:]
        ok = (draft[:, :-1] == want[:, :-1])  # the second draft counts only after an accepted first
        second += ((logits2.argmax(-1)[:, :-1] == want2) & ok).sum().item()
        n2 += ok.sum().item()
    head.train()
    return first / max(n1, 1), second / max(n2, 1)


def chained_logits(head, tokens, hidden, positions, draft, r):
    """Logits of the second draft at every position: query row i + 1 built
    from (draft_i, r_i), attending to the teacher-forced keys 0..i and to
    itself. Only one-layer heads take this path exactly; deeper heads reuse
    the first layer's layout per layer."""
    x_tf = head.fc(torch.cat([head.embed(tokens), hidden], dim=-1))
    x_ch = head.fc(torch.cat([head.embed(draft), r], dim=-1))  # row i is position i + 1
    pos_ch = positions + 1
    for layer in head.layers:
        x_tf, x_ch = chained_layer(layer, x_tf, positions, x_ch, pos_ch)
    return head.lm_head(head.norm(x_ch))


def chained_layer(layer, x_tf, pos_tf, x_ch, pos_ch):
    L = x_tf.shape[1]
    q1, k1, v1 = layer.qkv(x_tf, pos_tf)
    q2, k2, v2 = layer.qkv(x_ch, pos_ch)
    scale = 1.0 / math.sqrt(layer.head_dim)
    # Chained row i sees teacher-forced keys 0..i and its own key.
    s_tf = (q2 @ k1.transpose(-1, -2)) * scale  # [B, heads, L, L]
    mask = torch.ones(L, L, dtype=torch.bool, device=x_tf.device).tril()
    s_tf = s_tf.masked_fill(~mask, float("-inf"))
    s_self = (q2 * k2).sum(-1, keepdim=True) * scale
    p = torch.softmax(torch.cat([s_tf, s_self], dim=-1), dim=-1)
    o2 = p[..., :L] @ v1 + p[..., L:] * v2
    out_tf = layer.finish(x_tf, F.scaled_dot_product_attention(q1, k1, v1, is_causal=True))
    return out_tf, layer.finish(x_ch, o2)


def write_fixture(args):
    """A random head for --model and the logits this code computes for it."""
    torch.manual_seed(0)
    cfg_t, embed, lm_head = load_target(args.model)
    cfg = head_config(cfg_t, 1, embed.shape[0])
    cfg["intermediate_size"] = min(cfg["intermediate_size"], 2 * cfg["hidden_size"])
    head = EagleHead(cfg, embed, lm_head)
    with torch.no_grad():
        for p in head.parameters():
            if p.requires_grad:
                p.copy_(torch.randn_like(p) * (1.0 / math.sqrt(p.shape[-1])))
        for layer in head.layers:
            layer.input_layernorm.weight.uniform_(0.5, 1.5)
            layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)
        head.norm.weight.uniform_(0.5, 1.5)
    # The C++ side reads bf16 weights: compute with those values.
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    L, H = 7, cfg["hidden_size"]
    tokens = torch.randint(3, embed.shape[0], (1, L))
    hidden = torch.randn(1, L, H)
    positions = torch.arange(L)[None] + 2  # the head runs at the target's positions
    with torch.no_grad():
        logits, r = head(tokens, hidden, positions)
    write_head(head, cfg, args.fixture, {"fixture": True, "target": os.path.basename(os.path.normpath(args.model))},
               standalone=True)
    save_file({"tokens": tokens[0].int().contiguous(), "positions": positions[0].int().contiguous(),
               "hidden": hidden[0].contiguous(), "logits": logits[0].float().contiguous(),
               "hidden_out": r[0].float().contiguous()},
              os.path.normpath(args.fixture) + "_expected.safetensors")
    log(f"wrote the fixture head and expected outputs to {args.fixture}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the target model's directory")
    ap.add_argument("--train", help="basalt_dump_hidden output for training")
    ap.add_argument("--valid", help="basalt_dump_hidden output for validation")
    ap.add_argument("--out", help="where to write the head")
    ap.add_argument("--fixture", help="write a random test head and its expected outputs here instead")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=5.0, help="training time budget")
    ap.add_argument("--batch", type=int, default=16, help="windows per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--reg-weight", type=float, default=1.0)
    ap.add_argument("--ce-weight", type=float, default=0.1)
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--standalone", action="store_true", help="store copies of the embedding and lm_head")
    args = ap.parse_args()
    if args.fixture:
        write_fixture(args)
        return
    if not (args.train and args.valid and args.out):
        ap.error("--train, --valid and --out are needed (or --fixture)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    cfg_t, embed, lm_head = load_target(args.model)
    cfg = head_config(cfg_t, args.layers, embed.shape[0])
    train, valid = load_file(args.train), load_file(args.valid)
    tr_tok, tr_hid = train["tokens"], train["hidden"]
    va_tok, va_hid = valid["tokens"], valid["hidden"]
    if tr_hid.shape[-1] != cfg["hidden_size"]:
        raise SystemExit(f"{args.train}: hidden size {tr_hid.shape[-1]}, the model's is {cfg['hidden_size']}")
    log(f"train {tuple(tr_tok.shape)}, valid {tuple(va_tok.shape)}; head {cfg['num_hidden_layers']} layer(s), "
        f"{cfg['num_attention_heads']} heads of {cfg['head_dim']}, intermediate {cfg['intermediate_size']}")
    head = EagleHead(cfg, embed, lm_head).to(device)
    target_head = lm_head.float().to(device)
    params = [p for p in head.parameters() if p.requires_grad]
    log(f"trainable parameters: {sum(p.numel() for p in params) / 1e6:.2f} M")
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    budget = args.minutes * 60
    start = time.time()
    step, best, best_state, history = 0, -1.0, None, []
    N, L = tr_tok.shape
    while True:
        elapsed = time.time() - start
        if elapsed > budget:
            break
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, elapsed / budget))))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, N, (args.batch,))
        tok = tr_tok[idx].to(device).long()
        hid = tr_hid[idx].to(device).float()
        inp = hid[:, :-1]
        if args.noise > 0:
            inp = inp + (torch.rand_like(inp) * 2 - 1) * args.noise * rms(inp)
        pos = torch.arange(L - 1, device=device).expand(args.batch, L - 1)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            logits, r = head(tok[:, 1:], inp, pos)
        target = hid[:, 1:]
        with torch.no_grad():
            p_target = torch.softmax(target @ target_head.t(), dim=-1)
        reg = F.smooth_l1_loss(r.float(), target)
        ce = -(p_target * torch.log_softmax(logits.float(), dim=-1)).sum(-1).mean()
        loss = args.reg_weight * reg + args.ce_weight * ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % args.eval_every == 0:
            a1, a2 = evaluate(head, va_tok, va_hid, target_head, device)
            history.append({"step": step, "loss": loss.item(), "reg": reg.item(), "ce": ce.item(),
                            "first_draft": a1, "second_draft": a2})
            log(f"step {step}: loss {loss.item():.4f} (reg {reg.item():.4f}, ce {ce.item():.3f}); "
                f"valid agreement first draft {a1:.3f}, chained second {a2:.3f}")
            if a1 > best:
                best = a1
                best_state = {k: v.detach().clone() for k, v in head.state_dict().items()}
    if best_state is not None:
        head.load_state_dict(best_state)
    a1, a2 = evaluate(head, va_tok, va_hid, target_head, device)
    log(f"best: valid agreement first draft {a1:.3f}, chained second {a2:.3f} after {step} steps")
    meta = {"target": os.path.basename(os.path.normpath(args.model)), "steps": step, "minutes": args.minutes,
            "train_windows": int(N), "window": int(L), "valid_windows": int(va_tok.shape[0]),
            "valid_first_draft_agreement": a1, "valid_second_draft_agreement": a2,
            "settings": {k: v for k, v in vars(args).items() if k not in ("model", "train", "valid", "out", "fixture")},
            "history": history}
    write_head(head, cfg, args.out, meta, args.standalone)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
