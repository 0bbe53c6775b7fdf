"""Softmax attention and kernelised linear attention: the baselines GLA starts from (chapter 1).

Layout ``[B, T, H, D]`` as everywhere in gla_ref: q, k ``[B,T,H,K]``, v and o ``[B,T,H,V]``.
Math runs in float32 (float64 when given float64); outputs come back in q's dtype.

* Softmax attention (Vaswani et al., 2017) in its parallel form, :func:`softmax_attention`, and
  its recurrent (decoding) form, :func:`softmax_attention_recurrent`, which keeps an explicit
  :class:`KVCache` that grows by one key and one value per token.
* Linear attention with a feature map φ and the normaliser of Katharopoulos et al. (2020):
  :func:`linear_attention_normalized` (parallel) and
  :func:`linear_attention_normalized_recurrent` (the RNN with state ``S_t`` and ``z_t``).
* Unnormalised linear attention with the identity map, written three ways to show what the
  causal mask does to associativity: :func:`linear_attention_qk_first` ``((QKᵀ)⊙M)V``,
  :func:`linear_attention_kv_first` ``Q(KᵀV)`` (no mask possible) and
  :func:`linear_attention_prefix_sum` (causal, with every state ``S_t`` materialised).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gla_ref._validate import check_flag, check_inputs, check_scale


# --- checks and small helpers ---------------------------------------------------------------

def _check(q, k, v):
    """Shape/dtype checks of gla_ref._validate (no gate here), tensor type, finite values."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not torch.is_tensor(x):
            raise TypeError(f"{name} must be a torch.Tensor of shape [B, T, H, D], got {type(x).__name__}")
    dims = check_inputs(q, k, v, gate_ranks=(None,))
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not torch.isfinite(x).all():
            raise ValueError(f"{name} contains NaN or inf")
    return dims


def _check_qk(q, k):
    """Checks for the functions that take only q and k (k stands in for v)."""
    return _check(q, k, k)


def _compute_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _scale(scale, K):
    """``scale`` or the default ``K**-0.5``; must be a positive finite number."""
    value = check_scale(scale, K)
    if not value > 0:
        raise ValueError(f"scale must be positive and finite, got {scale}")
    return value


def causal_mask(T: int, device=None) -> torch.Tensor:
    """Boolean ``[T, T]`` mask M with ``M[i, j] = (i >= j)``: query i sees keys 1..i."""
    if not isinstance(T, int) or isinstance(T, bool) or T < 1:
        raise ValueError(f"T must be a positive int, got {T!r}")
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


# --- softmax attention -----------------------------------------------------------------------

def softmax_attention_weights(q, k, *, scale=None, causal=True):
    """Attention weights ``softmax(scale·QKᵀ + mask)`` as ``[B, H, T, T]`` (rows sum to one).

    Masked entries get ``-inf`` before the softmax, so they come out as exact zeros.
    """
    B, T, H, K, _, _ = _check_qk(q, k)
    check_flag("causal", causal)
    dt = _compute_dtype(q)
    scores = torch.einsum("bihk,bjhk->bhij", q.to(dt), k.to(dt)) * _scale(scale, K)
    if causal:
        scores = scores.masked_fill(~causal_mask(T, q.device), float("-inf"))
    return torch.softmax(scores, dim=-1)


def softmax_attention(q, k, v, *, scale=None, causal=True):
    """Parallel softmax attention ``O = softmax(scale·QKᵀ + mask) V`` → o ``[B, T, H, V]``.

    The whole ``T × T`` weight matrix is formed at once: O(T²K) work and O(T²) memory per head.
    """
    _check(q, k, v)
    P = softmax_attention_weights(q, k, scale=scale, causal=causal)
    o = torch.einsum("bhij,bjhv->bihv", P, v.to(P.dtype))
    return o.to(q.dtype)


