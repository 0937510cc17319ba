"""The trainable policy: a Hugging Face causal LM, fully fine-tuned or with a LoRA adapter.

Loads the base model from a local Hugging Face folder (`orl.connectors.model_files.resolve_model` gives
one), makes it trainable, keeps a frozen reference for the KL term (and for the frozen-teacher OPD
setting), and saves checkpoints that serving loads like the base:

- `kind="full"`: fp32 master weights; the reference is a frozen deep copy of the base. A save is a
  complete model folder: `model.safetensors`, `config.json`, `generation_config.json` and every
  tokenizer / chat-template file of the base.
- `kind="lora"` (default): peft LoRA on the base in fp32; the reference is the same network with the
  adapter disabled (no second copy in memory). A save is `adapter_model.safetensors` +
  `adapter_config.json`; serving applies it to the base named in the checkpoint manifest.

Defaults and why:

- LoRA r=16, alpha=32, dropout 0 (OpenClaw-RL's LoRA scripts and the learnability prototype), on all
  linear layers q,k,v,o,gate,up,down: the prototype's best arm (combined 0.11 -> 0.95 by step 4 and
  0.98 at step 16, against 0.91 with q,k,v,o only, at the same step time).
- LoRA lr 5e-4: in the prototype 1e-4 was too slow for a 16-step run (0.31-0.59 at step 16, still
  climbing) while 5e-4 moved the score within 4-8 steps. It passes through a short off-topic phase,
  hence the KL term and the optional reward centring.
- Full fine-tuning lr 1e-5: OpenClaw-RL's shipped value (Adam, constant) for full weights; a LoRA
  update is a low-rank, alpha/r-scaled delta and tolerates a much larger lr than the full matrices.

Reads and writes no topics or object keys (publishing a saved folder is `orl.connectors.checkpoint_store`).
"""

from __future__ import annotations

import copy
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from orl.schemas.errors import CheckpointError
from orl.trainer.settings import TrainKind
from torch import nn

log = logging.getLogger(__name__)

PolicyKind = TrainKind  # the `orl train --kind` choices
ALL_LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_LR = {"full": 1e-5, "lora": 5e-4}
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA hyper-parameters (see the module docstring for the defaults' justification)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ALL_LINEAR_MODULES


def default_lr(kind: PolicyKind) -> float:
    """The learning rate to use when none is configured: 1e-5 full, 5e-4 LoRA."""
    return DEFAULT_LR[kind]


class PolicyModel:
    """A trainable causal LM plus its frozen reference. Build it with `load_policy`."""

    def __init__(self, module: nn.Module, kind: PolicyKind, base_dir: Path, frozen_ref: nn.Module | None):
        self.module = module  # call it for the policy's logits (adapter on, for LoRA)
        self.kind: PolicyKind = kind
        self.base_dir = base_dir
        self._frozen_ref = frozen_ref

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters the optimizer steps (fp32 master weights)."""
        return [p for p in self.module.parameters() if p.requires_grad]

    @contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """The frozen base model for KL / frozen-teacher logprobs, in eval mode, inside `no_grad`.

        LoRA: the policy network with its adapter disabled (exactly the base, since LoRA adds a
        delta). Full: the frozen copy made at load time.
        """
        if self._frozen_ref is not None:
            with torch.no_grad():
                yield self._frozen_ref
            return
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad(), self.module.disable_adapter():  # type: ignore[operator]
                yield self.module
        finally:
            self.module.train(was_training)

    def save(self, out_dir: Path) -> list[Path]:
        """Write the checkpoint folder (see module docstring); returns the files written, sorted."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        if self.kind == "lora":
            self.module.save_pretrained(out_dir)  # type: ignore[operator]
            _drop_model_card(out_dir)
        else:
            self.module.save_pretrained(out_dir, safe_serialization=True)  # type: ignore[operator]
            _copy_non_weight_files(self.base_dir, out_dir)
        return sorted(p for p in out_dir.rglob("*") if p.is_file())


def _drop_model_card(out_dir: Path) -> None:
    """peft writes a README.md model card with the local base path in it; it is not a weight file."""
    (out_dir / "README.md").unlink(missing_ok=True)


def _copy_non_weight_files(base_dir: Path, out_dir: Path) -> None:
    """Tokenizer, chat template and any other base file save_pretrained did not write."""
    for source in sorted(base_dir.iterdir()):
        if not source.is_file() or source.name.endswith(_WEIGHT_SUFFIXES):
            continue
        target = out_dir / source.name
        if not target.exists():
            shutil.copy2(source, target)


def _load_base(model_dir: Path) -> nn.Module:
    from transformers import AutoModelForCausalLM

    if not (model_dir / "config.json").is_file():
        raise CheckpointError(f"{model_dir} is not a Hugging Face model folder (no config.json)")
    model: nn.Module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model


def _frozen(model: nn.Module) -> nn.Module:
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def _load_full(base_dir: Path, init_dir: Path | None) -> PolicyModel:
    base = _load_base(base_dir)
    policy = _load_base(init_dir) if init_dir is not None else copy.deepcopy(base)
    policy.train()
    for parameter in policy.parameters():
        parameter.requires_grad_(True)
    return PolicyModel(policy, "full", base_dir, _frozen(base))


def _load_lora(base_dir: Path, init_dir: Path | None, lora: LoraSettings) -> PolicyModel:
    from peft import LoraConfig, PeftModel, get_peft_model

    base = _load_base(base_dir)
    if init_dir is not None:
        missing = [name for name in ADAPTER_FILES if not (init_dir / name).is_file()]
        if missing:
            raise CheckpointError(f"{init_dir} is not a LoRA checkpoint: missing {missing}")
        module: nn.Module = PeftModel.from_pretrained(base, init_dir, is_trainable=True)
    else:
        config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            task_type="CAUSAL_LM",
        )
        module = get_peft_model(base, config)
    module.train()
    return PolicyModel(module, "lora", base_dir, None)


def load_policy(
    base_dir: Path,
    kind: PolicyKind = "lora",
    *,
    lora: LoraSettings | None = None,
    init_dir: Path | None = None,
) -> PolicyModel:
    """Load the trainable policy from the base model folder.

    `init_dir` resumes from a checkpoint folder written by `PolicyModel.save` (full: a model
    folder; LoRA: adapter files); the reference stays the base model either way, so the KL always
    measures the distance from the base, not from the last checkpoint.
    """
    base_dir = Path(base_dir)
    init = Path(init_dir) if init_dir is not None else None
    if kind == "full":
        policy = _load_full(base_dir, init)
    elif kind == "lora":
        policy = _load_lora(base_dir, init, lora or LoraSettings())
    else:
        raise CheckpointError(f"unknown policy kind {kind!r} (full | lora)")
    count = sum(p.numel() for p in policy.trainable_parameters())
    log.info("policy loaded: kind=%s base=%s init=%s trainable_params=%d", kind, base_dir, init, count)
    return policy
