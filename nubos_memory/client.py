"""The CLI's side of warm mode: hand a verb to a running ``memory-serve``.

Kept free of numpy and of the library's heavy modules, so a forwarded verb
costs little more than starting Python.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path
from typing import Any

from .config import MEMORY_DIR, STATE_DIR, find_root
from .errors import NubosMemoryError
from .fsio import JSONDecodeError, dumps, loads

SOCKET_NAME = "serve.sock"
MAX_MESSAGE = 512 << 20


def socket_path(root: Path) -> Path:
    return root / STATE_DIR / MEMORY_DIR / SOCKET_NAME


def connect(path: Path, timeout: float | None = 1.0) -> socket.socket:
    """Connect to a Unix socket, even when its path is longer than sun_path allows."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    target = str(path)
    if len(target.encode()) >= 100:  # bind/connect relative to the folder instead
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            target = f"/proc/self/fd/{fd}/{path.name}"
            sock.connect(target)
        finally:
            os.close(fd)
    else:
        sock.connect(target)
    return sock


def send_message(sock: socket.socket, doc: Any) -> None:
    data = dumps(doc)
    sock.sendall(len(data).to_bytes(8, "big") + data)


def recv_message(sock: socket.socket) -> Any:
    header = _recv_exact(sock, 8)
    size = int.from_bytes(header, "big")
    if size > MAX_MESSAGE:
        raise ValueError("message too large")
    return loads(_recv_exact(sock, size))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(1 << 20, n - got))
        if not chunk:
            raise ConnectionError("connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def forward(args: argparse.Namespace) -> tuple[int, str, Any] | None:
    """The server's answer to this verb, or None when no server answers (run in-process)."""
    try:
        root = find_root(args.root)
    except NubosMemoryError:
        return None
    path = socket_path(root)
    if not path.exists():
        return None
    try:
        sock = connect(path)
    except OSError:
        return None  # a stale socket from a killed server: work in-process
    request = {k: v for k, v in vars(args).items() if k != "root"}
    sent = False
    try:
        with sock:
            sock.settimeout(None)  # a forwarded write may embed for a while
            send_message(sock, {"args": request})
            sent = True
            reply = recv_message(sock)
    except (OSError, ValueError, ConnectionError, JSONDecodeError):
        if sent and args.verb == "memory-index":
            # Records without an id got fresh ones inside the server; redoing the batch here
            # could store them twice, so say what happened instead of guessing.
            return 7, "stderr", {"error": {
                "code": "server-lost",
                "message": "memory-serve stopped while handling this batch; it may or may not have been "
                           "written. Check with memory-stats, then re-run (records with ids are skipped).",
                "details": {"socket": str(path)}}}
        return None  # reads, rebuild and memory-add (its id is fixed before sending) are safe to redo
    if not isinstance(reply, dict) or "code" not in reply:
        return None
    return int(reply["code"]), str(reply["stream"]), reply["doc"]
