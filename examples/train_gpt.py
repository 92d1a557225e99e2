#!/usr/bin/env python3
"""A small character-level GPT (nanoGPT's architecture) trained on flashjit's own docs and
sources, with torch SDPA or flashjit as the attention: the one-line swap

    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # --attn sdpa
    y = flashjit.sdpa(q, k, v, is_causal=True)                    # --attn flashjit

    python3 examples/train_gpt.py [--attn flashjit|sdpa|both] [--device cpu|cuda] [--compile]
                                  [--preset nano|small|tiny] [--steps 200] [--batch-size N]
                                  [--dtype fp32|bf16|fp16] [--seed 1337] [--json PATH]

Data: README.md, docs/ and the sources (generator, runtime, templates, tuner, cli, python) in
sorted order, concatenated (nothing is downloaded); the characters are the vocabulary; the last
10% is the validation split. Batches: random windows drawn from a generator seeded with --seed,
so every run with the same seed sees the same batches; the model's initial weights come from the
same seed. --attn both trains the SDPA model, then the flashjit one, in one process, and reports
how far their losses are apart.

Presets (layers, heads, d_model, context, batch): nano = 6, 6, 384, 256, 32 (nanoGPT's
shakespeare_char model: 10.7M parameters, head_dim 64); small = 4, 4, 256, 128, 16 (a CPU run in
minutes); tiny = 2, 2, 128, 64, 4 (CI: seconds). No dropout (flashjit has no attention dropout).
AdamW (lr 1e-3, betas 0.9/0.99, weight decay 0.1), linear warm-up over the first 10% of the
steps, then cosine decay to lr/10; gradients clipped to norm 1.

Precision: --dtype defaults to bf16 on CUDA (torch.autocast: matmuls and attention in bf16,
weights and optimizer in fp32; flashjit's CUDA kernels take bf16/fp16 only, so --dtype fp32 with
--attn flashjit stops with flashjit's message) and fp32 on the CPU. --compile wraps the model in
torch.compile(fullgraph=True): flashjit.sdpa is the custom operator flashjit::attention there, no
graph break.

Prints a progress bar (a line per --log-every steps when stderr is not a terminal) with the loss
and tokens/s, then per run: the mean loss of the last 10 steps, the validation loss and the
throughput (tokens/s over the steps after the first log window, which holds compilation).
--json writes every step's loss, the throughput and the settings (examples/train_gpt_report.py
plots them).
"""
import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS_ROOTS = ("README.md", "docs", "generator", "runtime", "templates", "tuner", "cli",
                "python")
CORPUS_SUFFIXES = (".md", ".hpp", ".cpp", ".h", ".py")
PRESETS = {  # layers, heads, d_model, context, batch
    "nano": (6, 6, 384, 256, 32),
    "small": (4, 4, 256, 128, 16),
    "tiny": (2, 2, 128, 64, 4),
}
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attn", choices=("flashjit", "sdpa", "both"), default="flashjit")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="nano")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=None, help="default: the preset's")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="default bf16 on CUDA (autocast), fp32 on the CPU")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--eval-batches", type=int, default=10)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--json", default=None, help="write the runs' losses and throughput here")
    return parser.parse_args(argv)


# ---- data -------------------------------------------------------------------------------------

def corpus_files():
    files = []
    for root in CORPUS_ROOTS:
        path = REPO / root
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(p for p in path.rglob("*")
                         if p.is_file() and p.suffix in CORPUS_SUFFIXES and
                         not any(part.startswith((".", "__")) for part in p.parts))
    return sorted(files, key=lambda p: str(p.relative_to(REPO)))


def load_corpus(torch):
    """(train, val) as int64 token tensors, and the vocabulary (a string of characters)."""
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in corpus_files())
    vocab = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(vocab)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(data))
    return data[:split], data[split:], vocab


def batch(data, context, size, generator, device):
    """`size` random windows of `context` tokens and their next-token targets."""
    import torch

    starts = torch.randint(len(data) - context - 1, (size,), generator=generator)
    x = torch.stack([data[s:s + context] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + 1 + context] for s in starts.tolist()])
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


# ---- model (nanoGPT) --------------------------------------------------------------------------

