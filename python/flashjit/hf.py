"""flashjit as a Hugging Face transformers attention implementation.

    import flashjit.hf
    flashjit.hf.register()                      # once: "fjit" in transformers' registries
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="fjit")
    # or, for a model already built: model.set_attn_implementation("fjit")

The name is "fjit", not "flashjit": transformers routes every attn_implementation whose name
contains "flash" to its own flash-attention loader (the flash_attn package or a Hub kernel), and
its models change their masks for such names.

register() adds an attention function to transformers' public AttentionInterface and a mask
function of the same name to its AttentionMaskInterface (transformers >= 4.53). The mask function
hands the attention function what flash_attention_2's does: None for plain causal (or
bidirectional, or sliding-window) attention, else the 2-D padding mask (batch, kv_length), True
where a token is real (shorter than the keys for a static cache not yet full: the rows past the
queries' last position hold no token and are dropped); masks it cannot describe that way
(or_mask_function / and_mask_function deviations, e.g. image tokens) are transformers' SDPA
masks (4-D), which only the fallback runs.

What the attention function does with what transformers passes:
  * query (batch, heads, seqlen_q, head_dim), key / value (batch, heads_kv, seqlen_k, head_dim)
    (GQA from the head counts); returns (attn_output (batch, seqlen_q, heads, head_dim), None).
  * no mask: flashjit.attention on the bhsd views, causal (module.is_causal, or is_causal=)
    aligned bottom-right (the queries are the last seqlen_q keys: prefill and cached decode in
    generate()); sequences packed along one row (batch 1, position_ids restarting at 0, or
    cu_seq_lens_q / _k with max_length_q / _k as flash_attention_2 takes them) run as packed
    documents.
  * a 2-D padding mask (left or right padding, or holes): each sequence's real keys and queries
    gathered into packed documents (flashjit's varlen forward, differentiable), causal per
    document, the output scattered back (zeros at padded query rows). With causal attention this
    is exact for any mask (the queries are the last real keys); a sliding window also needs each
    row's real tokens to be contiguous (left or right padding), else the call falls back / raises.
    The packing (indices, offsets, longest document: two host waits) is computed by the first
    layer of a forward and kept on the mask tensor mask_function made for it, which every later
    layer of that forward is handed (_packing).
  * sliding_window=w: window (w - 1, 0) with causal, (w - 1, w - 1) without, as transformers'
    masks; softcap=c: c * tanh(s / c); scaling: the softmax scale.
  * not supported (flashjit.UnsupportedError naming it, or the fallback): dropout > 0 (training
    with attention dropout), 4-D masks, attention sinks (s_aux), output_attentions, a window over
    a mask with holes, seqlen_q > seqlen_k with a mask.

register(fallback="sdpa") sends those calls to transformers' own "sdpa" function instead (a
bool 4-D mask built from the padding mask, causal and the window), counted in
flashjit.hf.fallback_calls.
"""
import torch

import flashjit as _flashjit
from ._flashjit import InvalidArgumentError, UnsupportedError

__all__ = ["register", "attention_forward", "mask_function", "fallback_calls"]

# transformers treats any implementation name containing "flash" as a flash-attention kernel to
# load (from the flash_attn package or the Hub: utils.generic.is_flash_attention_requested), and
# its models change their masks for such names: flashjit registers under a name without it.
NAME = "fjit"

# Calls that went to the fallback, by reason (register(fallback="sdpa")).
fallback_calls = {}

_fallback = None  # None: raise; "sdpa": transformers' sdpa attention function


def register(name=NAME, fallback=None):
    """Registers flashjit's attention and mask functions under `name` with transformers'
    AttentionInterface and AttentionMaskInterface; then attn_implementation=name selects it.
    fallback: None (what flashjit cannot run raises UnsupportedError) or "sdpa" (such calls run
    transformers' SDPA attention). Returns name. ImportError without transformers."""
    global _fallback
    if not isinstance(name, str) or not name or "flash" in name:
        raise InvalidArgumentError(
            f"name = {name!r}: transformers takes any attn_implementation containing 'flash' for "
            f"a flash-attention kernel it must load itself (flash_attn or the Hub); register "
            f"flashjit under another name (the default {NAME!r})")
    if fallback not in (None, "sdpa"):
        raise InvalidArgumentError(f"fallback = {fallback!r}: expected None (raise) or 'sdpa'")
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
    except ImportError as error:
        raise ImportError(
            f"flashjit.hf.register: transformers with AttentionInterface and "
            f"AttentionMaskInterface (>= 4.53) is needed: {error}") from error
    _fallback = fallback
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask_function)
    return name


