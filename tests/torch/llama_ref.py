#!/usr/bin/env python3
"""A float64 reference of zeropp's Llama training, from torch primitives.

Reads a Hugging Face Llama folder (config.json and model.safetensors; the
safetensors header parsed here with struct and json, no package beyond
torch) and an llm.c token file, then trains --steps steps of AdamW exactly
as zeropp's engine does (src/engine/step.c, src/device/device_host.c) and
prints one JSON line per step: {"step": s, "loss": L}, L the loss of the
step's forward, before its update (what `zeropp train --metrics` logs).

The model is LlamaForCausalLM's arithmetic written out (not transformers):
  h = embed[tokens]
  per layer:  a = RMSNorm(h) * g1;  q, k, v = a Wq^T (+bq), a Wk^T (+bk), a Wv^T (+bv)
              RoPE on q and k (HF's rotate-half: channel i pairs with
              i + hd/2, turned by position * theta^(-2i/hd), Llama 3's
              rope_scaling when given); each of the n_kv_heads key/value
              heads serves n_heads / n_kv_heads consecutive query heads
              (HF's repeat_kv); causal softmax(q k^T / sqrt(hd)) v;
              h = h + o Wo^T (+bo);  b = RMSNorm(h) * g2;
              h = h + (silu(b Wgate^T) * (b Wup^T)) Wdown^T
  logits = RMSNorm(h) * gf  Whead^T  (Whead = embed when tied)
  loss = mean over every token of the batch of cross-entropy
with RMSNorm(x) = x / sqrt(mean(x^2) + eps).

The data, as `zeropp train --data-order sequential` reads it
(src/train/data.h): step s (0-based) takes tokens [s G T, (s + 1) G T] of
the training split, sequence j being [s G T + j T, s G T + j T + T], the
targets one token later; the split wraps after E = floor((n_train - 1) /
(G T)) steps, n_train = n - max(floor(n / 10), T + 1).

The optimizer (the engine's): the global gradient norm over every
parameter; clipping as torch.nn.utils.clip_grad_norm_, coefficient
clip / (norm + 1e-6) applied only when below 1; then AdamW per element,
  m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,
  p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + wd p),
with weight decay on the matrices only (every 2-D tensor: the embedding,
the head, the projections) unless --decay-all, none on the norm gains and
biases.
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

DT = torch.float64
ST_DTYPES = {"F64": (torch.float64, 8), "F32": (torch.float32, 4),
             "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2)}


def read_safetensors(path):
    """Every tensor of one safetensors file, widened to float64."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, size = ST_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = info["shape"]
        count = (end - begin) // size
        raw = bytearray(blob[base + begin:base + end])
        t = torch.frombuffer(raw, dtype=dtype, count=count) if count else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(shape).to(DT).clone()
    return out


def read_weights(folder):
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for name in files:
        out.update(read_safetensors(os.path.join(folder, name)))
    return out


def read_tokens(path):
    """An llm.c token file: 256 int32 of header (magic 20240520, version 1
    for uint16 ids, 2 for uint32, the count), then the ids."""
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        if header[0] != 20240520 or header[1] not in (1, 2):
            sys.exit(f"llama_ref: {path} is not a token file (magic {header[0]}, version {header[1]})")
        n = header[2]
        width = 2 if header[1] == 1 else 4
        data = f.read(n * width)
    return list(struct.unpack(f"<{n}{'H' if width == 2 else 'I'}", data))


