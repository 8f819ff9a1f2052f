"""An OpenAI-compatible chat server that serves a ``tr`` policy (scripted teacher or the JAX model).

Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /v1/models/{id}``.  The contract
is the one the official ``openai`` client relies on (tests/test_openai_server.py drives it):

* ``stream=True`` answers with server-sent events: ``chat.completion.chunk`` objects (the role, then
  the content, then the ``finish_reason``; a ``usage`` chunk when ``stream_options.include_usage``),
  then ``data: [DONE]``.  The policy generates a whole reply before the first chunk (the samplers
  do not expose partial decodes), so the content arrives as one chunk per choice.
* Errors have OpenAI's body ``{"error": {"message", "type", "param", "code"}}``: 404 for an unknown
  model (``code="model_not_found"``) or route, 400 for a bad field (``param`` names it), for an
  unknown or missing ``metadata.task_id`` when the policy needs a task (the scripted teacher), and
  for any parameter the server cannot honour; 500 only when the policy itself fails.
* ``max_tokens`` (or ``max_completion_tokens``) is a hard cap (400 above the server's or the
  model's limit; a text policy's longer reply is cut to that many tokens, ``finish_reason="length"``); ``n`` choices are sampled as ``n`` requests (choice ``i`` with seed
  ``seed * n + i``); ``stop`` (a string or up to 4) cuts the reply before the first stop string,
  exactly what stopping the decode there gives; ``seed`` reaches the policy.  ``temperature`` and
  ``top_p``: a sampling policy (one with ``temperature`` / ``top_p`` attributes, the JAX
  :class:`~tr.agent.policies.ModelPolicy`) samples at the values it was built with, so any other
  value is refused with 400; any other policy is a deterministic function of the request (its seed
  included), a point mass that temperature and nucleus filtering leave unchanged, so every valid
  value is honoured.  ``user`` (an end-user id for abuse monitoring) is accepted and unused, as
  it changes no reply.  Any other field is refused with 400 unless it has its neutral value
  (``presence_penalty=0``, ``logprobs=false``, ...).
* ``metadata.task_id`` (and ``episode_id``, ``turn``, ``purpose``) reach the policy's request; a
  policy with ``check_request(req)`` (raises ValueError) has each request checked before batching,
  so one bad request is a 400 for its client and never fails the batch it would have joined.

Concurrent requests are batched into one policy call (:class:`~tr.agent.policies.RequestBatcher`).

Why :mod:`http.server` and not an ASGI stack: the work behind each request is a blocking call into
the thread-based :class:`~tr.agent.policies.RequestBatcher` (batched JAX sampling), so a thread per
connection (:class:`~http.server.ThreadingHTTPServer`) is the natural fit and an async framework
would only wrap it in an executor; the server binds 127.0.0.1 by default and serves tens of
concurrent episodes, not the public internet (no TLS, no HTTP/2: put a reverse proxy in front for
that); SSE over chunked transfer encoding is a few lines; and it adds no dependency.

    python -m tr.agent.server --policy scripted --port 8000
    python -m tr.agent.server --policy model --model tiny --port 8000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tr.agent.harness import GenerationRequest
from tr.agent.policies import Policy, RequestBatcher
from tr.agent.policies import ScriptedPolicy, load_model_policy
from tr.agent.transcript import ChatLayout, Generation, transcript_from_messages
from tr.envs.tasks import load_suite
from tr.models.tokenizer import ByteTokenizer

MAX_N = 16          # most choices one request may ask for
MAX_STOP = 4        # OpenAI's limit on stop strings
# Fields accepted only at their neutral value (what the server does anyway); any other value is a 400.
NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "logprobs": False, "top_logprobs": None,
           "logit_bias": None, "store": False, "tools": None, "tool_choice": None,
           "parallel_tool_calls": None, "response_format": None, "functions": None, "function_call": None,
           "modalities": None, "audio": None, "prediction": None, "service_tier": None}
HONOURED = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop",
            "n", "stream", "stream_options", "seed", "metadata", "user"}


class ApiError(Exception):
    """An error reply in OpenAI's shape: HTTP ``status`` and ``{"error": {...}}``."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class PolicyFailure(RuntimeError):
    """The policy could not produce a completion (HTTP 500)."""


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A validated chat-completions request."""

    requests: tuple[GenerationRequest, ...]   # one per choice
    prompt_tokens: int
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"field '{param}': {message}", param=param)


def _number(body: dict, name: str, lo: float, hi: float, *, lo_open: bool = False) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo < v if lo_open else lo <= v) or v > hi:
        raise _bad(name, f"expected a number in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")
    return float(v)


def _int(body: dict, name: str, default: int, lo: int) -> int:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise _bad(name, f"expected an integer >= {lo}, got {v!r}")
    return v


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` up to (not including) the earliest occurrence of any stop string, and whether it was cut."""
    hits = [i for i in (text.find(s) for s in stop) if i >= 0]
    return (text[:min(hits)], True) if hits else (text, False)


