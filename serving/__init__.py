"""The OpenAI-compatible policy server: captures every request and response as events, hot-swaps checkpoints."""
