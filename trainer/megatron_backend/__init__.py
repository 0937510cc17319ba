"""megatron-core trainer backend: tensor and data parallel full fine-tuning through torchrun.

Loads a Hugging Face Llama-family checkpoint into megatron's GPTModel (`model`, `hf_conversion`),
computes the torch backend's loss from vocab-parallel logprobs (`logprobs`, `step`), and exports full
Hugging Face safetensors checkpoints through the same publish protocol (`export`), so serving does
not care which backend trained. Entry point: `torchrun ... -m trainer.megatron_backend.worker`
(see `worker`). megatron-core is an optional dependency (the `megatron` extra); nothing outside
this package and its tests imports it.
"""
