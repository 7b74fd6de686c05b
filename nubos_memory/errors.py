"""The one exception tree of nubos-memory.

Every error a user can cause is a :class:`NubosMemoryError` with a stable
machine ``code``, a human ``message`` and JSON-able ``details``.  The CLI maps
it to ``{"error": {"code", "message", "details"}}`` on stderr and to the exit
code of its class, in exactly one place (``cli.main``)::

    NubosMemoryError                 exit 1   (base; never raised directly)
    ├── UsageError                   exit 2   usage
    ├── ConfigError                  exit 3   config-invalid-json, config-invalid, config-unknown-key,
    │                                         config-invalid-value, project-not-found
    ├── DisabledError                exit 4   memory-disabled
    ├── InputError                   exit 5   memory-empty-query, records-file-*, record-* (one code
    │                                         per field: record-invalid-type, record-missing-title, ...)
    ├── LockTimeout                  exit 6   lock-timeout
    ├── StoreError                   exit 7   manifest-corrupt, index-missing, index-corrupt,
    │                                         keymap-corrupt, vectors-corrupt, records-unreadable, ...
    ├── EmbeddingError               exit 8   embedding-unavailable, embedding-failed
    └── RebuildRequired              exit 9   memory-rebuild-required

Store, embedding and rebuild errors met while *querying* do not fail the
query: it answers lexically and reports them as ``degraded`` instead.
"""

from __future__ import annotations

from typing import Any


class NubosMemoryError(Exception):
    """Base error: a stable ``code``, a ``message`` and ``details``."""

    exit_code = 1
    default_code = "error"

    def __init__(self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code or self.default_code
        self.message = message
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        """The ``error`` object of the JSON envelope."""
        return {"code": self.code, "message": self.message, "details": self.details}


class UsageError(NubosMemoryError):
    """Bad command-line usage: missing or malformed arguments."""

    exit_code = 2
    default_code = "usage"


class ConfigError(NubosMemoryError):
    """The project's ``.nubos-pilot/config.json`` is unreadable or invalid."""

    exit_code = 3
    default_code = "config-invalid"


class DisabledError(NubosMemoryError):
    """``memory.enabled`` is false (the default): nothing is loaded or written."""

    exit_code = 4
    default_code = "memory-disabled"


class InputError(NubosMemoryError):
    """A record, batch, records file or query text the user gave is invalid."""

    exit_code = 5
    default_code = "input-invalid"


class LockTimeout(NubosMemoryError):
    """Another live process held the memory's write lock for too long."""

    exit_code = 6
    default_code = "lock-timeout"


class StoreError(NubosMemoryError):
    """A file of the memory folder is missing, corrupt or unusable."""

    exit_code = 7
    default_code = "store-error"


class EmbeddingError(NubosMemoryError):
    """The embedding model could not be loaded or failed to embed."""

    exit_code = 8
    default_code = "embedding-unavailable"


class RebuildRequired(NubosMemoryError):
    """The index was built with another embedding fingerprint; run ``memory-rebuild``."""

    exit_code = 9
    default_code = "memory-rebuild-required"
