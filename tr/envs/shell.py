"""The persistent shell protocol shared by both backends.

One ``bash --norc`` per episode reads commands from a pipe.  For each command the driver writes
``__tr_do; __tr_end NONCE`` then the command text and a NUL; ``__tr_do`` reads the text and
evaluates it inside a function (stdin ``/dev/null``, so interactive programs see end-of-file),
``__tr_end`` prints ``__TR_DONE_<NONCE>_<exit code>`` on a saved copy of stdout.  The command runs in
the shell itself, so cwd, variables, functions and jobs persist.  The helpers are read-only
functions that call ``builtin`` ``read``/``eval``/``printf``/``local``, so a command cannot redefine
them, and a function it names ``printf`` or ``read`` does not break the protocol.  (A command that
redefines ``builtin`` itself only breaks its own shell: its next command runs to its timeout and
the shell is replaced, ``shell_restarted``.)  A timeout is handled by the
backend's tracker (:mod:`tr.envs.cgroups`): the command's process tree is killed and the shell gets
SIGINT, whose trap ``return``s out of the evaluating function -- even out of a builtin loop like
``while :; do :; done`` -- and the shell survives.  ``declare``/``typeset`` are aliased to their
``-g`` forms so that variables declared by a command stay global, as at a prompt.
"""

from __future__ import annotations

import os
import secrets
import select
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from tr.envs.sandbox import CappedOutput, CommandResult

SHELL_INIT = r"""
exec 3>&1
trap 'return 130 2>/dev/null' INT
shopt -s expand_aliases
alias declare='declare -g' typeset='typeset -g'
__tr_eval() { builtin eval "$__TR_CMD"; }
__tr_do() { IFS= builtin read -r -d '' __TR_CMD || exit 0; __tr_eval </dev/null 3>&-; }
__tr_end() { builtin local __tr_rc=$?; builtin printf '__TR_DONE_%s_%d\n' "$1" "$__tr_rc" >&3; }
readonly -f __tr_eval __tr_do __tr_end
"""

SENTINEL_PREFIX = b"__TR_DONE_"
GRACE_S = 3.0


