"""Stream processors that turn captured turns into scored training samples, plus replay and audit."""
