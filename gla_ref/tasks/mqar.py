"""Multi-query associative recall (MQAR): the synthetic task of the GLA paper's §5.1 (chapter 8).

MQAR (Arora et al. 2023, "Zoology", arXiv 2312.04927) asks a model to recall, several times in one
sequence, the token that followed a key. A sequence of length T holds P key–value pairs, then
queries::

    k₁ v₁ k₂ v₂ … k_P v_P   0 0 k₂ 0 0 0 k₁ 0 …      (inputs)
    ·  ·  ·  ·  … ·  ·     · · v₂ · · · v₁ · …      (targets; · is IGNORE_INDEX)

Keys are drawn without repetition from the lower half of the vocabulary ``[1, vocab_size/2)``, values
from the upper half ``[vocab_size/2, vocab_size)``; token 0 fills the gaps. Every key comes back once,
as a query at an even offset after the pairs; the offsets follow Zoology's power law (small gaps are
likelier, ``power_a`` = 0.01). The target at a query's position is the value paired with its key, so a
causal model must predict it as the next token; every other position is ignored by the loss and by the
accuracy. Data are NumPy arrays made from a seed, so a run is reproducible; training and held-out
examples come from different seed streams.

* :func:`make_mqar` — a batch of examples; :func:`vocabulary` — the key and value token ranges.
* :class:`MQARConfig`, :func:`train` — an AdamW loop with fixed seeds (CPU or GPU) returning the
  accuracy on a held-out set; :func:`build_model` — the tiny :class:`gla_ref.layers.torch.GLALM` it trains.
* :func:`run`, :func:`sweep` — one row, and rows over mixers × widths × pairs × seeds (chapter 8 runs a
  tiny sweep on the CPU; ``benchmarks/mqar_sweep.py`` the large one on a GPU);
  :func:`summarize`, :func:`plot_accuracy` — rows averaged over seeds and drawn like the paper's Fig. 4.

Importing this module loads no framework; torch is imported by the functions that train.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

IGNORE_INDEX = -100
"""Target of every position that is not a query (PyTorch's default ``ignore_index``)."""

MIXERS = ("linear", "retnet", "scalar", "gla")
"""The four token mixers compared, from no forget gate to GLA's (see :data:`gla_ref.layers.torch.MIXERS`):
``linear`` (no gate), ``retnet`` (a constant decay γ_h per head), ``scalar`` (a data-dependent gate,
one per head and token), ``gla`` (a data-dependent gate per key channel)."""


# ----------------------------------------------------------------------------- data

def vocabulary(vocab_size: int) -> tuple[range, range]:
    """``(keys, values)``: the token ids keys are drawn from, ``[1, vocab_size // 2)``, and values,
    ``[vocab_size // 2, vocab_size)``. Token 0 is the filler between queries."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 4:
        raise ValueError(f"vocab_size must be an int >= 4, got {vocab_size!r}")
    half = vocab_size // 2
    return range(1, half), range(half, vocab_size)


def _check_task(seq_len, num_pairs, vocab_size, power_a):
    keys, values = vocabulary(vocab_size)
    for name, n in (("seq_len", seq_len), ("num_pairs", num_pairs)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    if seq_len < 4 * num_pairs:
        raise ValueError(f"seq_len = {seq_len} must be at least 4 · num_pairs = {4 * num_pairs}: 2·P tokens of "
                         f"pairs, then P queries each followed by a filler")
    if num_pairs > min(len(keys), len(values)):
        raise ValueError(f"num_pairs = {num_pairs} exceeds the {min(len(keys), len(values))} distinct keys "
                         f"and values of vocab_size = {vocab_size}")
    if not (isinstance(power_a, (int, float)) and 0 < power_a <= 1):
        raise ValueError(f"power_a must be in (0, 1], got {power_a!r}")


def _ordered_top(scores: np.ndarray, P: int) -> np.ndarray:
    """Per row, the indices of the P largest scores, largest first ``[n, P]``.

    With i.i.d. uniform scores this is a uniformly random ordered choice of P distinct indices; with
    ``log w + Gumbel`` scores, P draws without replacement proportional to w (Gumbel top-k).
    """
    idx = np.argpartition(-scores, P - 1, axis=1)[:, :P]
    order = np.argsort(-np.take_along_axis(scores, idx, axis=1), axis=1, kind="stable")
    return np.take_along_axis(idx, order, axis=1)


def make_mqar(num_examples: int, seq_len: int, num_pairs: int, vocab_size: int, seed, *,
              power_a: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """``num_examples`` MQAR sequences: ``(inputs, targets)``, both int64 ``[num_examples, seq_len]``.

    Example row (P = ``num_pairs``): positions ``0, 2, …, 2P−2`` hold P distinct keys, each followed by
    its value (values distinct too); then every key appears once more as a query at position
    ``2P + 2j`` (j < (T − 2P)/2, drawn with probability ∝ (j + 1)^(power_a − 1), distinct), and the
    other positions hold 0. ``targets`` is :data:`IGNORE_INDEX` except at the query positions, where it
    is the key's value. ``seed``: an int or a sequence of ints (NumPy's ``default_rng``), so separate
    streams, e.g. ``(seed, 0, step)`` for training and ``(seed, 1)`` for testing, never share a draw.
    Raises ValueError for sizes that cannot hold the pairs and queries.
    """
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
        raise ValueError(f"num_examples must be a positive int, got {num_examples!r}")
    _check_task(seq_len, num_pairs, vocab_size, power_a)
    rng = np.random.default_rng(seed)
    n, P, T = num_examples, num_pairs, seq_len
    key_ids, value_ids = vocabulary(vocab_size)
    keys = key_ids.start + _ordered_top(rng.random((n, len(key_ids))), P)
    values = value_ids.start + _ordered_top(rng.random((n, len(value_ids))), P)
    slots = (T - 2 * P) // 2
    log_w = (power_a - 1.0) * np.log(np.arange(1, slots + 1))
    gumbel = -np.log(-np.log(rng.random((n, slots))))
    query_pos = 2 * P + 2 * _ordered_top(log_w + gumbel, P)  # [n, P]: where key j is asked again
    inputs = np.zeros((n, T), dtype=np.int64)
    targets = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
    inputs[:, 0:2 * P:2], inputs[:, 1:2 * P:2] = keys, values
    rows = np.arange(n)[:, None]
    inputs[rows, query_pos] = keys
    targets[rows, query_pos] = values
    return inputs, targets


# ----------------------------------------------------------------------------- training

@dataclasses.dataclass(frozen=True)
class MQARConfig:
    """One training run: the task, the optimiser and the held-out set.

    ``steps`` AdamW steps of ``batch_size`` fresh examples each (stream ``(seed, 0, step)``); the
    learning rate warms up linearly over the first ``warmup`` fraction of the steps, then decays
    along a cosine to 0. ``num_test`` held-out examples (stream ``(seed, 1)``) give the accuracy.
    ``seed`` also seeds the model's initialisation in :func:`run`.
    """

    seq_len: int = 64
    num_pairs: int = 4
    vocab_size: int = 64
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.1
    warmup: float = 0.1
    num_test: int = 256
    power_a: float = 0.01
    seed: int = 0

    def __post_init__(self):
        _check_task(self.seq_len, self.num_pairs, self.vocab_size, self.power_a)
        for name in ("steps", "batch_size", "num_test"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not (self.lr > 0 and self.weight_decay >= 0 and 0 <= self.warmup < 1):
            raise ValueError(f"need lr > 0, weight_decay >= 0 and 0 <= warmup < 1, got {self.lr}, "
                             f"{self.weight_decay}, {self.warmup}")

    def batch(self, step: int):
        """Training examples of ``step`` (NumPy int64 ``[batch_size, seq_len]`` twice)."""
        return make_mqar(self.batch_size, self.seq_len, self.num_pairs, self.vocab_size,
                         (self.seed, 0, step), power_a=self.power_a)

    def test_set(self):
        """The held-out examples (NumPy int64 ``[num_test, seq_len]`` twice)."""
        return make_mqar(self.num_test, self.seq_len, self.num_pairs, self.vocab_size, (self.seed, 1),
                         power_a=self.power_a)

    def lr_factor(self, step: int) -> float:
        """Learning rate of ``step`` over ``lr``: linear warmup, then a cosine to 0."""
        warm = max(1, round(self.warmup * self.steps))
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, self.steps - warm)))


def build_model(mixer: str, hidden_size: int, vocab_size: int, *, num_layers: int = 2, num_heads: int = 2,
                backend: str = "reference", seed: int = 0, short_conv: bool = True, conv_size: int = 4,
                **mixer_kwargs):
    """A :class:`gla_ref.layers.torch.GLALM` for MQAR, initialised from ``torch.manual_seed(seed)``.

    Two layers and two heads, as the GLA paper sets its MQAR models (§5.1); ``mixer`` one of
    :data:`MIXERS` (or any key of ``gla_ref.layers.torch.MIXERS``); ``mixer_kwargs`` go to the layers.
    The model has no position embedding. ``short_conv`` (default True) gives every mixer FLA's short
    convolution of width ``conv_size`` on q, k and v (``use_short_conv``), as FLA's GLA layer and
    Zoology's MQAR models have: the value's position then sees the key just before it, which a
    recurrence alone must learn to isolate with its gate. Without it the order of the tokens reaches
    the model only through the causal recurrence and its forget gates.
    """
    import torch

    from gla_ref.layers.torch import GLALM

    if not isinstance(short_conv, bool):
        raise TypeError(f"short_conv must be a bool, got {short_conv!r}")
    if short_conv:
        mixer_kwargs = {"use_short_conv": True, "conv_size": conv_size, **mixer_kwargs}
    torch.manual_seed(seed)
    return GLALM(vocab_size, hidden_size, num_layers=num_layers, num_heads=num_heads, mixer=mixer,
                 backend=backend, **mixer_kwargs)


def _logits(model, inputs):
    out = model(inputs)
    return out[0] if isinstance(out, tuple) else out


def evaluate(model, inputs, targets, batch_size: int = 256) -> dict:
    """Accuracy (argmax = target) and mean cross-entropy over the query positions of a held-out set.

    ``inputs``, ``targets``: int64 arrays or tensors ``[n, T]``; evaluated in batches of ``batch_size``
    on the model's device, without gradients. Returns ``{"accuracy", "loss", "queries"}``.
    """
    import torch
    import torch.nn.functional as F

    dev = next(model.parameters()).device
    inputs, targets = torch.as_tensor(inputs), torch.as_tensor(targets)
    was_training, correct, loss_sum, count = model.training, 0, 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, inputs.shape[0], batch_size):
            x, y = inputs[i:i + batch_size].to(dev), targets[i:i + batch_size].to(dev)
            logits = _logits(model, x).float()
            mask = y != IGNORE_INDEX
            correct += int((logits.argmax(-1)[mask] == y[mask]).sum())
            loss_sum += float(F.cross_entropy(logits[mask], y[mask], reduction="sum"))
            count += int(mask.sum())
    model.train(was_training)
    return {"accuracy": correct / count, "loss": loss_sum / count, "queries": count}


def train(model, config: MQARConfig) -> dict:
    """Train ``model`` (token ids ``[B, T]`` → logits ``[B, T, vocab]``, or a tuple starting with them)
    on MQAR, on the model's device, and measure it on the held-out set.

    AdamW (β = 0.9, 0.95; weight decay on the projection matrices only, :func:`_param_groups`),
    gradients clipped to norm 1, the schedule of :meth:`MQARConfig.lr_factor`,
    cross-entropy over the query positions only. Returns ``{"accuracy", "test_loss", "train_loss"`` (mean of the last tenth of the steps),
    ``"losses"`` (one per step), ``"seconds"``, ``"examples"}``.
    """
    import torch
    import torch.nn.functional as F

    if not isinstance(config, MQARConfig):
        raise TypeError(f"config must be an MQARConfig, got {type(config).__name__}")
    dev = next(model.parameters()).device
    opt = torch.optim.AdamW(_param_groups(model, config.weight_decay), lr=config.lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, config.lr_factor)
    model.train()
    losses, start = [], time.perf_counter()
    for step in range(config.steps):
        x, y = (torch.from_numpy(a).to(dev, non_blocking=True) for a in config.batch(step))
        loss = F.cross_entropy(_logits(model, x).flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE_INDEX)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.detach())  # kept on the device: reading it every step would wait for the GPU
    losses = torch.stack(losses).tolist()
    result = evaluate(model, *config.test_set(), batch_size=config.batch_size)
    tail = losses[-max(1, config.steps // 10):]
    return {"accuracy": result["accuracy"], "test_loss": result["loss"], "train_loss": sum(tail) / len(tail),
            "losses": losses, "seconds": time.perf_counter() - start,
            "examples": config.steps * config.batch_size}


def _param_groups(model, weight_decay):
    """AdamW groups: matrices of the projections decay; embeddings, norms' weights and biases do not."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 and "embeddings" not in name else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# ----------------------------------------------------------------------------- sweeps