class ShellIO(Protocol):
    """A byte pipe to and from the shell: non-blocking reads, blocking writes."""

    def fileno(self) -> int: ...

    def read_available(self) -> bytes | None: ...  # None: end of stream; b"": nothing yet

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class PipeIO:
    """Two OS pipes (local backend)."""

    def __init__(self, write_fd: int, read_fd: int):
        self.write_fd, self.read_fd = write_fd, read_fd
        os.set_blocking(read_fd, False)
        try:   # a 1 MiB pipe: a gigabyte of output takes ~16x fewer wake-ups
            import fcntl
            fcntl.fcntl(read_fd, 1031, 1 << 20)   # F_SETPIPE_SZ
        except OSError:
            pass

    def fileno(self) -> int:
        return self.read_fd

    def read_available(self) -> bytes | None:
        try:
            data = os.read(self.read_fd, 1 << 20)
        except BlockingIOError:
            return b""
        return data if data else None

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.write_fd, view)
            view = view[n:]

    def close(self) -> None:
        for fd in (self.write_fd, self.read_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class Tracker(Protocol):
    def begin(self, shell_pid: int) -> None: ...

    def end(self, shell_pid: int) -> None: ...

    def kill_command(self, shell_pid: int) -> None: ...

    def sweep(self, shell_pid: int) -> None: ...

    def kill_session(self, shell_pid: int | None) -> None: ...


@dataclass
class ShellProcess:
    """A started shell: its pipe, its host pid, how to learn its exit code and to kill it."""

    io: ShellIO
    pid: int
    exit_code: Callable[[], int | None]
    kill: Callable[[], None]


class _Scanner:
    """Feeds stream bytes into a CappedOutput until ``marker`` + exit code + newline appears."""

    def __init__(self, out: CappedOutput, marker: bytes):
        self.out, self.marker = out, marker
        self.pending = bytearray()
        self.exit_code: int | None = None
        self.done = False
        self.leftover = b""

    def feed(self, data: bytes) -> None:
        if self.pending:
            data = bytes(self.pending) + data
            self.pending.clear()
        i = data.find(self.marker)
        if i >= 0:
            nl = data.find(b"\n", i)
            self.out.add(data[:i])
            if nl < 0:                      # the exit code is still on its way
                self.pending += data[i:]
                return
            code = data[i + len(self.marker):nl]
            self.exit_code = int(code) if code.lstrip(b"-").isdigit() else None
            self.leftover = data[nl + 1:]
            self.done = True
            return
        keep = len(self.marker) - 1      # a marker may straddle two reads
        if len(data) > keep:
            self.out.add(memoryview(data)[:len(data) - keep])
            self.pending += data[len(data) - keep:]
        else:
            self.pending += data

    def flush(self) -> None:
        self.out.add(bytes(self.pending))
        self.pending.clear()


def _wait_readable(fd: int, timeout: float) -> bool:
    r, _, _ = select.select([fd], [], [], max(0.0, timeout))
    return bool(r)


class ShellSession:
    """Drives one persistent shell; restarts it (state lost, flagged) if it died."""

    def __init__(self, spawn: Callable[[], ShellProcess], tracker: Tracker, cap: int,
                 init: str = "", prelude: str = ""):
        """``prelude``: shell text run before the protocol is set up (e.g. closing a descriptor
        the launcher inherited); ``init``: run after it, before the first command."""
        self.spawn, self.tracker, self.cap, self.init = spawn, tracker, cap, init
        self.prelude = prelude
        self.proc: ShellProcess | None = None
        self.pending_output = b""
        self.lost_state = False

    def ensure_started(self) -> bool:
        """Start the shell if needed; True when a new one was started."""
        if self.proc is not None:
            return False
        self.proc = self.spawn()
        self.proc.io.write((self.prelude + "\n" + SHELL_INIT + self.init + "\n").encode())
        return True

    def run(self, command: str, timeout_s: float) -> CommandResult:
        if not isinstance(command, str):
            raise TypeError(f"command must be a str, got {type(command).__name__}")
        if "\0" in command:
            raise ValueError("command contains a NUL byte, which no shell can run")
        if not (timeout_s > 0):
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        t0 = time.monotonic()
        restarted = self.ensure_started() and self.lost_state
        self.lost_state = False
        proc = self.proc
        out = CappedOutput(self.cap)
        if self.pending_output:
            out.add(self.pending_output)
            self.pending_output = b""
        nonce = secrets.token_hex(12)
        scanner = _Scanner(out, SENTINEL_PREFIX + nonce.encode() + b"_")
        early = proc.io.read_available()   # output background jobs wrote between commands
        if early:
            out.add(early)
        self.tracker.begin(proc.pid)
        timed_out = dead = False
        try:
            proc.io.write(f"__tr_do; __tr_end {nonce}\n".encode() + command.encode() + b"\0")
        except (BrokenPipeError, OSError):
            dead = True
        deadline = t0 + timeout_s
        grace_end = next_int = None
        fd = proc.io.fileno()
        while not dead and not scanner.done:
            now = time.monotonic()
            if not timed_out and now >= deadline:
                timed_out = True
                self.tracker.kill_command(proc.pid)
                grace_end, next_int = now + GRACE_S, now + 0.25
            if timed_out:
                if now >= grace_end:
                    break
                if now >= next_int:   # nested loops / user functions: interrupt again
                    self.tracker.sweep(proc.pid)
                    os_kill(proc.pid)
                    next_int = now + 0.25
                wait = min(0.05, grace_end - now)
            else:
                wait = deadline - now
            if _wait_readable(fd, wait):
                while True:
                    data = proc.io.read_available()
                    if data is None:
                        dead = True
                        break
                    if not data:
                        break
                    scanner.feed(data)
                    if scanner.done:
                        break
            elif timed_out:
                self.tracker.sweep(proc.pid)
        scanner.flush()
        exit_code = None if timed_out else scanner.exit_code
        if scanner.done:
            self.tracker.end(proc.pid)
            if scanner.leftover:
                self.pending_output = scanner.leftover
            if timed_out:
                self._swallow_job_notices(proc)
        else:
            # The shell exited (``exit``) or ignored interrupts: it is replaced on the next run.
            if dead and not timed_out:
                exit_code = proc.exit_code()
            self.kill_shell()
            self.lost_state = True
        if timed_out:
            out.add(f"\n[command timed out after {timeout_s:g}s; its processes were killed]\n"
                    .encode())
        return CommandResult(output=out.text(), exit_code=exit_code, timed_out=timed_out,
                             truncated=out.truncated, duration_s=time.monotonic() - t0,
                             output_bytes=out.total, shell_restarted=restarted)

    def _swallow_job_notices(self, proc: ShellProcess) -> None:
        """bash reports the jobs killed by a timeout ("line 6: 42 Killed ...") before it runs
        the next line; run an empty line now so the notice does not open the next output."""
        nonce = secrets.token_hex(12)
        sink = _Scanner(CappedOutput(1), SENTINEL_PREFIX + nonce.encode() + b"_")
        try:
            proc.io.write(f"__tr_end {nonce}\n".encode())
        except OSError:
            return
        deadline = time.monotonic() + 1.0
        while not sink.done and time.monotonic() < deadline:
            if _wait_readable(proc.io.fileno(), deadline - time.monotonic()):
                data = proc.io.read_available()
                if data is None:
                    return
                sink.feed(data)
        self.pending_output = sink.leftover

    def kill_shell(self) -> None:
        """End the shell and every process it started."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        try:
            self.tracker.kill_session(proc.pid)
        finally:
            proc.kill()
            proc.io.close()


def os_kill(pid: int) -> None:
    import signal
    try:
        os.kill(pid, signal.SIGINT)
    except (ProcessLookupError, PermissionError):
        pass


def run_to_eof(io: ShellIO, cap: int, timeout_s: float, on_timeout: Callable[[], None],
               is_done: Callable[[], bool] = lambda: False) -> tuple[CappedOutput, bool, float]:
    """Read a one-shot process's output until end of stream (or timeout -> ``on_timeout``)."""
    t0 = time.monotonic()
    out = CappedOutput(cap)
    deadline = t0 + timeout_s
    timed_out = False
    fd = io.fileno()
    while True:
        now = time.monotonic()
        if now >= deadline and not timed_out:
            timed_out = True
            on_timeout()
            deadline = now + GRACE_S
        elif now >= deadline:
            break
        if _wait_readable(fd, min(deadline - now, 0.2)):
            data = io.read_available()
            if data is None:
                break
            out.add(data)
        elif is_done():
            break
    return out, timed_out, time.monotonic() - t0
