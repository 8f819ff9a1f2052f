"""A sandbox's writable areas on the host, and file transfer that never follows planted links.

The writable areas (the task root ``/app``, home ``/root``, ``/tmp``, ``/logs`` and, locally,
``/etc``) are folders of one tmpfs that the host mounts per sandbox -- ``nosuid,nodev``, size
``disk_mb`` (filling it fails with ENOSPC) and ``disk_mb * INODES_PER_MB`` inodes (so a sandbox
cannot make a million empty files that every snapshot must walk) -- and bind-mounts into the
sandbox.  Its folders belong to the sandbox's root (``owner``: locally an unprivileged host uid,
see :mod:`tr.envs.userns`), and so does everything the host writes there for it.  The local
``/etc`` is an overlay of a cached, secret-free copy of the host's ``/etc`` whose upper folder lies
on that tmpfs: a writable copy that costs nothing at start.  The state folder, each sandbox's
folder and its snapshots are 0700: no other host user reaches a sandbox's files.  Because the host
holds them:

* a snapshot copies the tmpfs into a snapshot folder with :mod:`tr.envs.filetree` (iterative,
  sparse-aware, setuid bits and file capabilities stripped, bounded in time): the first one in
  full, later ones incrementally -- files unchanged since the previous snapshot (same inode, ctime
  and size) become hard links to that snapshot's copy, which is safe because snapshot files are
  never written or handed to the sandbox.  Restore empties nothing it does not have to: unchanged
  live files stay, the rest is deleted or copied back, in place (the bind mounts keep pointing at
  the same folders).  A fork is a new workspace filled from the snapshot.  Live files are never
  hard-linked to snapshot files: an in-place edit would change the snapshot through the shared
  inode.
* copy_in/copy_out resolve the sandbox path in *sandbox* space (an absolute link ``/app/x ->
  /root`` means the sandbox's ``/root``) and then walk it with ``openat(O_NOFOLLOW)`` from the
  area folder, so a link swapped in meanwhile fails instead of reaching a host file.
* clean-up (close, and the reaper of workspaces whose owner died) unmounts, then removes the tree
  iteratively; a workspace that cannot be removed is reported and skipped, never blocking the
  reaper or the next sandbox.

Without the right to mount (not root), the areas are plain folders and ``disk_limited`` is False.
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import stat
import time
from pathlib import Path

from tr.envs import filetree
from tr.envs.sandbox import SandboxError

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(None, use_errno=True)
MNT_DETACH = 2
MS_NOSUID, MS_NODEV = 2, 4
ROOT_PREFIX = "tr-sbx-"
try:
    COARSE_TICK_S = max(time.clock_getres(5), 0.001)   # CLOCK_REALTIME_COARSE: file times
except OSError:
    COARSE_TICK_S = 0.01
CTIME_MARGIN_NS = max(50_000_000, int(4 * COARSE_TICK_S * 1e9))
# Inodes of a workspace tmpfs: 64 per MB of disk_mb (ext4's default ratio, 1 per 16 KiB), at
# least 4096.  A snapshot walks every inode: this bounds its time whatever the agent creates.
INODES_PER_MB = 64
MIN_INODES = 4096
# Wall-clock bounds of tree operations on a workspace (generous: a full 64k-inode tmpfs takes a
# few seconds; these only stop a pathological case from hanging an episode or the reaper).
SNAPSHOT_TIMEOUT_S = 300.0
REMOVE_TIMEOUT_S = 300.0


def inode_limit(disk_mb: int) -> int:
    """Inodes of a workspace of ``disk_mb`` MB: ``max(MIN_INODES, disk_mb * INODES_PER_MB)``."""
    return max(MIN_INODES, disk_mb * INODES_PER_MB)


def _mount_tmpfs(target: str, size_mb: int, owner: tuple[int, int]) -> bool:
    options = (f"size={size_mb}m,nr_inodes={inode_limit(size_mb)},mode=0755,"
               f"uid={owner[0]},gid={owner[1]}")
    r = _libc.mount(b"tr-sandbox", target.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                    options.encode())
    return r == 0


def _mount_overlay(lower: str, upper: str, work: str, target: str) -> bool:
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
    return _libc.mount(b"tr-overlay", target.encode(), b"overlay", MS_NOSUID | MS_NODEV,
                       opts) == 0


def _umount(target: str) -> None:
    _libc.umount2(target.encode(), MNT_DETACH)


def _proc_start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_ = f.read()
        return stat_[stat_.rindex(b")") + 2:].split()[19].decode()
    except (OSError, IndexError):
        return None


def owner_id(pid: int | None = None) -> str:
    """``<pid>-<start time in clock ticks>``: names a process uniquely on this boot (a reused
    pid has another start time).  Recorded on everything a sandbox leaves on the host."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_proc_start_time(pid)}"


