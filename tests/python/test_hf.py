"""flashjit.hf (issue 32): flashjit as a Hugging Face transformers attention implementation
(attn_implementation="fjit" after flashjit.hf.register()), against transformers' own "sdpa" (or
"eager" where SDPA has no softcap) on tiny models built from configs (random weights, nothing
downloaded): Llama with GQA (prefill logits, greedy generate() with left padding through the
cached decode, right padding, packed sequences by position_ids, training gradients), Mistral's
sliding window and Gemma 2's softcap + alternating windows; flashjit really runs (a spy on
flashjit.attention, no fallback call), and what it does not take raises UnsupportedError or goes
to the fallback when asked. float32 on the CPU backend (greedy tokens identical); the Llama cases
in bfloat16 on CUDA (`pytest tests/python/test_hf.py -k cuda`, skips without a GPU; tokens
identical or parted at a near tie of sdpa's own logits). Skips without transformers."""
import pytest

import flashjit
from conftest import have_module, require_cpu_backward, require_gpu

if not have_module("torch"):
    pytest.skip("torch is not installed", allow_module_level=True)
if not have_module("transformers"):
    pytest.skip("transformers is not installed (scripts/common.sh installs it for the tests)",
                allow_module_level=True)

import torch  # noqa: E402
import transformers  # noqa: E402

import flashjit.hf  # noqa: E402

NAME = flashjit.hf.register()

DEVICES = [pytest.param("cpu", torch.float32, id="cpu"),
           pytest.param("cuda", torch.bfloat16, id="cuda")]
# Max |logits - reference| over real tokens (logits of these models are O(1..10)).
LOGITS = {torch.float32: 1e-4, torch.bfloat16: 0.15}


def setup_device(device):
    if device == "cuda":
        require_gpu()
    else:
        require_cpu_backward()


@pytest.fixture
def spy(monkeypatch):
    """Counts flashjit.attention calls; checks after the test that flashjit.hf fell back on none
    (and restores register()'s default: no fallback)."""
    calls = []
    original = flashjit.attention

    def counting(*args, **kwargs):
        calls.append(kwargs.get("cu_seqlens_q") is not None)
        return original(*args, **kwargs)

    monkeypatch.setattr(flashjit, "attention", counting)
    flashjit.hf.fallback_calls.clear()
    yield calls
    flashjit.hf.register()
    assert not flashjit.hf.fallback_calls, flashjit.hf.fallback_calls


def llama(device, dtype, **overrides):
    """A tiny Llama (GQA 4 / 2 heads): head_dim 16 on the CPU, 64 on CUDA (the common path)."""
    hidden = 64 if device == "cpu" else 256
    config = dict(vocab_size=96, hidden_size=hidden, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  initializer_range=0.1, attention_dropout=0.0)
    config.update(overrides)
    torch.manual_seed(1234)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    return model.to(device=device, dtype=dtype).eval()


def logits(model, implementation, ids, **kwargs):
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model(ids, **kwargs).logits.float()


