"""gla_ref.tasks.text: the tiny grammar's corpus, its exact entropy rate and the character tokenizer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gla_ref.tasks import text


def test_corpus_is_sentences_of_the_grammar_and_reproducible():
    data = text.corpus(200, seed=4)
    assert data == text.corpus(200, seed=4) and data != text.corpus(200, seed=5)
    grammar = {f"{s} {v} {o}" for s in text.SUBJECTS for v in text.VERBS for o in text.OBJECTS}
    sentences = data.split(". ")[:-1]
    assert len(sentences) == 200 and set(sentences) <= grammar and data.endswith(". ")


def test_entropy_per_char_is_log80_over_the_mean_sentence_length():
    """The formula against the corpus: 80 equally likely sentences, so log 80 nats over the measured mean length."""
    data = text.corpus(20000, seed=0)
    measured = math.log(80) / (len(data) / 20000)
    assert abs(text.entropy_per_char() - measured) < 0.002 * measured
    sentences = data.split(". ")[:-1]
    counts = np.array(list({s: sentences.count(s) for s in set(sentences)}.values()))
    assert len(counts) == 80 and counts.min() > 0.7 * counts.mean()  # uniform over the 80


def test_tokenizer_round_trip_and_unknown_characters():
    tok = text.CharTokenizer(text.corpus(50))
    ids = tok.encode("the cat sees a tree. ")
    assert tok.decode(ids) == "the cat sees a tree. " and max(ids) < tok.vocab_size
    with pytest.raises(ValueError, match="does not know"):
        tok.encode("the cat sees a zebra!")
    with pytest.raises(ValueError, match="n_sentences"):
        text.corpus(0)
