"""Text generation for :class:`gla_ref.models.torch.GLAForCausalLM`, with the recurrent state cache.

The prompt runs once through the chunkwise form (every layer writes its state into a
:class:`gla_ref.layers.cache.Cache`), then each new token runs alone from those states (the closed-form
one-token update), so a step costs the same at any length. The choices follow transformers'
``generate()``, which FLA's models use: greedy (``do_sample=False``, the arg-max, first index on ties)
or sampling with ``temperature``, then ``top_k`` (default 50, as transformers), then ``top_p``; a
sequence that emits an ``eos_token_id`` is finished, and gets ``pad_token_id`` from then on; generation
stops when every sequence is finished or after ``max_new_tokens``.

Batches of prompts of different lengths are padded (on the left, as for any decoder; right padding works
too) with an ``attention_mask`` ``[B, T]`` (1 = token, 0 = padding): the layers run each prompt as if
its padding were not there, and the first new token comes from each prompt's last real token.
"""

from __future__ import annotations

import torch

from gla_ref.layers.cache import Cache

__all__ = ["generate", "sample_next", "filter_top_k", "filter_top_p"]

_FROM_CONFIG = object()


def filter_top_k(logits, k):
    """Logits outside the k largest of each row set to -inf (k None or 0: unchanged)."""
    if not k or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits, p):
    """Nucleus filtering: keep, per row, the most probable tokens until their probability reaches p (at
    least one); the others get -inf. p = 1: unchanged."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    drop = probs.cumsum(-1) - probs >= p  # the mass strictly before a token already reaches p
    return logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def sample_next(logits, *, do_sample=False, temperature=1.0, top_k=50, top_p=1.0, generator=None):
    """The next token of each row of logits ``[B, vocab]``: arg-max, or a sample after temperature,
    top-k and top-p (in that order, as transformers applies them)."""
    logits = logits.float()
    if not do_sample:
        return logits.argmax(-1)
    logits = filter_top_p(filter_top_k(logits / temperature, top_k), top_p)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


def _check(input_ids, attention_mask, max_new_tokens, max_length, temperature, top_k, top_p, num_beams):
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
        raise TypeError(f"input_ids must be an integer torch.Tensor [B, T], got "
                        f"{getattr(input_ids, 'dtype', type(input_ids).__name__)}")
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor)
                                       or tuple(attention_mask.shape) != tuple(input_ids.shape)):
        raise ValueError(f"attention_mask must be a 0/1 torch.Tensor of input_ids' shape {tuple(input_ids.shape)}")
    if attention_mask is not None and not bool(attention_mask.bool().any(-1).all()):
        raise ValueError("attention_mask has a row without any token: every prompt needs at least one")
    for name, value in (("max_new_tokens", max_new_tokens), ("max_length", max_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name} must be None or an int >= 0, got {value!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise ValueError(f"top_k must be None or an int >= 0, got {top_k!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if num_beams != 1:
        raise ValueError(f"num_beams={num_beams!r}: beam search is not reproduced (greedy or sampling only)")


@torch.no_grad()
def generate(model, input_ids, attention_mask=None, *, max_new_tokens=None, max_length=None, do_sample=False,
             temperature=1.0, top_k=50, top_p=1.0, eos_token_id=_FROM_CONFIG, pad_token_id=_FROM_CONFIG,
             use_cache=True, generator=None, num_beams=1, **unknown):
    """Continue ``input_ids`` ``[B, T]``: returns ``[B, T + n]`` (the prompts, then n ≤ max_new_tokens new
    tokens), as transformers' ``generate`` does.

    ``max_new_tokens`` (or ``max_length``, prompt included; transformers' default 20 when neither is
    given); ``do_sample``, ``temperature``, ``top_k``, ``top_p``: see :func:`sample_next`; ``generator``: a
    ``torch.Generator`` for reproducible sampling; ``eos_token_id`` (an int, a list, or None for no
    stopping) and ``pad_token_id`` default to the config's (the pad to the first eos, as transformers,
    when the config has none); ``use_cache=False`` recomputes the whole sequence at every step (same
    tokens, slower: a check). Other transformers options (beam search, penalties, …) are refused by name.
    """
    if unknown:
        raise TypeError(f"generate() does not take {sorted(unknown)} (gla_ref reproduces greedy decoding and "
                        f"sampling with temperature, top_k and top_p)")
    _check(input_ids, attention_mask, max_new_tokens, max_length, temperature, top_k, top_p, num_beams)
    cfg = model.config
    eos = cfg.eos_token_id if eos_token_id is _FROM_CONFIG else eos_token_id
    eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    pad = cfg.pad_token_id if pad_token_id is _FROM_CONFIG else pad_token_id
    pad = (eos[0] if eos else 0) if pad is None else pad
    B, T = input_ids.shape
    steps = max_new_tokens if max_new_tokens is not None else max(0, (20 if max_length is None else max_length) - T)
    device = input_ids.device
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(input_ids.dtype)
    eos_t = torch.tensor(eos, dtype=input_ids.dtype, device=device)
    ids, unfinished = input_ids, torch.ones(B, dtype=torch.bool, device=device)
    cache = Cache() if use_cache else None
    choose = dict(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    for step in range(steps):
        if use_cache and step > 0:
            logits = model(ids[:, -1:], attention_mask=mask, past_key_values=cache, use_cache=True,
                           logits_to_keep=1).logits[:, -1]
        else:  # the prompt (or, without a cache, everything so far): logits at each row's last real token
            h = model.model(ids, attention_mask=mask, past_key_values=cache, use_cache=use_cache).last_hidden_state
            last = mask.shape[1] - 1 - mask.flip(1).argmax(1)
            logits = model.lm_head(h[torch.arange(B, device=device), last])
        token = sample_next(logits, **choose)
        token = torch.where(unfinished, token, torch.full_like(token, pad))
        ids = torch.cat([ids, token[:, None]], 1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        if eos:
            unfinished &= ~torch.isin(token, eos_t)
            if not bool(unfinished.any()):
                break
    return ids