def run(mixer: str, hidden_size: int, config: MQARConfig, *, backend: str = "reference", device="cpu",
        num_heads: int = 2, short_conv: bool = True, **mixer_kwargs) -> dict:
    """Build a model (:func:`build_model`, seeded by ``config.seed``), train it (:func:`train`) and
    return one row: the settings (``mixer``, ``hidden_size``, ``num_heads``, ``num_pairs``,
    ``seq_len``, ``vocab_size``, ``seed``, ``steps``, ``batch_size``, ``lr``, ``backend``,
    ``short_conv``), ``params``
    (the model's parameter count), ``accuracy``, ``test_loss``, ``train_loss``, ``seconds`` and
    ``loss_curve`` (the training loss averaged over 20 equal spans of steps)."""
    model = build_model(mixer, hidden_size, config.vocab_size, num_heads=num_heads, backend=backend,
                        seed=config.seed, short_conv=short_conv, **mixer_kwargs).to(device)
    out = train(model, config)
    spans = np.array_split(np.asarray(out["losses"]), min(20, config.steps))
    return {"mixer": mixer, "hidden_size": hidden_size, "num_heads": num_heads, "num_pairs": config.num_pairs,
            "seq_len": config.seq_len, "vocab_size": config.vocab_size, "seed": config.seed,
            "steps": config.steps, "batch_size": config.batch_size, "lr": config.lr, "backend": backend,
            "short_conv": short_conv, "params": sum(p.numel() for p in model.parameters()), "accuracy": out["accuracy"],
            "test_loss": out["test_loss"], "train_loss": out["train_loss"], "seconds": round(out["seconds"], 2),
            "loss_curve": [round(float(s.mean()), 4) for s in spans]}


