"""An OpenAI-compatible chat server that serves a ``tr`` policy (scripted teacher or the JAX model).

Endpoints: ``POST /v1/chat/completions`` (``model``, ``messages``, ``max_tokens``; ``metadata.task_id``
helps the scripted policy find its task) and ``GET /v1/models``.  Concurrent requests are batched
into one policy call (:class:`~tr.agent.policies.RequestBatcher`).  Binds 127.0.0.1 by default.

    python -m tr.agent.server --policy scripted --port 8000
    python -m tr.agent.server --policy model --model tiny --port 8000
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tr.agent.harness import GenerationRequest
from tr.agent.policies import Policy, RequestBatcher
from tr.agent.transcript import ChatLayout, transcript_from_messages


class PolicyFailure(RuntimeError):
    """The policy could not produce a completion (HTTP 500)."""


class ChatServer:
    """A running server; ``url`` is the API root (``http://127.0.0.1:PORT/v1``).  Use as a context
    manager or call :meth:`close`."""

    def __init__(self, policy: Policy, layout: ChatLayout, *, host: str = "127.0.0.1", port: int = 0,
                 model_name: str | None = None, max_output_tokens: int = 1024,
                 batch_window_s: float = 0.02):
        self.policy, self.layout = policy, layout
        self.model_name = model_name or policy.name
        self.max_output_tokens = max_output_tokens
        self.batcher = RequestBatcher(policy, window_s=batch_window_s)
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="chat-server", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)
        self.batcher.close()

    def __enter__(self) -> "ChatServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------
    def complete(self, body: dict) -> dict:
        """One chat completion; raises ValueError with a message naming the bad field."""
        if not isinstance(body, dict):
            raise ValueError("request body: expected a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("field 'messages': expected a non-empty list")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", self.max_output_tokens))
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"field 'max_tokens': expected a positive integer, got {max_tokens!r}")
        max_tokens = min(max_tokens, self.max_output_tokens)
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict):
            raise ValueError("field 'metadata': expected an object")
        seed = body.get("seed", 0)
        if not isinstance(seed, int):
            raise ValueError(f"field 'seed': expected an integer, got {seed!r}")
        tr = transcript_from_messages(self.layout, messages)
        prompt = tr.prompt_ids()
        req = GenerationRequest(messages=tuple(tr.messages), prompt_tokens=tuple(prompt),
                                max_tokens=max_tokens, task_id=str(meta.get("task_id", "")),
                                episode_id=str(meta.get("episode_id", "")), seed=seed,
                                turn=int(meta.get("turn", 0) or 0),
                                purpose=str(meta.get("purpose", "action")))
        self.batcher.register()
        try:
            gen = self.batcher.generate(req)
        except Exception as e:  # noqa: BLE001 — reported as a server error (500), not a bad request
            raise PolicyFailure(f"{type(e).__name__}: {e}") from e
        finally:
            self.batcher.unregister()
        completion_tokens = len(gen.tokens) if gen.tokens is not None else len(
            self.layout.tokenizer.encode(gen.text))
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": gen.text},
                         "finish_reason": gen.finish_reason, "logprobs": None}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens,
                      "total_tokens": len(prompt) + completion_tokens},
        }


def _handler(server: ChatServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet: one line per error only
            pass

        def _send(self, code: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, code: int, message: str, kind: str) -> None:
            self._send(code, {"error": {"message": message, "type": kind, "code": code}})

        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [
                    {"id": server.model_name, "object": "model", "owned_by": "tr"}]})
            else:
                self._error(404, f"no route {self.path}", "not_found")

        def do_POST(self):
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._error(404, f"no route {self.path}", "not_found")
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
            except (ValueError, json.JSONDecodeError) as e:
                self._error(400, f"request body is not valid JSON: {e}", "invalid_request_error")
                return
            try:
                self._send(200, server.complete(body))
            except PolicyFailure as e:
                self._error(500, str(e), "server_error")
            except ValueError as e:
                self._error(400, str(e), "invalid_request_error")
            except Exception as e:  # noqa: BLE001 — a bug: a 500 with its message, never a hang
                self._error(500, f"{type(e).__name__}: {e}", "server_error")

    return Handler


def build_policy(kind: str, *, suite: str | None, mistake_prob: float, model: str, seed: int):
    """(policy, layout) for the CLI: the scripted teacher over a suite, or the JAX model policy."""
    if kind == "scripted":
        from tr.envs.tasks import load_suite
        from tr.models.tokenizer import ByteTokenizer
        from tr.agent.policies import ScriptedPolicy

        return (ScriptedPolicy(load_suite(suite), mistake_prob=mistake_prob, seed=seed),
                ChatLayout(ByteTokenizer()))
    if kind == "model":
        from tr.agent.policies import load_model_policy

        policy = load_model_policy(model, seed=seed)
        return policy, policy.layout
    raise ValueError(f"--policy={kind!r}: expected 'scripted' or 'model'")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tr.agent.server", description=__doc__.splitlines()[0])
    p.add_argument("--policy", choices=("scripted", "model"), default="scripted")
    p.add_argument("--suite", default=None, help="task suite for the scripted policy (default: built-in)")
    p.add_argument("--mistake-prob", type=float, default=0.0)
    p.add_argument("--model", default="tiny", help="model size for --policy model (fresh weights)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-output-tokens", type=int, default=1024)
    args = p.parse_args(argv)
    policy, layout = build_policy(args.policy, suite=args.suite, mistake_prob=args.mistake_prob,
                                  model=args.model, seed=args.seed)
    server = ChatServer(policy, layout, host=args.host, port=args.port,
                        max_output_tokens=args.max_output_tokens)
    print(f"serving {policy.name} at {server.url}", file=sys.stderr, flush=True)
    try:
        server.thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
