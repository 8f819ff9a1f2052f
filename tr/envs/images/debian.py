"""The stand-in base image: a real Debian made from the Debian registry, for task Dockerfiles whose
``FROM`` image is neither here nor pullable.

``tr-debian:<hash>`` is a ``--variant=minbase`` bootstrap of Debian :data:`SUITE` from
:data:`MIRROR` (``mmdebstrap`` or ``debootstrap`` when installed; else the ``debootstrap`` package
is fetched from the same mirror and run from a cache folder) with :data:`PACKAGES` -- apt, python3
(also as ``python``), pip and venv -- so a Dockerfile's ``RUN apt-get install …`` and ``pip
install …`` work at build time.  The host's own added certificate authorities
(``/usr/local/share/ca-certificates``) are trusted in it too.  pip installs system-wide as in a python image (Debian's
``EXTERNALLY-MANAGED`` marker is removed).  The tag is a hash of the recipe (suite, mirror,
packages, version), so it is built once per machine: a file lock makes concurrent callers wait for
one build, and later ones find the image.  Bootstrapping needs root (debootstrap chroots).
"""

from __future__ import annotations

import fcntl
import hashlib
import lzma
import os
import re
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Callable

STANDIN_REPO = "tr-debian"
SUITE = "bookworm"
MIRROR = os.environ.get("TR_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = ("python3", "python3-pip", "python3-venv", "python-is-python3", "python3-dev",
            "build-essential", "ca-certificates", "curl", "procps", "less", "tmux",
            "fonts-dejavu-core")
# python3-dev + build-essential: pip builds sdists (C extensions) as in python images; tmux: the
# t-bench base images have it (TB1 runs agents in it and some tasks' tests call it);
# fonts-dejavu-core: a TrueType font with the Unicode chess glyphs, which PIL finds by name
# (`ImageFont.truetype("DejaVuSans.ttf")`: chess-best-move draws its board and reads it back).
RECIPE_VERSION = "3"
PYTHON_MINOR = "11"    # bookworm's python3
LABEL = "tr.managed"
IMPORT_CHANGES = [
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["/bin/bash"]',
]
DESCRIPTION = (f"Debian {SUITE} minbase + python3 (python), pip, venv, python3-dev, "
               "build-essential, curl, tmux, DejaVu fonts")


LOCAL_CAS = Path("/usr/local/share/ca-certificates")


def _local_cas() -> list[Path]:
    """Certificate authorities this host's admin added (a TLS-inspecting proxy's, a company's):
    the stand-in trusts them too, or `pip install` at build time fails where the host's works."""
    return sorted(p for p in LOCAL_CAS.rglob("*.crt") if p.is_file()) if LOCAL_CAS.is_dir() else []


def standin_tag() -> str:
    cas = [(p.name, p.read_bytes()) for p in _local_cas()]
    h = hashlib.sha256(repr((RECIPE_VERSION, SUITE, MIRROR, PACKAGES, cas)).encode()).hexdigest()[:12]
    return f"{STANDIN_REPO}:{h}"


def cache_dir() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tr" / "images"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _image_exists(client, tag: str) -> bool:
    import docker
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_standin_image(client, log: Callable[[str], None] | None = None) -> str:
    """The stand-in's tag, bootstrapping and importing it first when this machine lacks it."""
    log = log or (lambda m: None)
    tag = standin_tag()
    if _image_exists(client, tag):
        return tag
    lock_path = cache_dir() / f"{tag.replace(':', '-')}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)      # one build per machine; the others wait for it
        if _image_exists(client, tag):
            return tag
        _build(client, tag, log)
    return tag


