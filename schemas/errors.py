"""The root of orl's exception hierarchy (here because `schemas` is the one package everybody may import).

Every exception class orl defines derives from `OrlError` (tests/unit/test_exception_hierarchy.py
checks it), so an entry point can catch one class and print a clear message (`orl` does, in
orl/cli.py). The tree (module in brackets where it is not this one):

    OrlError
    |-- ConfigError                      a setting, flag or URL is invalid
    |-- ServiceUnavailable               a broker, object store or model server cannot be reached
    |-- EventEncodeError
    |   `-- UnknownEventTypeError
    |-- EventDecodeError
    |-- SchemaDefinitionError
    |-- SchemaCompatibilityError
    |-- UnsupportedContentError          [orl.schemas.messages] a chat message content orl cannot read
    |-- JsonTooDeep                      [orl.schemas.json_depth] JSON nested deeper than MAX_JSON_DEPTH
    |-- CheckpointError                  a checkpoint cannot be published, verified or loaded
    |   `-- CheckpointRejected           [orl.connectors.checkpoint_store] verification failed
    |-- ObjectStoreError                 [orl.connectors.object_store.base]
    |   `-- ObjectNotFound
    |-- EventLogError                    [orl.connectors.event_log.base]
    |-- ModelFilesError                  [orl.connectors.model_files]
    |-- IngestError                      [orl.connectors.environment.ingest_client]
    |-- PayloadError                     [orl.connectors.environment.outcome_events]
    |-- PolicyError                      [orl.serving.policy.base]
    |-- ApiError                         [orl.serving.openai_api] carries the HTTP status
    |-- SpoolError                       [orl.serving.spool]
    |-- ReplayWorkerError                [orl.pipeline.history.replay_workers]
    |-- ImportFailed                     [orl.pipeline.history.openclaw_import]
    |-- NotFound                         [orl.pipeline.history.audit]
    |-- ArchiveError                     [orl.pipeline.history.archive]
    |-- TrainingError                    [orl.trainer.steps] non-finite loss or gradient (every backend)
    |-- LogprobInputError                [orl.trainer.logprobs]
    |-- LossInputError                   [orl.trainer.losses]
    |-- MegatronBackendError             [orl.trainer.megatron_backend.hf_conversion]
    |   `-- UnsupportedModelError
    `-- DemoDataError                    [orl.gate.scoring]

A new error class goes under `OrlError` or one of these; reuse one that already means the same thing.
"""


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


class CheckpointError(OrlError):
    """A checkpoint, or a policy folder, could not be published, verified or loaded; the message says why.

    One class for the whole life of a checkpoint: the store refusing a publish (bad input, version
    already published), the trainer or a serving backend refusing to load a folder (wrong kind,
    missing files), the follower finding no such version. A serving backend that refuses a
    checkpoint keeps serving the old policy.
    """
