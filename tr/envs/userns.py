"""The local sandbox's user namespace: root inside, an unprivileged host uid outside.

A sandbox's processes run as uid/gid 0 of their own user namespace, which maps ids
``0..COUNT-1`` to the host's ``BASE..BASE+COUNT-1`` (a subordinate range no host account uses).
So the agent's root is, to the host kernel, uid ``BASE``: it cannot write host sysctls (the
``core_pattern`` escape), signal or trace host processes, or use any file the host did not give
it; files it creates are owned by ``BASE`` on the host.  Ids outside the range (host root
included) show as ``nobody`` (65534) inside and can never be reached: no id maps to host root.

The range: ``TR_SANDBOX_SUBID=BASE:COUNT`` if set, else the entry of user ``tr-sandbox`` in
``/etc/subuid`` (and ``/etc/subgid``, which must agree), else ``524288:65536``.

:class:`UserNamespace` makes one namespace with that map (a short-lived ``unshare --user``
process whose maps the host writes, as root may) and holds it open by a file descriptor that the
sandbox launcher joins (``nsenter --user``) after bubblewrap has built the mounts as host root:
mounts, PID, network, IPC and UTS namespaces therefore belong to the host's user namespace, and
root in the sandbox has no rights over any of them.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

DEFAULT_RANGE = (524288, 65536)
SUBID_USER = "tr-sandbox"
NOBODY = 65534


class UserNamespaceError(RuntimeError):
    """A user namespace could not be made (kernel or host configuration)."""


def _subid_entry(path: str) -> tuple[int, int] | None:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] == SUBID_USER and parts[1].isdigit() and parts[2].isdigit():
            return int(parts[1]), int(parts[2])
    return None


def subordinate_range() -> tuple[int, int]:
    """(BASE, COUNT) of the host ids sandbox ids 0..COUNT-1 map to (see module doc)."""
    env = os.environ.get("TR_SANDBOX_SUBID")
    if env:
        base, _, count = env.partition(":")
        if not (base.isdigit() and count.isdigit()) or int(base) == 0 or int(count) < 1:
            raise ValueError(f"TR_SANDBOX_SUBID={env!r}: expected BASE:COUNT with BASE > 0")
        return int(base), int(count)
    uid, gid = _subid_entry("/etc/subuid"), _subid_entry("/etc/subgid")
    if uid is not None and uid == gid:
        return uid
    return DEFAULT_RANGE


def host_id(sandbox_id: int, base: int, count: int) -> int:
    """The host uid/gid of sandbox id ``sandbox_id`` (ids outside the range: nobody's)."""
    if 0 <= sandbox_id < count:
        return base + sandbox_id
    return base + min(NOBODY, count - 1)


class UserNamespace:
    """One user namespace mapping sandbox ids ``0..count-1`` to host ``base..``; ``fd`` holds it
    open until :meth:`close`."""

    def __init__(self, base: int | None = None, count: int | None = None):
        if base is None or count is None:
            base, count = subordinate_range()
        self.base, self.count = base, count
        holder = subprocess.Popen(["unshare", "--user", "--", "cat"], stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  close_fds=True)
        try:
            ours = os.readlink("/proc/self/ns/user")
            deadline = time.monotonic() + 10
            while True:           # until the holder has unshared (then it execs cat)
                try:
                    if os.readlink(f"/proc/{holder.pid}/ns/user") != ours:
                        break
                except OSError:
                    pass
                if holder.poll() is not None:
                    raise UserNamespaceError(
                        "cannot create a user namespace (unshare --user failed: "
                        f"{holder.stderr.read().decode(errors='replace').strip()})")
                if time.monotonic() > deadline:
                    raise UserNamespaceError("unshare --user did not start within 10 s")
                time.sleep(0.0005)
            mapping = f"0 {base} {count}\n"
            try:
                for name in ("uid_map", "gid_map"):
                    with open(f"/proc/{holder.pid}/{name}", "w") as f:
                        f.write(mapping)
            except OSError as e:
                raise UserNamespaceError(f"cannot map sandbox ids to host {base}..{base + count - 1}"
                                         f": {e} (needs root)") from e
            self.fd = os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            holder.stdin.close()
            try:
                holder.wait(timeout=10)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait()
            holder.stderr.close()

    @property
    def root(self) -> tuple[int, int]:
        """Host (uid, gid) of the sandbox's root."""
        return self.base, self.base

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def shift_owners(root: Path, base: int, count: int) -> None:
    """Give every entry under ``root`` (itself included, links not followed) the host ids its
    owner has inside a sandbox of range ``base:count`` -- a copy of host files that sandbox root
    should own as root owns the originals."""
    def shift(path: str) -> None:
        st = os.lstat(path)
        os.chown(path, host_id(st.st_uid, base, count), host_id(st.st_gid, base, count),
                 follow_symlinks=False)
        if not stat.S_ISLNK(st.st_mode):    # chown clears setuid bits: put the mode back
            os.chmod(path, stat.S_IMODE(st.st_mode))

    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            shift(os.path.join(directory, name))
    shift(str(root))
