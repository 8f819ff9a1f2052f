"""Build Docker images without a registry.

The base image ``tr-base:<hash>`` is made from this machine's own Debian packages: the files of
:data:`BASE_PACKAGES` and everything they depend on (``Depends``/``Pre-Depends`` closure, as
``dpkg -L`` lists them), plus a minimal ``/etc`` (passwd, group, hosts, loader config, the
alternatives links that point into the image), packed into a tar and ``docker import``-ed.  The
tag is a hash of the package names and versions, so a changed host gets a new image and an
unchanged one reuses the cached image.  Debian's ``/usr/bin/python3`` is in it; pytest is not --
the protected verifier mounts the project's interpreter and site-packages read-only instead.

A task Dockerfile is built with its own ``FROM`` images when they are here or can be pulled; an
image that is neither is replaced by the Debian stand-in (:mod:`tr.envs.images.debian`: apt,
python3, pip), which the result's notes record.  Builds have the network (``network=False``: none);
the agent's runtime is the sandbox's business (offline by default).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

from tr.envs.images import debian
from tr.envs.sandbox import SandboxError
from tr.envs.tasks.dockerfile import inline_heredocs
from tr.envs.tasks.packages import debian_name

BASE_REPO = "tr-base"
TASK_REPO = "tr-task"
LABEL = "tr.managed"
RECIPE_VERSION = "2"
BASE_PACKAGES = (
    "base-files", "base-passwd", "bash", "coreutils", "dash", "debianutils", "diffutils",
    "findutils", "grep", "gzip", "hostname", "libc-bin", "mawk", "ncurses-base", "ncurses-bin",
    "procps", "sed", "tar", "util-linux", "bzip2", "xz-utils", "less", "patch", "file", "make",
    "python3", "python3.11", "ca-certificates",
    # what the built-in suite's tasks use (tr/envs/suite/README.md): compilers for build-*,
    # git for git-*, venv for py-venv-*; libc6-dev is only a Recommends of gcc, so it is named.
    # envsubst (gettext-base), jq and the sqlite3 CLI: tools an agent reaches for on the local
    # backend (the host's /usr), so attempts behave the same on both backends.
    "git", "gcc", "binutils", "libc6-dev", "python3-venv", "gettext-base", "jq", "sqlite3",
)
SUITE_TOOLS = ("git", "gcc", "cc", "make", "ar", "patch", "flock", "setsid", "ps", "file",
               "envsubst", "jq", "sqlite3")
IMAGE_DIRS = {"/tmp": 0o1777, "/var/tmp": 0o1777, "/root": 0o700, "/app": 0o755,
              "/logs": 0o755, "/home": 0o755, "/run": 0o755, "/proc": 0o555, "/sys": 0o555,
              "/dev": 0o755, "/opt": 0o755, "/mnt": 0o755, "/srv": 0o755,
              "/usr/local/bin": 0o755}
ETC_FILES = {
    "/etc/passwd": "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:"
                   "/usr/sbin/nologin\n",
    "/etc/group": "root:x:0:\nnogroup:x:65534:\n",
    "/etc/hostname": "tr-sandbox\n",
    "/etc/hosts": "127.0.0.1 localhost tr-sandbox\n::1 localhost\n",
    "/etc/resolv.conf": "",
    "/etc/nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n",
}
IMPORT_CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    "WORKDIR /app",
    'CMD ["/bin/bash"]',
]


def docker_client():
    """A docker-py client, or a clear error when no engine answers."""
    try:
        import docker
        client = docker.from_env(timeout=120)
        client.ping()
        return client
    except Exception as e:  # noqa: BLE001 - any failure means the same to the caller
        raise SandboxError(f"no Docker engine answers ({type(e).__name__}: {e}); start dockerd "
                           "or use the local backend") from None


def _query(pkgs: list[str], fmt: str) -> list[str]:
    r = subprocess.run(["dpkg-query", "-W", "-f", fmt, *pkgs], capture_output=True, text=True)
    return r.stdout.splitlines()


def package_closure(roots=BASE_PACKAGES) -> list[tuple[str, str]]:
    """Installed packages reachable from ``roots`` via Depends/Pre-Depends: (name, version).
    A dependency on a virtual package (``python3.11-distutils``) is met by an installed package
    that ``Provides`` it."""
    installed, providers = {}, {}
    for line in _query([], "${Package}\t${Version}\t${db:Status-Abbrev}\t${Provides}\n"):
        parts = line.split("\t")
        if len(parts) >= 4 and parts[2].startswith("ii"):
            installed[parts[0]] = parts[1]
            for virtual in filter(None, (re.sub(r"[ (].*", "", v.strip()).split(":")[0]
                                         for v in parts[3].split(","))):
                providers.setdefault(virtual, []).append(parts[0])
    missing = [p for p in roots if p not in installed]
    if missing:
        raise RuntimeError(f"base image: host packages not installed: {missing}")
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        batch = [p for p in todo if p not in seen]
        todo = []
        if not batch:
            break
        seen.update(batch)
        for line in _query(batch, "${Depends}, ${Pre-Depends}\n"):
            for clause in line.split(","):
                options = [re.sub(r"[ (].*", "", o.strip()).split(":")[0]
                           for o in clause.split("|")]
                for o in options:
                    if o not in installed and o in providers:
                        o = next((p for p in providers[o] if p in seen), providers[o][0])
                    if o in installed:
                        if o not in seen:
                            todo.append(o)
                        break
    return sorted((p, installed[p]) for p in seen)


def base_image_tag(packages: list[tuple[str, str]] | None = None) -> str:
    packages = package_closure() if packages is None else packages
    h = hashlib.sha256(repr((RECIPE_VERSION, packages)).encode()).hexdigest()[:12]
    return f"{BASE_REPO}:{h}"


def _canonical(path: str) -> str:
    """Path with the parent folder's links resolved (/bin/ls -> /usr/bin/ls)."""
    parent, name = os.path.split(path)
    return os.path.join(os.path.realpath(parent), name)


