"""The count-model baselines of chapter 09 (book.experiments.charlm.ngram_loss): a character model's
comparison of designs means something only below them."""
from __future__ import annotations

import math

import torch

from book.experiments import charlm


def test_unigram_is_the_entropy_of_the_character_frequencies():
    train = torch.tensor([0, 0, 0, 1])  # p(0) = 3/4, p(1) = 1/4 (k = 0: no smoothing)
    held = torch.tensor([0, 1])
    want = -(math.log(3 / 4) + math.log(1 / 4)) / 2
    assert abs(charlm.ngram_loss(train, held, 1, 2, k=0.0) - want) < 1e-12


def test_a_bigram_model_knows_a_cycle_and_a_unigram_model_does_not():
    cycle = torch.arange(5).repeat(200)  # 0 1 2 3 4 0 1 ...: each character fixes the next
    uni, bi = (charlm.ngram_loss(cycle, cycle[:50], n, 5, k=1e-6) for n in (1, 2))
    assert abs(uni - math.log(5)) < 1e-6 and bi < 1e-4


def test_an_unseen_context_gives_the_uniform_guess():
    train, held = torch.tensor([0, 0, 0, 0]), torch.tensor([1, 2])  # context 1 never seen
    assert abs(charlm.ngram_loss(train, held, 2, 3, k=0.5) - math.log(3)) < 1e-12


def test_on_the_books_text_each_order_beats_the_one_below():
    train, held, vocab = charlm.corpus()
    losses = [charlm.ngram_loss(train, held, n, len(vocab)) for n in (1, 2, 3)]
    assert math.log(len(vocab)) > losses[0] > losses[1] > losses[2]
