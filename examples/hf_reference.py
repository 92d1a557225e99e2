#!/usr/bin/env python3
"""Greedy tokens of transformers' "sdpa" and flashjit's "fjit" attention in bf16 (or fp16), each
against an fp32 reference of the same weights: which of the two low-precision runs picks the
reference's tokens, and, where one does not, whether the reference itself nearly tied there.

    python3 examples/hf_reference.py [--device cpu|cuda] [--dtype bf16|fp16] [--preset tiny|...]
                                     [--batch 4] [--prompt-len 64] [--new-tokens 32]
                                     [--pad 0,7,1,0] [--reference eager|sdpa]
                                     [--tie-threshold X] [--json PATH]

The model and prompts are examples/hf_generate.py's (a Llama-style model from a config, random
weights, left padding per --pad). The bf16 model is built in fp32 and cast; the reference is that
bf16 model cast back to fp32 (the same weights exactly, bf16-rounded; --reference "eager": the
attention as fp32 matmuls and softmax, no fused kernel; TF32 off), so the only differences are
the arithmetic's precision and the attention implementation.

  * free-running: each implementation generates --new-tokens greedy tokens; per sequence, the
    first step where it leaves the reference's tokens, and the reference's logit gap there;
  * teacher-forced: each implementation is fed the reference's tokens (a logits processor forces
    them through generate(): the same prefill, cache and cached decode as a free run) and its own
    greedy choice is compared with the reference's at every step, so that one early near tie
    does not hide (or cascade into) every later step;
  * at each teacher-forced disagreement: the reference's logit of its own token minus its logit
    of the token the implementation chose (its "fp32 gap"; the top-2 margin is also given);
  * a near tie is an fp32 gap within the threshold: by default the larger of (1) the largest
    change that bf16 rounding makes, in the sdpa run, to the gap between the reference's token
    and any of its top --top-k candidates (measured here, over every step of every sequence: a
    pair closer than that can swap by rounding alone) and (2) twice the spacing of bf16 numbers
    at the largest logit (the logits themselves are bf16: closer logits may round to equal);
  * verdict: every fjit disagreement is a near tie, and fjit agrees with the reference at least as
    often as sdpa does, or, where the counts differ by chance (each is a handful of near ties),
    fjit's rounding error is no larger than sdpa's (mean over rows, within 10%).
Exit status 1 when the verdict fails.
"""
import argparse
import copy
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_generate  # noqa: E402

LOW = ("bf16", "fp16")
MANTISSA_BITS = {"bf16": 7, "fp16": 10}  # stored fraction bits
ERROR_RATIO = 1.1  # fjit's mean rounding error may exceed sdpa's by this factor (see the verdict)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    hf_generate.add_model_args(parser, dtypes=LOW, dtype="bf16")
    parser.add_argument("--reference", choices=("eager", "sdpa"), default="eager",
                        help="the fp32 reference's attention implementation")
    parser.add_argument("--top-k", type=int, default=8,
                        help="the reference's candidates whose gaps measure the rounding noise")
    parser.add_argument("--tie-threshold", type=float, default=None,
                        help="an absolute fp32 logit gap below which a disagreement is a near "
                             "tie (default: measured, see the documentation)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.new_tokens < 1 or args.top_k < 2:
        parser.error(f"--batch {args.batch}, --new-tokens {args.new_tokens}, --top-k "
                     f"{args.top_k}: expected >= 1, >= 1, >= 2")
    return hf_generate.finish_model_args(parser, args)


def build_models(args, torch, transformers):
    """(the low-precision model, the fp32 reference with the same (rounded) weights)."""
    fp32_args = copy.copy(args)
    fp32_args.dtype = "fp32"
    low = hf_generate.build_model(fp32_args, torch, transformers)
    low = low.to(getattr(torch, hf_generate.DTYPES[args.dtype]))
    reference = copy.deepcopy(low).float()
    reference.set_attn_implementation(args.reference)
    return low, reference


def make_forcing(transformers, torch):
    class Force(transformers.LogitsProcessor):
        """Greedy decoding that takes the given tokens: every other token's score -inf."""

        def __init__(self, tokens, start):
            self.tokens, self.start = tokens, start

        def __call__(self, input_ids, scores):
            step = input_ids.shape[1] - self.start
            forced = torch.full_like(scores, float("-inf"))
            return forced.scatter_(1, self.tokens[:, step:step + 1], 0.0)

    return Force


def generate(model, ids, mask, new_tokens, torch, transformers, force=None):
    """(tokens (batch, new_tokens), raw logits (batch, new_tokens, vocab) float32)."""
    processors = None
    if force is not None:
        processors = transformers.LogitsProcessorList(
            [make_forcing(transformers, torch)(force, ids.shape[1])])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, logits_processor=processors)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1).float()