def _image_files(packages: list[str]) -> list[str]:
    r = subprocess.run(["dpkg-query", "-L", *packages], capture_output=True, text=True)
    files = set()
    for line in r.stdout.splitlines():
        if line.startswith("/") and os.path.lexists(line):
            if line.startswith(("/etc/", "/proc", "/sys", "/dev")):
                continue
            files.add(_canonical(line))
    for entry in Path("/etc/alternatives").iterdir():
        target = os.readlink(entry) if entry.is_symlink() else None
        if target and _canonical(target) in files:
            files.add(str(entry))
    alternatives = {str(e) for e in Path("/etc/alternatives").iterdir()} & files
    for d in ("/usr/bin", "/usr/sbin"):
        for entry in os.scandir(d):
            if entry.is_symlink() and os.readlink(entry.path) in alternatives:
                files.add(entry.path)
    for name in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/bash.bashrc", "/etc/profile",
                 "/etc/os-release", "/etc/debian_version", "/etc/protocols", "/etc/services",
                 "/etc/mime.types", "/etc/inputrc", "/etc/localtime", "/etc/shells"):
        if os.path.lexists(name):
            files.add(name)
    if os.path.isdir("/etc/ld.so.conf.d"):
        files.update(str(p) for p in Path("/etc/ld.so.conf.d").iterdir())
    return sorted(files)


def _write_tar(path: str, files: list[str]) -> None:
    with tarfile.open(path, "w") as tar:
        def add_dir(name: str, mode: int) -> None:
            info = tarfile.TarInfo(name.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        made: set[str] = set()

        def parents(p: str) -> None:
            parent = os.path.dirname(p)
            if parent in ("/", "") or parent in made:
                return
            parents(parent)
            made.add(parent)
            add_dir(parent, 0o755)
        for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):   # merged-/usr links
            if os.path.islink("/" + d):
                info = tarfile.TarInfo(d)
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink("/" + d)
                tar.addfile(info)
                made.add("/" + d)
        for name, mode in IMAGE_DIRS.items():
            parents(name)
            add_dir(name, mode)
            made.add(name)
        for f in files:
            if f in made:
                continue
            parents(f)
            if os.path.isdir(f) and not os.path.islink(f):
                add_dir(f, os.stat(f).st_mode & 0o7777)
                made.add(f)
                continue
            tar.add(f, arcname=f.lstrip("/"), recursive=False)
        for name, text in ETC_FILES.items():
            data = text.encode()
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))


def _image_exists(client, tag: str) -> bool:
    import docker
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


_READY: set[str] = set()   # base tags known to exist (this process)
_CLOSURE: list | None = None


