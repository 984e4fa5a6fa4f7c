#!/usr/bin/env python3
"""Trains hapilot's own policy model with PyTorch, its loss on the answer alone.

llama-finetune (the first two attempts, docs/lab/own-model.md) takes its loss on every
token of its text, so a model of this size spends itself on predicting the
prompts: the servers' figures, which no model can predict. After the
assistant's header it then wrote more prompt. Here the loss is on the
answer's tokens only (the JSON plan and the newline the Modelfile stops at):
the prompt is read, never predicted, which is how the model is used.

The model is llama.cpp's llama as Ollama serves it (internal/lab/modelserver
writes its GGUF): RMSNorm, attention with rotary embeddings on adjacent
pairs (GGML's "normal" RoPE, which Ollama and llama.cpp apply to a llama),
as many K/V heads as Q heads, and a SwiGLU feed-forward. The weights go to a
GGUF of F32 tensors with GGML's names and shapes; `hapilot-bench dataset
--trained` then writes it servable with the recipe's keys and vocabulary.

  train.py --work DIR --out FILE.gguf [--penalty N] [--history N] [--epochs N] ...

DIR is what `hapilot-bench dataset` wrote: examples.jsonl (the token ids
and where each answer starts) and stats.json (the model's shape).
--penalty N weighs the loss of an example that flags a healthy server N
times: the same examples and the same steps as without it, which is what
the with-and-without comparison needs. --history N weighs N times an
example whose prompt holds a history line and whose answer acts
(acts_after_history): few of them, and a model that saw history mostly
before no_op answered no_op after it (the sixth attempt). Both models of a
recipe take the same --history; the validation loss weighs every example
alike.
"""

import argparse
import json
import math
import os
import random
import struct
import sys
import time


def _threads():
    # OpenBLAS starts a thread per core of its own unless told, whatever
    # torch.set_num_threads says: two trainers on 2 cores then ran four
    # threads, half the CPU in the kernel, 3 times slower a step.
    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return "1"


for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _threads())

import torch  # noqa: E402  (after the thread counts, which it reads on import)
import torch.nn.functional as F  # noqa: E402


def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(n, dim, base=10000.0):
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cos(ang), torch.sin(ang)


def rope(x, cos, sin):
    # x: batch, heads, time, dim. GGML's normal mode rotates the pairs
    # (x[2i], x[2i+1]); NeoX's would rotate (x[i], x[i+dim/2]).
    t = x.shape[2]
    c, s = cos[:t], sin[:t]
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


class Llama(torch.nn.Module):
    def __init__(self, vocab, width, layers, heads, ff, ctx):
        super().__init__()
        self.heads = heads
        self.tok = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            b = torch.nn.Module()
            b.attn_norm = torch.nn.Parameter(torch.ones(width))
            b.ffn_norm = torch.nn.Parameter(torch.ones(width))
            for name, (i, o) in {"q": (width, width), "k": (width, width), "v": (width, width), "o": (width, width),
                                 "gate": (width, ff), "up": (width, ff), "down": (ff, width)}.items():
                setattr(b, name, torch.nn.Linear(i, o, bias=False))
            self.blocks.append(b)
        self.norm = torch.nn.Parameter(torch.ones(width))
        self.out = torch.nn.Linear(width, vocab, bias=False)
        cos, sin = rope_tables(ctx, width // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        # GPT-2's initialisation: 0.02, the residual projections down by
        # the square root of twice the depth.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("o.weight", "down.weight")) else 0.02
                torch.nn.init.normal_(p, std=std)

    def forward(self, ids):
        bsz, t = ids.shape
        x = self.tok(ids)
        hd = x.shape[-1] // self.heads
        causal = torch.full((t, t), float("-inf")).triu(1)
        for b in self.blocks:
            h = rms_norm(x, b.attn_norm)
            q, k, v = (getattr(b, n)(h).view(bsz, t, self.heads, hd).transpose(1, 2) for n in "qkv")
            q, k = rope(q, self.cos, self.sin), rope(k, self.cos, self.sin)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + causal, dim=-1)
            x = x + b.o((att @ v).transpose(1, 2).reshape(bsz, t, -1))
            h = rms_norm(x, b.ffn_norm)
            x = x + b.down(F.silu(b.gate(h)) * b.up(h))
        return self.out(rms_norm(x, self.norm))

    def tensors(self):
        """GGML's names, with torch's row-major shapes (GGML lists them reversed)."""
        yield "token_embd.weight", self.tok.weight
        yield "output.weight", self.out.weight
        yield "output_norm.weight", self.norm
        names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
                 "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
        for i, b in enumerate(self.blocks):
            yield f"blk.{i}.attn_norm.weight", b.attn_norm
            yield f"blk.{i}.ffn_norm.weight", b.ffn_norm
            for n, g in names.items():
                yield f"blk.{i}.{g}.weight", getattr(b, n).weight


def write_gguf(path, tensors):
    """A GGUF v3 of F32 tensors and one key (the architecture): enough for
    modelserver.WriteTrained, which takes the tensors and writes the keys."""
    align = 32

    def string(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1)
    head += string("general.architecture") + struct.pack("<I", 8) + string("llama")
    offset, datas = 0, []
    for name, t in tensors:
        a = t.detach().contiguous().to(torch.float32).numpy()
        dims = list(reversed(a.shape))
        head += string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        head += struct.pack("<IQ", 0, offset)
        raw = a.tobytes()
        pad = (-len(raw)) % align
        datas.append(raw + b"\0" * pad)
        offset += len(raw) + pad
    head += b"\0" * ((-len(head)) % align)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head)
        for d in datas:
            f.write(d)
    os.replace(tmp, path)


