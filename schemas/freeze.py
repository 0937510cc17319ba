"""`python -m orl.schemas.freeze`: freeze changed event schemas as new history versions.

For each event whose current self-contained schema differs from its latest frozen version in
`schemas/history/<EventType>/`, checks that the new schema can read every frozen version, then
writes `v<N+1>.avsc`. Nothing is written if any event fails the check. `--check` writes nothing
and exits 1 if a freeze is needed (for CI).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from orl.schemas.compatibility import evolution_problems
from orl.schemas.errors import OrlError, SchemaCompatibilityError
from orl.schemas.registry import AVRO_DIR, HISTORY_DIR, Registry, load_registry


def pending_versions(registry: Registry) -> dict[str, tuple[int, dict[str, object]]]:
    """The (version number, schema) each unfrozen event would be frozen as."""
    return {
        name: (registry.current(name).version, registry.current(name).schema) for name in registry.unfrozen()
    }


def freeze(avro_dir: Path = AVRO_DIR, history_dir: Path = HISTORY_DIR) -> list[Path]:
    """Write a new history version for every changed event; returns the files written."""
    registry = load_registry(avro_dir, history_dir)
    pending = pending_versions(registry)
    problems = [
        f"{name}: {problem}"
        for name, (_, schema) in pending.items()
        for problem in evolution_problems([v.schema for v in registry.history(name)] + [schema])
    ]
    if problems:
        raise SchemaCompatibilityError("incompatible schema changes:\n  " + "\n  ".join(problems))
    written = []
    for name, (version, schema) in pending.items():
        path = history_dir / name / f"v{version}.avsc"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(schema, indent=2) + "\n", encoding="utf-8")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orl.schemas.freeze", description=__doc__.splitlines()[0])
    parser.add_argument("--avro-dir", type=Path, default=AVRO_DIR, help="current .avsc files")
    parser.add_argument("--history-dir", type=Path, default=HISTORY_DIR, help="frozen versions")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a freeze is needed")
    args = parser.parse_args(argv)
    try:
        if args.check:
            pending = pending_versions(load_registry(args.avro_dir, args.history_dir))
            for name, (version, _) in pending.items():
                print(f"needs freezing: {name} v{version}")
            return 1 if pending else 0
        written = freeze(args.avro_dir, args.history_dir)
    except OrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    if not written:
        print("every schema is frozen")
    return 0


if __name__ == "__main__":
    sys.exit(main())
