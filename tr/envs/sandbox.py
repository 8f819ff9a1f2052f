"""The sandbox interface: one protocol, the results and configuration every backend shares.

A :class:`Sandbox` holds one persistent shell per episode (cwd, variables, functions and background
jobs persist), runs commands with timeouts that stop the whole process tree the command started,
caps the combined output (head and tail kept), copies files in and out without following links
planted inside, and snapshots / restores / forks its writable state.  This module imports no
backend: they are ``tr.envs.local`` (bubblewrap) and ``tr.envs.docker_sandbox``, found by name
through :mod:`tr.envs.backends` (``make_sandbox``, ``get_backend``, ``discard_snapshot``).
``tests/test_sandbox_conformance.py`` checks every backend against :class:`Sandbox`.
"""

from __future__ import annotations

import atexit
import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

class SandboxError(RuntimeError):
    """A sandbox could not do what was asked (bad path, backend missing, engine failure)."""


class SnapshotRefused(SandboxError):
    """The agent's state is beyond what a snapshot may keep (apparent size over the disk budget,
    too many entries): the agent's doing, so the harness counts the episode as its failure rather
    than as an infrastructure fault that would drop it from the batch."""


@dataclass(frozen=True)
class CommandResult:
    """What one command did.

    ``output`` is stdout+stderr combined, capped: when longer than the cap, the first and last
    ``cap/2`` bytes are kept with a ``[... N bytes cut ...]`` marker between them.
    ``exit_code`` is ``None`` when the command was stopped (timeout) or its shell died.
    """

    output: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_s: float
    output_bytes: int = 0          # total bytes the command wrote (before the cap)
    shell_restarted: bool = False  # the persistent shell had to be replaced (state lost)
    # every line of the whole output that starts with MARK_PREFIX (the protected verifier's
    # records, kept even where the output was cut; "[tr-marks-overflow]" last if there were
    # more than MAX_MARKS)
    marks: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and layout of one sandbox (both backends unless noted).

    ``disk_mb`` bounds the writable task areas (/app, home, /tmp; local: also /etc) together: a
    size-limited tmpfs, so filling it fails with ENOSPC.  ``persist_snapshots``: snapshots outlive
    the sandbox that took them (e.g. to restore a recovery rollout later) until
    :func:`tr.envs.backends.discard_snapshot`.
    """

    workdir: str = "/app"
    env: dict = field(default_factory=dict)
    memory_mb: int = 2048
    pids: int = 256
    file_size_mb: int = 1024
    cpu_time_s: int = 600
    output_cap_bytes: int = 10_000
    network: bool = False
    image: str | None = None        # docker only: the task image (default: the built tr base image)
    disk_mb: int = 1024
    cpus: float = 1.0               # CPU quota in cores across all the sandbox's processes
    persist_snapshots: bool = False
    state_dir: str | None = None    # host folder for sandbox roots and snapshots (default: $TMPDIR)
    docker_endpoint: str | None = None  # docker only: the engine, a URL or docker context name
                                        # (tr.envs.endpoints; default: $DOCKER_HOST / the socket)

    def __post_init__(self):
        for name in ("memory_mb", "pids", "file_size_mb", "cpu_time_s", "output_cap_bytes",
                     "disk_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"SandboxConfig.{name} must be a positive int, got {value!r}")
        if not isinstance(self.workdir, str) or not self.workdir.startswith("/"):
            raise ValueError(f"SandboxConfig.workdir must be an absolute path, got {self.workdir!r}")
        if not isinstance(self.env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            raise ValueError(f"SandboxConfig.env must map str to str, got {self.env!r}")
        if not (isinstance(self.cpus, (int, float)) and self.cpus > 0):
            raise ValueError(f"SandboxConfig.cpus must be > 0, got {self.cpus!r}")
        if self.docker_endpoint is not None and not (
                isinstance(self.docker_endpoint, str) and self.docker_endpoint.strip()):
            raise ValueError("SandboxConfig.docker_endpoint must be a URL or docker context name, "
                             f"got {self.docker_endpoint!r}")


@dataclass(frozen=True)
class Snapshot:
    """A saved sandbox state.  ``location`` is the host folder holding the writable areas;
    ``image`` the committed Docker image (docker only).  JSON-able: all fields are plain."""

    id: str
    backend: str
    location: str
    image: str = ""
    persistent: bool = False
    endpoint: str = ""              # docker only: the engine holding ``image`` ("": the default)


@runtime_checkable
class Sandbox(Protocol):
    """One episode's isolated machine.  A context manager: ``close()`` runs on every exit path.

    The first block is what an agent's episode uses; the second, the hooks the protected verifier
    (:func:`tr.envs.protected.run_verifier`) calls.  Paths are the sandbox's own (absolute);
    nothing here follows a link the agent planted.
    """

    config: SandboxConfig
    backend: str                    # the name tr.envs.backends knows it by (Snapshot.backend)

    def start(self) -> "Sandbox": ...

    def run(self, command: str, timeout_s: float = 30.0) -> CommandResult: ...

    def run_fresh(self, command: str, timeout_s: float = 30.0, *, extra_ro_binds=(),
                  env: dict | None = None, clean_env: bool = False) -> CommandResult:
        """A new process tree over the same files, not the agent's shell; ``clean_env``: only a
        minimal environment + ``env``; ``extra_ro_binds`` [(host, sandbox)] read-only (a backend
        that cannot add them to a running sandbox raises SandboxError)."""

    def copy_in(self, host_path, sandbox_path) -> None: ...

    def copy_out(self, sandbox_path, host_path, *, keep_symlinks: bool = True) -> list[str]:
        """Copies without following links; returns the links skipped (``keep_symlinks=False``)."""

    def write_file(self, sandbox_path, data: bytes | str, mode: int = 0o644) -> None: ...

    def read_file(self, sandbox_path) -> bytes: ...

    def remove_path(self, sandbox_path) -> None:
        """Deletes a file, link or folder (links not followed); a missing path is fine."""

    def snapshot(self, *, persist: bool | None = None) -> Snapshot: ...

    def restore(self, snapshot: Snapshot) -> None: ...

    def fork(self, snapshot: Snapshot) -> "Sandbox": ...

    def end_session(self) -> None: ...

    def alive(self) -> bool: ...

    def close(self) -> None: ...

    def __enter__(self) -> "Sandbox": ...

    def __exit__(self, *exc) -> None: ...

    # --- the protected verifier's hooks -----------------------------------------------------
    def install_tests(self, tests_dir, mount: str) -> list:
        """Put the host folder ``tests_dir`` at ``mount`` for the verifier only; returns the
        read-only binds [(host, sandbox)] run_fresh needs for it (none when copied in)."""

    def reset_dir(self, sandbox_path) -> None:
        """Whatever is at ``sandbox_path`` (links not followed) replaced by an empty folder."""

    def verifier_python(self) -> tuple[str, list]:
        """(the project interpreter as the verifier's shell names it, read-only binds for it)."""

    def network_sibling(self) -> "Sandbox":
        """A started sandbox from a snapshot of this one's files (taken now) sharing only its
        network, this sandbox's processes left running: the verifier's sandbox for tests that
        talk to the agent's servers.  SandboxError where the backend cannot (its
        ``Backend.network_sibling`` is False); the caller closes it."""


PROTOCOL_METHODS = tuple(name for name in Sandbox.__dict__
                         if callable(getattr(Sandbox, name, None)) and not name.startswith("_")
                         ) + ("__enter__", "__exit__")


_OPEN_SANDBOXES: "weakref.WeakSet[ShellSandbox]" = weakref.WeakSet()


@atexit.register
def _close_open_sandboxes() -> None:
    """Closes every sandbox still open when the interpreter exits (nothing outlives its owner)."""
    for sandbox in list(_OPEN_SANDBOXES):
        try:
            sandbox.close()
        except Exception:  # pylint: disable=broad-except
            pass


class ShellSandbox:
    """What both backends share around their persistent shell: the open-sandbox registry closed at
    exit, the started/closed guard, commands in the shell, ending the session, and a close that
    stops the shell before the backend releases its resources (:meth:`_release`)."""

    backend = ""
    _started = False
    _closed = False
    session = None

    def start(self, _from_snapshot: Snapshot | None = None):
        """Once: registered for the exit-time close, then the backend's :meth:`_open`; whatever
        fails on the way closes the sandbox (nothing half-made is left) and is raised."""
        if self._started:
            return self
        self._started = True
        _OPEN_SANDBOXES.add(self)
        try:
            self._open(_from_snapshot)
        except BaseException:
            self.close()
            raise
        return self

    def _open(self, from_snapshot: Snapshot | None) -> None:
        """The backend's resources (workspace, container, shell), its areas a copy of
        ``from_snapshot`` when given."""
        raise NotImplementedError

    def _own_snapshot(self, snapshot, verb: str) -> Snapshot:
        """``snapshot`` as a Snapshot of this backend (restore/fork); SandboxError otherwise."""
        snapshot = snapshot_fields(snapshot)
        if snapshot.backend != self.backend:
            raise SandboxError(f"cannot {verb} a {snapshot.backend!r} snapshot in a "
                               f"{self.backend} sandbox")
        return snapshot

    def fork(self, snapshot) -> "ShellSandbox":
        """A new started sandbox of the same config whose areas are a copy of ``snapshot``."""
        self._require()
        snapshot = self._own_snapshot(snapshot, "fork")
        return type(self)(self.config).start(_from_snapshot=snapshot)

    def _require(self) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")
        if not self._started:
            raise SandboxError("sandbox not started: call start() or use it as a context manager")

    def run(self, command: str, timeout_s: float = 30.0) -> CommandResult:
        self._require()
        return self.session.run(command, timeout_s)

    def end_session(self) -> None:
        """Stop the agent's shell and every process it started -- whatever it did with traps,
        sessions or cgroups -- and check that none is left (SandboxError if one survives);
        files stay."""
        if self.session is not None:
            self.session.kill_shell()
        self._kill_stragglers()

    def _kill_stragglers(self) -> None:
        """Kill whatever process of the agent the shell's own clean-up missed."""
        raise NotImplementedError

    def alive(self) -> bool:
        """Whether the sandbox still stands: started, not closed, and its backend's resources
        (workspace, container) in place.  False after a failure that is the harness's, not the
        agent's (the container or its engine died)."""
        return self._started and not self._closed and self._alive()

    def _alive(self) -> bool:
        raise NotImplementedError

    def _release(self) -> None:
        """Frees the backend's resources (process tree, container, images, workspace)."""
        raise NotImplementedError

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.session is not None:    # the rest of the agent's processes: in _release
                self.session.kill_shell()
        finally:
            try:
                self._release()
            finally:
                _OPEN_SANDBOXES.discard(self)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


# ----------------------------------------------------------------------------------------------
# Output capping, shared by both backends.

MARK_PREFIX = b"[tr-"      # lines the protected verifier's runners print for the harness
MAX_MARKS = 1000
MAX_MARK_BYTES = 512
MARKS_OVERFLOW = "[tr-marks-overflow]"


class CappedOutput:
    """Keeps the first ``cap//2`` and last ``cap - cap//2`` bytes of a stream; memory <= cap.
    Lines starting with :data:`MARK_PREFIX` are kept besides, whole stream long (``marks``; at
    most :data:`MAX_MARKS` of at most :data:`MAX_MARK_BYTES`, then :data:`MARKS_OVERFLOW`)."""

    def __init__(self, cap: int):
        self.cap = cap
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.marks: list[str] = []
        self._line = bytearray()       # the start of the current line, if it may be a mark
        self._line_len = 0             # -1: inside a line that is no mark

    def _scan(self, data: bytes) -> None:
        """Collect mark lines; only candidate line starts are visited (``find``), so a long
        output of ordinary lines costs one C-level search per chunk."""
        buf = bytes(self._line) + data if self._line_len >= 0 else data
        pos = 0 if self._line_len >= 0 else buf.find(b"\n") + 1 if b"\n" in buf else len(buf) + 1
        if pos > len(buf):                     # still inside an ordinary line
            return
        while True:
            # ``pos`` is a line start: is the line a mark (or could it still become one)?
            end = buf.find(b"\n", pos)
            head = buf[pos:pos + len(MARK_PREFIX)]
            if end < 0:                        # the line goes on in the next chunk
                rest = buf[pos:pos + MAX_MARK_BYTES + 1]
                if MARK_PREFIX.startswith(head) or head == MARK_PREFIX:
                    self._line, self._line_len = bytearray(rest), len(rest)
                else:
                    self._line, self._line_len = bytearray(), -1
                return
            if head == MARK_PREFIX and end - pos <= MAX_MARK_BYTES:
                if len(self.marks) < MAX_MARKS:
                    self.marks.append(buf[pos:end].decode("utf-8", errors="replace").rstrip("\r"))
                elif self.marks[-1] != MARKS_OVERFLOW:
                    self.marks.append(MARKS_OVERFLOW)
            nxt = buf.find(b"\n" + MARK_PREFIX[:1], end)
            if nxt < 0:                        # no later line starts like a mark in this chunk
                last = buf.rfind(b"\n")
                pos = last + 1
                if pos >= len(buf):
                    self._line, self._line_len = bytearray(), 0
                    return
                head = buf[pos:pos + len(MARK_PREFIX)]
                if MARK_PREFIX.startswith(head):
                    self._line, self._line_len = bytearray(buf[pos:pos + MAX_MARK_BYTES + 1]), 1
                else:
                    self._line, self._line_len = bytearray(), -1
                return
            pos = nxt + 1

    def add(self, data: bytes) -> None:
        self._scan(bytes(data))
        self.total += len(data)
        view = memoryview(data)
        if len(self.head) < self.head_cap:
            take = self.head_cap - len(self.head)
            self.head += view[:take]
            view = view[take:]
        if len(view) >= self.tail_cap:
            self.tail = bytearray(view[len(view) - self.tail_cap:])
        elif view:
            self.tail += view
            if len(self.tail) > self.tail_cap:
                del self.tail[:len(self.tail) - self.tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        if not self.truncated:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", errors="replace")
        cut = self.total - len(self.head) - len(self.tail)
        return (self.head.decode("utf-8", errors="replace")
                + f"\n[... {cut} bytes of output cut ...]\n"
                + self.tail.decode("utf-8", errors="replace"))


def snapshot_fields(snapshot) -> Snapshot:
    """Accept a Snapshot or its ``dataclasses.asdict`` form; a clear error otherwise."""
    if isinstance(snapshot, Snapshot):
        return snapshot
    if isinstance(snapshot, dict):
        known = {f.name for f in dataclasses.fields(Snapshot)}
        return Snapshot(**{k: v for k, v in snapshot.items() if k in known})
    raise TypeError(f"expected a Snapshot, got {type(snapshot).__name__}: {snapshot!r}")
