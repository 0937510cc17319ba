"""Top-K distillation: the tail bin, the reverse KL over K+1 bins, masking, and the student's gathered logprobs."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from orl.trainer.logprobs import LogprobInputError, response_and_top_k_logprobs, response_logprobs
from orl.trainer.losses import LossInputError, topk_reverse_kl, with_tail_bin


def top_k_of(logits_V: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [K], logprobs [K]) of a distribution's K most likely tokens."""
    top = torch.log_softmax(logits_V, dim=-1).topk(k)
    return top.indices, top.values


def test_the_tail_bin_holds_the_rest_of_the_mass() -> None:
    top = torch.log(torch.tensor([[[0.5, 0.2, 0.1]]]))
    bins = with_tail_bin(top)
    assert bins.shape == (1, 1, 4)
    assert math.isclose(float(bins[0, 0, 3].exp()), 0.2, rel_tol=1e-5)
    assert math.isclose(float(bins.exp().sum()), 1.0, rel_tol=1e-5)


@pytest.mark.parametrize("mass", [1.0, 1.0001, 1.5])
def test_a_top_k_holding_all_the_mass_gets_a_finite_tail(mass: float) -> None:
    top = torch.log(torch.tensor([[[mass / 2, mass / 2]]]))
    bins = with_tail_bin(top)
    assert torch.isfinite(bins).all()
    assert float(bins[0, 0, 2]) < -15  # log(1 - exp(-1e-7)) ~ log(1e-7)


def test_kl_is_zero_when_student_equals_teacher() -> None:
    logp = torch.log_softmax(torch.randn(2, 3, 8), dim=-1)[..., :4]
    kl = topk_reverse_kl(logp, logp.clone(), torch.ones(2, 3, dtype=torch.bool))
    assert torch.allclose(kl, torch.zeros(2, 3), atol=1e-6)


def test_kl_is_the_reverse_kl_over_the_k_plus_one_bins() -> None:
    student, teacher = torch.tensor([0.6, 0.3]), torch.tensor([0.2, 0.5])
    kl = topk_reverse_kl(student.log()[None, None], teacher.log()[None, None], torch.ones(1, 1))
    p, q = [0.6, 0.3, 0.1], [0.2, 0.5, 0.3]  # the third bin is the tail
    expected = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
    assert math.isclose(float(kl[0, 0]), expected, rel_tol=1e-5)


def test_the_gradient_moves_the_student_towards_the_teacher() -> None:
    # The teacher puts more mass on id 0 than the student: descending the KL raises the student's logit 0.
    logits_V = torch.tensor([0.0, 1.0, 0.5, -1.0], requires_grad=True)
    ids = torch.tensor([0, 1])
    student_K = torch.log_softmax(logits_V, dim=-1)[ids]
    teacher_K = torch.log(torch.tensor([0.7, 0.2]))
    kl = topk_reverse_kl(student_K[None, None], teacher_K[None, None], torch.ones(1, 1, dtype=torch.bool))
    kl.sum().backward()
    assert logits_V.grad is not None
    assert float(logits_V.grad[0]) < 0 < float(logits_V.grad[1])  # -grad raises id 0, lowers id 1


def test_the_teacher_gets_no_gradient() -> None:
    student = torch.log(torch.tensor([[[0.5, 0.3]]])).requires_grad_(True)
    teacher = torch.log(torch.tensor([[[0.4, 0.4]]])).requires_grad_(True)
    topk_reverse_kl(student, teacher, torch.ones(1, 1, dtype=torch.bool)).sum().backward()
    assert teacher.grad is None and student.grad is not None


def test_padding_is_zero_and_its_garbage_never_reaches_the_gradient() -> None:
    student = torch.log(torch.tensor([[[0.5, 0.3], [0.5, 0.3]]])).clone()
    student[0, 1] = float("nan")
    student.requires_grad_(True)
    teacher = torch.tensor([[[-1.0, -2.0], [float("inf"), 3.0]]])
    mask = torch.tensor([[True, False]])
    kl = topk_reverse_kl(student, teacher, mask)
    assert float(kl.detach()[0, 1]) == 0.0 and math.isfinite(float(kl.detach()[0, 0]))
    kl.sum().backward()
    assert student.grad is not None and torch.isfinite(student.grad).all()
    assert float(student.grad[0, 1].abs().sum()) == 0.0


def test_mismatched_shapes_are_refused() -> None:
    with pytest.raises(LossInputError, match="top-K"):
        topk_reverse_kl(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4), torch.ones(1, 2))
    with pytest.raises(LossInputError, match="mask"):
        topk_reverse_kl(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.ones(1, 3))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(0, 10_000))
def test_kl_is_never_negative(k: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    student = torch.log_softmax(torch.randn(2, 3, 8, generator=generator) * 3, dim=-1)[..., :k]
    teacher = torch.log_softmax(torch.randn(2, 3, 8, generator=generator) * 3, dim=-1)[..., :k]
    assert (topk_reverse_kl(student, teacher, torch.ones(2, 3, dtype=torch.bool)) >= -1e-6).all()


class TinyLM(torch.nn.Module):
    """A causal stand-in (an embedding and a head: each position's logits depend on its own token)."""

    def __init__(self, vocab: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, vocab)
        self.forwards = 0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> object:
        self.forwards += 1
        return type("Out", (), {"logits": self.head(self.embed(input_ids))})()


def test_one_forward_gives_the_sampled_and_the_gathered_top_k_logprobs() -> None:
    model = TinyLM()
    prompts, responses = [[1, 2, 3], [4, 5]], [[6, 7], [8, 9, 10]]
    top_ids = [[[6, 0, 1], [7, 2, 3]], None]
    scored = response_and_top_k_logprobs(model, prompts, responses, [1.0, 0.7], top_ids, [0.5, 0.7])
    sampled, gathered = scored.sampled, scored.top_k
    assert model.forwards == 1 and scored.distributions is None
    expected = response_logprobs(model, prompts, responses, [1.0, 0.7])
    assert all(torch.equal(a, b) for a, b in zip(sampled, expected, strict=True))
    assert gathered[1] is None and gathered[0] is not None and gathered[0].shape == (2, 3)
    # the top-K is at its own temperature (0.5), from the logits that predict each response token
    logits_T_V = model.head(model.embed(torch.tensor([3, 6])))
    manual = torch.log_softmax(logits_T_V / 0.5, dim=-1).gather(-1, torch.tensor(top_ids[0]))
    assert torch.allclose(gathered[0], manual, atol=1e-6)


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([[6, 0]], r"\[2\]\[K\]"),  # one row for two tokens
        ([[6, 0], [7]], r"one K"),  # ragged
        ([[6, 0], [7, 99]], "vocabulary"),
    ],
)
def test_bad_top_k_ids_are_refused(ids: list[list[int]], match: str) -> None:
    with pytest.raises(LogprobInputError, match=match):
        response_and_top_k_logprobs(TinyLM(), [[1]], [[6, 7]], [1.0], [ids], [1.0])
