"""The CLI's side of warm mode: hand a verb to a running ``memory-serve``.

Two ways, both kept free of numpy, orjson and the library's heavy modules:

* :func:`quick`, before anything else is imported (``entry.py``): the command line as it was typed,
  with the working directory, goes to the server, which parses it with the CLI's own parser and
  answers with the text the CLI would print (``server.py``).  A call costs little more than starting
  Python (issue 27: within 3× of ``python -c pass``).  The server answers ``fallback`` for what it must
  not run for a client — a verb it does not serve, one that reads this process's standard input, a
  long verb (its progress bar is this terminal's), a ``--root`` that is not its memory, ``--help`` —
  and the CLI then runs as below.
* :func:`forward`, from ``cli.py`` once the request is parsed and prepared here (standard input read).

Messages are framed JSON (an 8-byte big-endian length, then the document); this side encodes them
with the standard library's ``json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import codes
from ..roots import MEMORY_DIR, STATE_DIR, find_root

SOCKET_NAME = "serve.sock"
MAX_MESSAGE = 512 << 20
ACCEPT_TIMEOUT_S = 10.0  # a server says it took a call (or will not) before it runs anything: one that does
# not within this is stopped (Ctrl-Z) or wedged, and the CLI runs the call itself


def environment() -> dict[str, str]:
    """Every environment variable's value as a digest, by name: a server answers only where the variables
    its answers depend on are the caller's too (``server.same_environment``); no value crosses the socket."""
    return {name: hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]
            for name, value in os.environ.items()}


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


def send_frame(sock: socket.socket, data: bytes) -> None:
    sock.sendall(len(data).to_bytes(8, "big") + data)


def recv_frame(sock: socket.socket) -> bytes:
    header = _recv_exact(sock, 8)
    size = int.from_bytes(header, "big")
    if size > MAX_MESSAGE:
        raise ValueError("message too large")
    return _recv_exact(sock, size)


