"""A warm process's search queries embedded by a helper process, beside the query's other stages (issue 27).

A query's text embedded on the model's int8 copy (adr/0022) is about half of a warm query at 100k records,
and the query's filters, scope and lexical side do not need its vector.  A warm process (``memory-serve``,
``memory-mcp``, ``memory-http``: ``interfaces/warm.py``) may start a :class:`QueryHelper`: a child process
holding the same int8 copy, one thread, the same session options, so the same bits (checked on a probe
text before it is used).  The query hands the text over the moment it knows it (``submit``), runs its other
stages on this process's core meanwhile, and takes the vector when the vector side needs it
(``Pending.result``).  adr/0023 has the measurements and what it costs (a second copy of the int8 model in
memory).

Never a reason for a query to fail or wait: until the helper is ready, while another thread's query holds it,
or once it failed (its process gone, an answer late, short or of the wrong size: it is stopped for this
process, ``why`` says why), the query embeds in process as without it.  A one-shot call never starts one.
The child ends when its input closes: when this process ends, however it ends.

Protocol (pipes, native byte order): a request is the text's UTF-8 length (uint32) and bytes; an answer is
the vector's length in floats (uint32; 0: the child could not embed it) and that many float32.
"""

from __future__ import annotations

import os
import select
import site
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

READY_S = 120.0  # the child's start (python, onnxruntime, the model) before it is given up
ANSWER_S = 5.0  # one answer, before the helper is given up (an int8 encode of a query takes milliseconds)
MAX_TEXT_BYTES = 16 * 1024  # longer texts are embedded in process (a pipe takes one whole; a few pieces at most)
PROBE = "a probe text to check that the helper embeds queries bit for bit as this process does (v1.2, 42%)"
_LENGTH = struct.Struct("=I")


class QueryHelper:
    """A child process embedding search queries on an int8 copy (``folder``: the model's files,
    ``onnx_path``: the copy); started in the background, used once it gave ``expected(PROBE)``'s bits."""

    def __init__(self, folder: Path, onnx_path: Path, batch_size: int, expected: "np.ndarray"):
        self.why: str | None = None  # why it is not used (None: starting or ready)
        self.ready = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # one query at a time holds the child (the others embed in process)
        # (-P and cwd /: never a module from the folder the warm process runs in, a repository)
        self._args = [sys.executable, "-P", "-m", "nubos_memory.embed.helper", str(folder), str(onnx_path),
                      str(batch_size)]
        self._expected = np.asarray(expected, dtype=np.float32)
        self._owed = 0  # answers to texts whose query ended without its vector, read before the next one
        threading.Thread(target=self._start, name="nubos-query-helper", daemon=True).start()

    def _start(self) -> None:
        with self._lock:
            try:
                self._proc = subprocess.Popen(self._args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=subprocess.DEVNULL, env=_child_env(), cwd="/",
                                              close_fds=True)
                os.set_blocking(self._pipes()[0], False)  # (a write never blocks: ``_send`` waits with a deadline)
                if self._read(1, READY_S) != b"R":
                    raise OSError("it did not start")
                self._send(PROBE.encode("utf-8"))
                got = self._answer(READY_S)
                if got is None or got.shape != self._expected.shape or not np.array_equal(got, self._expected):
                    raise OSError("its vector of the probe text differs from this process's")
                if self.why is not None:  # (closed while it started)
                    raise OSError(self.why)
            except (OSError, ValueError) as exc:
                self._stop(f"the query helper could not start: {exc}")
                return
            self.ready = True

    def submit(self, text: str) -> "Pending | None":
        """Hand ``text`` to the child; None when the query embeds in process instead (not ready, failed,
        another thread's query holds it, a text longer than ``MAX_TEXT_BYTES``, or an answer an earlier
        query left is not there yet: at most one is ever owed, so the pipes never fill)."""
        encoded = text.encode("utf-8", "surrogatepass")
        if len(encoded) > MAX_TEXT_BYTES or not self.ready or not self._lock.acquire(blocking=False):
            return None
        try:
            self._drop_owed(ready_only=True)
        except (OSError, ValueError) as exc:
            self._stop(f"the query helper failed: {exc}")
        if not self.ready or self._owed:
            self._lock.release()
            return None
        try:
            self._send(encoded)
        except (OSError, ValueError) as exc:
            self._stop(f"the query helper failed: {exc}")
            self._lock.release()
            return None
        return Pending(self, text)

    def take(self) -> "np.ndarray | None":
        """(A submitted query's) its answer, read after those left by earlier queries; the helper freed."""
        try:
            self._drop_owed(ready_only=False)
            return self._answer(ANSWER_S)
        except (OSError, ValueError) as exc:
            self._stop(f"the query helper failed: {exc}")
            return None
        finally:
            self._lock.release()

    def leave(self) -> None:
        """(A submitted query's) its answer left to the next query that takes one; the helper freed."""
        self._owed += 1
        self._lock.release()

    def close(self) -> None:
        """Stop the child now (a process that ends stops it anyway: its input closes); a query holding it
        meets its end and embeds in process (it closes the pipes: never closed under another thread's read)."""
        self.ready, self.why = False, self.why or "closed"
        proc = self._proc
        if proc is not None:
            proc.kill()
        if self._lock.acquire(blocking=False):
            try:
                self._stop("closed")
            finally:
                self._lock.release()

    # -- the pipes (under ``_lock``) -------------------------------------------------------------
    def _pipes(self) -> tuple[int, int]:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise OSError("it was stopped")
        return proc.stdin.fileno(), proc.stdout.fileno()

    def _send(self, encoded: bytes) -> None:
        fd = self._pipes()[0]
        data = memoryview(_LENGTH.pack(len(encoded)) + encoded)
        deadline = time.monotonic() + ANSWER_S
        while len(data):
            if not _wait(fd, select.POLLOUT, deadline - time.monotonic()):
                raise OSError(f"it took no text in {ANSWER_S:g} s")
            try:
                data = data[os.write(fd, data):]
            except BlockingIOError:
                continue

    def _drop_owed(self, *, ready_only: bool) -> None:
        """Read and drop the answers earlier queries left (the child answers in order); ``ready_only``: only
        those already there (an answer is written whole: once readable, it is all there)."""
        while self._owed and (not ready_only or _wait(self._pipes()[1], select.POLLIN, 0)):
            self._answer(ANSWER_S)
            self._owed -= 1

    def _answer(self, timeout: float) -> "np.ndarray | None":
        """The child's next answer: a vector of the probe's size, or None where it could not embed the text."""
        (count,) = _LENGTH.unpack(self._read(_LENGTH.size, timeout))
        if count == 0:
            return None
        if count != len(self._expected):
            raise OSError(f"an answer of {count} floats, not {len(self._expected)}")
        return np.frombuffer(self._read(4 * count, timeout), dtype=np.float32).copy()

    def _read(self, size: int, timeout: float) -> bytes:
        fd, out = self._pipes()[1], b""
        deadline = time.monotonic() + timeout
        while len(out) < size:
            if not _wait(fd, select.POLLIN, deadline - time.monotonic()):
                raise OSError(f"no answer in {timeout:g} s")
            chunk = os.read(fd, size - len(out))
            if not chunk:
                raise OSError("its process ended")
            out += chunk
        return out

    def _stop(self, why: str) -> None:
        """(Under ``_lock``.)"""
        self.ready = False
        self.why = self.why or why
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


