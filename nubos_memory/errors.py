"""The one exception tree of nubos-memory, and the one place errors become JSON.

Every error a user can cause is a :class:`NubosMemoryError` with a stable
machine ``code``, a human ``message`` and JSON-able ``details``.  Every
interface (the CLI, ``memory-serve``, ``memory-mcp``) turns an exception into
``{"error": {"code", "message", "details"}}`` and an exit code with
:func:`failure`, and nowhere else::

    NubosMemoryError                 exit 1   (base; never raised directly)
    ├── UsageError                   exit 2   usage, argument-invalid-utf8, argument-unknown, ...
    ├── ConfigError                  exit 3   config-invalid-json, config-invalid, config-unknown-key,
    │                                         config-invalid-value, project-not-found
    ├── DisabledError                exit 4   memory-disabled
    ├── InputError                   exit 5   memory-empty-query, records-file-*, record-* (one code
    │                                         per field: record-invalid-type, record-missing-title, ...),
    │                                         query-invalid-*, ingest-*, beir-invalid, serve-already-running
    ├── LockTimeout                  exit 6   lock-timeout
    ├── StoreError                   exit 7   manifest-corrupt, index-missing, index-corrupt,
    │                                         keymap-corrupt, vectors-corrupt, records-unreadable,
    │                                         server-lost, store-unavailable, ...
    ├── EmbeddingError               exit 8   embedding-unavailable, embedding-failed; the generator's
    │                                         generator-unavailable, generator-failed
    ├── RebuildRequired              exit 9   memory-rebuild-required
    ├── InternalError                exit 70  internal-error (a bug; NUBOS_MEMORY_DEBUG=1 re-raises it)
    ├── IOFailure                    exit 74  io-error (the OS refused a read or write we did not handle)
    └── Interrupted                  exit 130 interrupted

Store, embedding and rebuild errors met while *querying* do not fail the
query: it answers lexically and reports them as ``degraded`` instead.

Every code is declared, with one line of meaning, in :mod:`nubos_memory.codes`
(``docs/errors.md`` lists them all); raise sites use its constants.
"""

from __future__ import annotations

import os
from typing import Any

from . import codes


class NubosMemoryError(Exception):
    """Base error: a stable ``code``, a ``message`` and ``details``."""

    exit_code = 1
    default_code = codes.ERROR

    def __init__(self, message: str, *, code: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code or self.default_code
        self.message = message
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        """The ``error`` object of the JSON envelope."""
        return {"code": self.code, "message": self.message, "details": self.details}


class UsageError(NubosMemoryError):
    """Bad command-line or tool usage: missing, unknown or malformed arguments."""

    exit_code = 2
    default_code = codes.USAGE


class ConfigError(NubosMemoryError):
    """The project's ``.nubos-pilot/config.json`` is unreadable or invalid."""

    exit_code = 3
    default_code = codes.CONFIG_INVALID


class DisabledError(NubosMemoryError):
    """``memory.enabled`` is false (the default): nothing is loaded or written."""

    exit_code = 4
    default_code = codes.MEMORY_DISABLED


class InputError(NubosMemoryError):
    """A record, batch, records file or query text the user gave is invalid."""

    exit_code = 5
    default_code = codes.INPUT_INVALID


class LockTimeout(NubosMemoryError):
    """Another live process held the memory's write lock for too long."""

    exit_code = 6
    default_code = codes.LOCK_TIMEOUT


class StoreError(NubosMemoryError):
    """A file of the memory folder (or the store's server) is missing, corrupt or unusable."""

    exit_code = 7
    default_code = codes.STORE_ERROR


class EmbeddingError(NubosMemoryError):
    """The embedding model could not be loaded or failed to embed (or the generator, a model too, failed)."""

    exit_code = 8
    default_code = codes.EMBEDDING_UNAVAILABLE


class RebuildRequired(NubosMemoryError):
    """The index was built with another embedding fingerprint; run ``memory-rebuild``."""

    exit_code = 9
    default_code = codes.MEMORY_REBUILD_REQUIRED


class InternalError(NubosMemoryError):
    """A bug: an exception nobody expected.  Still one JSON error, never a bare traceback."""

    exit_code = 70
    default_code = codes.INTERNAL_ERROR


class IOFailure(NubosMemoryError):
    """The operating system refused a read or write outside the library's own handling."""

    exit_code = 74
    default_code = codes.IO_ERROR


class Interrupted(NubosMemoryError):
    """The user interrupted the verb (Ctrl-C)."""

    exit_code = 130
    default_code = codes.INTERRUPTED


ERROR_CLASSES: tuple[type[NubosMemoryError], ...] = (
    UsageError, ConfigError, DisabledError, InputError, LockTimeout, StoreError, EmbeddingError,
    RebuildRequired, InternalError, IOFailure, Interrupted,
)
# Every exit code a verb can return (0: success, also a skipped disabled memory).
EXIT_CODES: dict[int, str] = {0: "success", **{cls.exit_code: cls.__name__ for cls in ERROR_CLASSES}}


def as_error(exc: BaseException) -> NubosMemoryError:
    """Any exception as one of ours: library errors as they are, the rest by kind."""
    if isinstance(exc, NubosMemoryError):
        return exc
    if isinstance(exc, KeyboardInterrupt):
        return Interrupted("interrupted")
    if isinstance(exc, OSError):
        return IOFailure(str(exc), details={"errno": exc.errno})
    if os.environ.get("NUBOS_MEMORY_DEBUG"):
        raise exc
    return InternalError(f"{type(exc).__name__}: {exc}", details={"hint": "set NUBOS_MEMORY_DEBUG=1 for a traceback"})


def failure(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """``(exit code, {"error": {...}})`` for any exception: the one envelope every interface prints."""
    err = as_error(exc)
    return err.exit_code, {"error": err.to_dict()}