def host_scope() -> str:
    """``<boot id>/<pid namespace>``: where owner ids can be checked.  A resource recorded in
    another scope (another machine or pid namespace sharing the Docker engine) is never judged
    dead from here."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "?"
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = "?"
    return f"{boot}/{ns}"


def owner_is_dead(owner: str | None, scope: str | None = None) -> bool:
    """True only when ``owner`` (an :func:`owner_id`) is known to have exited: its pid is gone
    or now belongs to a process started at another time.  Unparseable owners and owners of
    another :func:`host_scope` are never called dead, so their resources are left alone."""
    if scope is not None and scope != host_scope():
        return False
    pid_s, _, start = (owner or "").partition("-")
    if not pid_s.isdigit() or not start:
        return False
    return _proc_start_time(int(pid_s)) != start


def default_state_dir() -> Path:
    return Path(os.environ.get("TR_SANDBOX_STATE_DIR") or
                Path(os.environ.get("TMPDIR", "/tmp")) / "tr-sandboxes")


def private_dir(path: Path) -> Path:
    """``path`` made if missing (parents too) and set to 0700: host state no other user reads."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def reap_stale(state_dir: Path) -> int:
    """Remove workspaces whose owning process is gone (killed -9 before it could clean up).
    A workspace that cannot be removed is logged and skipped: it never stops the reaper or the
    sandbox that called it.  Returns the number removed."""
    removed = 0
    if not state_dir.is_dir():
        return 0
    for entry in state_dir.iterdir():
        if not entry.name.startswith(ROOT_PREFIX):
            continue
        try:
            pid_s, start, _ = entry.name[len(ROOT_PREFIX):].split("-", 2)
        except ValueError:
            continue
        if owner_is_dead(f"{pid_s}-{start}"):
            try:
                remove_tree(entry)
                removed += 1
            except Exception as e:  # noqa: BLE001 - one bad leftover must not stop the rest
                log.warning("could not remove the stale sandbox folder %s: %s", entry, e)
    return removed


def run_reaper(*reapers) -> None:
    """Run stale-resource reapers; one that fails is logged, never stops a sandbox's start."""
    for reap in reapers:
        try:
            reap()
        except Exception as e:  # noqa: BLE001 - leftovers of dead processes can wait
            log.warning("reaping stale sandbox resources failed: %s: %s", type(e).__name__, e)


def remove_tree(root: Path, timeout_s: float = REMOVE_TIMEOUT_S) -> None:
    """Unmount everything mounted under ``root`` (deepest first), then delete it iteratively
    without following links; raises SandboxError if that fails or takes over ``timeout_s``."""
    prefix = str(root).rstrip("/") + "/"
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split()[4] for line in f]
    except OSError:
        mounts = []
    for m in sorted(mounts, key=len, reverse=True):
        if m.startswith(prefix):
            _umount(m)
    deadline = filetree.Deadline(timeout_s, f"removing {root}")
    try:
        parent = os.open(str(root.parent), filetree.DIR_FLAGS)
    except FileNotFoundError:
        return
    try:
        filetree.remove_entry(parent, root.name, deadline)
    except OSError as e:
        raise SandboxError(f"removing {root} failed: {e}") from e
    finally:
        os.close(parent)


def copy_dir(src: str, dst: str, *, strip: bool = True,
             timeout_s: float = SNAPSHOT_TIMEOUT_S) -> None:
    """Copy folder ``src``'s contents and metadata into the empty folder ``dst``
    (:func:`tr.envs.filetree.copy_tree`: links kept, mounts inside not entered, sparse)."""
    s = os.open(src, filetree.DIR_FLAGS)
    try:
        d = os.open(dst, filetree.DIR_FLAGS)
        try:
            filetree.copy_tree(s, d, strip=strip,
                               deadline=filetree.Deadline(timeout_s, f"copying {src}"))
        finally:
            os.close(d)
    except OSError as e:
        raise SandboxError(f"copying {src} -> {dst} failed: {e}") from e
    finally:
        os.close(s)


