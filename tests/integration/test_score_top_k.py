"""POST /v1/orl/score with `top_k` on the real SmolLM2 model (the teacher of top-K distillation).

The app (`orl.serving.app.build_app`) runs in-process over the real `TransformersBackend`; the top-K ids
and logprobs it returns are checked against one fp32 forward of the same model at the same temperature.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from orl.connectors.metrics import Metrics
from orl.serving.app import ServerState, build_app
from orl.serving.capture import EventRecorder
from orl.serving.policy.transformers_backend import TransformersBackend
from orl.serving.settings import ServeSettings
from orl.serving.spool import EventSpool

pytestmark = [pytest.mark.model, pytest.mark.slow]

KEY = "score-key"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
TEMPERATURE = 0.7


@pytest.fixture
async def client(
    tmp_path: Path, base_model_dir: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, TransformersBackend]]:
    backend = TransformersBackend(base_model_dir)  # fp32
    await backend.start()
    spool = EventSpool(tmp_path / "spool.db")
    state = ServerState(
        settings=ServeSettings(api_keys=("client-key",), admin_key="admin", internal_key=KEY),
        backend=backend,
        template=backend.chat_template,
        recorder=EventRecorder(spool, "live", clock_ms=lambda: 1_700_000_000_000),
        metrics=Metrics(),
    )
    transport = httpx.ASGITransport(app=build_app(state), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://orl") as http:
        yield http, backend
    spool.close()
    await backend.close()


async def score(http: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    body = {"messages": MESSAGES, "temperature": TEMPERATURE, **fields}
    return await http.post("/v1/orl/score", json=body, headers={"authorization": f"Bearer {KEY}"})


def reference_logprobs_T_V(model_dir: Path, prompt: list[int], response: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / TEMPERATURE, dim=-1)


async def test_top_k_ids_and_logprobs_match_a_forward_at_the_same_temperature(
    client: tuple[httpx.AsyncClient, TransformersBackend], base_model_dir: Path
) -> None:
    http, backend = client
    response_ids = backend.chat_template.tokenizer("The capital of France is Paris.")["input_ids"]
    plain = await score(http, response_token_ids=response_ids)
    top = await score(http, response_token_ids=response_ids, top_k=5)
    assert plain.status_code == 200 and top.status_code == 200, top.text
    body = top.json()
    assert "top_ids" not in plain.json()
    assert body["logprobs"] == plain.json()["logprobs"]  # the same forward, the same numbers
    assert [len(row) for row in body["top_ids"]] == [5] * len(response_ids)
    assert [len(row) for row in body["top_logprobs"]] == [5] * len(response_ids)
    expected_T_V = reference_logprobs_T_V(base_model_dir, body["prompt_token_ids"], response_ids)
    expected = expected_T_V.topk(5, dim=-1)
    assert body["top_ids"] == expected.indices.tolist()
    assert torch.allclose(torch.tensor(body["top_logprobs"]), expected.values, atol=1e-4)
    for t, token in enumerate(response_ids):  # the sampled token's logprob is never above the top-1
        assert body["logprobs"][t] <= body["top_logprobs"][t][0] + 1e-6
        if token in body["top_ids"][t]:
            assert abs(body["top_logprobs"][t][body["top_ids"][t].index(token)] - body["logprobs"][t]) < 1e-5


async def test_top_k_with_the_base_weights_reports_version_zero(
    client: tuple[httpx.AsyncClient, TransformersBackend],
) -> None:
    http, _ = client
    response = await score(http, response_token_ids=[504, 2114, 30], top_k=3, use_base=True)
    assert response.status_code == 200, response.text
    assert response.json()["policy_version"] == 0
    assert len(response.json()["top_ids"]) == 3