def send_message(sock: socket.socket, doc: Any) -> None:
    send_frame(sock, json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def recv_message(sock: socket.socket) -> Any:
    return json.loads(recv_frame(sock))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(1 << 20, n - got))
        if not chunk:
            raise ConnectionError("connection closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def untrusted(path: Path) -> str | None:
    """Why the socket at ``path`` may not be ours (None when it may be used).

    Only a socket that this user owns, in a memory folder this user owns, neither of them
    writable by group or others, is used: in a folder others can write to, another user could
    have put a server there that reads what we send and answers with memories of its own.
    """
    uid = os.getuid()
    for target, what in ((path.parent, "memory folder"), (path, "socket")):
        try:
            st = os.lstat(target)
        except OSError:
            return f"cannot inspect the {what}"
        if what == "socket" and not stat.S_ISSOCK(st.st_mode):
            return f"{path.name} is not a socket"
        if st.st_uid != uid:
            return f"the {what} belongs to uid {st.st_uid}, not to this user (uid {uid})"
        if st.st_mode & 0o022:
            return f"the {what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (None where it cannot be told)."""
    if hasattr(socket, "SO_PEERCRED"):  # Linux
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", creds)[1])
    if sys.platform == "darwin":  # getpeereid: LOCAL_PEERCRED gives a struct xucred
        local_peercred = 0x001
        creds = sock.getsockopt(0, local_peercred, struct.calcsize("IIh16I") + 8)
        return int(struct.unpack_from("II", creds)[1])
    return None


def _connect_ours(path: Path) -> tuple[socket.socket | None, str | None]:
    """``(a connection, None)`` to the server at ``path``; ``(None, why)`` when it may not be ours;
    ``(None, None)`` for a stale socket nobody serves."""
    why = untrusted(path)
    if why is not None:
        return None, why
    try:
        sock = connect(path)
    except OSError:
        return None, None
    try:
        uid = peer_uid(sock)
    except OSError:
        uid = None
    if uid != os.getuid():
        sock.close()
        return None, ("the process serving the socket cannot be identified" if uid is None
                      else f"the process serving the socket runs as uid {uid}, not as this user")
    return sock, None


def _lost(path: Path) -> tuple[int, str, Any]:
    """The answer when the server went away after it took a write: it may or may not be written."""
    return (7, "stderr", {"error": {
        "code": codes.SERVER_LOST,
        "message": "memory-serve stopped while handling this write; it may or may not have been written. "
                   "Check with memory-stats, then re-run (records with ids are skipped).",
        "details": {"socket": str(path)}}})


def _root_argument(argv: list[str]) -> tuple[bool, str | None]:
    """``(readable, the --root given)`` as argparse reads it (the last one wins); a ``--root`` without
    a value is not readable here (the CLI says what is wrong)."""
    root = None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        flag = arg.split("=", 1)[0]
        if flag != "--root" and len(flag) > 2 and "--root".startswith(flag):
            return False, None  # an abbreviation argparse may take for --root
        if arg == "--root":
            if i + 1 >= len(argv):
                return False, None
            root = argv[i + 1]
        elif arg.startswith("--root="):
            root = arg[len("--root="):]
    return True, root


def _untrusted_warning(why: str, path: Path) -> dict[str, str]:
    return {"code": codes.SERVER_UNTRUSTED, "message": f"memory-serve was not used: {why}; answered in-process instead",
            "socket": str(path)}


def _not_taken(reply: Any, path: Path) -> dict[str, str] | None:
    """The warning when a server would not take a call because it runs in another environment."""
    if isinstance(reply, dict) and reply.get("environment"):
        return {"code": codes.SERVER_OTHER_ENVIRONMENT, "message": "memory-serve was not used: it runs in another "
                "environment (the user memory's folder, keys or the team DSN differ); answered in-process",
                "socket": str(path)}
    return None


def quick(argv: list[str]) -> tuple[int, str, str | None] | dict[str, str] | None:
    """``(exit code, "stdout" or "stderr", the text to print)`` of a command line a running server of
    ours answered; None when the CLI must run it (no server, or the server's ``fallback``: module
    docstring); the warning the CLI adds to its answer when the server may not be ours (not a byte
    was sent to it, and the CLI does not try it again)."""
    if os.environ.get("NUBOS_MEMORY_NO_SERVER") or not argv or "-h" in argv or "--help" in argv:
        return None
    readable, explicit = _root_argument(argv)
    if not readable:
        return None
    try:
        path = socket_path(find_root(explicit))
    except Exception:  # noqa: BLE001 - no usable root: the CLI reports it
        return None
    if not os.path.lexists(path):
        return None
    sock, why = _connect_ours(path)
    if why is not None:
        return _untrusted_warning(why, path)
    if sock is None:
        return None
    accepted: dict[str, Any] | None = None
    try:
        with sock:
            sock.settimeout(ACCEPT_TIMEOUT_S)
            send_message(sock, {"argv": argv, "cwd": os.getcwd(), "env": environment()})
            reply = recv_message(sock)
            if not isinstance(reply, dict) or not reply.get("accepted"):
                return _not_taken(reply, path)  # "fallback", or an answer this version does not know
            accepted = reply
            sock.settimeout(None)  # a write may embed for a while
            reply = recv_message(sock)
            return int(reply["code"]), str(reply["stream"]), reply["out"]
    except (OSError, ValueError, ConnectionError, KeyError, TypeError):
        # (before the server took the call nothing ran: the CLI runs it; after, only a read is redone)
        if accepted is not None and accepted.get("writes"):
            code, stream, doc = _lost(path)
            return code, stream, json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"
        return None


def forward(name: str, request: dict[str, Any], progress: Callable[[str, int, int], None] | None = None
            ) -> tuple[tuple[int, str, Any] | None, dict[str, str] | None]:
    """``(the server's answer, None)``, or ``(None, why not)`` when the verb must run in-process:
    no server, a stale socket (no warning), or a server that may not be ours (a warning).  A long
    verb's progress reports, which the server sends ahead of its answer, go to ``progress``."""
    from ..errors import NubosMemoryError

    try:
        root = find_root(request.get("root"))
    except NubosMemoryError:
        return None, None
    path = socket_path(root)
    if not os.path.lexists(path):
        return None, None
    sock, why = _connect_ours(path)
    if why is not None:
        return None, _untrusted_warning(why, path)
    if sock is None:
        return None, None  # a stale socket from a killed server: work in-process
    args = {k: v for k, v in request.items() if k != "root"}
    sent = False
    try:
        with sock:
            sock.settimeout(ACCEPT_TIMEOUT_S)
            send_message(sock, {"verb": name, "args": args, "env": environment(), "ack": True})
            # {"accepted": true} before the server runs anything, or "fallback"; a server older than "ack"
            # answers at once (its progress, or its answer: taken as such, never run here again)
            reply = recv_message(sock)
            if not isinstance(reply, dict) or reply.get("fallback") or not (
                    reply.get("accepted") or "progress" in reply or "code" in reply):
                return None, _not_taken(reply, path)
            sent = True
            sock.settimeout(None)  # a forwarded write may embed for a while
            if reply.get("accepted"):
                reply = recv_message(sock)
            while isinstance(reply, dict) and "progress" in reply and "code" not in reply:
                if progress is not None:
                    progress(*reply["progress"])
                reply = recv_message(sock)
    except (OSError, ValueError, ConnectionError):
        if sent and name == "memory-index":
            # Records without an id got fresh ones inside the server; redoing the batch here
            # could store them twice, so say what happened instead of guessing.
            return _lost(path), None
        return None, None  # reads, rebuild and memory-add (its id is fixed before sending) are safe to redo
    if not isinstance(reply, dict) or "code" not in reply:
        return None, None
    return (int(reply["code"]), str(reply["stream"]), reply["doc"]), None
