"""Docker engines for tests and benchmarks: a TCP endpoint of the local engine, a second engine.

``SocketProxy``: a TCP listener on 127.0.0.1 forwarding every connection to the engine's unix
socket -- a second endpoint of the same engine that can be made to go away (``stop``) and come
back (``start``, same port).  ``second_dockerd``: a separate Docker daemon of this machine (own
data root, containerd, image store and socket; no network), for what must not assume one engine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time


class SocketProxy:
    """A TCP listener on 127.0.0.1 forwarding every connection to a unix socket (two pump threads
    per connection).  ``stop`` closes the listener and every forwarded connection."""

    def __init__(self, target: str = "/var/run/docker.sock", port: int = 0):
        self.target, self.port = target, port
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self) -> None:
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(64)
        self.port = ls.getsockname()[1]
        self.listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                conn, _ = ls.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # as dockerd's own
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                up.connect(self.target)
            except OSError:
                conn.close()
                continue
            with self.lock:
                self.conns += [conn, up]
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(1 << 16):
                b.sendall(data)
        except OSError:
            pass
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def stop(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)   # wakes the thread blocked in accept()
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()



class EngineUnavailable(RuntimeError):
    """No second engine can run here (no dockerd, not root, it did not start)."""


@contextlib.contextmanager
def second_dockerd(timeout_s: float = 30.0):
    """Yields the URL of a second dockerd; stops it and removes its folders after."""
    from tr.envs.endpoints import answers

    dockerd = shutil.which("dockerd")
    if dockerd is None or os.geteuid() != 0:
        raise EngineUnavailable("no dockerd, or not root")
    root = tempfile.mkdtemp(prefix="tr-d2-", dir="/tmp")     # short: socket paths <= 107 bytes
    url = f"unix://{root}/d.sock"
    with open(os.path.join(root, "config.json"), "w") as f:
        f.write("{}")                                     # not the system's daemon.json
    with open(os.path.join(root, "log"), "wb") as log:
        # its own network namespace: a dockerd started with `--bridge none` deletes the host's
        # docker0 at start-up (libnetwork's removeDefaultBridgeInterface), which broke the main
        # engine's bridge network for every later container with the network
        unshare = shutil.which("unshare")
        proc = subprocess.Popen(
            ([unshare, "--net"] if unshare else []) +
            [dockerd, "--config-file", f"{root}/config.json", "--data-root", f"{root}/data",
             "--exec-root", f"{root}/x", "--host", url, "--pidfile", f"{root}/d.pid",
             "--bridge", "none", "--iptables=false", "--ip-masq=false"],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout_s
        while not answers(url, timeout=2):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(root, "log"), errors="replace") as f:
                    raise EngineUnavailable(f"dockerd did not start: {f.read()[-600:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)
