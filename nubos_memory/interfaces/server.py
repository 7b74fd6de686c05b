"""``memory-serve``: keep one project's model, index and lexical index warm.

It listens on ``.nubos-pilot/memory/serve.sock`` (owner-only; peers of another
uid are refused) and answers the same verbs as the CLI, with the same JSON and
the same errors, by running the same verb table (``verbs.py``) against a
:class:`~nubos_memory.interfaces.warm.WarmMemory`.  Each connection is served
on its own thread: queries are answered while a long write is running (writes
run one at a time, and keep every guarantee of the core: the same lock, fsync
and atomic commit), and a background thread embeds records other processes
wrote without vectors.  Other processes' writes are seen by the next answer.

Start-up: the server takes ``serve.lock`` (a second server gets
``serve-already-running`` at once), warms up (log, indexes, model), and only
then binds the socket and prints ``{"serving": path}`` on stderr, so a client
never waits on a half-started server: until then it works in-process.
``--idle-timeout`` counts from the end of warm-up and of the last request.

Protocol: one request per connection, each message an 8-byte big-endian length
and a JSON document: ``{"verb": name, "args": {...request...}, "env": {...}, "ack": true}`` (a
request the CLI parsed and prepared) → ``{"accepted": true}`` (asked for by ``ack``) or
``{"fallback": true}``, then ``{"code", "stream", "doc"}``, preceded, for a long verb whose
request asks for progress, by ``{"progress": [stage, done, total]}`` messages; or
``{"argv": [...], "cwd": path, "env": {...}}`` (a command line as typed: ``client.quick``) →
``{"fallback": true}`` when the CLI must run it itself (``client.py`` says when), else
``{"accepted": true, "writes": bool}`` then ``{"code", "stream", "out"}``: the text the CLI
would print, parsed, prepared, answered and printed by the CLI's own functions.  ``accepted`` is
sent before anything runs (a client that waits ``client.ACCEPT_TIMEOUT_S`` for it in vain runs
the call itself, and the server then runs nothing: its ``accepted`` cannot be sent).  ``env``: the
caller's environment as digests (``client.environment``); a server whose own differs in a
variable its answers read (``same_environment``) answers ``fallback``.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .. import codes
from ..config import (
    DSN_ENV_SETTING,
    EMBED_BASE_URL_ENV,
    EMBED_KEY_ENV_SETTING,
    GENERATOR_BASE_URL_ENV,
    GENERATOR_KEY_ENV_SETTING,
)
from ..errors import InputError, UsageError, failure
from ..fsio import DIR_MODE, FILE_MODE, dumps, loads
from ..roots import find_root
from ..trust import KEY_ENV
from ..userdirs import DOWNLOADS_ENV, ENV_KEYS
from .client import connect, environment, peer_uid, recv_frame, send_frame, socket_path
from .verbs import VERBS, from_caller
from .warm import WarmMemory, catch_up_forever

LOCK_NAME = "serve.lock"
# The environment variables a served answer reads, besides those a setting names (``_named_variables``): where
# the user's folders are (``userdirs.ENV_KEYS``), the signing key, downloads, the gateways' URLs and the names of
# their keys' and the DSN's variables.  (Not the model hub's: they say where a model loads from, and the server's
# is loaded; the vectors name their model by its files' fingerprint.  Not the root's: it is checked on its own.)
ENV_READ = frozenset({*ENV_KEYS, KEY_ENV, DOWNLOADS_ENV, EMBED_BASE_URL_ENV, GENERATOR_BASE_URL_ENV,
                      EMBED_KEY_ENV_SETTING, GENERATOR_KEY_ENV_SETTING, DSN_ENV_SETTING})


def _named_variables(mem: Any) -> set[str]:
    """The variables the memory's settings name: the gateway's and the generator's keys, the team DSN."""
    from ..config import dsn_env_name, gateway_key_env, generator_key_env

    try:
        return {gateway_key_env(mem.config), generator_key_env(mem.config), dsn_env_name()}
    except Exception:  # noqa: BLE001 - unreadable user settings: the declared variables only (ENV_READ)
        return set()


def same_environment(theirs: Any, mine: dict[str, str], mem: Any) -> bool:
    """Whether a caller's environment (``client.environment``; none: an older client) agrees with the one
    this server was started in (``mine``: what its own libraries set since, such as the model runtime's
    ``HF_HUB_OFFLINE``, is not the user's) in every variable an answer may read."""
    if theirs is None:
        return True
    if not isinstance(theirs, dict):
        return False
    return all(theirs.get(n) == mine.get(n) for n in ENV_READ | _named_variables(mem))


