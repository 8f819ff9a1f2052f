"""Sandbox backends by name, and what a backend owns beyond the :class:`~tr.envs.sandbox.Sandbox`
protocol: how a task's environment is made on it.

    backend = get_backend("docker")          # a name, or "package.module" holding BACKEND
    with backend.make(config) as box: ...    # = make_sandbox("docker", config)

A backend is one module that defines its sandbox class and ``BACKEND``, a :class:`Backend`
instance.  ``local`` (``tr.envs.local``, bubblewrap) and ``docker`` (``tr.envs.docker_sandbox``)
are known by name; another backend is one new file, used by its module path (``--backend
mypkg.remote_docker``) or after :func:`register_backend`.  Callers (``tr.envs.tasks.runner``,
``tr.agent.rollout``) ask the backend object, never compare backend names.

This module imports no backend until one is asked for, and ``tr.envs.sandbox`` imports neither
(no import circle: ``tests/test_sandbox_conformance.py`` checks it).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

from tr.envs.sandbox import Sandbox, SandboxConfig, Snapshot
from tr.envs.sandbox import SandboxError, snapshot_fields
from tr.envs.workspace import remove_tree

_KNOWN = {"local": "tr.envs.local", "docker": "tr.envs.docker_sandbox"}
BACKENDS = tuple(_KNOWN)
_LOADED: dict[str, "Backend"] = {}     # names and module paths already resolved


class Backend:
    """What differs between backends for the code above the sandbox.

    ``builds_images``: a task's Dockerfile becomes an image the sandbox starts from
    (:meth:`task_image`); otherwise the sandbox carries the Dockerfile's steps out itself after it
    starts (``tr.envs.tasks.runner.prepare``), and a task that only names an image cannot run.
    ``disk_is_memory``: ``SandboxConfig.disk_mb`` is a tmpfs (RAM), so a task's storage size is
    not applied as the disk limit.  ``endpoints``: sandboxes can be placed on several engines
    (``SandboxConfig.docker_endpoint``, ``tr.envs.endpoints``).  ``network_sibling``: its
    sandboxes' :meth:`~tr.envs.sandbox.Sandbox.network_sibling` works, so the protected verifier
    can run tests that talk to the agent's servers beside the agent's live processes
    (``tr.envs.protected.run_verifier(beside_agent=True)``); otherwise those servers are ended
    with every agent process before the tests.
    """

    name = ""
    builds_images = False
    disk_is_memory = False
    endpoints = False
    network_sibling = False

    def sandbox_class(self) -> type:
        raise NotImplementedError

    def make(self, config: SandboxConfig | None = None) -> Sandbox:
        """A not-yet-started sandbox of this backend."""
        config = SandboxConfig() if config is None else config
        if not isinstance(config, SandboxConfig):
            raise TypeError(f"make_sandbox: config must be a SandboxConfig, "
                            f"got {type(config).__name__}")
        return self.sandbox_class()(config)

    def task_image(self, dockerfile: Path, context: Path, *, notes: list[str],
                   log: Callable[[str], None], timeout_s: float | None,
                   config: SandboxConfig) -> str:
        """The image built from a task's Dockerfile (``builds_images`` backends only); a line
        per way it differs from the task's own (a stand-in base) appended to ``notes``."""
        raise NotImplementedError(f"the {self.name} backend builds no images")

    def discard_snapshot(self, snapshot: Snapshot) -> None:
        """Delete a (persistent) snapshot's host folder (and whatever else the backend made)."""
        remove_snapshot_folder(snapshot)

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


def register_backend(name: str, module: str) -> None:
    """Make ``name`` stand for the backend defined in ``module`` (its ``BACKEND``)."""
    if not (isinstance(name, str) and name.isidentifier()):
        raise ValueError(f"register_backend: name must be an identifier, got {name!r}")
    _KNOWN[name] = module


def get_backend(backend: "str | Backend") -> Backend:
    """The backend object for a name ('local', 'docker', a registered one) or a module path."""
    if isinstance(backend, Backend):
        _LOADED.setdefault(backend.name, backend)
        return backend
    if isinstance(backend, str) and backend in _LOADED:
        return _LOADED[backend]
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(_KNOWN)} or a "
                         "module path defining BACKEND")
    module_name = _KNOWN.get(backend, backend)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"unknown backend {backend!r}; expected one of {sorted(_KNOWN)} or a "
                         f"module path defining BACKEND (importing {module_name}: {exc})") from None
    found = getattr(module, "BACKEND", None)
    if not isinstance(found, Backend):
        raise ValueError(f"backend {backend!r}: {module_name} defines no BACKEND "
                         "(a tr.envs.backends.Backend)")
    _LOADED[backend] = found
    _LOADED.setdefault(found.name, found)      # a sandbox names its backend by name
    return found


def make_sandbox(backend: "str | Backend", config: SandboxConfig | None = None) -> Sandbox:
    """A not-yet-started sandbox of ``backend`` ('local', 'docker', ...)."""
    return get_backend(backend).make(config)


def discard_snapshot(snapshot: Snapshot) -> None:
    """Delete a (persistent) snapshot: its host folder and whatever its backend made for it."""
    snapshot = snapshot_fields(snapshot)
    try:
        backend = get_backend(snapshot.backend)
    except ValueError:
        remove_snapshot_folder(snapshot)
        return
    backend.discard_snapshot(snapshot)


def remove_snapshot_folder(snapshot: Snapshot) -> None:
    """Delete a snapshot's host folder (any depth); a missing one is fine."""
    import os

    if snapshot.location and os.path.isdir(snapshot.location):
        try:                          # iterative: a snapshot may hold a tree of any depth
            remove_tree(Path(snapshot.location))
        except SandboxError:
            pass
