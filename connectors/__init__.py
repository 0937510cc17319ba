"""Ports to the outside world: the event log, the object store, the model files and environment connectors.

Imports only `schemas`.
"""
