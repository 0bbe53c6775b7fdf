"""A tiny language for training a language model on a CPU in seconds: sentences from a small grammar.

Each sentence is a subject, a verb and an object drawn uniformly and independently, then ``". "``
(``"the cat sees a tree. "``). Nothing is downloaded: :func:`corpus` generates the text from a seed. Its
entropy is known exactly, ``log(|S| |V| |O|)`` nats per sentence, so a trained model's loss per character
can be put against the floor no model can beat (:func:`entropy_per_char`). Characters are the tokens
(:class:`CharTokenizer`). Importing this module loads no framework.
"""

from __future__ import annotations

import math

import numpy as np

SUBJECTS = ("the cat", "a dog", "the bird", "my friend", "the child")
VERBS = ("sees", "likes", "follows", "finds")
OBJECTS = ("the ball", "a tree", "the river", "some bread")


def sentence(rng: np.random.Generator) -> str:
    """One sentence of the grammar, ending in ``". "``."""
    parts = (SUBJECTS[rng.integers(len(SUBJECTS))], VERBS[rng.integers(len(VERBS))],
             OBJECTS[rng.integers(len(OBJECTS))])
    return " ".join(parts) + ". "


def corpus(n_sentences: int, seed: int = 0) -> str:
    """``n_sentences`` sentences drawn with the NumPy generator of ``seed``, joined."""
    if not isinstance(n_sentences, int) or isinstance(n_sentences, bool) or n_sentences < 1:
        raise ValueError(f"n_sentences must be a positive int, got {n_sentences!r}")
    rng = np.random.default_rng(seed)
    return "".join(sentence(rng) for _ in range(n_sentences))


def entropy_per_char() -> float:
    """The grammar's entropy rate in nats per character: ``log(|S| |V| |O|)`` over the mean sentence length
    (the three choices are independent and uniform; every character but the choices' is determined)."""
    mean_len = (np.mean([len(s) for s in SUBJECTS]) + np.mean([len(v) for v in VERBS])
                + np.mean([len(o) for o in OBJECTS]) + 4)  # two spaces between the parts, then ". "
    return math.log(len(SUBJECTS) * len(VERBS) * len(OBJECTS)) / mean_len


class CharTokenizer:
    """Characters to token ids and back, over the characters of ``text`` (sorted)."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list:
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            raise ValueError(f"text has characters the tokenizer does not know: {unknown}")
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)