# --- the mask ----------------------------------------------------------------------------------

def mask_function(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                  mask_function=None, attention_mask=None, use_vmap=False, **kwargs):
    """transformers' mask interface: None (no padding), the 2-D bool padding mask (batch,
    kv_length), or (mask functions beyond causal / window / padding: use_vmap) transformers'
    4-D SDPA mask, which the attention function sends to the fallback."""
    if use_vmap:
        from transformers.masking_utils import sdpa_mask

        return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length,
                         q_offset=q_offset, kv_offset=kv_offset, mask_function=mask_function,
                         attention_mask=attention_mask, allow_is_causal_skip=False,
                         use_vmap=True, **kwargs)
    # Key rows past the queries' last position (a static cache not yet full: kv_length is its
    # size) hold no token: the mask then ends at the queries' last position, so that the
    # attention function drops those rows and the queries are again the last keys.
    filled = int(q_offset + q_length) - int(kv_offset)
    if attention_mask is None:
        if filled >= kv_length:
            return None
        return _reusable(torch.ones(batch_size, filled, dtype=torch.bool,
                                    device=kwargs.get("device")))
    attention_mask = attention_mask[:, -kv_length:].to(torch.bool)
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return _reusable(attention_mask)


# The attribute of a padding mask made by mask_function (a new tensor per forward, seen by every
# layer, never by the user) that holds its packings into documents (_packing).
_PACKINGS = "_flashjit_packings"


def _reusable(mask):
    """`mask` (a tensor of mask_function's own) with an empty packing cache; under
    torch.compile / export it stays a plain tensor (every layer packs it anew)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and compiler.is_compiling():
        return mask
    setattr(mask, _PACKINGS, {})
    return mask


# --- the attention -----------------------------------------------------------------------------

class _Refused(Exception):
    """A call flashjit does not run: the reason, for the fallback or the UnsupportedError."""


def _window(sliding_window, causal, seqlen_k):
    if sliding_window is None or sliding_window <= 0 or sliding_window >= seqlen_k + 1:
        return None
    left = int(sliding_window) - 1
    return (left, 0 if causal else left)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, **kwargs):
    """transformers' attention function signature (see the module's documentation)."""
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    try:
        return _flashjit_attention(query, key, value, attention_mask, dropout, scaling,
                                   sliding_window, softcap, causal, kwargs)
    except _Refused as refused:
        reason = str(refused)
    if _fallback != "sdpa":
        raise UnsupportedError(
            f"flashjit.hf: {reason}; flashjit.hf.register(fallback='sdpa') runs such calls "
            f"with transformers' SDPA attention instead")
    fallback_calls[reason] = fallback_calls.get(reason, 0) + 1
    return _sdpa(module, query, key, value, attention_mask, dropout, scaling, sliding_window,
                 softcap, causal, kwargs)


def _flashjit_attention(query, key, value, mask, dropout, scaling, sliding_window, softcap,
                        causal, kwargs):
    if dropout:
        raise _Refused(f"dropout = {dropout}: flashjit has no attention dropout (train with "
                       f"attention_dropout=0, or evaluate with model.eval())")
    if kwargs.get("s_aux") is not None:
        raise _Refused("s_aux (attention sinks) is not supported")
    if kwargs.get("output_attentions"):
        raise _Refused("output_attentions=True: flashjit does not form the probabilities")
    if softcap is not None and softcap <= 0:
        softcap = None
    batch, heads, seqlen_q, head_dim = query.shape
    if mask is not None and mask.dim() != 2:
        raise _Refused(f"a {mask.dim()}-D attention mask: flashjit takes padding masks (2-D) "
                       f"and causal / sliding-window structure")
    if mask is not None and mask.shape[1] < key.shape[2]:
        # A static cache: its first mask.shape[1] rows hold the tokens; without padding there,
        # the dense path on those rows.
        key, value = key[:, :, :mask.shape[1]], value[:, :, :mask.shape[1]]
        if _all_real(mask):
            mask = None
    if mask is not None:
        return _padded(query, key, value, mask, scaling, sliding_window, softcap, causal)
    seqlen_k = key.shape[2]
    window = _window(sliding_window, causal, seqlen_k)
    documents = _packed_documents(query, key, kwargs)
    if documents is not None:
        cu_q, cu_k, max_q, max_k = documents
        q, k, v = (x.transpose(1, 2).reshape(-1, x.shape[1], head_dim)
                   for x in (query, key, value))
        out = _flashjit.attention(q, k, v, causal=causal, scale=scaling, window=window,
                                  softcap=softcap, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                  max_seqlen_q=max_q, max_seqlen_k=max_k)
        return out.view(batch, seqlen_q, heads, head_dim), None
    out = _flashjit.attention(query, key, value, causal=causal, scale=scaling, layout="bhsd",
                              window=window, softcap=softcap)
    return out.transpose(1, 2), None


def _packed_documents(query, key, kwargs):
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k) of sequences packed along the rows, as
    flash_attention_2 finds them (cu_seq_lens_q / _k and max_length_q / _k given, or batch 1 with
    position_ids that restart at 0), else None."""
    given = [kwargs.get(name) for name in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                                           "max_length_k")]
    if all(x is not None for x in given):
        cu_q, cu_k, max_q, max_k = given
        return cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k)
    position_ids = kwargs.get("position_ids")
    batch, seqlen = query.shape[0], query.shape[2]
    if (position_ids is None or batch != 1 or key.shape[2] != seqlen or
            position_ids.shape[-1] != seqlen or seqlen < 2):
        return None
    positions = position_ids.reshape(-1)
    if not bool((positions[1:] == 0).any()):
        return None
    starts = torch.nonzero(positions == 0).reshape(-1)
    if starts.numel() == 0 or int(starts[0]) != 0:
        return None
    cu = torch.cat((starts, torch.tensor([seqlen], device=starts.device))).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    return cu, cu, longest, longest