def empty_dir(path: str, timeout_s: float = REMOVE_TIMEOUT_S) -> None:
    """Delete everything inside ``path`` without following links; keep ``path`` itself."""
    fd = os.open(path, filetree.DIR_FLAGS)
    try:
        filetree.clear_dir(fd, filetree.Deadline(timeout_s, f"emptying {path}"))
    finally:
        os.close(fd)


class HostWorkspace:
    """The writable areas of one sandbox, as host folders; ``areas`` maps sandbox path -> name.
    ``owner``: the host (uid, gid) of the sandbox's root, who owns the areas and every file the
    host writes into them."""

    def __init__(self, areas: dict[str, str], disk_mb: int, state_dir: Path | None = None,
                 overlays: dict[str, str] | None = None, owner: tuple[int, int] = (0, 0)):
        """``overlays`` maps an area name to a read-only lower folder: the area is an overlay of
        it (upper/work folders ``.<name>-upper``/``.<name>-work`` on the tmpfs), so a writable
        copy of e.g. /etc costs no copying; snapshots hold only the upper (changed) part."""
        self.areas = dict(areas)
        self.overlays = dict(overlays or {})
        self.owner = tuple(owner)
        self.state_dir = private_dir(Path(state_dir) if state_dir else default_state_dir())
        me = os.getpid()
        self.root = self.state_dir / f"{ROOT_PREFIX}{owner_id(me)}-{secrets.token_hex(6)}"
        self.root.mkdir(mode=0o700)
        self.w = self.root / "w"
        self.w.mkdir(mode=0o700)
        self.closed = False
        self.disk_limited = _mount_tmpfs(str(self.w), disk_mb, self.owner)
        if not self.disk_limited:
            os.chown(self.w, *self.owner)
            os.chmod(self.w, 0o755)
        for name in self.areas.values():
            (self.w / name).mkdir(exist_ok=True)
            os.chown(self.w / name, *self.owner)
        for name in ("tmp", "shm"):
            if name in self.areas.values():
                (self.w / name).chmod(0o1777)
        (self.root / "snaps").mkdir(mode=0o700)
        self.trusted: dict[str, dict] = {}
        self.last_snapshot: str | None = None
        if not self.disk_limited and self.overlays:   # no mount rights: plain copies
            for name, lower in self.overlays.items():
                copy_dir(lower, self.host_dir(name), strip=False)
            self.overlays = {}
        for name, lower in self.overlays.items():
            upper = self.w / f".{name}-upper"
            upper.mkdir()             # the merged folder's own owner and mode are the upper's
            lst = os.stat(lower)
            os.chown(upper, lst.st_uid, lst.st_gid)
            os.chmod(upper, stat.S_IMODE(lst.st_mode))
            (self.w / f".{name}-work").mkdir(mode=0o700)
        self._mount_overlays()

    def _mount_overlays(self) -> None:
        for name, lower in self.overlays.items():
            if not _mount_overlay(lower, str(self.w / f".{name}-upper"),
                                  str(self.w / f".{name}-work"), self.host_dir(name)):
                err = ctypes.get_errno()
                raise SandboxError(f"mounting the {name} overlay failed: {os.strerror(err)}")

    def _umount_overlays(self) -> None:
        for name in self.overlays:
            _umount(self.host_dir(name))

    def host_dir(self, name: str) -> str:
        return str(self.w / name)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            remove_tree(self.root)

    # --- snapshots -------------------------------------------------------------------------
    # Incremental: ``self.trusted[snapshot]`` maps area-relative paths of live regular files and
    # links (one link each) to (inode, ctime_ns, size) when that live file is known to equal the
    # snapshot's copy.  ctime cannot be set from user space and changes on every write or chmod,
    # so an equal key means an unchanged file.  Timestamps are coarse (one clock tick, ~4 ms), so
    # files changed in the last CTIME_MARGIN_NS before a snapshot are never trusted, and host-side
    # writes (write_file, copy_in, remove) drop all trust.  Unchanged files are then hard-linked
    # from the previous snapshot (snapshots are never written, so sharing inodes between them is
    # safe) and left alone on restore; a snapshot's own files never become live inodes.
    # Setuid/setgid bits and file capabilities are stripped from snapshot copies, so a restored
    # file has lost them too.

    def save(self, dest: Path) -> None:
        """Snapshot every area into ``dest`` (the sandbox's processes must be stopped)."""
        t_snap = time.time_ns()
        private_dir(dest.parent)
        dest.mkdir(mode=0o700)
        deadline = filetree.Deadline(SNAPSHOT_TIMEOUT_S, "the snapshot")
        prev = self.last_snapshot
        trusted = self.trusted.get(prev) if prev is not None else None
        live = os.open(str(self.w), filetree.DIR_FLAGS)
        try:
            out = os.open(str(dest), filetree.DIR_FLAGS)
            try:
                prev_fd = None
                if trusted:
                    try:
                        prev_fd = os.open(prev, filetree.DIR_FLAGS)
                    except OSError:
                        trusted = None
                keys: dict = {}
                try:
                    filetree.copy_tree(live, out, prev_fd=prev_fd, trusted=trusted,
                                       deadline=deadline, keys_out=keys,
                                       keys_before_ns=t_snap - CTIME_MARGIN_NS)
                finally:
                    if prev_fd is not None:
                        os.close(prev_fd)
            finally:
                os.close(out)
        except BaseException:
            try:
                remove_tree(dest)
            except Exception:  # noqa: BLE001 - the original error matters
                pass
            raise
        finally:
            os.close(live)
        self.trusted[str(dest)] = keys
        self.last_snapshot = str(dest)

    def load(self, src: Path) -> None:
        """Make every area equal to the snapshot at ``src``, in place: files whose live copy is
        known unchanged stay, the rest is deleted or copied back."""
        if not src.is_dir():
            raise SandboxError(f"snapshot folder {src} does not exist (discarded, or its sandbox "
                               "closed without persist_snapshots)")
        trusted = self.trusted.get(str(src), {})
        deadline = filetree.Deadline(SNAPSHOT_TIMEOUT_S, "the restore")
        self.distrust()
        self._umount_overlays()
        try:
            names = list(self.areas.values())
            for name in self.overlays:
                names += [f".{name}-upper", f".{name}-work"]
            for name in names:
                here, there = self.w / name, src / name
                live = os.open(str(here), filetree.DIR_FLAGS)
                try:
                    if not there.is_dir():
                        filetree.clear_dir(live, deadline)
                        continue
                    snap = os.open(str(there), filetree.DIR_FLAGS)
                    try:
                        filetree.sync_tree(snap, live, _below(trusted, name), deadline=deadline)
                    finally:
                        os.close(snap)
                finally:
                    os.close(live)
        finally:
            self._mount_overlays()
        # Our own copies are exact; wait out one clock tick so that no later write can share
        # their ctime, then trust them for the next restore/snapshot of this snapshot.
        time.sleep(COARSE_TICK_S)
        live = os.open(str(self.w), filetree.DIR_FLAGS)
        try:
            self.trusted = {str(src): filetree.trust_keys(live, before_ns=None,
                                                          deadline=deadline)}
        finally:
            os.close(live)
        self.last_snapshot = str(src)

    def distrust(self) -> None:
        """A host-side write happened: the next snapshot/restore copies everything."""
        self.trusted = {}
        self.last_snapshot = None

    # --- safe path resolution ----------------------------------------------------------------
    def split_area(self, path: str) -> tuple[str, list[str]] | None:
        """('area name', [components below it]) for a canonical sandbox path, or None."""
        for prefix in sorted(self.areas, key=len, reverse=True):
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                rest = path[len(prefix):].strip("/")
                return self.areas[prefix], [p for p in rest.split("/") if p]
        return None

    def canonical(self, path: str, follow_last: bool = True) -> str:
        """Resolve ``path`` in sandbox space: links inside the areas are read and followed as the
        sandbox would (absolute targets restart at the sandbox root).  Raises on loops."""
        if not isinstance(path, (str, os.PathLike)) or not str(path).startswith("/"):
            raise SandboxError(f"sandbox path must be absolute, got {path!r}")
        queue = [p for p in str(path).split("/") if p]
        out: list[str] = []
        hops = 0
        while queue:
            c = queue.pop(0)
            if c == ".":
                continue
            if c == "..":
                if out:
                    out.pop()
                continue
            cand = out + [c]
            if not queue and not follow_last:
                out = cand
                break
            split = self.split_area("/" + "/".join(cand))
            if split is None or not split[1]:
                out = cand
                continue
            host = os.path.join(self.host_dir(split[0]), *split[1])
            try:
                st = os.lstat(host)
            except (FileNotFoundError, NotADirectoryError):
                out = cand
                continue
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > 40:
                    raise SandboxError(f"too many levels of symbolic links in {path!r}")
                target = os.readlink(host)
                if target.startswith("/"):
                    out = []
                queue = [p for p in target.split("/") if p] + queue
            else:
                out = cand
        return "/" + "/".join(out)

    def locate(self, path, follow_last: bool = True) -> tuple[str, list[str]]:
        canon = self.canonical(str(path), follow_last)
        split = self.split_area(canon)
        if split is None:
            raise SandboxError(f"sandbox path {path!r} (resolved {canon!r}) is outside the "
                               f"writable areas {sorted(self.areas)}")
        return split

    def open_dir(self, area: str, parts: list[str], create: bool) -> int:
        """fd of the folder ``area/parts``, walked with O_NOFOLLOW (created when ``create``,
        belonging to the sandbox's root)."""
        fd = os.open(self.host_dir(area), filetree.DIR_FLAGS)
        try:
            return filetree.open_below(fd, parts, create=create, owner=self.owner)
        except OSError as e:
            raise SandboxError(f"cannot open folder {'/'.join([area, *parts])} in the sandbox: "
                               f"{e.strerror} (a link or file where a folder is expected?)") from e
        finally:
            os.close(fd)

    # --- transfers ---------------------------------------------------------------------------
    def remove(self, path) -> None:
        """Delete a file, link or folder (links not followed); a missing path is fine."""
        self.distrust()
        area, parts = self.locate(path, follow_last=False)
        if not parts:
            raise SandboxError(f"cannot remove {path!r}: it is a writable area's root")
        dfd = self.open_dir(area, parts[:-1], create=False)
        try:
            filetree.remove_entry(dfd, parts[-1],
                                  filetree.Deadline(REMOVE_TIMEOUT_S, f"removing {path}"))
        except OSError as e:
            raise SandboxError(f"cannot remove {path!r}: {e.strerror}") from e
        finally:
            os.close(dfd)

    def make_empty_dir(self, path) -> None:
        """``path`` becomes a new empty folder, whatever (file, link, folder) was there."""
        self.remove(path)
        area, parts = self.locate(path, follow_last=False)
        os.close(self.open_dir(area, parts, create=True))

    def write_file(self, path, data: bytes, mode: int) -> None:
        self.distrust()
        area, parts = self.locate(path)
        if not parts:
            raise SandboxError(f"write_file: {path!r} is an area folder, not a file")
        dfd = self.open_dir(area, parts[:-1], create=True)
        try:
            try:
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                             | os.O_NONBLOCK | os.O_CLOEXEC, mode & 0o7777, dir_fd=dfd)
            except OSError as e:
                raise SandboxError(f"write_file {path!r}: {e.strerror}") from e
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise SandboxError(f"write_file {path!r}: not a regular file")
                os.fchown(fd, *self.owner)
                os.fchmod(fd, mode & 0o7777)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            except OSError as e:
                raise SandboxError(f"write_file {path!r}: {e.strerror}") from e
            finally:
                os.close(fd)
        finally:
            os.close(dfd)

    def read_file(self, path) -> bytes:
        area, parts = self.locate(path)
        if not parts:
            raise SandboxError(f"read_file: {path!r} is a folder")
        dfd = self.open_dir(area, parts[:-1], create=False)
        try:
            fd = os.open(parts[-1], filetree.FILE_FLAGS, dir_fd=dfd)
        except OSError as e:
            raise SandboxError(f"read_file {path!r}: {e.strerror}") from e
        finally:
            os.close(dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SandboxError(f"read_file {path!r}: not a regular file")
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def copy_in(self, host_path, path) -> None:
        """Copy a host file or folder to sandbox ``path`` (a folder's contents are merged)."""
        self.distrust()
        host_path = Path(host_path)
        if not host_path.exists():
            raise SandboxError(f"copy_in: host path {host_path} does not exist")
        if host_path.is_file():
            self.write_file(path, host_path.read_bytes(), stat.S_IMODE(host_path.stat().st_mode))
            return
        area, parts = self.locate(path)
        dfd = self.open_dir(area, parts, create=True)
        try:
            os.fchmod(dfd, stat.S_IMODE(host_path.stat().st_mode))
            copy_host_tree_into(host_path, dfd, self.owner)
        finally:
            os.close(dfd)

    def copy_out(self, path, host_path, *, keep_symlinks: bool = True) -> list[str]:
        """Copy sandbox ``path`` to the host without following links inside it (an existing
        destination folder must be empty); links are kept as links (or skipped with
        ``keep_symlinks=False``), special files skipped, setuid bits dropped, and the copies
        belong to the caller.  Returns the relative paths that were skipped."""
        area, parts = self.locate(path, follow_last=False)
        host_path = Path(host_path)
        if parts:
            dfd = self.open_dir(area, parts[:-1], create=False)
            name = parts[-1]
        else:
            dfd = os.open(str(self.w), filetree.DIR_FLAGS)
            name = area
        try:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError as e:
                raise SandboxError(f"copy_out: {path!r} does not exist in the sandbox") from e
            host_path.parent.mkdir(parents=True, exist_ok=True)
            out_parent = os.open(str(host_path.parent), filetree.DIR_FLAGS)
            try:
                return _copy_out_entry(dfd, name, st, out_parent, host_path.name, keep_symlinks)
            except OSError as e:
                raise SandboxError(f"copy_out {path!r} -> {host_path}: {e}") from e
            finally:
                os.close(out_parent)
        finally:
            os.close(dfd)


def _below(trusted: dict, name: str) -> dict:
    """The trust keys of area ``name``, relative to that area's folder."""
    prefix = name + "/"
    return {k[len(prefix):]: v for k, v in trusted.items() if k.startswith(prefix)}


def _copy_out_entry(src_dir: int, name: str, st: os.stat_result, dst_dir: int, dst_name: str,
                    keep_symlinks: bool) -> list[str]:
    """copy_out of one entry (a whole tree for a folder) to ``dst_name`` in ``dst_dir``."""
    if not stat.S_ISDIR(st.st_mode):
        try:
            dst = os.stat(dst_name, dir_fd=dst_dir, follow_symlinks=False)
            if stat.S_ISDIR(dst.st_mode):
                raise SandboxError(f"copy_out: the destination {dst_name} is a folder")
            os.unlink(dst_name, dir_fd=dst_dir)
        except FileNotFoundError:
            pass
        if name != dst_name:      # copy_entry keeps the name: go through a private temp name
            tmp = f".tr-copy-{secrets.token_hex(6)}"
            os.mkdir(tmp, 0o700, dir_fd=dst_dir)
            try:
                tfd = os.open(tmp, filetree.DIR_FLAGS, dir_fd=dst_dir)
                try:
                    ok = filetree.copy_entry(src_dir, tfd, name, st, owner=False,
                                             keep_symlinks=keep_symlinks)
                    if ok:
                        os.rename(name, dst_name, src_dir_fd=tfd, dst_dir_fd=dst_dir)
                finally:
                    os.close(tfd)
            finally:
                filetree.remove_entry(dst_dir, tmp)
        else:
            ok = filetree.copy_entry(src_dir, dst_dir, name, st, owner=False,
                                     keep_symlinks=keep_symlinks)
        return [] if ok else [name]
    try:
        os.mkdir(dst_name, 0o700, dir_fd=dst_dir)
    except FileExistsError:
        pass
    out = os.open(dst_name, filetree.DIR_FLAGS, dir_fd=dst_dir)
    try:
        if os.listdir(out):
            raise SandboxError(f"copy_out: the destination folder {dst_name} is not empty")
        sub = os.open(name, filetree.DIR_FLAGS, dir_fd=src_dir)
        try:
            return filetree.copy_tree(sub, out, owner=False, keep_symlinks=keep_symlinks)
        finally:
            os.close(sub)
    finally:
        os.close(out)


def copy_host_tree_into(src: Path, dfd: int, owner: tuple[int, int]) -> None:
    """Copy a host folder's contents (harness input: the task's files) into open folder
    ``dfd``, merged; every entry made belongs to ``owner``."""
    for entry in os.scandir(src):
        if entry.is_symlink():
            try:
                os.unlink(entry.name, dir_fd=dfd)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                pass
            os.symlink(os.readlink(entry.path), entry.name, dir_fd=dfd)
            os.chown(entry.name, *owner, dir_fd=dfd, follow_symlinks=False)
        elif entry.is_dir():
            try:
                os.mkdir(entry.name, 0o755, dir_fd=dfd)
            except FileExistsError:
                pass
            sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
            try:
                os.fchown(sub, *owner)
                os.fchmod(sub, stat.S_IMODE(entry.stat().st_mode))
                copy_host_tree_into(Path(entry.path), sub, owner)
            finally:
                os.close(sub)
        elif entry.is_file():
            mode = stat.S_IMODE(entry.stat().st_mode)
            fd = os.open(entry.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                         | os.O_NONBLOCK, mode, dir_fd=dfd)
            try:
                os.fchown(fd, *owner)
                os.fchmod(fd, mode)
                with open(entry.path, "rb") as f:
                    while chunk := f.read(1 << 20):
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view):]
            finally:
                os.close(fd)