def prompts(device, batch=3, length=17, vocab=96, pad_left=(0, 5, 1)):
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(1, vocab, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    for b, pad in enumerate(pad_left):
        mask[b, :pad] = 0
        ids[b, :pad] = 0
    return ids.to(device), mask.to(device)


def assert_same_greedy_tokens(model, ids, mask, expected, tokens, dtype):
    """float32: identical. bfloat16: identical, or parted at a step where sdpa's own two best
    logits are within LOGITS[dtype] (a near tie that either kernel's rounding may break)."""
    if torch.equal(expected, tokens):
        return
    assert dtype != torch.float32, (expected, tokens)
    start = ids.shape[1]
    first = int(torch.nonzero((expected != tokens).any(dim=0))[0])
    assert first >= start, "the prompts differ"
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=first - start + 1,
                             do_sample=False, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True)
    rows = expected[:, first] != tokens[:, first]
    best = out.logits[first - start][rows].float().topk(2, dim=-1).values
    gap = float((best[:, 0] - best[:, 1]).max())
    assert gap < LOGITS[dtype], f"tokens part at step {first - start}, not a near tie ({gap})"


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_llama_logits_and_greedy_generation(device, dtype, spy):
    setup_device(device)
    model = llama(device, dtype)
    ids, mask = prompts(device)
    # Prefill without padding: one flashjit.attention per layer, no packing.
    expected = logits(model, "sdpa", ids)
    spy.clear()
    got = logits(model, NAME, ids)
    assert spy == [False, False]
    assert (got - expected).abs().max().item() < LOGITS[dtype]
    # Left padding: real tokens' logits, then greedy generate() through the cache.
    expected = logits(model, "sdpa", ids, attention_mask=mask)
    got = logits(model, NAME, ids, attention_mask=mask)
    real = mask.bool()
    assert (got - expected)[real].abs().max().item() < LOGITS[dtype]
    tokens = {}
    for implementation in ("sdpa", NAME):
        model.set_attn_implementation(implementation)
        spy.clear()
        tokens[implementation] = model.generate(ids, attention_mask=mask, max_new_tokens=10,
                                                do_sample=False, pad_token_id=0)
    assert len(spy) >= 2 * 10 and all(spy)  # every call packed (the mask has padding)
    assert_same_greedy_tokens(model, ids, mask, tokens["sdpa"], tokens[NAME], dtype)


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_generation_without_padding_decodes_from_the_cache(device, dtype, spy):
    setup_device(device)
    model = llama(device, dtype)
    ids, _ = prompts(device, pad_left=(0, 0, 0))
    tokens = {}
    for implementation in ("sdpa", NAME):
        model.set_attn_implementation(implementation)
        spy.clear()
        tokens[implementation] = model.generate(ids, max_new_tokens=8, do_sample=False,
                                                pad_token_id=0)
    assert len(spy) == 2 * 8 and not any(spy)  # prefill + 7 cached decode steps, per layer
    assert_same_greedy_tokens(model, ids, None, tokens["sdpa"], tokens[NAME], dtype)


@pytest.mark.parametrize("pad_left", [(0, 0, 0), (0, 5, 1)], ids=["no-padding", "padding"])
def test_static_cache_generation(pad_left, spy):
    """A static cache (kv_length = its size, rows past the tokens empty): the mask function ends
    the keys at the queries' last position; greedy tokens as sdpa's."""
    require_cpu_backward()
    model = llama("cpu", torch.float32)
    ids, mask = prompts("cpu", pad_left=pad_left)
    tokens = {}
    for implementation in ("sdpa", NAME):
        model.set_attn_implementation(implementation)
        tokens[implementation] = model.generate(ids, attention_mask=mask, max_new_tokens=6,
                                                do_sample=False, pad_token_id=0,
                                                cache_implementation="static")
    assert spy and any(spy) == any(pad_left)  # packed documents only where there is padding
    assert torch.equal(tokens["sdpa"], tokens[NAME])


def test_right_padding_and_packed_sequences(spy):
    require_cpu_backward()
    model = llama("cpu", torch.float32)
    ids, _ = prompts("cpu", pad_left=(0, 0, 0))
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    mask[2, 16:] = 0
    expected = logits(model, "sdpa", ids, attention_mask=mask)
    got = logits(model, NAME, ids, attention_mask=mask)
    assert (got - expected)[mask.bool()].abs().max().item() < 1e-4
    # Three sequences of 5, 1 and 11 tokens packed in one row (position_ids restart at 0),
    # each as if alone.
    lengths = (5, 1, 11)
    row = ids[0, :sum(lengths)][None]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    spy.clear()
    packed = logits(model, NAME, row, position_ids=positions)
    assert spy == [True, True]
    start = 0
    for n in lengths:
        alone = logits(model, "sdpa", row[:, start:start + n])
        assert (packed[:, start:start + n] - alone).abs().max().item() < 1e-4
        start += n


