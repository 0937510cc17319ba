"""Test-only support code: helpers that must never run in a deployable's code path."""
