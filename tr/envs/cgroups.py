"""Which processes a shell command started, and stopping all of them (cgroup v1, or /proc scan).

While command ``n`` runs, the sandbox's shell sits in its own child cgroup ``cmd-n`` (pids and
freezer controllers), so every process it forks -- pipelines, ``&`` jobs, daemons that double-fork
-- lands there.  Between commands the shell waits in ``base``.  A timeout freezes ``cmd-n``,
SIGKILLs everything in it but the shell, interrupts the shell (its INT trap returns from the
command) and thaws: the whole tree is gone, background jobs of earlier commands live on.  Without
writable cgroups, :class:`ScanTracker` does the same by diffing the /proc descendant set (a fork
bomb is then bounded only by rlimits).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

CGROUP_V1 = Path("/sys/fs/cgroup")
_TRACKED = ("pids", "freezer")


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_pids(path: Path) -> set[int]:
    try:
        return {int(x) for x in path.read_text().split()}
    except (FileNotFoundError, ProcessLookupError):
        return set()


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


_V1_OK: bool | None = None


def cgroup_v1_writable() -> bool:
    """True when this process may create pids+freezer(+memory) cgroups (v1 hierarchy)."""
    global _V1_OK
    if _V1_OK is None:
        ok = all((CGROUP_V1 / c / "cgroup.procs").exists() for c in (*_TRACKED, "memory"))
        if ok:
            probe = CGROUP_V1 / "pids" / f"tr-probe-{os.getpid()}"
            try:
                probe.mkdir(exist_ok=True)
                probe.rmdir()
            except OSError:
                ok = False
        _V1_OK = ok
    return _V1_OK


def own_cgroup(controller: str) -> str:
    """This process's cgroup path (relative) in a v1 ``controller`` hierarchy."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            return path.lstrip("/")
    return ""


class CgroupTree:
    """One sandbox's v1 cgroups: a parent per controller, children ``base`` and ``cmd-N``.

    ``parents`` maps controller -> parent folder.  With ``owned`` the parents are created here
    (limits written into them) and removed by :meth:`destroy`; otherwise (docker: the container's
    own cgroups) only the children are ours.
    """

    def __init__(self, parents: dict[str, Path], *, owned: bool, limits: dict[str, str] = ()):
        self.parents = {c: Path(p) for c, p in parents.items()}
        self.owned = owned
        self.children: list[str] = []
        if owned:
            for c, p in self.parents.items():
                p.mkdir(exist_ok=False)
            for rel, value in dict(limits).items():
                ctrl = rel.split(".", 1)[0]
                if ctrl not in self.parents:     # a controller this host does not have
                    continue
                path = self.parents[ctrl] / rel
                if path.exists():
                    _write(path, value)
        self.make_child("base")

    def child(self, controller: str, name: str | None) -> Path:
        return self.parents[controller] / name if name else self.parents[controller]

    def join_files(self, name: str) -> list[str]:
        """The cgroup.procs files a new process writes itself into to start in child ``name``
        (tracked controllers) and in the parent of the others (memory)."""
        files = [str(self.child(c, name) / "cgroup.procs") for c in _TRACKED if c in self.parents]
        files += [str(p / "cgroup.procs") for c, p in self.parents.items() if c not in _TRACKED]
        return files

    def make_child(self, name: str) -> None:
        for c in _TRACKED:
            if c in self.parents:
                self.child(c, name).mkdir(exist_ok=True)
        if name not in self.children:
            self.children.append(name)

    def move(self, pid: int, name: str) -> None:
        for c in _TRACKED:
            if c in self.parents:
                try:
                    _write(self.child(c, name) / "cgroup.procs", str(pid))
                except ProcessLookupError:
                    pass
                except OSError as e:
                    if e.errno != errno.ESRCH:
                        raise

    def procs(self, name: str | None) -> set[int]:
        return _read_pids(self.child("pids", name) / "cgroup.procs")

    def all_procs(self) -> set[int]:
        found = self.procs(None) if self.owned else set()
        for name in self.children:
            found |= self.procs(name)
        return found

    def set_frozen(self, name: str | None, frozen: bool) -> None:
        if "freezer" not in self.parents:
            return
        state = self.child("freezer", name) / "freezer.state"
        try:
            _write(state, "FROZEN" if frozen else "THAWED")
        except OSError:
            return
        if frozen:
            for _ in range(200):  # FREEZING -> FROZEN takes a few ms under load
                if state.read_text().strip() == "FROZEN":
                    return
                time.sleep(0.0005)

    def kill(self, name: str | None, keep: set[int] = frozenset()) -> set[int]:
        """Freeze child ``name`` (None: whole tree), SIGKILL all but ``keep``; returns who was
        there.  Frozen tasks cannot fork, so a fork bomb is stopped in one pass."""
        self.set_frozen(name, True)
        found = self.procs(name) if name else self.all_procs()
        for pid in found - set(keep):
            _kill(pid, signal.SIGKILL)
        return found

    def remove_child(self, name: str, wait_s: float = 2.0) -> bool:
        """rmdir a child once its processes are gone (thawing it first); False if still busy."""
        self.set_frozen(name, False)
        deadline = time.monotonic() + wait_s
        while self.procs(name):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        for c in _TRACKED:
            if c in self.parents:
                try:
                    self.child(c, name).rmdir()
                except FileNotFoundError:
                    pass
                except OSError as e:
                    if e.errno != errno.EBUSY:
                        raise
                    return False
        if name in self.children:
            self.children.remove(name)
        return True

    def reap_empty_children(self) -> None:
        for name in list(self.children):
            if name != "base" and not self.procs(name):
                self.remove_child(name, wait_s=0)

    def subtree_procs(self) -> set[int]:
        """Every process in the parent pids cgroup or any cgroup below it (whoever made it)."""
        found: set[int] = set()
        for directory, _, files in os.walk(self.parents["pids"]):
            if "cgroup.procs" in files:
                found |= _read_pids(Path(directory) / "cgroup.procs")
        return found

    def kill_all(self, timeout_s: float = 5.0, keep: set[int] = frozenset()) -> set[int]:
        """SIGKILL every process of the parent cgroup and everything below it (``keep`` aside)
        while the whole tree is frozen, so none can fork meanwhile; after that only ``keep`` can
        start processes.  Waits for the victims to be gone; returns those still there after
        ``timeout_s`` (none, normally)."""
        deadline = time.monotonic() + timeout_s
        state = self.child("freezer", None) / "freezer.state" if "freezer" in self.parents \
            else None
        self.set_frozen(None, True)
        try:
            while state is not None and time.monotonic() < deadline:
                try:
                    if state.read_text().strip() == "FROZEN":
                        break
                except OSError:
                    break
                time.sleep(0.001)
            victims = self.subtree_procs() - set(keep)
            for pid in victims:
                _kill(pid, signal.SIGKILL)
        finally:
            self.set_frozen(None, False)
        while True:
            left = victims & self.subtree_procs()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.002)

    def destroy(self) -> None:
        """Kill every process of the tree and remove every cgroup it made."""
        for _ in range(50):
            if self.owned:
                self.set_frozen(None, True)
            for name in self.children:
                self.kill(name)
            if self.owned:
                for pid in self.procs(None):
                    _kill(pid, signal.SIGKILL)
                self.set_frozen(None, False)
            for name in self.children:
                self.set_frozen(name, False)
            if not self.all_procs():
                break
            time.sleep(0.002)
        for name in list(self.children):
            self.remove_child(name, wait_s=2.0)
        if self.owned:
            for c, p in self.parents.items():
                for _ in range(100):
                    try:
                        p.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError as e:
                        if e.errno != errno.EBUSY:
                            raise
                        time.sleep(0.01)