def rounding_error(torch, reference_logits, reference_tokens, logits, top_k):
    """Per (sequence, step): the largest change, from the reference to `logits`, of the gap
    between the reference's token and one of its top_k candidates (batch, steps)."""
    delta = logits - reference_logits
    candidates = reference_logits.topk(top_k, dim=-1).indices
    own = delta.gather(-1, reference_tokens[..., None])
    return (delta.gather(-1, candidates) - own).abs().amax(dim=-1)


def spacing(dtype, value):
    """The distance between adjacent `dtype` numbers at |value| (bf16: 8 significant bits)."""
    value = abs(value)
    if value == 0:
        return 0.0
    return 2.0 ** (math.floor(math.log2(value)) - MANTISSA_BITS[dtype])


def summarize(values):
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return dict(mean=0.0, p99=0.0, max=0.0)
    p99 = ordered[min(len(ordered) - 1, int(math.ceil(0.99 * len(ordered))) - 1)]
    return dict(mean=sum(ordered) / len(ordered), p99=p99, max=ordered[-1])


def teacher_forced(torch, reference_logits, reference_tokens, logits, threshold):
    """Agreement of `logits`' greedy choices with the reference tokens at every step."""
    choices = logits.argmax(dim=-1)
    agree = choices == reference_tokens
    own = reference_logits.gather(-1, reference_tokens[..., None])[..., 0]
    gap = own - reference_logits.gather(-1, choices[..., None])[..., 0]
    best = reference_logits.topk(2, dim=-1).values
    margin = best[..., 0] - best[..., 1]
    disagreements = []
    for b, t in torch.nonzero(~agree).tolist():
        disagreements.append(dict(
            sequence=b, step=t, reference_token=int(reference_tokens[b, t]),
            chosen=int(choices[b, t]), fp32_gap=float(gap[b, t]),
            fp32_top2_margin=float(margin[b, t]), near_tie=bool(gap[b, t] <= threshold)))
    rows = ["".join("." if x else "x" for x in row) for row in agree.tolist()]
    return dict(agree=int(agree.sum()), of=agree.numel(), rows=rows,
                disagreements=disagreements,
                all_near_ties=all(d["near_tie"] for d in disagreements))


def free_running(reference_logits, reference_tokens, tokens, threshold):
    """Per sequence: the first step leaving the reference's tokens (None: never) and the
    reference's gap there (its prefix up to that step is the reference's own)."""
    sequences = []
    for b in range(tokens.shape[0]):
        differs = (tokens[b] != reference_tokens[b]).nonzero()
        if differs.numel() == 0:
            sequences.append(dict(first_difference=None, agreeing=tokens.shape[1]))
            continue
        t = int(differs[0])
        row = reference_logits[b, t]
        gap = float(row[reference_tokens[b, t]] - row[tokens[b, t]])
        sequences.append(dict(first_difference=t, agreeing=t, fp32_gap=gap,
                              near_tie=gap <= threshold))
    return dict(identical=sum(s["first_difference"] is None for s in sequences),
                agreeing_tokens=sum(s["agreeing"] for s in sequences), sequences=sequences)


def verdict(results, names):
    sdpa, fjit = (results[n] for n in names)
    ratio = fjit["rounding_error"]["mean"] / max(sdpa["rounding_error"]["mean"], 1e-30)
    as_often = fjit["teacher_forced"]["agree"] >= sdpa["teacher_forced"]["agree"]
    near_ties = fjit["teacher_forced"]["all_near_ties"]
    return dict(
        fjit_disagreements_all_near_ties=near_ties,
        fjit_agrees_at_least_as_often=as_often,
        agreement={n: results[n]["teacher_forced"]["agree"] for n in names},
        rounding_error_ratio=ratio,
        ok=bool(near_ties and (as_often or ratio <= ERROR_RATIO)))