def _padded(query, key, value, mask, scaling, sliding_window, softcap, causal):
    """Attention under a 2-D padding mask as packed documents (see the module's documentation)."""
    batch, heads, seqlen_q, head_dim = query.shape
    length = mask.shape[1]
    if key.shape[2] < length or seqlen_q > length:
        raise _Refused(f"a padding mask of {length} tokens for {key.shape[2]} keys and "
                       f"{seqlen_q} queries")
    if key.shape[2] > length:  # a static cache: its first `length` rows are the tokens
        key, value = key[:, :, :length], value[:, :, :length]
    window = _window(sliding_window, causal, length)
    packing = _packing(mask, seqlen_q, window is not None, query.device)
    q_index, k_index, cu_q, cu_k, max_q, max_k = packing
    if k_index.numel() == 0 or (q_index is not None and q_index.numel() == 0):
        return query.new_zeros(batch, seqlen_q, heads, head_dim), None
    # index_select, not tensor[index]: on the CPU the latter's parallel kernel took ~10 ms per
    # call on a busy 2-core machine (index_select ~4 us).
    q = query.transpose(1, 2).reshape(batch * seqlen_q, heads, head_dim)
    if q_index is not None:
        q = q.index_select(0, q_index)
    k, v = (x.transpose(1, 2).reshape(batch * length, x.shape[1], head_dim).index_select(
        0, k_index) for x in (key, value))
    out = _flashjit.attention(q, k, v, causal=causal, scale=scaling, window=window,
                              softcap=softcap, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                              max_seqlen_q=max_q, max_seqlen_k=max_k)
    if q_index is None:  # every query row real (cached decode): already in order
        return out.view(batch, seqlen_q, heads, head_dim), None
    full = out.new_zeros(batch * seqlen_q, heads, head_dim)
    full = full.index_copy(0, q_index, out)
    return full.view(batch, seqlen_q, heads, head_dim), None


