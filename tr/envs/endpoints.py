"""Several Docker engines for one rollout: a pool of endpoints, balanced by load.

An endpoint is named as the Docker CLI names one: a ``DOCKER_HOST`` URL (``unix:///var/run/
docker.sock``, ``tcp://10.0.0.7:2375``, ``ssh://user@host``) or a docker context name, resolved
from the CLI's context store (``$DOCKER_CONFIG`` or ``~/.docker``: ``contexts/meta/<sha256(name)>/
meta.json``, TLS files in ``contexts/tls/<sha256(name)>/docker/``), ``default`` being
``$DOCKER_HOST`` or the local socket.  A sandbox on an endpoint gets it through
``SandboxConfig.docker_endpoint``.

:class:`EndpointPool` places each new sandbox on the healthy endpoint with the fewest live
sandboxes (ties go round-robin).  An endpoint that stops answering is marked down; it is asked
again (``/_ping``) after ``cooldown_s`` and comes back when it answers.  Containers and images
that could not be removed while it was away are removed then (or by :meth:`EndpointPool.close`).
Images a sandbox needs are made present on its endpoint: the base image is built there
(``ensure_base_image``), any other image is copied (``docker save`` -> ``docker load``) from an
endpoint that has it.

The Docker sandbox works on its engine's containers from the host (``/proc/<pid>/root``, the
container's cgroups, bind-mounted host folders), so every endpoint must be an engine whose
containers run on this machine's kernel: several daemons, rootless engines, a socket forwarded
over TCP or SSH.  An engine on another machine is refused at sandbox start with a clear error.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tr.envs.images.base import base_image_tag as tag
from tr.envs.sandbox import SandboxError

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
NOT_ASKED = "not asked yet"
URL_SCHEMES = ("unix://", "tcp://", "http://", "https://", "ssh://", "npipe://")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One Docker engine: ``name`` as given (URL or context name), ``url`` for docker-py, and the
    TLS material of a context (``tls_dir`` holding ``ca.pem``/``cert.pem``/``key.pem``)."""

    name: str
    url: str
    tls_dir: str | None = None
    skip_tls_verify: bool = False


def docker_config_dir() -> Path:
    return Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")


@functools.lru_cache(maxsize=64)
def _resolve(spec: str, config_dir: str, docker_host: str) -> Endpoint:
    if spec.startswith(URL_SCHEMES):
        return Endpoint(name=spec, url=spec)
    if spec == "default":
        return Endpoint(name=spec, url=docker_host or DEFAULT_SOCKET)
    digest = hashlib.sha256(spec.encode()).hexdigest()
    meta = Path(config_dir) / "contexts" / "meta" / digest / "meta.json"
    try:
        data = json.loads(meta.read_text())
        docker_ep = data["Endpoints"]["docker"]
        host = docker_ep["Host"]
    except FileNotFoundError:
        raise ValueError(f"docker endpoint {spec!r}: not a URL ({', '.join(URL_SCHEMES)}) and no "
                         f"docker context of that name ({meta} does not exist)") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"docker endpoint {spec!r}: cannot read its context {meta}: "
                         f"{type(e).__name__}: {e}") from None
    if not isinstance(host, str) or not host.startswith(URL_SCHEMES):
        raise ValueError(f"docker context {spec!r} ({meta}): Endpoints.docker.Host {host!r} is "
                         "not a Docker URL")
    tls = Path(config_dir) / "contexts" / "tls" / digest / "docker"
    return Endpoint(name=spec, url=host, tls_dir=str(tls) if tls.is_dir() else None,
                    skip_tls_verify=bool(docker_ep.get("SkipTLSVerify", False)))


def resolve_endpoint(spec: "str | Endpoint") -> Endpoint:
    """The :class:`Endpoint` a URL or docker context name stands for (ValueError naming it when
    it is neither)."""
    if isinstance(spec, Endpoint):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"docker endpoint must be a URL or a context name, got {spec!r}")
    return _resolve(spec.strip(), str(docker_config_dir()), os.environ.get("DOCKER_HOST", ""))