def ensure_base_image(rebuild: bool = False, log: Callable[[str], None] | None = None,
                      client=None) -> str:
    """The tag of the base image, building it from host packages when absent."""
    global _CLOSURE
    log = log or (lambda m: None)
    if _CLOSURE is None or rebuild:
        _CLOSURE = package_closure()
    packages = _CLOSURE
    tag = base_image_tag(packages)
    if tag in _READY and not rebuild:
        return tag
    own_client = client is None
    client = client or docker_client()
    try:
        if not rebuild and _image_exists(client, tag):
            _READY.add(tag)
            return tag
        # one build per machine: concurrent callers (test workers, rollout processes) wait for it
        with open(debian.cache_dir() / f"{tag.replace(':', '-')}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if rebuild or not _image_exists(client, tag):
                _build_base(client, tag, packages, log)
    finally:
        if own_client:
            client.close()
    _READY.add(tag)
    return tag


def _build_base(client, tag: str, packages: list, log: Callable[[str], None]) -> None:
    names = [p for p, _ in packages]
    log(f"building {tag} from {len(names)} host packages")
    files = _image_files(names)
    with tempfile.TemporaryDirectory(prefix="tr-base-image-") as tmp:
        tar_path = os.path.join(tmp, "rootfs.tar")
        _write_tar(tar_path, files)
        log(f"rootfs tar: {os.path.getsize(tar_path) / 1e6:.0f} MB, {len(files)} paths")
        repo, version = tag.split(":")
        client.api.import_image_from_file(tar_path, repository=repo, tag=version,
                                          changes=IMPORT_CHANGES + [f"LABEL {LABEL}=base"])
    if not _image_exists(client, tag):
        raise RuntimeError(f"docker import did not produce {tag}")


def build_task_image(dockerfile, context, log: Callable[[str], None] | None = None, *,
                     notes: list | None = None, network: bool = True,
                     timeout_s: float | None = None) -> str:
    """Build a task's Dockerfile; returns its tag.  Each ``FROM`` image is used when present or
    pullable (pull progress to ``log``); otherwise the local Debian stand-in
    (:mod:`tr.envs.images.debian`) takes its place, and a line saying so is appended to
    ``notes``.  The build has the network unless ``network`` is false; ``timeout_s`` bounds
    the wait for the engine's next word (Harbor's ``build_timeout_sec``; default an hour)."""
    log = log or (lambda m: None)
    # resolved: a task folder reached through a symlink is sent whole (tarfile keeps links)
    dockerfile, context = Path(dockerfile).resolve(), Path(context).resolve()
    if not dockerfile.is_file():
        raise FileNotFoundError(f"Dockerfile {dockerfile} does not exist")
    if not context.is_dir():
        raise FileNotFoundError(f"build context {context} is not a folder")
    client = docker_client()
    try:
        return _build_task(client, dockerfile, context, log, notes if notes is not None else [],
                           network, timeout_s or 3600.0)
    finally:
        client.close()


_PULL_FAILED: dict[str, str] = {}   # image -> why it could not be pulled (this process)
_TBENCH = re.compile(r"^ghcr\.io/laude-institute/t-bench/")


def _available(client, image: str, log: Callable[[str], None]) -> tuple[bool, str]:
    """(present or pulled, why not).  Pull progress goes to ``log``, one line per layer state."""
    import docker
    if _image_exists(client, image):
        return True, ""
    if image in _PULL_FAILED:
        return False, _PULL_FAILED[image]
    repo, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
    log(f"pulling {image}")
    seen: dict[str, str] = {}
    try:
        for event in client.api.pull(repo, tag=tag or "latest", stream=True, decode=True):
            if "error" in event:
                raise docker.errors.APIError(event["error"])
            layer, status = event.get("id", ""), event.get("status", "")
            if status and seen.get(layer) != status:
                seen[layer] = status
                log(f"  {layer + ': ' if layer else ''}{status}")
    except (docker.errors.APIError, docker.errors.DockerException, OSError) as e:
        why = str(getattr(e, "explanation", None) or e).splitlines()[0][:200]
        _PULL_FAILED[image] = why
        log(f"cannot pull {image}: {why}")
        return False, why
    return _image_exists(client, image), ""


_PPA = re.compile(r"\badd-apt-repository\s+(?:-\S+\s+)*['\"]?ppa:[^\s'\"&;|]+['\"]?")


def _standin_lines(instruction_text: str) -> str:
    """A RUN line in a stand-in stage with Ubuntu apt package names mapped to Debian's."""

    def fix(match: re.Match) -> str:
        words = match.group(2).split(" ")
        return match.group(1) + " ".join(debian_name(w) if re.fullmatch(r"[a-z0-9][a-z0-9+.-]*", w)
                                         else w for w in words)
    return re.sub(r"(\bapt(?:-get)?\s+(?:-\S+\s+)*install\s+)([^;&|\n]*)", fix, instruction_text)


def _multi_source_copy(line: str) -> str:
    """`COPY a b /app` (or `COPY dir/* /app`) -> `.../app/`: BuildKit (Terminal-Bench's builder) takes a folder
    without the slash, the classic builder this engine API runs refuses it."""
    m = re.match(r"^(\s*(?:COPY|ADD)\s+)((?:--\S+\s+)*)([^\[].*?)\s*$", line, re.IGNORECASE)
    if not m or line.rstrip().endswith("\\"):
        return line
    words = m.group(3).split()
    globbed = any(c in w for w in words[:-1] for c in "*?[")
    if (len(words) > 2 or (globbed and len(words) == 2)) and not words[-1].endswith("/"):
        return f"{m.group(1)}{m.group(2)}{' '.join(words[:-1])} {words[-1]}/"
    return line


def _rewrite(client, dockerfile: Path, log, notes: list,
             files: dict | None = None) -> tuple[str, list[str]]:
    """The Dockerfile as built: here-documents made context files / plain RUNs (the engine API's
    classic builder has no BuildKit; their files go to ``files``), FROMs resolved (see
    build_task_image); in stand-in stages a t-bench image's ``WORKDIR /app`` and Debian package
    names.  Returns (text, stand-in images)."""
    stages: set[str] = set()
    replaced: list[str] = []
    standin_stage = False
    out = []
    text, docs = inline_heredocs(dockerfile.read_text(), dockerfile)
    if files is not None:
        files.update(docs)
    for line in text.splitlines():
        m = re.match(r"^(\s*FROM\s+)(?:--platform=\S+\s+)?(\S+)(.*)$", line, re.IGNORECASE)
        if m:
            image, rest = m.group(2), m.group(3)
            standin_stage = False
            if image.lower() not in stages and image.lower() != "scratch":
                ok, why = _available(client, image, log)
                if not ok:
                    standin = debian.ensure_standin_image(client, log)
                    notes.append(f"FROM {image}: not on this machine and not pullable ({why}); "
                                 f"built on the local stand-in {standin} ({debian.DESCRIPTION})")
                    log(notes[-1])
                    replaced.append(image)
                    image, standin_stage = standin, True
            alias = re.match(r"\s+AS\s+(\S+)", rest, re.IGNORECASE)
            if alias:
                stages.add(alias.group(1).lower())
            out.append(f"{m.group(1)}{image}{rest}")
            if standin_stage:       # pip installs system-wide as in python images, also over
                out.append("ENV PIP_BREAK_SYSTEM_PACKAGES=1")   # a Debian python3.X reinstalled by apt
            if standin_stage and _TBENCH.match(m.group(2)):
                out.append("WORKDIR /app")      # what t-bench's own base images set
            continue
        line = _multi_source_copy(line)
        if standin_stage:
            line = _standin_lines(line)
            ppa = _PPA.search(line)
            if ppa:       # Launchpad PPAs are Ubuntu's: Debian's own packages stand in for them
                line = _PPA.sub("true", line)
                notes.append(f"{dockerfile.name}: `{ppa.group(0).strip()}` (an Ubuntu PPA) is "
                             "skipped on the Debian stand-in; its packages come from Debian")
                log(notes[-1])
            other = re.search(r"/usr/local/lib/python3\.(\d+)|\bpython3\.(\d+)\b", line)
            if other and (other.group(1) or other.group(2)) != debian.PYTHON_MINOR and not any(
                    "other Python" in n for n in notes):
                notes.append(f"{dockerfile.name}: `{other.group(0)}` belongs to the real base "
                             f"image; the stand-in's Python is 3.{debian.PYTHON_MINOR} under /usr, "
                             "so this step may not do what the task expects (other Python)")
                log(notes[-1])
        out.append(line)
    return "\n".join(out) + "\n", replaced


_APT_MISSING = re.compile(r"(?:Unable to locate package |Package ')(\S+?)'?(?: has no installation "
                          r"candidate|$)", re.M)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _build_task(client, dockerfile: Path, context: Path, log: Callable[[str], None], notes: list,
                network: bool = True, timeout_s: float = 3600.0) -> str:
    docs: dict[str, str] = {}
    text, replaced = _rewrite(client, dockerfile, log, notes, docs)
    h = hashlib.sha256(text.encode())
    for p in sorted(context.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(context)).encode())
            h.update(p.read_bytes())
    for rel, body in sorted(docs.items()):
        h.update(rel.encode())
        h.update(body.encode())
    tag = f"{TASK_REPO}:{h.hexdigest()[:12]}"
    if _image_exists(client, tag):
        return tag
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(context), arcname=".")
        for folder in sorted({str(Path(rel).parents[i]) for rel in docs
                              for i in range(len(Path(rel).parents) - 1)}):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, body in [(".tr.Dockerfile", text), *sorted(docs.items())]:
            data = body.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    modes = [os.environ["TR_BUILD_NETWORK"]] if os.environ.get("TR_BUILD_NETWORK") else (
        (["host"] if _BRIDGE_BROKEN else ["default", "host"]) if network else ["none"])
    for mode in modes:
        buf.seek(0)
        log(f"building {dockerfile} as {tag} (build network: {mode})")
        error, lines = _run_build(client, buf, tag, mode, log, timeout_s)
        if error is None or not _NO_BRIDGE.search(error):
            break
        _BRIDGE_BROKEN.append(True)
        log(f"the engine's bridge network is unusable here ({error.strip()[:120]}); "
            "building with the host's network")
    if error is None and _image_exists(client, tag):
        return tag
    raise RuntimeError(_build_error(dockerfile, error or "no image was produced", lines, replaced))