def plan(mixers=MIXERS, widths=(64,), pairs=(4,), seeds=(0,)) -> list[tuple]:
    """The runs of a sweep, ``(mixer, hidden_size, num_pairs, seed)``, seed-major: every setting's first
    seed comes before any second seed, so a sweep cut short still covers every setting."""
    return [(m, d, P, s) for s in seeds for P in pairs for d in widths for m in mixers]


def sweep(config: MQARConfig, mixers=MIXERS, widths=(64,), pairs=(4,), seeds=(0,), *, backend="reference",
          device="cpu", on_row=None, **mixer_kwargs) -> list[dict]:
    """Rows of :func:`run` for every run of :func:`plan`, one after another; ``config`` gives everything
    but the number of pairs and the seed, which the plan sets. ``on_row(row)`` is called after each
    run (to print progress); ``mixer_kwargs`` (e.g. ``short_conv=False``) go to :func:`run`."""
    rows = []
    for mixer, d, P, seed in plan(mixers, widths, pairs, seeds):
        rows.append(run(mixer, d, dataclasses.replace(config, num_pairs=P, seed=seed), backend=backend,
                        device=device, **mixer_kwargs))
        if on_row is not None:
            on_row(rows[-1])
    return rows


def summarize(rows) -> dict:
    """``{(mixer, num_pairs, hidden_size): {"mean", "min", "max", "n"}}``: accuracy over the seeds."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["mixer"], r["num_pairs"], r["hidden_size"]), []).append(r["accuracy"])
    return {key: {"mean": float(np.mean(a)), "min": float(min(a)), "max": float(max(a)), "n": len(a)}
            for key, a in sorted(groups.items())}


def plot_accuracy(rows, axes=None, *, title_fmt="T = {T}, P = {P} pairs"):
    """Accuracy against model width, one panel per number of pairs, one line per mixer (the paper's
    Fig. 4): the mean over seeds, with a bar from the lowest to the highest seed. Returns the axes."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    table = summarize(rows)
    pairs = sorted({P for _, P, _ in table})
    T = sorted({r["seq_len"] for r in rows})
    if axes is None:
        _, axes = plt.subplots(1, len(pairs), figsize=(3.2 * len(pairs), 3.0), dpi=90, squeeze=False)
        axes = axes[0]
    mixers = [m for m in MIXERS if any(k[0] == m for k in table)]
    mixers += sorted({k[0] for k in table} - set(mixers))
    for ax, P in zip(axes, pairs):
        for m in mixers:
            pts = sorted((d, s) for (mm, PP, d), s in table.items() if mm == m and PP == P)
            if not pts:
                continue
            ds = [d for d, _ in pts]
            mean = np.array([100 * s["mean"] for _, s in pts])
            err = np.array([[100 * (s["mean"] - s["min"]) for _, s in pts], [100 * (s["max"] - s["mean"]) for _, s in pts]])
            ax.errorbar(ds, mean, yerr=err, marker="o", capsize=3, label=m)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({d for (_, PP, d) in table if PP == P}))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_ylim(-3, 103)
        ax.set_xlabel("model width d")
        ax.set_title(title_fmt.format(T="/".join(map(str, T)), P=P), fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy (%)")
    axes[0].legend(fontsize=8)
    return axes