def _all_real(mask):
    """bool(mask.all()), once per mask of mask_function's (see _packing)."""
    packings = getattr(mask, _PACKINGS, None)
    if packings is None:
        return bool(mask.all())
    if "all" not in packings:
        packings["all"] = bool(mask.all())
    return packings["all"]


def _packing(mask, seqlen_q, windowed, device):
    """(q_index (None: every query row), k_index, cu_q, cu_k, max_q, max_k) of a padding mask:
    the rows of the real queries and keys in the (batch * length) rows and their documents.
    transformers hands every layer of a forward the same mask tensor: a mask that
    mask_function made carries a dict of its packings (_PACKINGS), so that the layers after the
    first compute nothing and wait for nothing (the first synchronizes twice: the indices and
    the longest document). Refuses a window over a mask with holes."""
    packings = getattr(mask, _PACKINGS, None)
    key = (seqlen_q, windowed, str(device))
    if packings is not None and key in packings:
        return packings[key]
    batch, length = mask.shape
    mask = mask.to(device=device, dtype=torch.bool)
    counts = mask.sum(dim=1)
    if windowed:
        # Each row's real tokens contiguous: the window's distances survive the packing.
        positions = torch.arange(length, device=mask.device)
        first = torch.where(mask, positions, length).min(dim=1).values
        last = torch.where(mask, positions, -1).max(dim=1).values
        if bool(((last - first + 1 != counts) & (counts > 0)).any()):
            raise _Refused("sliding_window with a padding mask whose real tokens are not "
                           "contiguous (holes): the window's distances would change")
    k_index = torch.nonzero(mask.reshape(-1)).reshape(-1)
    cu_k = torch.zeros(batch + 1, dtype=torch.int32, device=mask.device)
    cu_k[1:] = torch.cumsum(counts, 0)
    max_k = max(1, int(counts.max()))
    if seqlen_q == 1:  # one query per sequence, its newest token: a document each
        q_index, max_q = None, 1
        cu_q = torch.arange(batch + 1, dtype=torch.int32, device=mask.device)
    else:
        query_mask = mask[:, -seqlen_q:]
        q_index = torch.nonzero(query_mask.reshape(-1)).reshape(-1)
        q_counts = query_mask.sum(dim=1)
        cu_q = torch.zeros(batch + 1, dtype=torch.int32, device=mask.device)
        cu_q[1:] = torch.cumsum(q_counts, 0)
        max_q = max(1, int(q_counts.max()))
    packing = (q_index, k_index, cu_q, cu_k, max_q, max_k)
    if packings is not None:
        packings[key] = packing
    return packing


# --- the fallback ------------------------------------------------------------------------------

def _sdpa(module, query, key, value, mask, dropout, scaling, sliding_window, softcap, causal,
          kwargs):
    """transformers' SDPA attention function; a 2-D padding mask (or a sliding window without
    one) made the 4-D bool mask it takes, causal and the window included (rows that see no key
    see every key: their output is padding, never used, and stays finite). transformers' SDPA
    raises for softcap."""
    from transformers import AttentionInterface

    window = _window(sliding_window, causal, key.shape[2] if mask is None else mask.shape[-1])
    if (mask is not None and mask.dim() == 2) or (mask is None and window is not None):
        seqlen_q = query.shape[2]
        seqlen_k = key.shape[2] if mask is None else mask.shape[1]
        key, value = key[:, :, :seqlen_k], value[:, :, :seqlen_k]
        i = torch.arange(seqlen_q, device=query.device)[:, None] + seqlen_k - seqlen_q
        j = torch.arange(seqlen_k, device=query.device)[None, :]
        visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=query.device)
        if causal:
            visible &= j <= i
        if window is not None:
            visible &= (j >= i - window[0]) & (j <= i + window[1])
        full = visible[None, None]
        if mask is not None:
            full = full & mask.to(query.device, torch.bool)[:, None, None, :]
        mask = full | ~full.any(dim=-1, keepdim=True)
    if softcap is not None:
        kwargs = dict(kwargs, softcap=softcap)
    sdpa = AttentionInterface()["sdpa"]
    return sdpa(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                is_causal=causal, **kwargs)