class KVCache:
    """The decoding cache of softmax attention: every key and value seen so far.

    ``keys`` is ``[B, t, H, K]`` and ``values`` ``[B, t, H, V]`` after t tokens; each
    :meth:`append` adds one token, so memory grows linearly with the sequence.
    """

    def __init__(self):
        self.keys = None
        self.values = None

    def append(self, k_t, v_t):
        """Add one token's key ``[B, H, K]`` and value ``[B, H, V]``."""
        if self.keys is not None and (k_t.shape != self.keys.shape[:1] + self.keys.shape[2:]
                                      or v_t.shape != self.values.shape[:1] + self.values.shape[2:]):
            raise ValueError(f"k_t/v_t must have shapes {tuple(self.keys.shape[:1] + self.keys.shape[2:])}"
                             f"/{tuple(self.values.shape[:1] + self.values.shape[2:])}, "
                             f"got {tuple(k_t.shape)}/{tuple(v_t.shape)}")
        k_t, v_t = k_t[:, None], v_t[:, None]
        self.keys = k_t if self.keys is None else torch.cat([self.keys, k_t], dim=1)
        self.values = v_t if self.values is None else torch.cat([self.values, v_t], dim=1)

    def __len__(self):
        return 0 if self.keys is None else self.keys.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached keys and values."""
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


def softmax_attention_step(q_t, cache: KVCache, *, scale=None):
    """One decoding step: ``o_t = Σ_i exp(s·q_t k_iᵀ) v_i / Σ_i exp(s·q_t k_iᵀ)`` over the cache.

    ``q_t`` is ``[B, H, K]``; returns ``o_t`` ``[B, H, V]``. Costs O(t·K) for the t cached tokens.
    """
    if len(cache) == 0:
        raise ValueError("cache is empty: append the current token's key and value first")
    scores = torch.einsum("bhk,bjhk->bhj", q_t, cache.keys) * _scale(scale, q_t.shape[-1])
    return torch.einsum("bhj,bjhv->bhv", torch.softmax(scores, dim=-1), cache.values)


def softmax_attention_recurrent(q, k, v, *, scale=None, cache=None):
    """Softmax attention decoded token by token with a growing :class:`KVCache` → o ``[B,T,H,V]``.

    Equals ``softmax_attention(q, k, v, causal=True)``. Pass a ``cache`` to keep it (its length is
    then the number of tokens seen); a cache that already holds a prefix continues that sequence.
    """
    B, T, H, K, V, _ = _check(q, k, v)
    cache = KVCache() if cache is None else cache
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
    dt, out_dtype = _compute_dtype(q), q.dtype
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    o = torch.empty(B, T, H, V, dtype=dt, device=q.device)
    for t in range(T):
        cache.append(k[:, t], v[:, t])  # the current token attends to itself
        o[:, t] = softmax_attention_step(q[:, t], cache, scale=scale)
    return o.to(out_dtype)


# --- kernelised linear attention -------------------------------------------------------------

def elu1(x):
    """``elu(x) + 1``: the positive feature map of Katharopoulos et al. (2020)."""
    return F.elu(x) + 1.0


def identity(x):
    """The identity feature map ``φ(x) = x`` (linear kernel; values can be negative)."""
    return x


FEATURE_MAPS = {"elu1": elu1, "identity": identity}
"""Feature maps by name; any callable ``[B,T,H,K] → [B,T,H,K']`` works too."""


def get_feature_map(feature_map):
    """A feature map from its name in :data:`FEATURE_MAPS` or a callable."""
    if callable(feature_map):
        return feature_map
    if isinstance(feature_map, str):
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {sorted(FEATURE_MAPS)} or a callable, got {feature_map!r}")
        return FEATURE_MAPS[feature_map]
    raise TypeError(f"feature_map must be a str or a callable, got {type(feature_map).__name__}")


def _features(q, k, feature_map):
    """``φ(q), φ(k)`` in the compute dtype, checked to share a shape ``[B, T, H, K']``."""
    phi = get_feature_map(feature_map)
    dt = _compute_dtype(q)
    fq, fk = phi(q.to(dt)), phi(k.to(dt))
    if not (torch.is_tensor(fq) and fq.shape[:3] == q.shape[:3] and fq.ndim == 4 and fq.shape == fk.shape):
        raise ValueError(f"feature_map must map [B, T, H, K] = {tuple(q.shape)} to one tensor shape "
                         f"[B, T, H, K'] for q and k, got {getattr(fq, 'shape', fq)} and {getattr(fk, 'shape', fk)}")
    return fq, fk


def linear_attention_weights(q, k, *, feature_map="elu1", causal=True, normalize=True):
    """The attention-like matrix ``φ(Q)φ(K)ᵀ ⊙ M`` as ``[B, H, T, T]``.

    With ``normalize`` each row is divided by its sum ``φ(q_t) z_t`` (Katharopoulos' normaliser),
    so rows sum to one; for a positive φ the weights are then a convex combination.
    """
    _, T, _, _, _, _ = _check_qk(q, k)
    check_flag("causal", causal)
    check_flag("normalize", normalize)
    fq, fk = _features(q, k, feature_map)
    A = torch.einsum("bihk,bjhk->bhij", fq, fk)
    if causal:
        A = torch.where(causal_mask(T, q.device), A, torch.zeros((), dtype=A.dtype, device=A.device))
    return A / A.sum(dim=-1, keepdim=True) if normalize else A


def linear_attention_normalized(q, k, v, *, feature_map="elu1", causal=True):
    """Parallel normalised linear attention → o ``[B, T, H, V]``:

    ``o_t = φ(q_t) Σ_{i≤t} φ(k_i)ᵀ v_i / φ(q_t) Σ_{i≤t} φ(k_i)ᵀ`` (all i when not causal).
    There is no ``scale``: a constant factor on φ(q) cancels in the ratio.
    """
    _check(q, k, v)
    A = linear_attention_weights(q, k, feature_map=feature_map, causal=causal, normalize=True)
    return torch.einsum("bhij,bjhv->bihv", A, v.to(A.dtype)).to(q.dtype)


def linear_attention_normalized_recurrent(q, k, v, *, feature_map="elu1", output_final_state=False):
    """Normalised linear attention as an RNN → ``(o, (S, z))`` (state None unless asked for).

    ``S_t = S_{t-1} + φ(k_t)ᵀ v_t`` ``[B,H,K',V]``, ``z_t = z_{t-1} + φ(k_t)`` ``[B,H,K']``,
    ``o_t = φ(q_t) S_t / φ(q_t) z_t``: constant memory in T, unlike :class:`KVCache`.
    """
    B, T, H, _, V, _ = _check(q, k, v)
    check_flag("output_final_state", output_final_state)
    fq, fk = _features(q, k, feature_map)
    vv = v.to(fq.dtype)
    S = fq.new_zeros(B, H, fq.shape[-1], V)
    z = fq.new_zeros(B, H, fq.shape[-1])
    o = fq.new_empty(B, T, H, V)
    for t in range(T):
        S = S + torch.einsum("bhk,bhv->bhkv", fk[:, t], vv[:, t])
        z = z + fk[:, t]
        num = torch.einsum("bhk,bhkv->bhv", fq[:, t], S)
        den = torch.einsum("bhk,bhk->bh", fq[:, t], z)
        o[:, t] = num / den[..., None]
    return o.to(q.dtype), ((S, z) if output_final_state else None)


# --- unnormalised linear attention (identity map): the three association orders --------------

def linear_attention_qk_first(q, k, v, *, scale=None, causal=True):
    """``O = ((scale·QKᵀ) ⊙ M) V``: the quadratic parallel form (M all-ones when not causal).

    O(T²K + T²V) work per head; with ``causal`` it equals ``recurrent_gla(q, k, v, g=None)``.
    """
    _, T, _, K, _, _ = _check(q, k, v)
    check_flag("causal", causal)
    dt = _compute_dtype(q)
    A = torch.einsum("bihk,bjhk->bhij", q.to(dt), k.to(dt)) * _scale(scale, K)
    if causal:
        A = torch.where(causal_mask(T, q.device), A, torch.zeros((), dtype=dt, device=A.device))
    return torch.einsum("bhij,bjhv->bihv", A, v.to(dt)).to(q.dtype)


def linear_attention_kv_first(q, k, v, *, scale=None):
    """``O = scale·Q(KᵀV)``: the product reassociated, O(T·K·V) work per head.

    ``KᵀV`` sums over *all* T tokens, so every query sees the future; there is no place to apply
    a causal mask (it acts on the ``T × T`` matrix this order never forms). It equals
    ``linear_attention_qk_first(..., causal=False)`` and differs from the causal form.
    """
    _, _, _, K, _, _ = _check(q, k, v)
    dt = _compute_dtype(q)
    S = torch.einsum("bjhk,bjhv->bhkv", k.to(dt), v.to(dt))  # KᵀV: one [K, V] matrix per head
    return (torch.einsum("bihk,bhkv->bihv", q.to(dt), S) * _scale(scale, K)).to(q.dtype)


def linear_attention_prefix_sum(q, k, v, *, scale=None, output_states=False):
    """Causal ``o_t = scale·q_t S_t`` with ``S_t = Σ_{i≤t} k_iᵀ v_i`` from a cumulative sum.

    Causal and linear in T, but every state is materialised: ``[B, T, H, K, V]`` in memory
    (returned as the second value when ``output_states``, else None).
    """
    _, _, _, K, _, _ = _check(q, k, v)
    check_flag("output_states", output_states)
    dt = _compute_dtype(q)
    states = torch.einsum("bthk,bthv->bthkv", k.to(dt), v.to(dt)).cumsum(dim=1)
    o = torch.einsum("bthk,bthkv->bthv", q.to(dt), states) * _scale(scale, K)
    return o.to(q.dtype), (states if output_states else None)