def _wait(fd: int, event: int, timeout: float) -> bool:
    """Whether ``fd`` is ready for ``event`` within ``timeout`` seconds (poll: any descriptor number)."""
    poller = select.poll()
    poller.register(fd, event)
    return bool(poller.poll(max(0, int(timeout * 1000))))


def _child_env() -> dict[str, str]:
    """The child's environment: this one, with this package importable where it is not installed (a
    checkout run by path); an installed one comes from site-packages, never ahead of the standard library."""
    package = str(Path(__file__).resolve().parents[2])
    if package in {str(Path(p).resolve()) for p in [*site.getsitepackages(), site.getusersitepackages()]}:
        return dict(os.environ)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)}


class Pending:
    """A query's text handed to the helper: its vector (``result``), or None (embed it in process)."""

    def __init__(self, helper: QueryHelper, text: str):
        self._helper: QueryHelper | None = helper
        self.text = text  # (what was handed over: the vector is of this text only)

    def result(self) -> "np.ndarray | None":
        """The vector, once; None where the child could not give it (the helper is then stopped if it failed)."""
        helper, self._helper = self._helper, None
        return helper.take() if helper is not None else None

    def close(self) -> None:
        """Free the helper if the vector was not taken (the query ended without it): its answer is read, and
        dropped, by the next query that takes one, so that this one never waits for it."""
        helper, self._helper = self._helper, None
        if helper is not None:
            helper.leave()


def main(argv: list[str]) -> int:
    """The child: embed each text read from stdin on the int8 copy, answer on stdout, until stdin closes."""
    from .onnx_runtime import OnnxRuntime
    from .pooling import embed_with

    folder, onnx_path, batch_size = Path(argv[0]), Path(argv[1]), int(argv[2])
    runtime = OnnxRuntime(folder, onnx_path, batch_size=batch_size, threads=1)
    runtime.load()
    inp, out = sys.stdin.buffer.fileno(), sys.stdout.buffer.fileno()

    def read(size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            chunk = os.read(inp, size - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def write(data: bytes) -> None:
        view = memoryview(data)
        while len(view):
            view = view[os.write(out, view):]

    write(b"R")
    while (head := read(_LENGTH.size)) is not None:
        body = read(_LENGTH.unpack(head)[0])
        if body is None:
            break
        try:
            vector = np.ascontiguousarray(embed_with(runtime, [body.decode("utf-8", "surrogatepass")])[0],
                                          dtype=np.float32)
            answer = _LENGTH.pack(len(vector)) + vector.tobytes()
        except Exception:  # noqa: BLE001 - this text could not be embedded here: the query embeds it in process
            answer = _LENGTH.pack(0)
        write(answer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
