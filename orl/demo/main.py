"""`orl demo`'s entry point: the methods compared on one simulated user, or two tenants (--two-tenants)."""

from __future__ import annotations

from orl.demo.run import DemoSettings, run_demo
from orl.demo.tenants import run_two_tenants


def demo(settings: DemoSettings) -> int:
    """Run the demo `settings` ask for."""
    settings = settings.effective()
    return run_two_tenants(settings) if settings.two_tenants else run_demo(settings)