_BRIDGE_BROKEN: list = []   # set once this process saw the engine's bridge fail
_NO_BRIDGE = re.compile(r"failed to create endpoint|bridge|network .* not found", re.I)


def _run_build(client, buf, tag: str, network_mode: str, log,
               timeout_s: float = 3600.0) -> tuple[str | None, list[str]]:
    """One `docker build` of the prepared context: (error or None, output lines)."""
    lines: list[str] = []
    try:
        for event in client.api.build(fileobj=buf, custom_context=True,
                                      dockerfile=".tr.Dockerfile", tag=tag, rm=True, forcerm=True,
                                      network_mode=network_mode, labels={LABEL: "task"},
                                      decode=True, timeout=int(timeout_s)):
            if "stream" in event:
                for ln in _ANSI.sub("", event["stream"]).splitlines():
                    if ln.strip():
                        lines.append(ln)
                        if ln.startswith("Step "):
                            log(f"  {ln[:160]}")
            if "error" in event:
                return event["error"], lines
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}", lines
    return None, lines


_NET_FAIL = re.compile(r"Could not resolve host|Name or service not known|Temporary failure "
                       r"resolving|Temporary failure in name resolution|Failed to establish a new "
                       r"connection|Could not fetch URL|"
                       r"unable to access|Connection refused|Network is unreachable|timed out", re.I)
