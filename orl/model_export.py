"""`orl model`: prepare the base model, or export a trained version to run anywhere.

`orl model` (or `orl model prepare`) converts the shipped SmolLM2 GGUF to safetensors once.
`orl model export --version V --format hf|gguf` reads version V of the run from the object store
(`checkpoints/<run-id>/<V>/`, every file verified against its manifest), builds the policy it holds
on the base model the manifest names (a LoRA adapter merged, or full weights) and writes it:
`hf`, a merged Hugging Face folder (safetensors, config, tokenizer, chat template) that transformers,
vLLM and SGLang load; `gguf`, one GGUF file for llama.cpp and Ollama (`orl.connectors.gguf_export`).
Version 0 is the base model. Output is written under a temporary name and renamed when complete;
an existing output is never overwritten.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from orl.connectors.settings import ConnectionSettings, RunSettings, setting
from orl.schemas.errors import ConfigError

log = logging.getLogger(__name__)

ModelAction = Literal["prepare", "export"]
ExportFormat = Literal["hf", "gguf"]
# the base folder's files an exported Hugging Face folder carries besides the weights and config
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


@dataclass(frozen=True)
class ModelSettings(ConnectionSettings, RunSettings):
    action: ModelAction = setting(
        "prepare",
        "ORL_MODEL_ACTION",
        "prepare: convert the base model once | export: write a published version as a model to run elsewhere.",
        positional=True,
    )
    version: int = setting(
        -1, "ORL_MODEL_VERSION", "export: the version (0: the base model; default: the newest published)."
    )
    format: ExportFormat = setting(
        "hf",
        "ORL_MODEL_FORMAT",
        "export: hf (a merged Hugging Face folder: transformers, vLLM, SGLang) | gguf (one file: llama.cpp, Ollama).",
    )
    out: Path = setting(
        Path(""), "ORL_MODEL_OUT", "export: where to write (default <data-dir>/exports/<run-id>-v<V>[.gguf])."
    )
    gguf_type: Literal["f32", "f16"] = setting(
        "f32", "ORL_MODEL_GGUF_TYPE", "export --format gguf: tensor type of the weights (norms stay f32)."
    )
    gguf_pre_tokenizer: str = setting(
        "",
        "ORL_MODEL_GGUF_PRE_TOKENIZER",
        "export --format gguf: llama.cpp's name for the base tokenizer's pre-tokenizer (tokenizer.ggml.pre); "
        "default: the shipped SmolLM2's (smollm) when the base is smollm2-135m, required otherwise.",
        advanced=True,
    )


def run_model(settings: ModelSettings) -> int:
    """Entry point of `orl model`."""
    from orl.connectors.model_files import resolve_model

    if settings.action == "prepare":
        print(f"model ready: {resolve_model(settings.model, settings.model_cache_dir)}")
        return 0
    return export_model(settings)


def export_model(settings: ModelSettings) -> int:
    """Write one version of the run as a Hugging Face folder or a GGUF file; print where and how to run it."""
    from orl.connectors.checkpoint_store import complete_versions
    from orl.connectors.object_store.factory import open_object_store

    store = open_object_store(
        settings.effective_store_url(), access_key=settings.s3_access_key, secret_key=settings.s3_secret_key
    )
    published = complete_versions(store, settings.run_id)
    version = settings.version if settings.version >= 0 else max(published, default=0)
    if version and version not in published:
        newest = f"the newest is v{max(published)}" if published else "none is published yet"
        raise ConfigError(f"run {settings.run_id!r} has no published version {version} ({newest})")
    suffix = ".gguf" if settings.format == "gguf" else ""
    out = settings.out if str(settings.out) not in ("", ".") else (
        settings.data_dir / "exports" / f"{settings.run_id}-v{version}{suffix}"
    )  # fmt: skip
    if out.exists():
        raise ConfigError(f"{out} exists; remove it or choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".export-v{version}-", dir=out.parent) as work:
        base_model, folder = _merged_folder(settings, store, version, Path(work))
        if settings.format == "hf":
            folder.rename(out)
        else:
            from orl.connectors.gguf_export import write_gguf

            write_gguf(
                folder,
                out,
                pre_tokenizer=_pre_tokenizer(settings, base_model),
                tensor_type=settings.gguf_type,
                name=f"orl {settings.run_id} v{version}",
            )
    print(f"exported v{version} of run {settings.run_id!r} ({base_model}) as {settings.format}: {out}")
    if settings.format == "gguf":
        print(f"  llama.cpp: llama-cli -m {out}\n  Ollama: a Modelfile with the line FROM {out}")
    else:
        print(
            f"  transformers: AutoModelForCausalLM.from_pretrained({str(out)!r}); vLLM / SGLang: --model {out}"
        )
    return 0


def _merged_folder(settings: ModelSettings, store: Any, version: int, work: Path) -> tuple[str, Path]:
    """(the base model's name, a Hugging Face folder under `work` holding version `version`'s policy)."""
    import torch
    from transformers import AutoModelForCausalLM

    from orl.connectors.checkpoint_store import MANIFEST_NAME, download_and_verify, version_prefix
    from orl.connectors.model_files import checkpoint_model, resolve_model

    manifest = None
    if version:
        key = version_prefix(settings.run_id, version) + MANIFEST_NAME
        manifest = download_and_verify(store, key, work / "checkpoint", trainer_state=False)
    base_model = manifest.base_model if manifest else settings.model
    base_dir = resolve_model(base_model, settings.model_cache_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if manifest:
        model = checkpoint_model(model, work / "checkpoint", manifest.kind)
    folder = work / "model"
    model.save_pretrained(folder, safe_serialization=True)
    for name in (*_TOKENIZER_FILES, "generation_config.json"):
        if (base_dir / name).is_file() and not (folder / name).is_file():
            shutil.copy2(base_dir / name, folder / name)
    return base_model, folder


def _pre_tokenizer(settings: ModelSettings, base_model: str) -> str:
    from orl.connectors.gguf_export import shipped_pre_tokenizer
    from orl.connectors.model_files import DEFAULT_MODEL

    if settings.gguf_pre_tokenizer:
        return settings.gguf_pre_tokenizer
    if base_model == DEFAULT_MODEL:
        return shipped_pre_tokenizer()
    raise ConfigError(
        f"the base model {base_model!r} is not the shipped one: give --gguf-pre-tokenizer, llama.cpp's name for "
        "its pre-tokenizer (the tokenizer.ggml.pre that llama.cpp's convert_hf_to_gguf.py writes for it)"
    )
