"""A policy behind any OpenAI-compatible ``/v1/chat/completions`` endpoint (a teacher, planner or
reviewer model), over urllib3 (already required through docker/requests).

Text in, text out: the reply's ids are whatever the episode's own tokenizer makes of the text
(``Generation.tokens = None``), since a remote model's token ids mean nothing to ``tr``'s tokenizer.
Requests of one batch go out concurrently (``max_parallel``); transient failures (connection
errors, HTTP 429/5xx) are retried by urllib3's :class:`~urllib3.util.Retry` (exponential back-off,
``Retry-After`` respected, POST included); anything else raises :class:`HttpPolicyError` naming the
endpoint, status and body.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import urllib3
from urllib3.util import Retry

from tr.agent.harness import GenerationRequest
from tr.agent.transcript import Generation


class HttpPolicyError(RuntimeError):
    pass


class HttpPolicy:
    """``base_url`` is the API root (``http://127.0.0.1:8000/v1``); the key comes from ``api_key``
    or the environment variable named by ``api_key_env``."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 api_key_env: str = "OPENAI_API_KEY", temperature: float = 0.6, top_p: float = 0.95,
                 timeout_s: float = 120.0, retries: int = 3, max_parallel: int = 8,
                 name: str | None = None, source: str = "teacher"):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url={base_url!r}: expected http(s)://host[:port]/v1")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get(api_key_env)
        self.temperature, self.top_p = temperature, top_p
        self.timeout_s, self.retries, self.max_parallel = timeout_s, retries, max_parallel
        self.name = name or f"http:{model}"
        self.source = source
        self.retry = Retry(total=retries, connect=retries, read=retries, status=retries, other=0,
                           backoff_factor=0.5, status_forcelist=(429, 500, 502, 503, 504),
                           allowed_methods=None, raise_on_status=False, respect_retry_after_header=True)
        self.pool = urllib3.PoolManager(num_pools=2, maxsize=max_parallel, retries=self.retry,
                                        timeout=urllib3.Timeout(total=timeout_s))

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if len(requests) == 1:
            return [self._one(requests[0])]
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(requests))) as pool:
            return list(pool.map(self._one, requests))

    def body(self, req: GenerationRequest) -> dict:
        return {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in req.messages],
            "max_tokens": req.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": req.seed * 1_000 + req.turn,
            "metadata": {"task_id": req.task_id, "episode_id": req.episode_id,
                         "turn": str(req.turn), "purpose": req.purpose},
        }

    def _one(self, req: GenerationRequest) -> Generation:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            resp = self.pool.request("POST", self.url, body=json.dumps(self.body(req)).encode(),
                                     headers=headers)
        except urllib3.exceptions.HTTPError as e:  # retries used up: connection refused, timeouts
            raise HttpPolicyError(f"POST {self.url}: {e}") from None
        if resp.status != 200:
            body = resp.data[:500].decode(errors="replace")
            raise HttpPolicyError(f"POST {self.url}: HTTP {resp.status}: {body}")
        try:
            payload = json.loads(resp.data)
        except ValueError:
            raise HttpPolicyError(f"POST {self.url}: the reply is not JSON: "
                                  f"{resp.data[:200].decode(errors='replace')}") from None
        return self._parse(payload)

    def _parse(self, payload: dict) -> Generation:
        try:
            choice = payload["choices"][0]
            text = choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise HttpPolicyError(f"POST {self.url}: no choices[0].message.content in the reply: "
                                  f"{json.dumps(payload)[:500]}") from None
        if not isinstance(text, str):
            raise HttpPolicyError(f"POST {self.url}: choices[0].message.content is "
                                  f"{type(text).__name__}, expected a string")
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return Generation(text=text, finish_reason=finish, source=self.source)
