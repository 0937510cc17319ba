"""Pure stream processors: state in, events out; no I/O, no clock, no runtime."""
