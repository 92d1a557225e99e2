#!/usr/bin/env python3
"""examples/train_gpt.py's model with its sequence split over N ranks (context parallelism):
every attention layer is flashjit.distributed.ring_attention, every other layer runs on the
rank's own tokens.

    torchrun --standalone --nproc-per-node 2 examples/train_gpt_cp.py --preset tiny --steps 20
    torchrun --standalone --nproc-per-node 2 examples/train_gpt_cp.py --device cuda --preset nano
        [--context-parallel N (default: the world size)] [--split zigzag|contiguous]
        [--compare] [--json PATH] (and train_gpt.py's --preset, --steps, --batch-size, --dtype,
        --lr, --seed, --log-every, --eval-batches)

Each step every rank draws the same batch (train_gpt.py's batches: same seed, same windows) and
keeps its rows of the sequence (the zig-zag split by default: rank r holds chunks r and 2N-1-r,
which balances the causal work); the positional embedding takes the rows' global positions. The
loss is each rank's summed cross-entropy over the global number of tokens, so that the ranks'
losses add up to the one-rank loss, and the gradients are summed over the ranks (an all_reduce,
as data parallelism does), which leaves every rank with the one-rank gradient: the same model,
the same optimizer steps, the same loss as one rank up to float rounding. --compare (rank 0)
trains the same model on one rank with flashjit.sdpa afterwards and prints how far the losses
are apart.

Backends: gloo on the CPU (float32), NCCL on CUDA (one GPU per rank, cuda:LOCAL_RANK; bf16
autocast by default).
"""
import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _train_gpt():
    spec = importlib.util.spec_from_file_location("train_gpt", HERE / "train_gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv, base):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:LOCAL_RANK per rank)")
    parser.add_argument("--context-parallel", type=int, default=None,
                        help="ranks the sequence is split over (default: the world size)")
    parser.add_argument("--split", choices=("zigzag", "contiguous"), default="zigzag")
    parser.add_argument("--preset", choices=sorted(base.PRESETS), default="tiny")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--dtype", choices=sorted(base.DTYPES), default=None)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--compare", action="store_true",
                        help="rank 0 also trains on one rank and reports the loss difference")
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def main(argv=None):
    base = _train_gpt()
    args = parse_args(sys.argv[1:] if argv is None else argv, base)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import flashjit
    from flashjit import distributed as fd

    cuda = args.device.startswith("cuda")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    cp = args.context_parallel or world
    if cp != world:
        raise SystemExit(f"--context-parallel {cp}: run it with {cp} processes (torchrun "
                         f"--nproc-per-node {cp}); this run has {world}")
    if args.dtype is None:
        args.dtype = "bf16" if cuda else "fp32"
    layers, heads, width, context, batch_size = base.PRESETS[args.preset]
    batch_size = args.batch_size or batch_size
    chunks = 2 * cp if args.split == "zigzag" else cp
    if context % chunks:
        raise SystemExit(f"--preset {args.preset}: context {context} does not divide into "
                         f"{chunks} chunks (--split {args.split}, {cp} ranks)")
    shape = (layers, heads, width, context, batch_size)
    data = base.load_corpus(torch)
    split = lambda x: fd.split_sequence(x, cp, rank, args.split)  # noqa: E731
    positions = split(torch.arange(context)[None], ).squeeze(0).to(device)

    def attend(q, k, v, is_causal):  # (b, heads, t_local, head_dim)
        return fd.ring_attention(q, k, v, causal=is_causal, layout="bhsd", split=args.split)

    torch.manual_seed(args.seed)
    model = base.build_model(torch, attend, len(data[2]), layers, heads, width, context)
    model = model.to(device)

    def loss_of(x, y):
        """This rank's summed cross-entropy over the global token count."""
        h = model.wte(x) + model.wpe(positions)
        for block in model.blocks:
            h = block(h)
        logits = model.head(model.ln_f(h))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1),
                               reduction="sum") / (x.shape[0] * context)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99),
                                  weight_decay=0.1)
    dtype = getattr(torch, base.DTYPES[args.dtype])
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    generator = torch.Generator().manual_seed(args.seed)
    if rank == 0:
        print(f"train_gpt_cp: {args.preset} (context {context}, batch {batch_size}) over {cp} "
              f"ranks ({args.split} split: {context // cp} tokens per rank), "
              f"{dist.get_backend()}, {args.dtype}, {args.steps} steps", flush=True)
    losses = []
    start = time.perf_counter()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = base.learning_rate(step, args.steps, args.lr)
        x, y = base.batch(data[0], context, batch_size, generator, "cpu")
        x, y = split(x).to(device), split(y).to(device)
        with autocast:
            loss = loss_of(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)  # the one-rank gradient on every rank
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
        if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
            print(f"step {step + 1:>5}/{args.steps} loss {losses[-1]:.4f}", flush=True)
    seconds = time.perf_counter() - start
    model.eval()
    eval_generator = torch.Generator().manual_seed(args.seed + 1)
    val = []
    with torch.no_grad(), autocast:
        for _ in range(args.eval_batches):
            x, y = base.batch(data[1], context, batch_size, eval_generator, "cpu")
            total = loss_of(split(x).to(device), split(y).to(device)).detach()
            dist.all_reduce(total)
            val.append(total.item())
    result = {"loss": losses, "final_loss": sum(losses[-10:]) / len(losses[-10:]),
              "val_loss": sum(val) / max(1, len(val)), "seconds": seconds,
              "tokens_per_s": args.steps * batch_size * context / seconds}
    if rank == 0:
        print(f"context-parallel x{cp}: loss {result['final_loss']:.4f} (mean of the last 10 "
              f"steps), val {result['val_loss']:.4f}, {result['tokens_per_s']:.0f} tokens/s",
              flush=True)
    reference = difference = None
    if args.compare and rank == 0:
        one = argparse.Namespace(device=str(device), seed=args.seed, lr=args.lr, steps=args.steps,
                                 dtype=args.dtype, compile=False, log_every=args.log_every,
                                 eval_batches=args.eval_batches)
        try:
            reference = base.train(torch, "flashjit", one, data, shape)
        except flashjit.Error as error:
            raise SystemExit(f"train_gpt_cp --compare: {error}") from None
        difference = max(abs(a - b) / b for a, b in zip(losses, reference["loss"]))
        print(f"one rank: loss {reference['final_loss']:.4f}, val {reference['val_loss']:.4f}; "
              f"context-parallel vs one rank: at most {100 * difference:.4f}% apart at any "
              f"step", flush=True)
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({"context_parallel": cp, "split": args.split, "preset": args.preset,
                       "dtype": args.dtype, "run": result, "one_rank": reference,
                       "max_step_difference": difference}, f, indent=1)
    dist.barrier()
    return result, reference, difference


if __name__ == "__main__":
    try:
        main()
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
