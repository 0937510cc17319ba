"""The root of orl's exception hierarchy (here because `schemas` is the one package everybody may import)."""


class OrlError(Exception):
    """Base class of every error orl raises on purpose."""


class ConfigError(OrlError):
    """A setting, flag or URL is invalid; the message names it."""


class ServiceUnavailable(OrlError):
    """An external service (broker, object store, model server) could not be reached; the message names its address."""
