"""The promotion gate: a published checkpoint reaches users only once it scores no worse than the
promoted one on held-out prompts.

`runner` is `orl gate` (reads checkpoints and requests, writes PolicyGated), `promotion_rule` its pure
decision, `scoring` the answer scorers it and the report share (relevance to the prompt, the
cluster bootstrap). What the trainer and the servers do with its decisions is theirs
(`orl.trainer.control`, `orl.serving.checkpoint_follower`), read through `orl.rules.gate_decisions`.
"""