def rope_inv_freq(cfg, hd):
    theta = float(cfg.get("rope_theta", 10000.0))
    inv = [theta ** (-(2.0 * i) / hd) for i in range(hd // 2)]
    rs = cfg.get("rope_scaling")
    if rs:  # HF's _compute_llama3_parameters
        if rs.get("rope_type", rs.get("type")) != "llama3":
            sys.exit(f"llama_ref: rope_scaling type {rs} is not llama3")
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        scaled = []
        for f in inv:
            wl = 2 * math.pi / f
            if wl < high_wl:
                scaled.append(f)
            elif wl > low_wl:
                scaled.append(f / factor)
            else:
                smooth = (old / wl - low) / (high - low)
                scaled.append((1 - smooth) * f / factor + smooth * f)
        inv = scaled
    return torch.tensor(inv, dtype=DT)


class Llama:
    def __init__(self, cfg, w):
        self.cfg = cfg
        self.C = cfg["hidden_size"]
        self.H = cfg["num_attention_heads"]
        self.KV = cfg.get("num_key_value_heads", self.H)
        self.hd = cfg.get("head_dim") or self.C // self.H
        self.L = cfg["num_hidden_layers"]
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        self.p = {k: v.clone().requires_grad_(True) for k, v in w.items()}
        self.inv_freq = rope_inv_freq(cfg, self.hd)

    def rms(self, x, g):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps) * g

    def rope(self, x, T):
        pos = torch.arange(T, dtype=DT)
        ang = pos[:, None] * self.inv_freq[None, :]          # T x hd/2
        cos = torch.cat([ang.cos(), ang.cos()], -1)[None, None]  # 1 x 1 x T x hd
        sin = torch.cat([ang.sin(), ang.sin()], -1)[None, None]
        half = self.hd // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rot * sin

    def lin(self, x, name):
        y = x @ self.p[name + ".weight"].T
        b = self.p.get(name + ".bias")
        return y + b if b is not None else y

    def loss(self, tokens, targets):
        B, T = tokens.shape
        p = self.p
        h = p["model.embed_tokens.weight"][tokens]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for l in range(self.L):
            pre = f"model.layers.{l}."
            a = self.rms(h, p[pre + "input_layernorm.weight"])
            q = self.lin(a, pre + "self_attn.q_proj").view(B, T, self.H, self.hd).transpose(1, 2)
            k = self.lin(a, pre + "self_attn.k_proj").view(B, T, self.KV, self.hd).transpose(1, 2)
            v = self.lin(a, pre + "self_attn.v_proj").view(B, T, self.KV, self.hd).transpose(1, 2)
            q, k = self.rope(q, T), self.rope(k, T)
            rep = self.H // self.KV
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
            s = s.masked_fill(~mask, float("-inf"))
            o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, self.H * self.hd)
            h = h + self.lin(o, pre + "self_attn.o_proj")
            b = self.rms(h, p[pre + "post_attention_layernorm.weight"])
            g = self.lin(b, pre + "mlp.gate_proj")
            u = self.lin(b, pre + "mlp.up_proj")
            h = h + self.lin(g * torch.sigmoid(g) * u, pre + "mlp.down_proj")
        h = self.rms(h, p["model.norm.weight"])
        head = p["model.embed_tokens.weight"] if self.tied else p["lm_head.weight"]
        logits = h @ head.T
        return torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))


def batch(ids, s, G, T):
    n = len(ids)
    n_train = n - max(n // 10, T + 1)
    E = (n_train - 1) // (G * T)
    if E < 1:
        sys.exit(f"llama_ref: the training split of {n_train} tokens holds no step of {G} x {T}")
    start = (s % E) * G * T
    x = torch.tensor([ids[start + j * T:start + j * T + T] for j in range(G)], dtype=torch.long)
    y = torch.tensor([ids[start + j * T + 1:start + j * T + T + 1] for j in range(G)], dtype=torch.long)
    return x, y


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf", required=True, help="the Hugging Face Llama folder")
    ap.add_argument("--tokens", required=True, help="an llm.c token file")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, required=True, help="G, sequences per step (all ranks)")
    ap.add_argument("--seq", type=int, required=True, help="T, tokens per sequence")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--clip", type=float, default=1.0, help="0: no clipping")
    ap.add_argument("--decay-all", action="store_true")
    a = ap.parse_args()
    torch.set_grad_enabled(True)
    with open(os.path.join(a.hf, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("architectures", ["LlamaForCausalLM"]) != ["LlamaForCausalLM"]:
        sys.exit(f"llama_ref: {a.hf} is not a LlamaForCausalLM")
    model = Llama(cfg, read_weights(a.hf))
    ids = read_tokens(a.tokens)
    names = sorted(model.p)
    params = [model.p[k] for k in names]
    decay = [a.decay_all or p.dim() == 2 for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for s in range(a.steps):
        x, y = batch(ids, s, a.batch, a.seq)
        for p in params:
            p.grad = None
        loss = model.loss(x, y)
        loss.backward()
        norm = math.sqrt(sum(float((p.grad * p.grad).sum()) for p in params))
        scale = 1.0
        if a.clip > 0 and a.clip / (norm + 1e-6) < 1.0:
            scale = a.clip / (norm + 1e-6)
        t = s + 1
        c1, c2 = 1 - a.beta1 ** t, 1 - a.beta2 ** t
        with torch.no_grad():
            for i, p in enumerate(params):
                g = p.grad * scale
                m[i].mul_(a.beta1).add_((1 - a.beta1) * g)
                v[i].mul_(a.beta2).add_((1 - a.beta2) * g * g)
                wd = a.weight_decay if decay[i] else 0.0
                p -= a.lr * ((m[i] / c1) / ((v[i] / c2).sqrt() + a.eps) + wd * p)
        print(json.dumps({"step": t, "loss": float(loss.detach()), "grad_norm": norm}), flush=True)


if __name__ == "__main__":
    main()
