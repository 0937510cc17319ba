"""The root of orl's exception hierarchy (here because `schemas` is the one package everybody may import)."""


class OrlError(Exception):
    """Base class of every error orl raises on purpose."""


class ConfigError(OrlError):
    """A setting, flag or URL is invalid; the message names it."""


class ServiceUnavailable(OrlError):
    """An external service (broker, object store, model server) could not be reached; the message names its address."""


class EventEncodeError(OrlError):
    """An event could not be encoded: the message names the event type and the offending field path."""


class UnknownEventTypeError(EventEncodeError):
    """An event type name that no `.avsc` file in `schemas/avro/` defines."""


class EventDecodeError(OrlError):
    """Bytes could not be decoded as an orl event (short, bad marker, unknown schema, corrupt body)."""


class SchemaDefinitionError(OrlError):
    """An `.avsc` file (current or frozen history) is invalid or references an undefined type."""


class SchemaCompatibilityError(OrlError):
    """A schema change would break reading events written with an earlier version."""
