"""The replay issue's story on the command line: re-judge recorded traffic with another judge,
train a new model from the base on the result, and show for a reward exactly why it was given.

History is real traffic: two users chat with SmolLM2 through `orl serve` (a redo request, then
thanks), and the pipeline's stages judge it with the demo's rule judges. `orl replay --votes
rejudge --judge llm` then judges it again with SmolLM2 behind a second `orl serve`, writes a new
namespace and trains one step from the base model (`--train-steps 1`, a child `orl train`).
`orl audit <sample id> --json` shows the new judge's raw words, the rule that decided, the training
step and the checkpoint, while the recorded namespace is untouched.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from orl.connectors.event_log.factory import open_event_log
from orl.pipeline.runtime.settings import PipelineSettings

from orl.cli import main
from tests.e2e.test_turns_to_samples import _wait_for_spool, chat, run_stages
from tests.fixtures.model import test_cache_dir
from tests.integration.serve_process import API_KEY, serve_process
from tests.integration.test_replay import events_of

pytestmark = [pytest.mark.model, pytest.mark.slow]
SOURCE = "live"


def record_traffic(base_url: str) -> None:
    for user in ("u1", "u2"):
        question = [{"role": "user", "content": "How do I simplify the fraction 18/24?"}]
        answer = chat(base_url, question, user)
        redo = [*question, {"role": "assistant", "content": answer},
                {"role": "user", "content": "Please redo this: answer in under 20 words, no bold."}]  # fmt: skip
        again = chat(base_url, redo, user)
        thanks = [
            *redo,
            {"role": "assistant", "content": again},
            {"role": "user", "content": "Thanks, that works."},
        ]
        chat(base_url, thanks, user, max_tokens=1, headers={"X-Session-Done": "true"})


async def namespace_events(log_url: str, namespace: str, topic: str) -> list[dict]:
    async with open_event_log(log_url) as log:
        return await events_of(log, namespace, topic)


def test_rejudge_retrain_from_the_base_and_audit_a_reward(
    tmp_path: Path, base_model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log_url = f"sqlite:///{tmp_path / 'log.db'}"
    with serve_process(tmp_path, log_url=log_url) as server:
        record_traffic(server.base_url)
        asyncio.run(_wait_for_spool(log_url))
    settings = PipelineSettings(
        data_dir=tmp_path, log_url=log_url, method="binary", judge="user_reply", hint_judge="user_hint"
    )
    asyncio.run(run_stages(settings))
    before = {
        t: asyncio.run(namespace_events(log_url, SOURCE, t)) for t in ("judge_votes", "rewards", "samples")
    }
    assert [v["judge_kind"] for v in before["judge_votes"]] == ["rule"] * 6  # 2 users x 3 turns
    where = [
        "--data-dir",
        str(tmp_path),
        "--log-url",
        log_url,
        "--store-url",
        f"file://{tmp_path / 'objects'}",
    ]
    monkeypatch.setenv("ORL_MODEL_CACHE", str(test_cache_dir()))
    monkeypatch.setenv("ORL_TRAIN_BATCH_SIZE", "1")  # read by the `orl train` child: one sample makes a step
    (tmp_path / "judge-server").mkdir()
    with serve_process(tmp_path / "judge-server") as judge:
        code = main(
            ["replay", *where, "--namespace", SOURCE, "--target-namespace", "rejudged", "--votes", "rejudge",
             "--method", "binary", "--judge", "llm", "--judge-url", f"{judge.base_url}/v1", "--judge-api-key", API_KEY,
             "--judge-votes", "1", "--judge-max-tokens", "48", "--model", str(base_model_dir), "--no-progress",
             "--train-steps", "1"]
        )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "recorded events into 'rejudged'" in out and "training: orl train --namespace rejudged" in out

    # New votes by the new judge, in the new namespace; the recorded history is as it was.
    votes = asyncio.run(namespace_events(log_url, "rejudged", "judge_votes"))
    assert votes and {v["judge_kind"] for v in votes} == {"llm"} and all(v["raw_output"] for v in votes)
    after = {t: asyncio.run(namespace_events(log_url, SOURCE, t)) for t in before}
    assert json.dumps(after, sort_keys=True) == json.dumps(before, sort_keys=True)

    # The step trained from the base model on a sample of the re-judged namespace.
    (step,) = asyncio.run(namespace_events(log_url, "rejudged", "train_steps"))
    assert step["run_id"] == "rejudged" and step["policy_version"] == 1
    (sample_id,) = step["sample_ids"]

    assert main(["audit", sample_id, "--json", *where, "--namespace", "rejudged"]) == 0
    chain = json.loads(capsys.readouterr().out)
    vote = chain["votes"][0]
    assert vote["judge_kind"] == "llm" and vote["raw_output"] and vote["prompt_sha256"]
    assert "Thanks, that works." in vote["prompt_text"] or "redo" in vote["prompt_text"]  # what it saw
    assert vote["score"] is not None or vote["parse_error"]  # a score, or why none could be read
    # the majority's reward, and when the small judge parsed no vote in the session, the
    # at-least-one-promotion rule's penalty on top (a second RewardDecided on the same votes)
    reward, *promotion = chain["rewards"]
    assert reward["rule"] == "majority" and reward["reason"]
    assert [r["rule"] for r in promotion] in ([], ["at_least_one_promotion"])
    for decided in chain["rewards"]:
        assert decided["vote_ids"] == [v["event_id"] for v in chain["votes"]]
        assert decided["votes"] == [v["score"] for v in chain["votes"]]
    (training,) = next(s for s in chain["samples"] if s["event_id"] == sample_id)["training"]
    assert training["train_step"]["run_id"] == "rejudged"
    (checkpoint,) = training["checkpoints"]
    assert checkpoint["version"] == 1 and (tmp_path / "objects" / "checkpoints" / "rejudged").is_dir()
    assert main(["audit", sample_id, *where, "--namespace", "rejudged"]) == 0  # the readable form
    text = capsys.readouterr().out
    assert "raw:" in text and "by rule" in text and "train step" in text and "checkpoint" in text
