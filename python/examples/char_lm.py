#!/usr/bin/env python3
"""A character-level transformer language model trained twice with libcastle: once with CASTLE
attention (castle.torch.CastleAttention) and once with the library's causal attention
(castle.torch.CausalAttention), same width, depth, heads, data, batches, steps and optimiser.

The text is the licences Debian ships in /usr/share/common-licenses (GPL, LGPL, GFDL, Apache, MPL,
Artistic): the first 90% of its characters train, the last 10% are held out.  The run writes
char_lm.png (training and held-out loss curves of both models) and char_lm.md (a table: parameters,
time per training step, final training and held-out loss), and ends by sampling a few lines from
each model through its cache (castle.Cache / castle.CausalCache: a prompt, then one token per call).

    python3 python/examples/char_lm.py            # the defaults: at most ~15 minutes on 2 CPU cores
    python3 python/examples/char_lm.py --smoke    # a few tiny steps, seconds (run by the test suite)
"""

import argparse
import math
import os
import sys
import time

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # the package beside it,
import castle  # noqa: E402  when it is not installed
import castle.torch as ct  # noqa: E402

LICENSES = ["GPL-3", "GPL-2", "LGPL-3", "LGPL-2.1", "GFDL-1.3", "Apache-2.0", "MPL-2.0", "Artistic"]


def load_text(paths):
    parts = []
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
    return "\n".join(parts)


class Block(nn.Module):
    def __init__(self, attn, width):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(width), attn, nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, cache=None, generate=False):
        if generate:
            a, cache = self.attn(self.ln1(x), cache=cache, return_cache=True)
        else:
            a = self.attn(self.ln1(x))
        x = x + a
        return x + self.mlp(self.ln2(x)), cache


class CharLM(nn.Module):
    def __init__(self, kind, vocab, width, layers, heads, context):
        super().__init__()
        dh = width // heads
        make = {"castle": lambda: ct.CastleAttention(width, heads, dh, cache_capacity=context),
                "causal": lambda: ct.CausalAttention(width, heads, dh, cache_capacity=context)}[kind]
        self.context = context
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(make(), width) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, idx, caches=None, start=0):
        """Logits for idx (B, L).  With caches (a list, one per layer, None entries for a prompt) the
        attention runs through the layers' caches and the new caches come back as well."""
        pos = torch.arange(start, start + idx.shape[1])
        x = self.tok(idx) + self.pos(pos)
        new = []
        for i, b in enumerate(self.blocks):
            x, c = b(x, None if caches is None else caches[i], generate=caches is not None)
            new.append(c)
        logits = self.head(self.ln(x))
        return (logits, new) if caches is not None else logits


def batches(data, rng, batch, context):
    i = rng.integers(0, len(data) - context - 1, batch)
    x = np.stack([data[j:j + context] for j in i])
    y = np.stack([data[j + 1:j + context + 1] for j in i])
    return torch.from_numpy(x).long(), torch.from_numpy(y).long()


@torch.no_grad()
def evaluate(model, held):
    model.eval()
    losses = [nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item() for x, y in held]
    model.train()
    return float(np.mean(losses))


@torch.no_grad()
def sample(model, stoi, itos, prompt, n, temperature, gen):
    model.eval()
    idx = torch.tensor([[stoi.get(c, 0) for c in prompt]])
    logits, caches = model(idx, caches=[None] * len(model.blocks))  # prefill
    out = []
    for t in range(n):
        p = torch.softmax(logits[0, -1] / temperature, dim=-1)
        nxt = torch.multinomial(p, 1, generator=gen)
        out.append(itos[nxt.item()])
        if idx.shape[1] + t + 1 >= model.context:
            break
        logits, caches = model(nxt.view(1, 1), caches=caches, start=idx.shape[1] + t)  # one token per call
    return prompt + "".join(out)


