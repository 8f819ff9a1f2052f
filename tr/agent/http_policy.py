"""A policy behind any OpenAI-compatible ``/v1/chat/completions`` endpoint (a teacher, planner or
reviewer model), with the standard library only.

Text in, text out: the reply's ids are whatever the episode's own tokenizer makes of the text
(``Generation.tokens = None``), since a remote model's token ids mean nothing to ``tr``'s tokenizer.
Requests of one batch go out concurrently (``max_parallel``); transient failures (connection
errors, HTTP 429/5xx) are retried with exponential back-off; anything else raises
:class:`HttpPolicyError` naming the endpoint, status and body.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

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
        data = json.dumps(self.body(req)).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        delay = 0.5
        for attempt in range(self.retries + 1):
            try:
                request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                    payload = json.loads(resp.read())
                return self._parse(payload)
            except urllib.error.HTTPError as e:
                body = e.read()[:500].decode(errors="replace")
                if e.code in (429, 500, 502, 503, 504) and attempt < self.retries:
                    time.sleep(delay)
                    delay *= 2
                    continue
                raise HttpPolicyError(f"POST {self.url}: HTTP {e.code}: {body}") from None
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                if attempt < self.retries:
                    time.sleep(delay)
                    delay *= 2
                    continue
                raise HttpPolicyError(f"POST {self.url}: {e}") from None
        raise AssertionError("unreachable")

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