class CgroupTracker:
    """Per-command process tracking for one shell over a :class:`CgroupTree`."""

    def __init__(self, tree: CgroupTree, keep: set[int] = frozenset()):
        self.tree = tree
        self.keep = set(keep)   # e.g. bwrap's own processes living in ``base``
        self.count = 0
        self.current: str | None = None

    def begin(self, shell_pid: int) -> None:
        self.count += 1
        self.current = f"cmd-{self.count}"
        self.tree.make_child(self.current)
        self.tree.move(shell_pid, self.current)

    def end(self, shell_pid: int) -> None:
        self.tree.move(shell_pid, "base")
        if self.current is not None:
            if not self.tree.procs(self.current):
                self.tree.remove_child(self.current, wait_s=0)
            self.current = None
        if self.count % 16 == 0:
            self.tree.reap_empty_children()

    def kill_command(self, shell_pid: int) -> None:
        """Stop the current command's whole tree; interrupt the shell so its trap returns."""
        if self.current is None:
            return
        self.tree.kill(self.current, keep={shell_pid})
        _kill(shell_pid, signal.SIGINT)
        self.tree.move(shell_pid, "base")
        self.tree.set_frozen(self.current, False)

    def sweep(self, shell_pid: int) -> None:
        """Kill whatever the interrupted shell forked after leaving the command's cgroup."""
        for pid in self.tree.procs("base") - {shell_pid} - self.keep:
            _kill(pid, signal.SIGKILL)
        if self.current is not None:
            for pid in self.tree.procs(self.current) - {shell_pid}:
                _kill(pid, signal.SIGKILL)

    def kill_session(self, shell_pid: int | None) -> None:
        """Kill every process the shell ever started (all ``cmd-*`` children) and the shell."""
        for name in list(self.tree.children):
            if name != "base":
                self.tree.kill(name)
        if shell_pid:
            _kill(shell_pid, signal.SIGKILL)
        for name in list(self.tree.children):
            if name != "base":
                self.tree.remove_child(name, wait_s=2.0)
        self.current = None


def descendants(root_pid: int) -> set[int]:
    """All live descendants of ``root_pid`` (host /proc scan)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root_pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


class ScanTracker:
    """Fallback without cgroups: a command's processes are the descendants of ``root_pid`` that
    did not exist when it began.  Processes are SIGSTOPped then SIGKILLed until none is left."""

    def __init__(self, root_pid: int, keep: set[int] = frozenset()):
        self.root_pid = root_pid
        self.keep = set(keep)
        self.before: set[int] = set()
        self.session: set[int] = set()

    def begin(self, shell_pid: int) -> None:
        self.before = descendants(self.root_pid)

    def end(self, shell_pid: int) -> None:
        self.session |= descendants(self.root_pid)

    def _stop_all(self, keep: set[int], only_new: bool) -> None:
        for _ in range(100):
            found = descendants(self.root_pid) - keep - self.keep
            if only_new:
                found -= self.before
            if not found:
                return
            for pid in found:
                _kill(pid, signal.SIGSTOP)
            for pid in found:
                _kill(pid, signal.SIGKILL)
            time.sleep(0.001)

    def kill_command(self, shell_pid: int) -> None:
        self._stop_all({shell_pid}, only_new=True)
        _kill(shell_pid, signal.SIGINT)

    def sweep(self, shell_pid: int) -> None:
        self._stop_all({shell_pid}, only_new=True)

    def kill_session(self, shell_pid: int | None) -> None:
        self._stop_all(set(), only_new=False)