def build_model(torch, attend, vocab_size, layers, heads, width, context):
    nn = torch.nn
    F = torch.nn.functional

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)

        def forward(self, x):
            b, t, c = x.shape
            # (b, t, 3c) -> q, k, v as (b, heads, t, head_dim) views
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2)
                       for z in self.qkv(x).split(c, dim=2))
            y = attend(q, k, v, is_causal=True)  # (b, heads, t, head_dim)
            return self.proj(y.transpose(1, 2).reshape(b, t, c))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.attn = CausalSelfAttention()
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                     nn.Linear(4 * width, width))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab_size, width)
            self.wpe = nn.Embedding(context, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab_size, bias=False)
            self.head.weight = self.wte.weight  # tied, as nanoGPT's
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() == 2:  # nanoGPT's init: residual projections scaled by depth
                    std = 0.02 / math.sqrt(2 * layers) if name.endswith(
                        ("proj.weight", "mlp.2.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            t = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))

    return GPT()


# ---- training ---------------------------------------------------------------------------------

class Progress:
    """A progress bar on stderr (\\r-redrawn on a terminal, a line per `every` steps else)."""

    def __init__(self, total, label, every):
        self.total, self.label, self.every = total, label, every
        self.tty = sys.stderr.isatty()

    def update(self, step, loss, rate):
        if not self.tty and step % self.every and step != self.total:
            return
        filled = int(30 * step / self.total)
        bar = "#" * filled + "." * (30 - filled)
        text = (f"{self.label:8} [{bar}] {step:>5}/{self.total} loss {loss:.4f} "
                f"{rate / 1e3:8.1f}k tok/s")
        sys.stderr.write(("\r" + text) if self.tty else (text + "\n"))
        if self.tty and step == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def learning_rate(step, steps, peak):
    warmup = max(1, steps // 10)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak / 10 + (peak - peak / 10) * 0.5 * (1 + math.cos(math.pi * progress))


def train(torch, attn, args, data, shape):
    """One run: {'loss': [per step], 'val_loss', 'tokens_per_s', 'seconds', ...}."""
    import flashjit

    layers, heads, width, context, batch_size = shape
    train_data, val_data, vocab = data
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    F = torch.nn.functional
    attend = flashjit.sdpa if attn == "flashjit" else F.scaled_dot_product_attention
    torch.manual_seed(args.seed)
    model = build_model(torch, attend, len(vocab), layers, heads, width, context).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99),
                                  weight_decay=0.1, fused=cuda or None)
    step_fn = model
    if args.compile:
        torch._dynamo.reset()
        step_fn = torch.compile(model, fullgraph=True)
    dtype = getattr(torch, DTYPES[args.dtype])
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    generator = torch.Generator().manual_seed(args.seed)
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)

    losses, window_rates = [], []
    progress = Progress(args.steps, attn, args.log_every)
    pending = []  # losses on the device, fetched once per log window (one sync per window)
    sync()
    start = window_start = time.perf_counter()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr)
        x, y = batch(train_data, context, batch_size, generator, device)
        with autocast:
            loss = step_fn(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        pending.append(loss.detach())
        done = step + 1
        if done % args.log_every == 0 or done == args.steps:
            losses.extend(torch.stack(pending).float().tolist())  # waits for the device
            now = time.perf_counter()
            rate = len(pending) * batch_size * context / (now - window_start)
            window_rates.append((len(pending), rate))
            pending, window_start = [], now
            progress.update(done, losses[-1], rate)
            if not math.isfinite(losses[-1]):
                raise SystemExit(f"{attn}: the loss is {losses[-1]} at step {done}")
    seconds = time.perf_counter() - start
    # Throughput after the first window (which holds compilation and warm-up).
    steady = window_rates[1:] or window_rates
    tokens = sum(n for n, _ in steady) * batch_size * context
    tokens_per_s = tokens / sum(n * batch_size * context / r for n, r in steady)

    model.eval()
    eval_generator = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad(), autocast:
        val = [step_fn(*batch(val_data, context, batch_size, eval_generator, device)).item()
               for _ in range(args.eval_batches)]
    tail = losses[-10:]
    return {"attn": attn, "loss": losses, "final_loss": sum(tail) / len(tail),
            "val_loss": sum(val) / len(val), "tokens_per_s": tokens_per_s, "seconds": seconds}


def describe_device(torch, device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    import flashjit

    device = torch.device(args.device)
    if args.dtype is None:
        args.dtype = "bf16" if device.type == "cuda" else "fp32"
    layers, heads, width, context, batch_size = PRESETS[args.preset]
    shape = (layers, heads, width, context, args.batch_size or batch_size)
    data = load_corpus(torch)
    parameters = 12 * layers * width * width + (len(data[2]) + context) * width
    print(f"train_gpt: {args.preset} ({layers} layers, {heads} heads, d_model {width}, context "
          f"{context}, batch {shape[4]}, ~{parameters / 1e6:.1f}M parameters), vocabulary "
          f"{len(data[2])}, {len(data[0]) + len(data[1])} characters; {args.steps} steps on "
          f"{describe_device(torch, device)}, {args.dtype}"
          f"{', torch.compile' if args.compile else ''}, torch {torch.__version__}", flush=True)
    attns = ("sdpa", "flashjit") if args.attn == "both" else (args.attn,)
    runs = {}
    for attn in attns:
        try:
            runs[attn] = train(torch, attn, args, data, shape)
        except flashjit.Error as error:
            raise SystemExit(f"train_gpt --attn {attn}: {error}") from None
        r = runs[attn]
        print(f"{attn:8}: loss {r['final_loss']:.4f} (mean of the last 10 steps), val "
              f"{r['val_loss']:.4f}, {r['tokens_per_s']:.0f} tokens/s, {r['seconds']:.1f} s",
              flush=True)
    agreement = None
    if len(runs) == 2:
        mine, theirs = runs["flashjit"], runs["sdpa"]
        agreement = {key: abs(mine[key] - theirs[key]) / theirs[key]
                     for key in ("final_loss", "val_loss")}
        agreement["max_step_difference"] = max(
            abs(a - b) / b for a, b in zip(mine["loss"], theirs["loss"]))
        print(f"flashjit vs sdpa: final loss {100 * agreement['final_loss']:.3f}% apart, "
              f"val {100 * agreement['val_loss']:.3f}%, at most "
              f"{100 * agreement['max_step_difference']:.3f}% at any step; throughput "
              f"{mine['tokens_per_s'] / theirs['tokens_per_s']:.2f}x", flush=True)
    if args.json:
        meta = {"preset": args.preset, "layers": layers, "heads": heads, "d_model": width,
                "context": context, "batch": shape[4], "steps": args.steps, "seed": args.seed,
                "dtype": args.dtype, "compile": args.compile, "device": args.device,
                "device_name": describe_device(torch, device), "torch": torch.__version__,
                "flashjit": flashjit.__version__, "commit": os.environ.get("COMMIT"),
                "vocabulary": len(data[2]), "characters": len(data[0]) + len(data[1])}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "runs": runs, "agreement": agreement}, f, indent=1)
    return runs, agreement


if __name__ == "__main__":
    main()
