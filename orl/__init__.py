"""The `orl` command line: the composition root that wires serving, pipeline and trainer into processes."""

__version__ = "0.1.0"