def batches(examples, tokens_per_batch, rng):
    """Examples of like length together, each batch about tokens_per_batch
    padded tokens, in a shuffled order."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["ids"]))
    out, cur, longest = [], [], 0
    for i in order:
        n = len(examples[i]["ids"])
        if cur and max(longest, n) * (len(cur) + 1) > tokens_per_batch:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def tensors_of(examples, idx, penalty, history=1.0):
    """Inputs, targets and per-token weights: the loss is on the answer's
    tokens, an example that flags a healthy server weighed penalty times,
    one that acts after a history line history times (both: the product)."""
    t = max(len(examples[i]["ids"]) for i in idx) - 1
    inp = torch.zeros(len(idx), t, dtype=torch.long)
    tgt = torch.zeros(len(idx), t, dtype=torch.long)
    wt = torch.zeros(len(idx), t)
    for r, i in enumerate(idx):
        e = examples[i]
        ids = torch.tensor(e["ids"], dtype=torch.long)
        n = len(ids) - 1
        inp[r, :n], tgt[r, :n] = ids[:-1], ids[1:]
        # Position p predicts token p+1: the answer starts at answer_at.
        w = penalty if e.get("suspicious") else 1.0
        if e.get("acts_after_history"):
            w *= history
        wt[r, e["answer_at"] - 1:n] = w
    return inp, tgt, wt


def loss_of(model, batch):
    inp, tgt, wt = batch
    logits = model(inp)
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none")
    return (nll * wt.reshape(-1)).sum(), wt.sum(), ((logits.argmax(-1) == tgt) | (wt == 0)).all(-1).sum().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--penalty", type=float, default=1.0)
    ap.add_argument("--history", type=float, default=1.0)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--lr-min", type=float, default=3e-4)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--val", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=0, help="stop after this long, at the end of a step (0: no limit)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    with open(os.path.join(a.work, "stats.json")) as f:
        spec = json.load(f)["recipe"]["Spec"]
    with open(os.path.join(a.work, "vocab.json")) as f:
        vocab = len(json.load(f)["Tokens"])
    with open(os.path.join(a.work, "examples.jsonl")) as f:
        examples = [json.loads(line) for line in f]
    nval = max(1, int(len(examples) * a.val))
    # The validation examples are the last ones drawn: whole situations
    # apart from most of the training's, since a situation's steps come
    # one after another.
    train, val = examples[:-nval], examples[-nval:]
    model = Llama(vocab, spec["Width"], spec["Layers"], spec["Heads"], spec["FF"], spec["ContextLength"])
    params = sum(p.numel() for p in model.parameters())
    answer = sum(len(e["ids"]) - e["answer_at"] for e in train)
    print(f"train.py: {params} parameters (width {spec['Width']}, {spec['Layers']} blocks, {spec['Heads']} heads, ff {spec['FF']}, "
          f"vocab {vocab}); {len(train)} examples ({answer} answer tokens), {len(val)} held out; penalty {a.penalty:g}, history {a.history:g} "
          f"({sum(1 for e in train if e.get('acts_after_history'))} act after one); "
          f"{a.epochs} epochs, lr {a.lr:g} to {a.lr_min:g}, {a.batch_tokens} tokens a batch, {a.threads} thread(s)", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01, betas=(0.9, 0.95))
    steps = a.epochs * len(batches(train, a.batch_tokens, random.Random(0)))
    warm = max(1, steps // 50)

    def lr_at(s):
        if s < warm:
            return a.lr * (s + 1) / warm
        p = (s - warm) / max(1, steps - warm)
        return a.lr_min + 0.5 * (a.lr - a.lr_min) * (1 + math.cos(math.pi * p))

    def evaluate():
        model.eval()
        tot, n, exact = 0.0, 0.0, 0
        with torch.no_grad():
            for idx in batches(val, a.batch_tokens, random.Random(0)):
                l, w, e = loss_of(model, tensors_of(val, idx, 1.0))
                tot, n, exact = tot + l.item(), n + w.item(), exact + e
        model.train()
        return tot / n, exact / len(val)

    start, step = time.time(), 0
    for epoch in range(a.epochs):
        tot, n = 0.0, 0.0
        for idx in batches(train, a.batch_tokens, rng):
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            l, w, _ = loss_of(model, tensors_of(train, idx, a.penalty, a.history))
            opt.zero_grad()
            (l / w).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            tot, n, step = tot + l.item(), n + w.item(), step + 1
            if step % 50 == 0:
                print(f"train: epoch {epoch + 1} step {step}/{steps} loss {tot / n:.4f} lr {lr_at(step):.2e} {time.time() - start:.0f}s", flush=True)
            if a.minutes and time.time() - start > a.minutes * 60:
                break
        vl, ve = evaluate()
        print(f"val: epoch {epoch + 1} train loss {tot / max(n, 1):.4f} val loss {vl:.4f} val answers exact {ve:.3f} {time.time() - start:.0f}s", flush=True)
        write_gguf(a.out, list(model.tensors()))
        if a.minutes and time.time() - start > a.minutes * 60:
            print(f"train.py: stopped at {a.minutes:g} min, in epoch {epoch + 1}", flush=True)
            break
    print(f"train.py: wrote {a.out} after {step} steps in {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
