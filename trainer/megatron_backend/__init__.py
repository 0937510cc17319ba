"""megatron-core trainer backend: tensor and data parallel full fine-tuning through torchrun.

Loads a Hugging Face Llama-family checkpoint into megatron's GPTModel (`model`, `hf_conversion`),
computes the torch backend's loss from vocab-parallel logprobs (`logprobs`, `step`), and exports full
Hugging Face safetensors checkpoints through the same publish protocol (`export`), so serving does
not care which backend trained. Entry point: `orl train --backend megatron` under torchrun (`launch`
has the command; `loop` runs the torch backend's training loop with rank 0 driving every rank);
`worker` runs the same step on a samples file (the parity tests). megatron-core is an optional
dependency (the `megatron` extra); nothing outside this package and its tests imports it.
"""
