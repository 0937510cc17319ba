"""Runs stages over a log: the shared processor host and its I/O shells (embedded, faust, memory)."""