def test_training_gradients_match_sdpa(spy):
    require_cpu_backward()
    model = llama("cpu", torch.float32).train()
    ids, mask = prompts("cpu")
    grads = {}
    for implementation in ("sdpa", NAME):
        model.set_attn_implementation(implementation)
        model.zero_grad()
        out = model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
        out.loss.backward()
        grads[implementation] = [p.grad.clone() for p in model.parameters()]
    for ours, theirs in zip(grads[NAME], grads["sdpa"]):
        assert ((ours - theirs).norm() / theirs.norm().clamp_min(1e-8)).item() < 1e-4


def test_mistral_sliding_window(spy):
    require_cpu_backward()
    config = transformers.MistralConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=6, initializer_range=0.1)
    torch.manual_seed(99)
    model = transformers.MistralForCausalLM(config).eval()
    ids, mask = prompts("cpu")
    expected = logits(model, "sdpa", ids, attention_mask=mask)
    got = logits(model, NAME, ids, attention_mask=mask)
    assert (got - expected)[mask.bool()].abs().max().item() < 1e-4
    tokens = {}
    for implementation in ("sdpa", NAME):
        model.set_attn_implementation(implementation)
        tokens[implementation] = model.generate(ids, attention_mask=mask, max_new_tokens=8,
                                                do_sample=False, pad_token_id=0)
    assert torch.equal(tokens["sdpa"], tokens[NAME])


def test_gemma2_softcap_against_eager(spy):
    require_cpu_backward()
    config = transformers.Gemma2Config(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=5,
        attn_logit_softcapping=2.0, final_logit_softcapping=None, initializer_range=0.1)
    torch.manual_seed(5)
    model = transformers.Gemma2ForCausalLM(config).eval()
    ids, mask = prompts("cpu")
    expected = logits(model, "eager", ids, attention_mask=mask)
    got = logits(model, NAME, ids, attention_mask=mask)
    assert (got - expected)[mask.bool()].abs().max().item() < 1e-4


