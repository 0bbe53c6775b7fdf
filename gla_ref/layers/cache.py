"""The decoding cache of FLA's models, without FLA or transformers: one dict of states per layer.

FLA's GLA layers read and write their states through ``past_key_values``, an ``fla.models.Cache``:
``cache[layer_idx]`` is a dict with ``"recurrent_state"`` (FLA's layout ``[N, H, V, K]``, float32),
``"conv_state"`` (a tuple of the q, k, v short-convolution caches, each ``[N, D, W]``: the last W
inputs, newest last, or None), ``"attn_state"`` and ``"ffn_state"`` (unused by GLA); ``cache.update(...,
layer_idx=i, offset=T)`` stores a layer's new states and counts its tokens. :class:`Cache` does the same
with the same method names and layouts, so the two are interchangeable: our layers take an FLA cache
object and write FLA's layouts into it, FLA's layers take ours, and a cache filled by one continues
in the other. (Our own ``(initial_state, output_final_state)`` path uses ``[N, H, K, V]`` states
instead; see :mod:`gla_ref.layers.torch`.)

No framework is imported here: the states are whatever tensors the layers put in.
"""

from __future__ import annotations

__all__ = ["Cache", "is_cache"]

_KEYS = ("recurrent_state", "attn_state", "conv_state", "ffn_state")


def is_cache(obj) -> bool:
    """Whether ``obj`` has a cache's interface (ours, FLA's ``Cache``/``LegacyFLACache`` alike)."""
    return all(hasattr(obj, name) for name in ("update", "__getitem__", "__len__"))


class Cache:
    """Per-layer states for decoding, with FLA's ``Cache`` interface (see the module docstring).

    ``Cache()`` starts empty; the layers fill it on their first call with ``use_cache=True``.
    ``get_seq_length()`` counts the tokens layer 0 has seen. ``reorder_cache(indices)`` keeps or
    reorders batch rows (beam search, dropping finished sequences). ``to_legacy_cache()`` /
    ``Cache.from_legacy_cache(states)`` convert to and from a tuple of the per-layer dicts.
    """

    def __init__(self, seen_tokens: int = 0):
        self.states: list[dict] = []
        self._seen: list[int] = []
        self._start = int(seen_tokens)

    def __getitem__(self, layer_idx: int) -> dict:
        if layer_idx >= len(self.states):
            raise KeyError(f"the cache holds {len(self.states)} layers, layer {layer_idx} was asked for")
        return self.states[layer_idx]

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self):
        yield from self.states

    def update(self, recurrent_state=None, attn_state=None, conv_state=None, ffn_state=None, layer_idx: int = 0,
               offset: int | None = 1, cache_kwargs=None) -> dict:
        """Store layer ``layer_idx``'s new states (a None leaves the stored one) and count ``offset`` tokens.
        Layers are added in order, as FLA's cache adds them."""
        if layer_idx > len(self.states):
            raise ValueError(f"layer_idx = {layer_idx} skips layers: the cache holds {len(self.states)}")
        if layer_idx == len(self.states):
            self.states.append(dict.fromkeys(_KEYS))
            self._seen.append(self._start)
        state = self.states[layer_idx]
        for key, value in zip(_KEYS, (recurrent_state, attn_state, conv_state, ffn_state)):
            if value is not None:
                state[key] = value
        self._seen[layer_idx] += 1 if offset is None else int(offset)
        return state

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        layer_idx = layer_idx or 0
        return self._seen[layer_idx] if layer_idx < len(self._seen) else 0

    def get_max_length(self) -> int:
        return -1  # a recurrent state has no maximum length

    def reorder_cache(self, indices) -> None:
        """Keep the batch rows ``indices`` (a LongTensor), in that order, in every stored state."""
        def select(value):
            if value is None:
                return None
            if isinstance(value, (tuple, list)):
                return type(value)(select(v) for v in value)
            return value.index_select(0, indices.to(value.device))

        self.states = [{key: select(value) for key, value in state.items()} for state in self.states]

    batch_select_indices = reorder_cache

    def reset(self) -> None:
        self.states.clear()
        self._seen.clear()

    def to_legacy_cache(self) -> tuple:
        return tuple(self.states)

    @classmethod
    def from_legacy_cache(cls, past_key_values=None, seen_tokens: int = 0) -> "Cache":
        """A cache from a tuple/list of per-layer state dicts (or None: empty), as FLA's."""
        cache = cls(seen_tokens)
        for state in past_key_values or ():
            cache.states.append({**dict.fromkeys(_KEYS), **(state or {})})
            cache._seen.append(int(seen_tokens))
        return cache

    def __repr__(self) -> str:
        return f"Cache(layers={len(self.states)}, seen_tokens={self.get_seq_length()})"