def _names_a_file(args: dict[str, Any]) -> bool:
    """Whether a prepared request still names a file for the server to open (``verbs.prepare`` reads them
    in the caller: a server never opens a path a client gave, which could be its own standard input)."""
    return args.get("body_file") is not None or (args.get("records_file") not in (None, "-")
                                                 and args.get("stdin_text") is None)


class Server:
    def __init__(self, root: str | None, idle_timeout: float = 0.0):
        self.environment = environment()  # (as started: before anything it loads sets a variable)
        self.warm = WarmMemory(root)
        self.warm.memory.require_enabled()
        self.root = self.warm.root
        self.path = socket_path(self.root)
        self.idle_timeout = idle_timeout
        self._stop = threading.Event()
        self._active = 0
        self._last = time.monotonic()
        self._count_lock = threading.Lock()
        self.served = 0

    def _claim(self) -> int:
        """Take ``serve.lock`` for this server's life; another server holding it wins."""
        self.path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        fd = os.open(self.path.parent / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise InputError("a memory-serve is already running (or starting) for this memory",
                             code=codes.SERVE_ALREADY_RUNNING, details={"socket": str(self.path)}) from None
        return fd

    def _bind(self) -> socket.socket:
        if self.path.exists() or self.path.is_symlink():
            try:
                connect(self.path, timeout=0.5).close()
            except OSError:
                self.path.unlink()  # stale: its server was killed
            else:  # a server of a version without serve.lock
                raise InputError("a memory-serve is already running for this memory", code=codes.SERVE_ALREADY_RUNNING,
                                 details={"socket": str(self.path)})
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket file is created 0600
        try:
            target = str(self.path)
            if len(target.encode()) >= 100:
                fd = os.open(self.path.parent, os.O_RDONLY)
                try:
                    sock.bind(f"/proc/self/fd/{fd}/{self.path.name}")
                finally:
                    os.close(fd)
            else:
                sock.bind(target)
        finally:
            os.umask(old_umask)
        sock.listen(64)
        sock.settimeout(0.25)
        return sock

    def handle(self, conn: socket.socket) -> bool:
        """Answer one connection (on its own thread); whether it was answered (not: a broken request, a
        peer of another uid, a command line the CLI runs itself)."""
        with conn:
            try:
                if peer_uid(conn) not in (None, os.getuid()):
                    return False  # the socket is owner-only; a peer of another uid should not exist at all
            except OSError:
                return False
            conn.settimeout(30)
            try:
                request = loads(recv_frame(conn))
                if not same_environment(request.get("env"), self.environment, self.warm.memory):
                    send_frame(conn, dumps({"fallback": True, "environment": True}))  # (the caller's CLI answers)
                    return False
                if "argv" in request:
                    return self._command_line(conn, [str(a) for a in request["argv"]], str(request["cwd"]))
                name, args = self._taken(conn, request)
            except Exception:  # noqa: BLE001 - a broken request, or a caller gone: nothing to answer
                return False
            args["root"] = str(self.root)
            unserved = name not in VERBS or not VERBS[name].served
            if unserved or _names_a_file(args):
                why = f"{name!r} is not served by memory-serve" if unserved \
                    else "a request to memory-serve carries the text of the files it names (the CLI reads them)"
                code, envelope = failure(UsageError(why))
                reply: dict[str, Any] = {"code": code, "stream": "stderr", "doc": envelope}
            else:
                gone = threading.Event()

                def report(stage: str, done: int, total: int) -> None:
                    """Ahead of the answer; a client that went away must not stop the work."""
                    if not gone.is_set():
                        try:
                            send_frame(conn, dumps({"progress": [stage, done, total]}))
                        except OSError:
                            gone.set()

                wanted = VERBS[name].long and args.get("progress") in ("bar", "json")
                code, stream, doc = self.warm.answer(name, args, report if wanted else None)
                reply = {"code": code, "stream": stream, "doc": doc}
            try:
                conn.settimeout(None)
                send_frame(conn, dumps(reply))
            except OSError:
                pass
            return True

    @staticmethod
    def _taken(conn: socket.socket, request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """A prepared request's verb and arguments (ValueError: not one), ``accepted`` said first where the
        client asks (``ack``), before anything runs."""
        name, args = request["verb"], dict(request["args"])
        if not isinstance(name, str):
            raise ValueError("the verb is not a string")
        if request.get("ack"):
            send_frame(conn, dumps({"accepted": True}))
        return name, args

    def _command_line(self, conn: socket.socket, argv: list[str], cwd: str) -> bool:
        """Answer a command line as the CLI would, with the text it would print, or say ``fallback``
        where the CLI must run it itself (``client.py``); whether it was answered."""
        from . import cli  # (the CLI's parser and printing, imported by the first command line)

        def accept(writes: bool) -> None:  # (before anything runs: a client that loses us later knows)
            send_frame(conn, dumps({"accepted": True, "writes": writes}))

        def answer(got: tuple[int, str, Any]) -> None:
            code, stream, doc = got
            conn.settimeout(None)
            send_frame(conn, dumps({"code": code, "stream": stream, "out": cli.render(doc)}))

        try:
            name, request = cli.parse(argv, quiet=True)
        except UsageError as exc:
            accept(False)
            answer((exc.exit_code, "stderr", {"error": exc.to_dict()}))
            return True
        except BaseException:  # noqa: BLE001 - what argparse would print (--help, abbreviated too): the CLI prints it
            send_frame(conn, dumps({"fallback": True}))
            return False
        verb = VERBS.get(name)
        if verb is None or not verb.served or verb.long or from_caller(name, request) \
                or not os.path.isabs(cwd) or not self._ours(request.get("root"), cwd):
            send_frame(conn, dumps({"fallback": True}))
            return False
        request["root"] = str(self.root)
        accept(verb.writes)
        answer(cli.prepared(name, request, cwd) or self.warm.answer(name, request))
        return True

    def _ours(self, given: Any, cwd: str) -> bool:
        """Whether a command line's ``--root`` (None: the caller found this server by its own) is this
        server's memory."""
        if given is None:
            return True
        try:
            return find_root(str(given), cwd=Path(cwd)) == self.root
        except Exception:  # noqa: BLE001 - not a folder: the CLI says so
            return False

    def _serve_one(self, conn: socket.socket) -> None:
        answered = False
        try:
            answered = self.handle(conn)
        finally:
            with self._count_lock:
                self._active -= 1
                self.served += answered
                self._last = time.monotonic()

    def serve(self) -> dict[str, Any]:
        claim = self._claim()
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        started = time.monotonic()
        reason = "signal"
        sock = None
        workers: list[threading.Thread] = []
        try:
            self.warm.warm_up()
            sock = self._bind()
            catcher = threading.Thread(target=catch_up_forever, args=(self.warm, self._stop), daemon=True)
            catcher.start()
            self._last = time.monotonic()  # idle time counts from here, not from the start
            sys.stderr.write(dumps({"serving": str(self.path),
                                    "warnings": self.warm.memory.notices}).decode() + "\n")
            sys.stderr.flush()
            while not self._stop.is_set():
                with self._count_lock:
                    idle = self._active == 0 and time.monotonic() - self._last > self.idle_timeout
                if self.idle_timeout and idle:
                    reason = "idle"
                    break
                try:
                    conn, _ = sock.accept()
                except (TimeoutError, InterruptedError):
                    continue
                with self._count_lock:
                    self._active += 1
                worker = threading.Thread(target=self._serve_one, args=(conn,), daemon=True)
                worker.start()
                workers = [w for w in workers if w.is_alive()] + [worker]
        finally:
            self._stop.set()
            if sock is not None:
                sock.close()
                try:
                    self.path.unlink()
                except FileNotFoundError:
                    pass
            for worker in workers:  # answers under way are finished, not cut
                worker.join(timeout=60)
            for s, handler in previous.items():
                signal.signal(s, handler)
            os.close(claim)
        return {"stopped": True, "reason": reason, "served": self.served,
                "uptime_s": round(time.monotonic() - started, 3), "socket": str(self.path)}

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stop.set()


def run_server(root: str | None, idle_timeout: float) -> dict[str, Any]:
    """Serve in the foreground until SIGTERM/SIGINT or idle; return a summary."""
    if idle_timeout < 0:
        raise UsageError("--idle-timeout must be >= 0")
    return Server(root, idle_timeout).serve()