def test_bert_encoder_with_right_padding(spy):
    """Bidirectional attention (an encoder) under a padding mask: packed documents, not causal."""
    require_cpu_backward()
    config = transformers.BertConfig(
        vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    torch.manual_seed(3)
    model = transformers.BertModel(config).eval()
    ids, _ = prompts("cpu", length=13, pad_left=(0, 0, 0))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    states = {}
    for implementation in ("sdpa", NAME):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            states[implementation] = model(ids, attention_mask=mask).last_hidden_state
    assert spy == [True, True]
    real = mask.bool()
    assert (states[NAME] - states["sdpa"])[real].abs().max().item() < 1e-5


def test_what_flashjit_does_not_take():
    require_cpu_backward()
    with pytest.raises(flashjit.InvalidArgumentError, match="flash"):
        flashjit.hf.register("flashjit")
    with pytest.raises(flashjit.InvalidArgumentError, match="fallback"):
        flashjit.hf.register(fallback="eager")
    config = transformers.MistralConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=4)
    model = transformers.MistralForCausalLM(config).eval()
    ids, _ = prompts("cpu", pad_left=(0, 0, 0))
    holes = torch.ones_like(ids)
    holes[1, 3:6] = 0  # padding inside a row: a window's distances would change
    try:
        with pytest.raises(flashjit.UnsupportedError, match="sliding_window"):
            logits(model, NAME, ids, attention_mask=holes)
        flashjit.hf.register(fallback="sdpa")
        flashjit.hf.fallback_calls.clear()
        got = logits(model, NAME, ids, attention_mask=holes)
        assert sum(flashjit.hf.fallback_calls.values()) == 1
        expected = logits(model, "sdpa", ids, attention_mask=holes)
        assert (got - expected)[holes.bool()].abs().max().item() < 1e-5
        # Attention dropout while training: refused without the fallback.
        flashjit.hf.register()
        dropping = llama("cpu", torch.float32, attention_dropout=0.5).train()
        dropping.set_attn_implementation(NAME)
        with pytest.raises(flashjit.UnsupportedError, match="dropout"):
            dropping(ids)
        # A 4-D mask (a custom one, or transformers' SDPA mask that the mask function returns
        # for mask functions beyond causal / window / padding): refused, or the fallback.
        causal = torch.ones(3, 1, 17, 17, dtype=torch.bool).tril()
        four_d = flashjit.hf.mask_function(3, 17, 17, attention_mask=None, use_vmap=True,
                                           mask_function=lambda b, h, i, j: j <= i)
        assert four_d.dim() == 4 and torch.equal(four_d, causal)
        q, k = torch.randn(3, 4, 17, 16), torch.randn(3, 2, 17, 16)
        layer = model.model.layers[0].self_attn
        with pytest.raises(flashjit.UnsupportedError, match="4-D"):
            flashjit.hf.attention_forward(layer, q, k, k, four_d)
        flashjit.hf.register(fallback="sdpa")
        out, _ = flashjit.hf.attention_forward(layer, q, k, k, four_d)
        expected, _ = flashjit.hf.attention_forward(layer, q, k, k, None)
        assert (out - expected).abs().max().item() < 1e-5
    finally:
        flashjit.hf.register()


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_padding_mask_packed_once_per_forward(device, dtype, spy):
    """A padding mask of mask_function's is packed into documents by the first layer and reused
    by the others (no recomputation, no host wait per layer); the result equals a fresh
    packing's, prefill and decode; a mask of the caller's own is packed every call."""
    setup_device(device)
    torch.manual_seed(5)
    batch, heads, kv_heads, d, length = 3, 4, 2, 64, 23
    _, pad = prompts(device, batch=batch, length=length, pad_left=(0, 6, 2))
    mask = flashjit.hf.mask_function(batch, length, length, attention_mask=pad)
    assert mask.dtype == torch.bool and getattr(mask, flashjit.hf._PACKINGS) == {}
    module = torch.nn.Module()
    module.is_causal = True
    for seqlen_q in (length, 1):
        query = torch.randn(batch, heads, seqlen_q, d, device=device, dtype=dtype)
        key, value = (torch.randn(batch, kv_heads, length, d, device=device, dtype=dtype)
                      for _ in range(2))
        first, _ = flashjit.hf.attention_forward(module, query, key, value, mask)
        packings = dict(getattr(mask, flashjit.hf._PACKINGS))
        again, _ = flashjit.hf.attention_forward(module, query, key, value, mask)
        assert getattr(mask, flashjit.hf._PACKINGS) == packings  # the same packing objects
        fresh, _ = flashjit.hf.attention_forward(module, query, key, value, mask.clone())
        assert torch.equal(first, again) and torch.equal(first, fresh)
        # The padded query rows are zeros; the real ones match sdpa with the same mask.
        visible = torch.ones(seqlen_q, length, dtype=torch.bool, device=device).tril(
            length - seqlen_q) & mask[:, None, None, :]
        visible = visible | ~visible.any(-1, keepdim=True)
        expected = torch.nn.functional.scaled_dot_product_attention(
            query.float(), key.float().repeat_interleave(2, 1),
            value.float().repeat_interleave(2, 1), attn_mask=visible).transpose(1, 2)
        real = mask[:, -seqlen_q:] if seqlen_q > 1 else torch.ones(batch, 1, dtype=torch.bool,
                                                                    device=device)
        error = (first.float()[real] - expected[real]).abs().max()
        assert error <= {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype], error
        assert not first.float()[~real].any()
    assert len(getattr(mask, flashjit.hf._PACKINGS)) == 2  # prefill's and decode's
    assert len(spy) == 6 and all(spy)
