"""Top-K distillation data on the log: its bound and its shape (TeacherScored, SampleReady v2).

`teacher_top_ids` / `teacher_top_logprobs` hold, per response token, the teacher's K most likely ids
and their logprobs. The server, the pipeline and the trainer all check them against these rules, so
they live here, beside the schemas. Reads and writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from orl.schemas.errors import ConfigError

MAX_TOP_K = 100  # T x K ids and logprobs travel on every teacher event and sample


def check_opd_topk(top_k: int) -> None:
    """The --opd-topk setting: 0 (token-level teacher logprobs only) up to MAX_TOP_K."""
    if not 0 <= top_k <= MAX_TOP_K:
        raise ConfigError(f"--opd-topk must be between 0 and {MAX_TOP_K}, not {top_k}")


def top_k_rows_aligned(
    top_ids: Sequence[Sequence[int]] | None, top_logprobs: Sequence[Sequence[float]] | None, length: int
) -> bool:
    """Both absent, or both `[length][K]` with one K >= 1 (`length`: the response's tokens)."""
    if top_ids is None and top_logprobs is None:
        return True
    if top_ids is None or top_logprobs is None or len(top_ids) != length or len(top_logprobs) != length:
        return False
    widths = {len(row) for row in top_ids} | {len(row) for row in top_logprobs}
    return len(widths) == 1 and 0 not in widths