def _bootstrapper(log) -> list[str]:
    """The command that bootstraps a root folder: mmdebstrap / debootstrap on PATH, else the
    debootstrap package of the mirror, unpacked into the cache."""
    for name in ("mmdebstrap", "debootstrap"):
        path = shutil.which(name)
        if path:
            return [path]
    index = f"{MIRROR}/dists/{SUITE}/main/binary-all/Packages.xz"
    log(f"fetching debootstrap from {MIRROR} (none installed)")
    with urllib.request.urlopen(index, timeout=60) as response:
        text = lzma.decompress(response.read()).decode("utf-8", "replace")
    stanza = re.search(r"^Package: debootstrap\n(?:.+\n)*?Filename: (\S+)", text, re.M)
    if not stanza:
        raise RuntimeError(f"no debootstrap package in {index}")
    filename = stanza.group(1)
    dest = cache_dir() / "debootstrap" / Path(filename).stem
    script = dest / "usr" / "sbin" / "debootstrap"
    if not script.is_file():
        tmp = Path(tempfile.mkdtemp(prefix="debootstrap.", dir=cache_dir()))
        deb = tmp / "debootstrap.deb"
        with urllib.request.urlopen(f"{MIRROR}/{filename}", timeout=120) as response:
            deb.write_bytes(response.read())
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp / "root")], check=True,
                       capture_output=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(tmp / "root", dest)
        shutil.rmtree(tmp, ignore_errors=True)
    return ["env", f"DEBOOTSTRAP_DIR={dest}/usr/share/debootstrap", str(script)]


def _build(client, tag: str, log) -> None:
    if os.geteuid() != 0 and not shutil.which("mmdebstrap"):
        raise RuntimeError(f"building the stand-in base image {tag} needs root (debootstrap) or "
                           "mmdebstrap (apt-get install mmdebstrap); or make the task's FROM "
                           "image available (docker pull / docker load)")
    tool = _bootstrapper(log)
    log(f"bootstrapping {tag}: {DESCRIPTION} from {MIRROR} (about a minute, once per machine)")
    with tempfile.TemporaryDirectory(prefix="tr-debian-", dir=cache_dir()) as tmp:
        root, tar = Path(tmp) / "rootfs", Path(tmp) / "rootfs.tar"
        include = "--include=" + ",".join(PACKAGES)
        if tool[-1].endswith("mmdebstrap") and os.geteuid() != 0:
            cmd = [*tool, "--variant=minbase", include,
                   '--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
                   SUITE, str(tar), MIRROR]
        else:
            cmd = [*tool, "--variant=minbase", include, SUITE, str(root), MIRROR]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"bootstrapping Debian {SUITE} failed ({' '.join(cmd[-4:])}):\n"
                               f"{(proc.stdout + proc.stderr)[-2000:]}")
        if root.is_dir():
            _finish(root)
            subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tar), "."],
                           check=True)
        repo, version = tag.split(":")
        log(f"importing {tar.stat().st_size / 1e6:.0f} MB as {tag}")
        client.api.import_image_from_file(str(tar), repository=repo, tag=version,
                                          changes=IMPORT_CHANGES + [f"LABEL {LABEL}=standin"])
    if not _image_exists(client, tag):
        raise RuntimeError(f"docker import did not produce {tag}")


def _finish(root: Path) -> None:
    """pip installs system-wide (as in python images), no package lists or caches kept."""
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    for folder in ("var/lib/apt/lists", "var/cache/apt/archives"):
        for entry in (root / folder).glob("*"):
            if entry.is_file():
                entry.unlink()
    (root / "etc" / "apt" / "sources.list").write_text(
        f"deb {MIRROR} {SUITE} main\ndeb {MIRROR} {SUITE}-updates main\n"
        f"deb {MIRROR}-security {SUITE}-security main\n")
    (root / "etc" / "hostname").write_text("tr-sandbox\n")
    cas = _local_cas()
    if cas:
        dest = root / "usr" / "local" / "share" / "ca-certificates"
        dest.mkdir(parents=True, exist_ok=True)
        for ca in cas:
            shutil.copyfile(ca, dest / ca.name)
        subprocess.run(["chroot", str(root), "update-ca-certificates"], check=True,
                       capture_output=True)