class ChatServer:
    """A running server; ``url`` is the API root (``http://127.0.0.1:PORT/v1``).  Use as a context
    manager or call :meth:`close`.  ``policy`` is any :class:`~tr.agent.policies.Policy` and
    ``layout`` the chat layout its prompts are built with; ``model_name`` (default ``policy.name``)
    is the one model id it answers to.  ``max_output_tokens``: the largest ``max_tokens`` accepted
    (None: only the model's own limits, its ``max_seq_len`` less the prompt and its sampler's
    ``max_new_tokens``); a request without ``max_tokens`` gets that limit, or 1024."""

    def __init__(self, policy: Policy, layout: ChatLayout, *, host: str = "127.0.0.1", port: int = 0,
                 model_name: str | None = None, max_output_tokens: int | None = None,
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

    def serve_until_interrupted(self) -> None:
        """Block until SIGINT (Ctrl-C), then close: what the serving commands do."""
        try:
            self.thread.join()
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def __enter__(self) -> "ChatServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------
    def model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": 0, "owned_by": "tr"}

    def output_limit(self, prompt_len: int) -> int | None:
        """The largest ``max_tokens`` for a prompt of ``prompt_len`` tokens (None: no limit)."""
        caps = [self.max_output_tokens] if self.max_output_tokens is not None else []
        if getattr(self.policy, "max_seq_len", None) is not None:
            caps.append(self.policy.max_seq_len - prompt_len)
        sampler_cap = getattr(getattr(self.policy, "sampler", None), "max_new_tokens", None)
        if isinstance(sampler_cap, int):
            caps.append(sampler_cap)
        return min(caps) if caps else None

    def parse(self, body) -> ChatRequest:
        """Validates a request body; raises :class:`ApiError` (400/404) naming the field at fault."""
        if not isinstance(body, dict):
            raise ApiError(400, "request body: expected a JSON object")
        for name in body:
            if name in NEUTRAL:
                if body[name] not in (NEUTRAL[name], None):
                    raise _bad(name, f"{body[name]!r:.80} is not supported by this server "
                                     f"(only {NEUTRAL[name]!r} or absent)")
            elif name not in HONOURED:
                raise ApiError(400, f"field '{name}': not supported by this server", param=name,
                               code="unsupported_parameter")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _bad("model", "required, the model id (GET /v1/models lists it)")
        if model != self.model_name:
            raise ApiError(404, f"The model '{model}' does not exist; this server serves "
                                f"'{self.model_name}'", param="model", code="model_not_found")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("messages", "expected a non-empty list")
        try:
            transcript = transcript_from_messages(self.layout, messages)
        except ValueError as e:
            raise ApiError(400, str(e), param="messages") from None
        prompt = tuple(transcript.prompt_ids())

        if "max_tokens" in body and "max_completion_tokens" in body and (
                body["max_tokens"] != body["max_completion_tokens"]):
            raise _bad("max_tokens", "differs from max_completion_tokens; give one")
        name = "max_tokens" if body.get("max_tokens") is not None else "max_completion_tokens"
        limit = self.output_limit(len(prompt))
        max_tokens = _int(body, name, limit if limit is not None else 1024, 1)
        if limit is not None and max_tokens > limit:
            raise _bad(name, f"{max_tokens} is more than this server allows for a prompt of "
                             f"{len(prompt)} tokens ({limit})")
        n = _int(body, "n", 1, 1)
        if n > MAX_N:
            raise _bad("n", f"at most {MAX_N}, got {n}")
        seed = _int(body, "seed", 0, 0)
        for name, lo, hi, lo_open in (("temperature", 0.0, 2.0, False), ("top_p", 0.0, 1.0, True)):
            value = _number(body, name, lo, hi, lo_open=lo_open)
            own = getattr(self.policy, name, None)
            if value is not None and isinstance(own, (int, float)) and abs(value - own) > 1e-6:
                raise _bad(name, f"this server's policy samples at {name}={own} (fixed when it was "
                                 f"started); got {value}")
        stop = body.get("stop")
        stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
        if (not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOP
                or not all(isinstance(s, str) and s for s in stop)):
            raise _bad("stop", f"expected a non-empty string or a list of up to {MAX_STOP}, got "
                               f"{body.get('stop')!r:.80}")
        stream = body.get("stream") or False
        if not isinstance(stream, bool):
            raise _bad("stream", f"expected true or false, got {stream!r}")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise _bad("stream_options", f"only {{'include_usage': bool}} is supported, got {options!r:.80}")
        if options and not stream:
            raise _bad("stream_options", "only allowed with stream=true")
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict):
            raise _bad("metadata", "expected an object")
        try:
            turn = int(meta.get("turn", 0) or 0)
        except (TypeError, ValueError):
            raise _bad("metadata.turn", f"expected an integer, got {meta.get('turn')!r}") from None
        base = GenerationRequest(messages=tuple(transcript.messages), prompt_tokens=prompt,
                                 max_tokens=max_tokens, task_id=str(meta.get("task_id", "") or ""),
                                 episode_id=str(meta.get("episode_id", "") or ""), seed=seed, turn=turn,
                                 purpose=str(meta.get("purpose", "action")))
        check = getattr(self.policy, "check_request", None)
        if check is not None:
            try:
                check(base)
            except ValueError as e:
                raise ApiError(400, str(e), param="metadata.task_id") from None
        requests = tuple(base if n == 1 else dataclasses.replace(
            base, seed=seed * n + i, episode_id=f"{base.episode_id}#{i}" if base.episode_id else "")
            for i in range(n))
        return ChatRequest(requests, len(prompt), tuple(stop), stream,
                           bool(options.get("include_usage", False)))

    def generate(self, chat: ChatRequest) -> list[tuple[str, str, int]]:
        """(text, finish_reason, completion tokens) for each choice; raises :class:`PolicyFailure`."""
        def one(req: GenerationRequest) -> Generation:
            try:
                return self.batcher.generate(req)
            finally:
                self.batcher.unregister()

        for _ in chat.requests:
            self.batcher.register()
        try:
            if len(chat.requests) == 1:
                gens = [one(chat.requests[0])]
            else:
                with ThreadPoolExecutor(max_workers=len(chat.requests)) as pool:
                    gens = list(pool.map(one, chat.requests))
        except Exception as e:  # noqa: BLE001 — reported as a server error (500), not a bad request
            raise PolicyFailure(f"{type(e).__name__}: {e}") from e
        out = []
        tok = self.layout.tokenizer
        for req, gen in zip(chat.requests, gens):
            text, cut = cut_at_stop(gen.text, chat.stop)
            finish = "stop" if cut else gen.finish_reason
            ids = tok.encode(text) if cut or gen.tokens is None else gen.tokens
            if len(ids) > req.max_tokens:     # a text policy (no token cap of its own) went over
                ids = tok.encode(text)[:req.max_tokens]
                text, finish = tok.decode(ids), "length"
            out.append((text, finish, len(ids)))
        return out

    def complete(self, body) -> dict:
        """One non-streamed chat completion (``stream`` is ignored); raises :class:`ApiError`."""
        chat = self.parse(body)
        try:
            choices = self.generate(chat)
        except PolicyFailure as e:
            raise ApiError(500, str(e), kind="server_error") from None
        return self.completion(chat, choices)

    def _head(self, kind: str) -> dict:
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": kind, "created": int(time.time()),
                "model": self.model_name, "system_fingerprint": None}

    def _usage(self, chat: ChatRequest, choices) -> dict:
        completion = sum(c for _, _, c in choices)
        return {"prompt_tokens": chat.prompt_tokens, "completion_tokens": completion,
                "total_tokens": chat.prompt_tokens + completion}

    def completion(self, chat: ChatRequest, choices) -> dict:
        return {**self._head("chat.completion"),
                "choices": [{"index": i, "message": {"role": "assistant", "content": text},
                             "finish_reason": finish, "logprobs": None}
                            for i, (text, finish, _) in enumerate(choices)],
                "usage": self._usage(chat, choices)}

    def chunks(self, chat: ChatRequest, choices) -> list[dict]:
        """The stream's ``chat.completion.chunk`` objects, in order (``[DONE]`` not included)."""
        head = self._head("chat.completion.chunk")
        out = []
        for i, (text, finish, _) in enumerate(choices):
            for delta, reason in (({"role": "assistant", "content": ""}, None), ({"content": text}, None),
                                  ({}, finish)):
                out.append({**head, "choices": [{"index": i, "delta": delta, "finish_reason": reason,
                                                 "logprobs": None}]})
        if chat.include_usage:
            out.append({**head, "choices": [], "usage": self._usage(chat, choices)})
        return out