def endpoint_client(spec: "str | Endpoint", timeout: float = 120):
    """A docker-py client of one endpoint that answered a ping (SandboxError naming it if not)."""
    import docker
    ep = resolve_endpoint(spec)
    tls = False
    if ep.tls_dir is not None:
        d = Path(ep.tls_dir)
        cert = (str(d / "cert.pem"), str(d / "key.pem")) if (d / "cert.pem").is_file() else None
        ca = str(d / "ca.pem") if (d / "ca.pem").is_file() else None
        tls = docker.tls.TLSConfig(client_cert=cert, ca_cert=ca,
                                   verify=bool(ca) and not ep.skip_tls_verify)
    client = None
    try:
        client = docker.DockerClient(base_url=ep.url, tls=tls, timeout=timeout)
        client.ping()
        return client
    except Exception as e:  # noqa: BLE001 - any failure means the same to the caller
        if client is not None:
            client.close()
        raise SandboxError(f"docker endpoint {ep.name!r} ({ep.url}) does not answer "
                           f"({type(e).__name__}: {e})") from None


def answers(spec: "str | Endpoint", timeout: float = 5.0) -> bool:
    """Whether an endpoint answers a ping within ``timeout`` seconds."""
    try:
        endpoint_client(spec, timeout=timeout).close()
        return True
    except SandboxError:
        return False


@functools.cache
def base_image_tag() -> str:
    """The tag of the base image this host's packages make (``tr.envs.images``), computed once."""
    return tag()


@dataclasses.dataclass
class _State:
    endpoint: Endpoint
    live: int = 0
    placed: int = 0                # sandboxes ever placed here
    down_until: float = 0.0        # monotonic time before which it is not asked again
    down_reason: str = NOT_ASKED    # "": up; every endpoint is pinged before its first use
    leftovers: list = dataclasses.field(default_factory=list)   # [(kind, id)] to remove
    probing: bool = False          # a caller of acquire is pinging it now

    @property
    def up(self) -> bool:
        return not self.down_reason

    @property
    def failed(self) -> bool:
        """Seen not answering (not merely not asked yet)."""
        return bool(self.down_reason) and self.down_reason != NOT_ASKED


