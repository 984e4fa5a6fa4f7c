#!/usr/bin/env python3
"""Checks that a model server runs the trained model as PyTorch does.

train.py writes its own GGUF, so a slip in it (a tensor transposed, RoPE on
the wrong pairs) would give a model that trained well and serves nonsense.
This reads the held-out examples' prompts as token ids, answers each
greedily in PyTorch from the trained GGUF's tensors, and asks llama-server
(/completion, the same ids, temperature 0) for its answer. It prints how
many agree token for token and exits 1 under --min. It also prints how many
of PyTorch's answers name the label's action and server, by the label's
action: what the model learned, on examples it never trained on.

  check.py --work DIR --gguf TRAINED.gguf --server URL [--n 20] [--min 0.9]
"""

import argparse
import json
import os
import struct
import sys
import urllib.request

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import Llama  # noqa: E402


def read_gguf(path):
    """The tensors of a GGUF train.py wrote: F32, torch's shapes."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"GGUF":
        raise SystemExit(f"{path}: not a GGUF")
    _, nt, nkv = struct.unpack_from("<IQQ", data, 4)
    p = 24

    def string():
        nonlocal p
        (n,) = struct.unpack_from("<Q", data, p)
        p += 8 + n
        return data[p - n:p].decode()

    for _ in range(nkv):
        string()
        (typ,) = struct.unpack_from("<I", data, p)
        p += 4
        if typ != 8:
            raise SystemExit(f"{path}: a key of type {typ}: not one train.py wrote")
        string()
    infos = []
    for _ in range(nt):
        name = string()
        (nd,) = struct.unpack_from("<I", data, p)
        dims = struct.unpack_from(f"<{nd}Q", data, p + 4)
        typ, off = struct.unpack_from("<IQ", data, p + 4 + 8 * nd)
        p += 4 + 8 * nd + 12
        infos.append((name, tuple(reversed(dims)), typ, off))
    base = p + (-p) % 32
    out = {}
    for name, shape, typ, off in infos:
        n = 1
        for d in shape:
            n *= d
        out[name] = torch.frombuffer(bytearray(data[base + off:base + off + 4 * n]), dtype=torch.float32).reshape(shape)
    return out


def load(model, tensors):
    for name, p in model.tensors():
        with torch.no_grad():
            p.copy_(tensors[name])


def greedy(model, ids, stop, limit):
    out = []
    with torch.no_grad():
        for _ in range(limit):
            nxt = int(model(torch.tensor([ids + out]))[0, -1].argmax())
            out.append(nxt)
            if nxt in stop:
                break
    return out


def served(url, ids, limit):
    body = json.dumps({"prompt": ids, "n_predict": limit, "temperature": 0, "top_k": 1, "cache_prompt": False,
                       "return_tokens": True, "stream": False}).encode()
    req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)["tokens"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--gguf", required=True, help="what train.py wrote")
    ap.add_argument("--server", required=True, help="llama-server serving the servable GGUF")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--min", type=float, default=0.9)
    a = ap.parse_args()
    torch.set_num_threads(1)
    with open(os.path.join(a.work, "stats.json")) as f:
        spec = json.load(f)["recipe"]["Spec"]
    with open(os.path.join(a.work, "vocab.json")) as f:
        tokens = json.load(f)["Tokens"]
    with open(os.path.join(a.work, "examples.jsonl")) as f:
        examples = [json.loads(line) for line in f][-a.n:]
    model = Llama(len(tokens), spec["Width"], spec["Layers"], spec["Heads"], spec["FF"], spec["ContextLength"])
    load(model, read_gguf(a.gguf))
    model.eval()
    # The answer ends at the first token that holds a newline: the
    # Modelfile's stop.
    stop = {i for i, t in enumerate(tokens) if "\n" in t}
    agree = 0
    right = {}  # the label's action: [right action and server, examples]
    acted = 0

    def decode(ids):
        return "".join(tokens[i] for i in ids).replace("\u2581", " ").strip()

    def action(text):
        try:
            a = json.loads(text)["actions"][0]
            return a["action"], a.get("server")
        except (ValueError, KeyError, IndexError, TypeError):
            return "invalid", None

    for e in examples:
        prompt = e["ids"][:e["answer_at"]]
        limit = len(e["ids"]) - e["answer_at"] + 8
        mine = greedy(model, prompt, stop, limit)
        theirs = served(a.server, prompt, len(mine))
        same = theirs[:len(mine)] == mine
        agree += same
        want = action(decode(e["ids"][e["answer_at"]:]))
        got = action(decode(mine))
        tally = right.setdefault(want[0], [0, 0])
        tally[0] += got == want
        tally[1] += 1
        # An action where the label is no_op: what a penalty should cut.
        acted += want[0] == "no_op" and got[0] not in ("no_op", "invalid")
        if not same:
            print(f"differ: torch {''.join(tokens[i] for i in mine)!r}\n        server {''.join(tokens[i] for i in theirs)!r}")
    print("check.py: PyTorch's answers with the label's action and server: " +
          ", ".join(f"{k} {v[0]} of {v[1]}" for k, v in sorted(right.items())) +
          f"; an action where the label is no_op: {acted}")
    share = agree / len(examples)
    print(f"check.py: {agree} of {len(examples)} held-out answers the same token for token in PyTorch and at {a.server}")
    return 0 if share >= a.min else 1


if __name__ == "__main__":
    sys.exit(main())