def _handler(server: ChatServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet: the client sees every error in its reply
            pass

        def _send(self, code: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, events: list[dict]) -> None:
            """Server-sent events over chunked transfer encoding (the connection stays reusable)."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for data in [json.dumps(e) for e in events] + ["[DONE]"]:
                frame = f"data: {data}\n\n".encode()
                self.wfile.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _no_route(self) -> None:
            err = ApiError(404, f"Invalid URL ({self.command} {self.path})", code="unknown_url")
            self._send(err.status, err.body())

        def do_GET(self):
            path = self.path.rstrip("/")
            if path == "/v1/models":
                self._send(200, {"object": "list", "data": [server.model_card()]})
            elif path.startswith("/v1/models/"):
                name = path[len("/v1/models/"):]
                if name == server.model_name:
                    self._send(200, server.model_card())
                else:
                    err = ApiError(404, f"The model '{name}' does not exist", param="model",
                                   code="model_not_found")
                    self._send(err.status, err.body())
            else:
                self._no_route()

        def do_POST(self):
            if self.path.rstrip("/") != "/v1/chat/completions":
                length = int(self.headers.get("Content-Length", "0") or 0)
                self.rfile.read(length)
                self._no_route()
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
            except (ValueError, json.JSONDecodeError) as e:
                err = ApiError(400, f"request body is not valid JSON: {e}")
                self._send(err.status, err.body())
                return
            try:
                chat = server.parse(body)
                choices = server.generate(chat)
            except ApiError as e:
                self._send(e.status, e.body())
                return
            except PolicyFailure as e:
                self._send(500, ApiError(500, str(e), kind="server_error").body())
                return
            except Exception as e:  # noqa: BLE001 — a bug: a 500 with its message, never a hang
                self._send(500, ApiError(500, f"{type(e).__name__}: {e}", kind="server_error").body())
                return
            if chat.stream:
                self._stream(server.chunks(chat, choices))
            else:
                self._send(200, server.completion(chat, choices))

    return Handler


def build_policy(kind: str, *, suite: str | None, mistake_prob: float, model: str, seed: int):
    """(policy, layout) for the CLI: the scripted teacher over a suite, or the JAX model policy."""
    if kind == "scripted":

        return (ScriptedPolicy(load_suite(suite), mistake_prob=mistake_prob, seed=seed),
                ChatLayout(ByteTokenizer()))
    if kind == "model":

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
    p.add_argument("--max-output-tokens", type=int, default=None,
                   help="largest max_tokens accepted (default: the model's own limits)")
    args = p.parse_args(argv)
    policy, layout = build_policy(args.policy, suite=args.suite, mistake_prob=args.mistake_prob,
                                  model=args.model, seed=args.seed)
    server = ChatServer(policy, layout, host=args.host, port=args.port,
                        max_output_tokens=args.max_output_tokens)
    print(f"serving {server.model_name} at {server.url}", file=sys.stderr, flush=True)
    server.serve_until_interrupted()
    return 0


if __name__ == "__main__":
    sys.exit(main())
