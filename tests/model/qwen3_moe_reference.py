#!/usr/bin/env python3
"""An independent Qwen3-MoE forward in plain PyTorch, written from transformers'
modeling_qwen3_moe.py (Qwen3MoeForCausalLM), for tests/model/qwen3_moe_test.cc.

    qwen3_moe_reference.py --model DIR --ids 1,2,3 --ids 4,5 --out OUT.safetensors

reads DIR/config.json and DIR/*.safetensors (HF names; read with the standard library: no
safetensors or transformers package here), runs each --ids sequence on its own (positions from 0,
causal attention) in float32 on the CPU, and writes OUT with, for sequence s:
    logits.{s}            [L, vocab] float32
    experts.{s}.{layer}   [L, k] int64: the router's top-k experts of each sparse layer, in
                          torch.topk's order (HF's selected_experts)
Only torch (1.13 or later) and the standard library are used.
"""
import argparse
import json
import os
import struct

import torch
import torch.nn.functional as F

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32}
NAMES = {v: k for k, v in DTYPES.items()}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(DTYPES[info["dtype"]]).reshape(info["shape"]).clone()
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        b = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def rms_norm(x, weight, eps):  # Qwen3MoeRMSNorm
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def linear(x, w):
    return x @ w.t()


class Qwen3Moe:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.c = json.load(f)
        self.w = {}
        for name in sorted(os.listdir(model_dir)):
            if name.endswith(".safetensors"):
                self.w.update(read_safetensors(os.path.join(model_dir, name)))
        c = self.c
        self.layers = c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads", self.heads)
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        self.eps = c.get("rms_norm_eps", 1e-6)
        self.theta = c.get("rope_theta", 10000.0)
        self.num_experts = c.get("num_experts", 128)
        self.top_k = c.get("num_experts_per_tok", 8)
        self.norm_topk_prob = c.get("norm_topk_prob", False)
        self.sparse_step = c.get("decoder_sparse_step", 1)
        self.mlp_only = c.get("mlp_only_layers") or []

    def sparse(self, i):  # Qwen3MoeDecoderLayer's choice of mlp
        return (i not in self.mlp_only and self.num_experts > 0
                and (i + 1) % self.sparse_step == 0)

    def mlp(self, x, prefix):  # Qwen3MoeMLP
        w = self.w
        return linear(F.silu(linear(x, w[prefix + "gate_proj.weight"])) *
                      linear(x, w[prefix + "up_proj.weight"]), w[prefix + "down_proj.weight"])

    def sparse_moe(self, h, prefix):  # Qwen3MoeSparseMoeBlock (transformers 4.5x)
        router_logits = linear(h, self.w[prefix + "gate.weight"])  # [T, E]
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        if self.norm_topk_prob:
            routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(h.dtype)
        final = torch.zeros_like(h)
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        for e in range(self.num_experts):
            idx, top_x = torch.where(expert_mask[e])
            if top_x.numel() == 0:
                continue
            out = self.mlp(h[top_x], f"{prefix}experts.{e}.") * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, out.to(h.dtype))
        return final, selected_experts

    def attention(self, h, prefix, cos, sin):  # Qwen3MoeAttention, eager, causal
        w, t, d = self.w, h.shape[0], self.head_dim
        q = linear(h, w[prefix + "q_proj.weight"]).view(t, self.heads, d)
        k = linear(h, w[prefix + "k_proj.weight"]).view(t, self.kv_heads, d)
        v = linear(h, w[prefix + "v_proj.weight"]).view(t, self.kv_heads, d)
        q = rms_norm(q, w[prefix + "q_norm.weight"], self.eps).transpose(0, 1)  # [H, T, D]
        k = rms_norm(k, w[prefix + "k_norm.weight"], self.eps).transpose(0, 1)
        v = v.transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        k = k.repeat_interleave(groups, dim=0)
        v = v.repeat_interleave(groups, dim=0)
        scores = q @ k.transpose(1, 2) * d ** -0.5  # [H, T, T]
        mask = torch.full((t, t), float("-inf"), dtype=scores.dtype).triu(1)
        probs = F.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        a = (probs @ v).transpose(0, 1).reshape(t, -1)
        return linear(a, w[prefix + "o_proj.weight"])

    def forward(self, ids):
        w, t = self.w, len(ids)
        x = w["model.embed_tokens.weight"][torch.tensor(ids)]
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2,
                                                       dtype=torch.int64).float() / self.head_dim))
        freqs = torch.arange(t).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        experts = {}
        for i in range(self.layers):
            p = f"model.layers.{i}."
            x = x + self.attention(rms_norm(x, w[p + "input_layernorm.weight"], self.eps),
                                   p + "self_attn.", cos, sin)
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], self.eps)
            if self.sparse(i):
                out, experts[i] = self.sparse_moe(h, p + "mlp.")
            else:
                out = self.mlp(h, p + "mlp.")
            x = x + out
        x = rms_norm(x, w["model.norm.weight"], self.eps)
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        return linear(x, head), experts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", action="append", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    model = Qwen3Moe(a.model)
    for name in list(model.w):
        model.w[name] = model.w[name].float()
    out = {}
    with torch.no_grad():
        for s, text in enumerate(a.ids):
            logits, experts = model.forward([int(v) for v in text.split(",")])
            out[f"logits.{s}"] = logits.float()
            for layer, e in experts.items():
                out[f"experts.{s}.{layer}"] = e.to(torch.int64)
    write_safetensors(a.out, out)


if __name__ == "__main__":
    main()