_HOST = re.compile(r"(?:https?|git|ftp)://([A-Za-z0-9.-]+\.[A-Za-z]{2,})|Could not resolve host:? "
                   r"'?([A-Za-z0-9.-]+\.[A-Za-z]{2,})|(?:host=?|resolving )'([A-Za-z0-9.-]+\.[A-Za-z]{2,})'")


def unreachable_hosts(lines: list[str]) -> list[str]:
    """Hosts a failing build (or script) could not reach, from its output lines."""
    hosts: list[str] = []
    for i, line in enumerate(lines):
        if not _NET_FAIL.search(line):
            continue
        found = [next(g for g in m.groups() if g) for m in _HOST.finditer(line)]
        for back in range(i - 1, max(-1, i - 4), -1):    # pip names only the path: look back
            if found or not re.search(r"Retrying|NewConnectionError", line):
                break
            found = [next(g for g in m.groups() if g) for m in _HOST.finditer(lines[back])][-1:]
        hosts.extend(h for h in found if h not in hosts)
    return hosts


def _build_error(dockerfile: Path, error: str, lines: list[str], replaced: list[str]) -> str:
    """One message: what failed, the build output's tail, and what would make it build."""
    tail = "\n".join(lines[-25:])
    message = f"building {dockerfile} failed: {error.strip()}\n--- build output (tail)\n{tail}"
    missing = sorted({m.group(1) for m in _APT_MISSING.finditer(tail)} - {""})
    hosts = unreachable_hosts(lines)
    if hosts:
        message += (f"\n=> the build could not reach {', '.join(hosts)} from this machine: run it "
                    "where that host is reachable (or give the image prebuilt: docker load)")
    elif missing and replaced:
        message += (f"\n=> apt package(s) {', '.join(missing)} do not exist in Debian "
                    f"{debian.SUITE}, the stand-in for {', '.join(replaced)}: make the real image "
                    f"available (docker pull {replaced[0]}, or docker load) or use the Debian "
                    "package names")
    elif replaced:
        message += (f"\n=> built on the Debian stand-in for {', '.join(replaced)}: the task may "
                    f"need that image itself (docker pull {replaced[0]}, or docker load)")
    return message