def train(kind, args, data_train, held, vocab):
    torch.manual_seed(args.seed)
    model = CharLM(kind, vocab, args.width, args.layers, args.heads, args.context)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    rng = np.random.default_rng(args.seed)  # the same batches for both models
    curve, evals, times, cpu = [], [], [], []
    for step in range(1, args.steps + 1):
        x, y = batches(data_train, rng, args.batch, args.context)
        t0, c0 = time.perf_counter(), time.process_time()
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)  # this process's CPU time, PoCL's threads included
        curve.append(loss.item())
        if step % args.eval_every == 0 or step == args.steps:
            evals.append((step, evaluate(model, held)))
            print(f"  {kind:6s} step {step:4d}  train {np.mean(curve[-args.eval_every:]):.3f}  "
                  f"held-out {evals[-1][1]:.3f}  {1e3 * np.mean(times[-args.eval_every:]):.0f} ms/step", flush=True)
    return model, curve, evals, times, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-batches", type=int, default=16, help="held-out batches per evaluation (fixed)")
    ap.add_argument("--sample-chars", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text", nargs="*", default=[os.path.join("/usr/share/common-licenses", n) for n in LICENSES])
    ap.add_argument("--out", default="char_lm_out", help="directory for char_lm.png and char_lm.md")
    ap.add_argument("--smoke", action="store_true", help="a few tiny steps (seconds): checks that everything runs")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.batch, args.context, args.width, args.layers, args.heads = 3, 2, 32, 32, 1, 2
        args.eval_every, args.eval_batches, args.sample_chars = 2, 1, 8

    text = load_text(args.text)
    chars = sorted(set(text))
    stoi, itos = {c: i for i, c in enumerate(chars)}, dict(enumerate(chars))
    data = np.array([stoi[c] for c in text], dtype=np.int64)
    cut = int(0.9 * len(data))
    held_rng = np.random.default_rng(12345)
    held = [batches(data[cut:], held_rng, args.batch, args.context) for _ in range(args.eval_batches)]
    print(f"libcastle {castle.library_version} from {castle.library_path} ({castle.library_origin}); "
          f"device {castle.default_device().name}")
    print(f"text: {len(text)} characters, vocabulary {len(chars)}; {cut} train, {len(data) - cut} held out")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"model: {args.layers} layers, width {args.width}, {args.heads} heads, context {args.context}, "
          f"batch {args.batch}, {args.steps} steps")

    results = {}
    for kind in ("castle", "causal"):
        model, curve, evals, times, cpu = train(kind, args, data[:cut], held, len(chars))
        params = sum(p.numel() for p in model.parameters())
        w = min(5, len(times) - 1)  # the first steps build kernels and warm caches
        results[kind] = dict(model=model, curve=curve, evals=evals, params=params, ms=1e3 * float(np.mean(times[w:])),
                             cpu_ms=1e3 * float(np.mean(cpu[w:])))

    os.makedirs(args.out, exist_ok=True)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    k = max(1, args.steps // 40)
    for kind, color in (("castle", "tab:blue"), ("causal", "tab:orange")):
        r = results[kind]
        c = np.convolve(r["curve"], np.ones(k) / k, mode="valid")
        ax.plot(np.arange(k, len(r["curve"]) + 1), c, color=color, alpha=0.5, label=f"{kind} train (mean of {k})")
        ax.plot(*zip(*r["evals"]), "o-", color=color, label=f"{kind} held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/char)")
    ax.set_title(f"char LM: {args.layers}x{args.width}, context {args.context}, libcastle on {castle.default_device().name}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "char_lm.png"), dpi=100)

    rows = ["| attention | parameters | ms / training step (wall) | CPU ms / step | final train loss (last 10% of steps) "
            "| held-out loss |", "|---|---|---|---|---|---|"]
    for kind, r in results.items():
        tail = r["curve"][-max(1, args.steps // 10):]
        rows.append(f"| {kind} | {r['params']:,} | {r['ms']:.0f} | {r['cpu_ms']:.0f} | {np.mean(tail):.3f} | {r['evals'][-1][1]:.3f} |")
    table = "\n".join(rows)
    with open(os.path.join(args.out, "char_lm.md"), "w") as f:
        f.write(table + "\n")
    print("\n" + table + "\n")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times grow with it)")
    print(f"wrote {os.path.join(args.out, 'char_lm.png')} and {os.path.join(args.out, 'char_lm.md')}")

    gen = torch.Generator().manual_seed(args.seed)
    for kind, r in results.items():
        print(f"samples from {kind} (through its cache):")
        for prompt in ("This License", "You may ", "The "):
            line = sample(r["model"], stoi, itos, prompt, args.sample_chars, 0.8, gen)
            print("  " + repr(line)[1:-1])


if __name__ == "__main__":
    main()
