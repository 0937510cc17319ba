"""PrefixCache (orl.serving.policy.batch_engine): longest-common-prefix lookup, byte budget, supersession."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from orl.serving.policy.prefix_cache import PrefixCache, common_prefix_length


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix_length([1, 2, 3], [1, 5, 3]) == 1
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([7], [8]) == 0


def test_the_longest_shared_prefix_wins_and_short_ones_do_not_count():
    cache: PrefixCache[str] = PrefixCache(budget_bytes=1000, min_tokens=3, superseded_tail=1)
    cache.put([1, 2, 3, 4, 5, 9, 9, 9], "a", 10)
    cache.put([1, 2, 3, 7, 7, 7, 7, 7], "b", 10)
    assert cache.longest_prefix([1, 2, 3, 4, 5, 6]) == ("a", 5)
    assert cache.longest_prefix([1, 2, 3, 7, 0]) == ("b", 4)
    assert cache.longest_prefix([1, 2, 0]) is None  # 2 shared tokens are fewer than min_tokens
    assert cache.longest_prefix([5, 5, 5, 5]) is None


def test_least_recently_used_goes_first_when_the_budget_is_exceeded():
    cache: PrefixCache[str] = PrefixCache(budget_bytes=30, min_tokens=2)
    cache.put([1, 1, 1], "one", 10)
    cache.put([2, 2, 2], "two", 10)
    cache.put([3, 3, 3], "three", 10)
    assert cache.longest_prefix([1, 1, 1]) == ("one", 3)  # "one" is now the most recently used
    cache.put([4, 4, 4], "four", 10)
    assert cache.longest_prefix([2, 2, 2]) is None
    assert [cache.longest_prefix([t] * 3) is not None for t in (1, 3, 4)] == [True, True, True]
    assert len(cache) == 3 and cache.nbytes == 30


def test_too_large_or_too_short_is_not_kept():
    cache: PrefixCache[str] = PrefixCache(budget_bytes=30, min_tokens=4)
    cache.put([1, 2, 3, 4, 5], "big", 31)
    cache.put([1, 2, 3], "short", 1)
    assert len(cache) == 0 and cache.nbytes == 0


def test_the_next_turn_supersedes_the_previous_one():
    """A conversation's next prompt repeats the previous one but for a short dropped tail."""
    cache: PrefixCache[str] = PrefixCache(budget_bytes=1000, min_tokens=3, superseded_tail=3)
    system, turn1_tail = [1] * 10, [8, 8]  # the tail (an internal-context message) is not resent
    cache.put(system + [2] + turn1_tail, "turn 1", 10)
    cache.put([5] * 10, "other session", 10)
    cache.put([1] * 4 + [6] * 6, "shares too little with turn 2", 10)
    cache.put(system + [2, 3, 4], "turn 2", 10)
    assert len(cache) == 3 and cache.nbytes == 30
    assert cache.longest_prefix(system + [2, 8, 8]) == ("turn 2", 11)
    cache.put(system, "prefix of turn 2", 5)  # "turn 2" starts with it and serves it as well
    assert len(cache) == 3


def test_clear_empties_everything():
    cache: PrefixCache[str] = PrefixCache(budget_bytes=100, min_tokens=1)
    cache.put([1, 2], "a", 10)
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.longest_prefix([1, 2]) is None


token_lists = st.lists(st.integers(0, 3), min_size=0, max_size=12)


@given(st.lists(st.tuples(token_lists, st.integers(1, 40)), max_size=20), token_lists)
def test_budget_holds_and_lookup_is_the_best_kept_prefix(puts: list[tuple[list[int], int]], query: list[int]):
    cache: PrefixCache[int] = PrefixCache(budget_bytes=60, min_tokens=2, superseded_tail=3)
    for i, (tokens, nbytes) in enumerate(puts):
        cache.put(tokens, i, nbytes)
        assert cache.nbytes <= 60
    kept = [entry.value for entry in cache._kept.values()]
    assert cache.nbytes == sum(puts[i][1] for i in kept)
    if puts and len(puts[-1][0]) >= 2:  # the last prompt put is kept, or one starting with it
        last = puts[-1][0]
        assert common_prefix_length(puts[kept[-1]][0], last) == len(last)
    best = max((common_prefix_length(puts[i][0], query) for i in kept), default=0)
    found = cache.longest_prefix(query)
    if best < 2:
        assert found is None
    else:
        assert found is not None and found[1] == best
        assert common_prefix_length(puts[found[0]][0], query) == best
