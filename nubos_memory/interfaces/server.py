"""``memory-serve``: keep one project's model, index and lexical index warm.

It listens on ``.nubos-pilot/memory/serve.sock`` (owner-only) and answers the
same verbs as the CLI, with the same JSON and the same errors, by running the
same code against one long-lived :class:`Memory`.  Requests are handled one
at a time; writes keep every guarantee of the core (they go through the same
lock, fsync and atomic commit), and the warm snapshot re-reads whatever other
processes wrote before each answer.

Protocol: one request per connection, each message an 8-byte big-endian length
and a JSON document: ``{"args": {...parsed CLI arguments...}}`` →
``{"code", "stream", "doc"}``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from typing import Any

from . import cli
from .client import connect, peer_uid, recv_message, send_message, socket_path
from ..errors import InputError
from ..fsio import DIR_MODE, dumps
from .warm import WarmMemory


class Server:
    def __init__(self, root: str | None, idle_timeout: float = 0.0):
        self.warm = WarmMemory(root)
        self.warm.memory._require_enabled()
        self.root = self.warm.root
        self.path = socket_path(self.root)
        self.idle_timeout = idle_timeout
        self._stop = False
        self.served = 0

    def _memory(self, _root: str | None) -> Any:
        return self.warm.get()

    def _bind(self) -> socket.socket:
        self.path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            try:
                connect(self.path, timeout=0.5).close()
            except OSError:
                self.path.unlink()  # stale: its server was killed
            else:
                raise InputError("a memory-serve is already running for this memory", code="serve-already-running",
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
        sock.listen(16)
        sock.settimeout(0.25)
        return sock

    def handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                if peer_uid(conn) not in (None, os.getuid()):
                    return  # the socket is owner-only; a peer of another uid should not exist at all
            except OSError:
                return
            conn.settimeout(30)
            try:
                request = recv_message(conn)
                args = argparse.Namespace(**request["args"])
                args.root = str(self.root)
            except Exception:
                return
            if args.verb not in cli.FORWARDED:
                reply: Any = {"code": 2, "stream": "stderr", "doc": {"error": {
                    "code": "usage", "message": f"{args.verb} is not served", "details": {}}}}
            else:
                code, stream, doc = cli.execute(args)
                reply = {"code": code, "stream": stream, "doc": doc}
            try:
                conn.settimeout(None)
                send_message(conn, reply)
            except OSError:
                pass
            self.served += 1

    def serve(self) -> dict[str, Any]:
        sock = self._bind()
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        factory = cli.MEMORY_FACTORY
        cli.MEMORY_FACTORY = self._memory
        started = last = time.monotonic()
        reason = "signal"
        try:
            self.warm.warm_up()
            # One line on stderr when ready, so scripts (and tests) can wait for it.
            sys.stderr.write(dumps({"serving": str(self.path)}).decode() + "\n")
            sys.stderr.flush()
            while not self._stop:
                if self.idle_timeout and time.monotonic() - last > self.idle_timeout:
                    reason = "idle"
                    break
                try:
                    conn, _ = sock.accept()
                except socket.timeout:
                    continue
                except InterruptedError:
                    continue
                self.handle(conn)
                last = time.monotonic()
        finally:
            cli.MEMORY_FACTORY = factory
            for s, handler in previous.items():
                signal.signal(s, handler)
            sock.close()
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
        return {"stopped": True, "reason": reason, "served": self.served,
                "uptime_s": round(time.monotonic() - started, 3), "socket": str(self.path)}

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stop = True


def run(root: str | None, idle_timeout: float) -> dict[str, Any]:
    """Serve in the foreground until SIGTERM/SIGINT or idle; return a summary."""
    if idle_timeout < 0:
        raise InputError("--idle-timeout must be >= 0", code="usage")
    return Server(root, idle_timeout).serve()
