"""Consumes samples, computes the losses, steps the optimizer and publishes verified checkpoints."""
