"""Policy backends: the model behind orl's OpenAI-compatible server.

`base` defines the interface (`PolicyBackend`, `SamplingParams`, `Generation`, `TokenStep`,
`GenerationStream`) and the logprob contract; `transformers_backend` serves in-process on CPU with
continuous batching; `sglang_backend` drives an SGLang server over HTTP; `chat_template` renders
OpenAI messages to the prompt token ids both take. Backends are imported from their own modules so
that importing this package does not load torch.
"""

from orl.schemas.errors import CheckpointError
from orl.serving.policy.base import (
    Generation,
    GenerationStream,
    PolicyBackend,
    PolicyError,
    SamplingParams,
    TokenStep,
)

__all__ = [
    "CheckpointError",
    "Generation",
    "GenerationStream",
    "PolicyBackend",
    "PolicyError",
    "SamplingParams",
    "TokenStep",
]