class EndpointPool:
    """Where each new sandbox goes (see module doc).  Thread-safe."""

    def __init__(self, endpoints: Sequence, *, cooldown_s: float = 30.0,
                 probe_timeout_s: float = 5.0):
        if isinstance(endpoints, str) or not endpoints:
            raise ValueError(f"docker endpoints must be a non-empty list of URLs or context "
                             f"names, got {endpoints!r}")
        if not cooldown_s >= 0:
            raise ValueError(f"cooldown_s must be >= 0, got {cooldown_s!r}")
        resolved = [resolve_endpoint(e) for e in endpoints]
        names = [e.name for e in resolved]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"docker endpoints listed twice: {dup}")
        self.cooldown_s, self.probe_timeout_s = cooldown_s, probe_timeout_s
        self._states = [_State(e) for e in resolved]
        self._lock = threading.Lock()
        self._probed = threading.Condition(self._lock)
        self._next = 0                 # round-robin start among ties

    @property
    def endpoints(self) -> list[Endpoint]:
        return [s.endpoint for s in self._states]

    def _state(self, endpoint) -> _State:
        name = resolve_endpoint(endpoint).name
        for s in self._states:
            if s.endpoint.name == name:
                return s
        raise KeyError(f"{name!r} is not an endpoint of this pool")

    # --- placement -----------------------------------------------------------------------------
    def acquire(self, exclude: Sequence = ()) -> Endpoint:
        """The healthy endpoint with the fewest live sandboxes (ties: round-robin), counted as one
        more live sandbox until :meth:`release`.  Endpoints down past their cool-down are pinged
        first and come back if they answer.  SandboxError when none is healthy."""
        skip = {resolve_endpoint(e).name for e in exclude}
        while True:
            now = time.monotonic()
            with self._lock:                       # one caller pings a due endpoint at a time
                due = [s for s in self._states if not s.up and not s.probing
                       and s.down_until <= now and s.endpoint.name not in skip]
                for s in due:
                    s.probing = True
            for s in due:                          # outside the lock: a ping can take a while
                try:
                    self._probe(s)
                finally:
                    with self._lock:
                        s.probing = False
                        self._probed.notify_all()
            with self._lock:
                healthy = [i for i, s in enumerate(self._states)
                           if s.up and s.endpoint.name not in skip]
                asking = [s for s in self._states if s.probing and s.endpoint.name not in skip]
                # Before any endpoint's first answer is in, nobody places (the load would not
                # balance); later pings of endpoints that went away hold nobody up.
                if healthy and not any(s.down_reason == NOT_ASKED for s in asking):
                    n = len(self._states)
                    order = sorted(healthy,
                                   key=lambda i: (self._states[i].live, (i - self._next) % n))
                    chosen = self._states[order[0]]
                    self._next = (order[0] + 1) % n
                    chosen.live += 1
                    chosen.placed += 1
                    return chosen.endpoint
                if asking:
                    self._probed.wait(self.probe_timeout_s + 1)   # another caller's ping
                    continue
                why = "; ".join(f"{s.endpoint.name}: {s.down_reason or 'excluded'}"
                                for s in self._states)
                raise SandboxError(f"no healthy docker endpoint ({why})")

    def release(self, endpoint, leftovers: Sequence = ()) -> None:
        """One live sandbox of ``endpoint`` is gone.  ``leftovers``: ``(kind, id)`` of containers
        / images its close could not remove (the endpoint stopped answering): the endpoint is
        checked, and they are removed now or once it answers again."""
        s = self._state(endpoint)
        with self._lock:
            s.live = max(0, s.live - 1)
            s.leftovers.extend(leftovers)
        if leftovers:
            self.check(endpoint)

    def check(self, endpoint, why: str = "") -> bool:
        """Ping ``endpoint`` now; mark it down (for ``cooldown_s``) when it does not answer.
        Returns whether it answered."""
        return self._probe(self._state(endpoint), why)

    def mark_down(self, endpoint, why: str) -> None:
        s = self._state(endpoint)
        with self._lock:
            s.down_reason = why or "marked down"
            s.down_until = time.monotonic() + self.cooldown_s

    def _probe(self, s: _State, why: str = "") -> bool:
        ok = answers(s.endpoint, self.probe_timeout_s)
        with self._lock:
            if ok:
                s.down_reason, s.down_until = "", 0.0
                leftovers, s.leftovers = s.leftovers, []
            else:
                s.down_reason = why or f"no answer from {s.endpoint.url}"
                s.down_until = time.monotonic() + self.cooldown_s
                return False
        if leftovers:
            self._remove(s, leftovers)
        return True

    def _remove(self, s: _State, leftovers: list) -> None:
        import docker
        try:
            client = endpoint_client(s.endpoint, timeout=60)
        except SandboxError:
            with self._lock:
                s.leftovers.extend(leftovers)
            return
        failed = []
        try:
            for kind, ident in leftovers:
                try:
                    if kind == "container":
                        client.api.remove_container(ident, force=True)
                    else:
                        client.api.remove_image(ident, force=True)
                except docker.errors.NotFound:
                    pass
                except docker.errors.APIError as e:
                    if "already in progress" not in str(e):
                        failed.append((kind, ident))
                except Exception:  # noqa: BLE001 - gone again: keep for later
                    failed.append((kind, ident))
        finally:
            client.close()
        with self._lock:
            s.leftovers.extend(failed)

    # --- images --------------------------------------------------------------------------------
    def ensure_image(self, endpoint, image: str | None, *, required: bool = True) -> bool:
        """Make ``image`` present on ``endpoint``: nothing if it is there; else copied from
        another endpoint that has it (``docker save`` streamed into ``docker load``).  When no
        endpoint has it: SandboxError if ``required``, else False.  ``None``: the base image,
        copied if another endpoint has it (else the sandbox builds it there from host packages)."""
        if not image:
            image, required = base_image_tag(), False
        import docker
        dst = endpoint_client(endpoint)
        try:
            try:
                dst.images.get(image)
                return True
            except docker.errors.ImageNotFound:
                pass
            target = resolve_endpoint(endpoint).name
            for s in list(self._states):
                if s.endpoint.name == target or s.failed:
                    continue
                try:
                    src = endpoint_client(s.endpoint)
                except SandboxError:
                    continue
                try:
                    try:
                        src.images.get(image)
                    except docker.errors.ImageNotFound:
                        continue
                    dst.api.load_image(src.api.get_image(image, chunk_size=1 << 20))
                    dst.images.get(image)
                    return True
                finally:
                    src.close()
            if not required:
                return False
            raise SandboxError(f"image {image!r} is on no healthy docker endpoint "
                               f"(needed on {target!r})")
        finally:
            dst.close()

    # --- state ---------------------------------------------------------------------------------
    def status(self) -> list[dict]:
        """Per endpoint: name, url, live sandboxes, sandboxes placed, up, why down, leftovers."""
        with self._lock:
            return [{"name": s.endpoint.name, "url": s.endpoint.url, "live": s.live,
                     "placed": s.placed, "up": s.up, "down_reason": s.down_reason,
                     "leftovers": len(s.leftovers)} for s in self._states]

    def close(self) -> None:
        """Last try at removing what endpoints that went away kept (those still away keep it:
        the sandbox reaper of a later process removes it, its owner being dead)."""
        for s in self._states:
            with self._lock:
                leftovers, s.leftovers = s.leftovers, []
            if leftovers:
                self._remove(s, leftovers)
