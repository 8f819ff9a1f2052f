"""Sandboxes across several Docker engines (``tr.envs.endpoints`` + the rollout engine).

Two real endpoints of this machine's engine: its socket, and a TCP listener on 127.0.0.1 that
this test opens (a thread forwarding each connection to the socket).  Stopping the listener and
dropping its connections is the endpoint going away; starting it again on the same port is the
endpoint coming back.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time

import pytest

from tr.agent.harness import EpisodeSpec
from tr.agent.records import EpisodeStatus
from tr.agent.rollout import RolloutConfig, TaskEnv, group_specs, run_rollouts
from tr.agent.transcript import ChatLayout
from tr.envs.endpoints import EndpointPool, answers, endpoint_client, resolve_endpoint
from tr.envs.backends import make_sandbox
from tr.envs.sandbox import SandboxConfig, SandboxError
from tr.envs.workspace import owner_id

from docker_engines import EngineUnavailable, SocketProxy, second_dockerd

SOCKET = "unix:///var/run/docker.sock"
SMALL = dict(memory_mb=512, pids=128, disk_mb=64, file_size_mb=256, cpu_time_s=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _our_containers() -> list[str]:
    """Containers of this process on the engine (through its socket, independent of tr)."""
    import docker
    client = docker.DockerClient(base_url=SOCKET)
    try:
        return [c["Id"] for c in client.api.containers(
            all=True, filters={"label": f"tr.owner={owner_id()}"})]
    finally:
        client.close()


@pytest.fixture(scope="module")
def engine():
    """The engine at its socket answers and has the base image (built if needed)."""
    if not answers(SOCKET):
        pytest.skip(f"NO DOCKER ENGINE AT {SOCKET} -- docker endpoints untested")
    from tr.envs.images import ensure_base_image
    try:
        ensure_base_image()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"NO BASE IMAGE -- docker endpoints untested: {type(e).__name__}: {e}")


@pytest.fixture
def proxy(engine):
    p = SocketProxy()
    yield p
    p.stop()
    import docker
    client = docker.DockerClient(base_url=SOCKET)    # a failed test leaks nothing either
    for cid in _our_containers():
        client.api.remove_container(cid, force=True)
    client.close()


# ----------------------------------------------------------------------------------------------
# Names.

def test_urls_contexts_and_bad_names(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "cfg"))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert resolve_endpoint(SOCKET).url == SOCKET
    assert resolve_endpoint(" tcp://127.0.0.1:2375 ").url == "tcp://127.0.0.1:2375"
    assert resolve_endpoint("default").url == SOCKET
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.1.2.3:2375")
    assert resolve_endpoint("default").url == "tcp://10.1.2.3:2375"
    # A context as the docker CLI writes it (the CLI itself when installed).
    port = _free_port()
    if shutil.which("docker"):
        subprocess.run(["docker", "context", "create", "tr-remote", "--docker",
                        f"host=tcp://127.0.0.1:{port}"], check=True, capture_output=True,
                       env={**os.environ, "DOCKER_CONFIG": str(tmp_path / "cfg")})
    else:
        import hashlib
        meta = tmp_path / "cfg/contexts/meta" / hashlib.sha256(b"tr-remote").hexdigest()
        meta.mkdir(parents=True)
        (meta / "meta.json").write_text(json.dumps(
            {"Name": "tr-remote", "Endpoints": {"docker": {"Host": f"tcp://127.0.0.1:{port}"}}}))
    ep = resolve_endpoint("tr-remote")
    assert (ep.name, ep.url, ep.tls_dir) == ("tr-remote", f"tcp://127.0.0.1:{port}", None)
    with pytest.raises(ValueError, match=r"'no-such-context'.*does not exist"):
        resolve_endpoint("no-such-context")
    for bad in ("", "  ", None, 3):
        with pytest.raises(ValueError, match="URL or a context name"):
            resolve_endpoint(bad)
    with pytest.raises(ValueError, match="listed twice"):
        EndpointPool([SOCKET, SOCKET])
    with pytest.raises(ValueError, match="non-empty list"):
        EndpointPool([])
    with pytest.raises(ValueError, match="non-empty list"):
        EndpointPool(SOCKET)
    with pytest.raises(ValueError, match="docker_endpoint"):
        SandboxConfig(docker_endpoint="")
    with pytest.raises(ValueError, match=r"needs a backend with engine endpoints \('docker'\), not 'local'"):
        TaskEnv("local", None, [SOCKET])
    # Nothing answers on that port: a clear error naming the endpoint, not a traceback.
    with pytest.raises(SandboxError, match=r"'tr-remote' \(tcp://127.0.0.1:\d+\) does not answer"):
        endpoint_client("tr-remote", timeout=5)
    # The experiment knob: checked before anything runs.
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), "..", "experiments", "evaluate.py")
    spec = importlib.util.spec_from_file_location("experiment_evaluate", path)
    experiment = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(experiment)
    from tr.stages.evaluate import docker_endpoints
    from tr.stages.registry import ConfigError
    config = experiment.get_config("docker").eval
    assert docker_endpoints(config) == ()
    config.docker_endpoints = (SOCKET, "tr-remote")
    assert docker_endpoints(config) == (SOCKET, "tr-remote")
    config.docker_endpoints = (SOCKET, "no-such-context")
    with pytest.raises(ConfigError, match=r"config.eval.docker_endpoints: .*'no-such-context'"):
        docker_endpoints(config)
    config = experiment.get_config("quick").eval
    config.docker_endpoints = (SOCKET,)
    with pytest.raises(ConfigError, match=r"needs a backend with engine endpoints .*'local' backend has none"):
        docker_endpoints(config)


def test_eval_endpoints_ask_the_backend_object_not_its_name():
    """config.eval.docker_endpoints is accepted for any backend whose object says it has engine
    endpoints (a third backend, known by a name that is not 'docker'), refused for one that has
    none, and an unknown backend name is a ConfigError naming the field."""
    import importlib.util
    from tr.envs.backends import Backend, get_backend
    from tr.stages.evaluate import docker_endpoints
    from tr.stages.registry import ConfigError

    class Engines(Backend):
        name, endpoints = "engines_for_eval_test", True

    class NoEngines(Backend):
        name = "no_engines_for_eval_test"

    get_backend(Engines())
    get_backend(NoEngines())
    path = os.path.join(os.path.dirname(__file__), "..", "experiments", "evaluate.py")
    spec = importlib.util.spec_from_file_location("experiment_evaluate", path)
    experiment = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(experiment)
    config = experiment.get_config("quick").eval
    config.docker_endpoints = (SOCKET,)
    config.backend = "engines_for_eval_test"
    assert docker_endpoints(config) == (SOCKET,)
    config.backend = "no_engines_for_eval_test"
    with pytest.raises(ConfigError, match=r"'no_engines_for_eval_test' backend has none"):
        docker_endpoints(config)
    config.backend = "no.such.backend"
    with pytest.raises(ConfigError, match=r"config.eval.backend = 'no.such.backend': unknown backend"):
        docker_endpoints(config)


def test_a_sandbox_through_a_context_on_the_tcp_endpoint(proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "cfg"))
    import hashlib
    meta = tmp_path / "cfg/contexts/meta" / hashlib.sha256(b"tr-proxy").hexdigest()
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps(
        {"Name": "tr-proxy", "Endpoints": {"docker": {"Host": proxy.url}}}))
    with make_sandbox("docker", SandboxConfig(docker_endpoint="tr-proxy", **SMALL)) as box:
        assert box.run("echo through-$((6*7))").output == "through-42\n"
        snap = box.snapshot()
        assert snap.endpoint == "tr-proxy"
    assert _our_containers() == []


# ----------------------------------------------------------------------------------------------
# Placement.

def test_fewest_live_sandboxes_first_ties_round_robin_dead_skipped(proxy):
    dead = f"tcp://127.0.0.1:{_free_port()}"
    pool = EndpointPool([SOCKET, dead, proxy.url], cooldown_s=60)
    got = [pool.acquire().name for _ in range(4)]
    assert got == [SOCKET, proxy.url, SOCKET, proxy.url]       # the dead one was pinged, skipped
    status = {s["name"]: s for s in pool.status()}
    assert not status[dead]["up"] and "no answer" in status[dead]["down_reason"]
    assert (status[SOCKET]["live"], status[proxy.url]["live"]) == (2, 2)
    pool.release(SOCKET)
    pool.release(SOCKET)
    assert [pool.acquire().name for _ in range(3)] == [SOCKET, SOCKET, proxy.url]
    assert pool.acquire(exclude=[SOCKET]).name == proxy.url
    proxy.stop()
    assert not pool.check(proxy.url)
    assert [pool.acquire().name for _ in range(2)] == [SOCKET, SOCKET]
    with pytest.raises(SandboxError, match="no healthy docker endpoint"):
        pool.acquire(exclude=[SOCKET])
    # Back after the cool-down: a pinged endpoint that answers is placed on again.
    proxy.start()
    pool.cooldown_s = 0.0
    pool.mark_down(proxy.url, "test")
    assert pool.acquire().name == proxy.url
    assert pool.ensure_image(proxy.url, None)                    # the base image: there
    with pytest.raises(SandboxError, match="on no healthy docker endpoint"):
        pool.ensure_image(proxy.url, "tr-no-such-image:0")


def test_concurrent_first_placements_wait_for_the_pings(proxy):
    """Episodes start together: while one caller pings the not-yet-asked endpoints the others
    wait for its answers instead of finding no healthy endpoint."""
    from concurrent.futures import ThreadPoolExecutor
    dead = f"tcp://127.0.0.1:{_free_port()}"
    pool = EndpointPool([dead, SOCKET, proxy.url], cooldown_s=60)
    with ThreadPoolExecutor(8) as ex:
        got = list(ex.map(lambda _: pool.acquire().name, range(8)))
    assert sorted(got) == sorted([SOCKET] * 4 + [proxy.url] * 4)


# ----------------------------------------------------------------------------------------------
# Images: a second, separate engine of this machine (its own dockerd and image store).

@pytest.fixture
def second_engine(engine):
    """A second Docker daemon (own data root, containerd, socket; no network), stopped after."""
    try:
        with second_dockerd() as url:
            yield url
    except EngineUnavailable as e:
        pytest.skip(f"NO SECOND DOCKER ENGINE -- copying images between engines untested: {e}")


def test_images_are_copied_to_an_engine_that_lacks_them(second_engine):
    import io
    import secrets
    import tarfile

    import docker
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"tr endpoint test\n"
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    tag = f"tr-endpoint-test:{secrets.token_hex(4)}"
    one = docker.DockerClient(base_url=SOCKET)
    two = docker.DockerClient(base_url=second_engine)
    try:
        one.api.import_image_from_data(buf.getvalue(), repository=tag.split(":")[0],
                                       tag=tag.split(":")[1])
        image_id = one.images.get(tag).id
        with pytest.raises(docker.errors.ImageNotFound):
            two.images.get(tag)
        pool = EndpointPool([SOCKET, second_engine])
        pool.ensure_image(second_engine, tag)                  # by tag (a task image)
        assert two.images.get(tag).id == image_id
        two.images.remove(tag, force=True)
        pool.ensure_image(second_engine, image_id)             # by id (a snapshot image)
        assert two.images.get(image_id).id == image_id
        one.images.remove(tag, force=True)
        with pytest.raises(docker.errors.ImageNotFound):
            one.images.get(image_id)
        pool.ensure_image(second_engine, image_id)             # present: nothing to copy
        pool.ensure_image(SOCKET, image_id)                    # and back the other way
        assert one.images.get(image_id).id == image_id
        for client in (one, two):
            client.images.remove(image_id, force=True)
        with pytest.raises(SandboxError, match="on no healthy docker endpoint"):
            pool.ensure_image(SOCKET, image_id)
        assert not pool.ensure_image(SOCKET, image_id, required=False)
    finally:
        for client in (one, two):
            for ref in (tag, locals().get("image_id")):
                try:
                    if ref:
                        client.images.remove(ref, force=True)
                except docker.errors.APIError:
                    pass
            client.close()


# ----------------------------------------------------------------------------------------------
# The rollout engine over two endpoints, one of which goes away mid-episode.

class GatedEnv(TaskEnv):
    """The real TaskEnv; every episode waits after its sandbox is up and the task laid down until
    the test lets it go (so the endpoint can go away mid-episode, deterministically)."""

    def __init__(self, *a, episodes: int, **kw):
        super().__init__(*a, **kw)
        self.opened = threading.Barrier(episodes + 1, timeout=120)
        self.go = threading.Event()

    def open(self, spec: EpisodeSpec):
        sandbox = super().open(spec)
        if not self.go.is_set():
            self.opened.wait()
            self.go.wait(120)
        return sandbox


def test_rollouts_spread_over_two_engines_and_survive_one_going_away(proxy):
    from tr.agent.policies import ScriptedPolicy
    from tr.envs.tasks import load_suite
    from tr.models.tokenizer import ByteTokenizer

    task = next(t for t in load_suite() if t.id == "data-csv-to-json")   # python3 only
    layout = ChatLayout(ByteTokenizer())
    endpoints = [SOCKET, proxy.url]
    env = GatedEnv("docker", SandboxConfig(**SMALL), endpoints, endpoint_cooldown_s=1.0,
                   episodes=4)
    cfg = RolloutConfig(backend="docker", concurrency=4, progress=False,
                        docker_endpoints=tuple(endpoints))
    result = {}
    runner = threading.Thread(target=lambda: result.update(out=run_rollouts(
        group_specs([task], 4), ScriptedPolicy([task]), layout, cfg, env=env)))
    runner.start()
    try:
        env.opened.wait()                       # 4 sandboxes up, tasks laid down, no turn yet
        live = {s["name"]: s["live"] for s in env.pool.status()}
        assert live == {SOCKET: 2, proxy.url: 2}
        assert len(_our_containers()) == 4
        proxy.stop()                            # the TCP endpoint goes away mid-episode
    finally:
        env.go.set()
        runner.join(120)
    out = result["out"]
    by_endpoint: dict[str, list] = {SOCKET: [], proxy.url: []}
    for rec in out.records:
        by_endpoint[env.placements[rec.episode_id]].append(rec)
    assert [len(v) for v in by_endpoint.values()] == [2, 2]
    for rec in by_endpoint[proxy.url]:          # the harness's failure: not counted, not trained
        assert rec.status is EpisodeStatus.INFRA_FAILURE and not rec.status.counts, rec.error
        assert rec.passed is None and "sandbox.run failed" in rec.error, rec.error
        assert "127.0.0.1" in rec.error and str(proxy.port) in rec.error, rec.error
    for rec in by_endpoint[SOCKET]:
        assert rec.status is EpisodeStatus.VERIFIED_PASS, rec.error
    from tr.agent.evaluation import summarise
    summary = summarise(out.records, [task], 4)
    assert summary["infra_failures"] == 2 and summary["tasks"][task.id]["valid"] == 2
    status = {s["name"]: s for s in env.pool.status()}
    assert not status[proxy.url]["up"] and status[proxy.url]["leftovers"] == 2
    assert status[SOCKET]["live"] == status[proxy.url]["live"] == 0
    # The containers of the episodes on the TCP endpoint are still on the engine: nobody could
    # remove them while it was away.
    assert len(_our_containers()) == 2

    # New episodes go to the surviving endpoint.
    again = run_rollouts(group_specs([task], 2, seed=1), ScriptedPolicy([task]), layout, cfg,
                         env=env)
    assert [r.status for r in again.records] == [EpisodeStatus.VERIFIED_PASS] * 2
    assert {env.placements[r.episode_id] for r in again.records} == {SOCKET}

    # The endpoint comes back: after the cool-down it is placed on again, and what it kept while
    # it was away is removed.
    proxy.start()
    time.sleep(1.0)
    back = [env.pool.acquire(), env.pool.acquire()]
    for ep in back:
        env.pool.release(ep)
    assert {ep.name for ep in back} == {SOCKET, proxy.url}
    assert {s["name"]: s["up"] for s in env.pool.status()} == {SOCKET: True, proxy.url: True}
    assert _our_containers() == []
    env.shutdown()
    assert not env.open_sandboxes
