"""The one sampling rule the server and the trainer share (rules/sampling.py)."""

from orl.rules.sampling import effective_temperature


def test_logprobs_are_taken_at_the_sampled_temperature_and_at_one_for_greedy_decoding() -> None:
    assert effective_temperature(0.7) == 0.7
    assert effective_temperature(1.3) == 1.3
    assert effective_temperature(0.0) == 1.0