def compare(args, torch, transformers, name="fjit"):
    """The whole comparison (see the module's documentation): the summary dict."""
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    low, reference = build_models(args, torch, transformers)
    ids, mask = hf_generate.prompts(args, torch, low.config.vocab_size)
    n = args.new_tokens
    start = time.perf_counter()
    reference_tokens, reference_logits = generate(reference, ids, mask, n, torch, transformers)
    del reference
    runs = {}
    for implementation in ("sdpa", name):
        low.set_attn_implementation(implementation)
        tokens, _ = generate(low, ids, mask, n, torch, transformers)
        _, forced = generate(low, ids, mask, n, torch, transformers, force=reference_tokens)
        runs[implementation] = (tokens, forced)
    seconds = time.perf_counter() - start
    errors = {k: rounding_error(torch, reference_logits, reference_tokens, forced, args.top_k)
              for k, (_, forced) in runs.items()}
    scale = float(reference_logits.abs().max())
    measured = float(errors["sdpa"].max())
    floor = 2 * spacing(args.dtype, scale)
    threshold = args.tie_threshold if args.tie_threshold is not None else max(measured, floor)
    results = {}
    for implementation, (tokens, forced) in runs.items():
        results[implementation] = dict(
            teacher_forced=teacher_forced(torch, reference_logits, reference_tokens, forced,
                                          threshold),
            free_running=free_running(reference_logits, reference_tokens, tokens, threshold),
            rounding_error=summarize(errors[implementation].flatten().tolist()))
    device = (torch.cuda.get_device_name(args.device) if args.device.startswith("cuda")
              else "CPU")
    return dict(
        preset=args.preset, device=device, dtype=args.dtype, reference=f"fp32 {args.reference}",
        batch=args.batch, prompt_len=args.prompt_len, new_tokens=n, pad=args.pad,
        logit_scale=scale, tie_threshold=dict(
            value=threshold, relative_to_logit_scale=threshold / max(scale, 1e-30),
            measured_sdpa_max_rounding_error=measured, two_spacings_at_scale=floor,
            given=args.tie_threshold is not None),
        results=results, verdict=verdict(results, ("sdpa", name)), seconds=seconds,
        reference_tokens=reference_tokens.tolist(),
        transformers_version=transformers.__version__, torch_version=torch.__version__)


def report(summary):
    """The summary as printed lines."""
    s = summary
    threshold = s["tie_threshold"]
    lines = [
        f"model: Llama-style {s['preset']}, {s['dtype']} vs a {s['reference']} reference of "
        f"the same weights on {s['device']}; batch {s['batch']}, prompt {s['prompt_len']} "
        f"(left padding {s['pad']}), {s['new_tokens']} new tokens",
        f"near-tie threshold: {threshold['value']:.4g} ({threshold['relative_to_logit_scale']:.3g}"
        f" of the largest logit {s['logit_scale']:.3g}; "
        + ("given" if threshold["given"] else
           f"max of sdpa's largest rounding change of a top-candidate gap "
           f"{threshold['measured_sdpa_max_rounding_error']:.4g} and two bf16/fp16 spacings at "
           f"the largest logit {threshold['two_spacings_at_scale']:.4g}") + ")"]
    for implementation, result in s["results"].items():
        forced, free = result["teacher_forced"], result["free_running"]
        error = result["rounding_error"]
        ties = sum(d["near_tie"] for d in forced["disagreements"])
        lines.append(
            f"{implementation:>5}: teacher-forced {forced['agree']}/{forced['of']} steps agree "
            f"with fp32 ({len(forced['disagreements'])} disagreements, {ties} near ties); "
            f"free-running {free['identical']}/{len(free['sequences'])} sequences identical, "
            f"{free['agreeing_tokens']}/{len(free['sequences']) * s['new_tokens']} tokens before "
            f"the first difference; rounding error mean {error['mean']:.3g} p99 {error['p99']:.3g}"
            f" max {error['max']:.3g}")
        for b, row in enumerate(forced["rows"]):
            if "x" in row:
                lines.append(f"        sequence {b}: {row}")
        for d in forced["disagreements"]:
            lines.append(
                f"        step {d['step']} of sequence {d['sequence']}: chose {d['chosen']} for "
                f"{d['reference_token']}, fp32 gap {d['fp32_gap']:.4g} (top-2 margin "
                f"{d['fp32_top2_margin']:.4g}): {'near tie' if d['near_tie'] else 'NOT a tie'}")
        for b, seq in enumerate(free["sequences"]):
            if seq["first_difference"] is not None:
                lines.append(
                    f"        free-running sequence {b} leaves the reference at step "
                    f"{seq['first_difference']}: fp32 gap {seq['fp32_gap']:.4g} "
                    f"({'near tie' if seq['near_tie'] else 'NOT a tie'})")
    v = s["verdict"]
    lines.append(
        f"verdict: {'PASS' if v['ok'] else 'FAIL'}: fjit's disagreements "
        f"{'are all near ties' if v['fjit_disagreements_all_near_ties'] else 'include non-ties'}"
        f"; agreement fjit {v['agreement']['fjit']} vs sdpa {v['agreement']['sdpa']} "
        f"(at least as often: {v['fjit_agrees_at_least_as_often']}); rounding error fjit/sdpa "
        f"{v['rounding_error_ratio']:.3f} (<= {ERROR_RATIO} counts when the agreement is lower)")
    return lines


def main(argv=None):
    args, torch, transformers, name = hf_generate.start(parse_args, argv)
    summary = compare(args, torch, transformers, name)
    print("\n".join(report(summary)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    if argv is None and not summary["verdict"]["ok"]:
        sys.exit(1)
    return summary


if __name__ == "__main__":
    main()
