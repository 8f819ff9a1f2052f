"""vllm (vllm-tpu) engine behind the same interface as the JAX samplers, imported only when constructed.

**Untested here**: vllm-tpu needs a TPU host and does not build on this Python, so nothing below has
run on this machine (only the missing-package error is tested). Kept small on purpose.

Interface (`tr.sampling.slots.EpisodeSampler`'s): `generate(prompts, params, max_new_tokens)`,
`submit(prompt, params, *, max_new_tokens, episode_id, salt) -> Future[Completion]`,
`end_episode(episode_id)`, `update_weights(weights)`. Token ids in, token ids out
(`prompt_token_ids`).

* **Log-probs.** `logprobs_mode='processed_logprobs'`: vLLM returns the log-probs of the
  distribution it sampled from (after temperature and top-p), = `Completion.logprobs`.
  `raw_logprobs` are filled only where they are the same numbers (temperature 1, top-p 1, the
  training setting), else left empty.
* **Cross-turn cache reuse** is vLLM's automatic prefix caching (`enable_prefix_caching=True`): an
  episode's next prompt extends its previous one, so its KV blocks are found by content and only
  the appended tokens are prefilled; vLLM evicts blocks under its own memory budget (LRU) and its
  scheduler batches continuously. `end_episode` has nothing to free (blocks are shared by content).
* **Weight sync.** `update_weights(Decoder | {hf_name: array})` sends the weights in
  Hugging Face names (`tr.models.weights.export_state_dict`) to every worker through
  `LLM.collective_rpc` into the worker extension `WeightSyncExtension.tr_load_weights` (the
  model's `load_weights`), then `reset_prefix_cache()` so no block of the old weights is reused.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Sequence

from tr.models.weights import export_state_dict
from tr.sampling.sampler import Completion, SamplingParams

_INSTALL_HINT = ("vllm is not installed: on a TPU host run `pip install vllm-tpu` (see requirements-tpu.txt), "
                 "or use the JAX samplers (tr.sampling.slots.EpisodeSampler, tr.sampling.sampler.JaxSampler)")


class VllmUnavailableError(ImportError):
    """Raised when the vllm package is absent."""


def _import_vllm() -> Any:
    try:
        import vllm  # noqa: PLC0415 - optional heavy dependency
    except ImportError as exc:
        raise VllmUnavailableError(_INSTALL_HINT) from exc
    return vllm


class WeightSyncExtension:
    """vLLM worker extension (`worker_extension_cls`): loads named weights into the worker's model."""

    def tr_load_weights(self, named: list[tuple[str, Any]]) -> None:
        self.model_runner.model.load_weights(weights=named)  # type: ignore[attr-defined]


class VllmEngine:
    """The sampler interface on a vllm `LLM` (module docstring). `llm_kwargs` go to `vllm.LLM`."""

    def __init__(self, model_path: str, **llm_kwargs: Any):
        vllm = _import_vllm()
        self._vllm = vllm
        llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        llm_kwargs.setdefault("enable_prefix_caching", True)
        llm_kwargs.setdefault("worker_extension_cls", f"{__name__}.WeightSyncExtension")
        self.llm = vllm.LLM(model=model_path, skip_tokenizer_init=False, **llm_kwargs)
        self._lock = threading.Lock()

    def _sampling(self, params: SamplingParams, cap: int, seed: int) -> Any:
        return self._vllm.SamplingParams(
            temperature=params.temperature, top_p=params.top_p, max_tokens=int(cap), seed=seed,
            stop=list(params.stop_strings) or None, stop_token_ids=list(params.stop_token_ids) or None,
            include_stop_str_in_output=True, logprobs=0, detokenize=bool(params.stop_strings))

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams = SamplingParams(),
                 max_new_tokens: Sequence[int] | None = None, *, seeds: Sequence[int] | None = None
                 ) -> list[Completion]:
        caps = [params.max_new_tokens] * len(prompts) if max_new_tokens is None else list(max_new_tokens)
        if len(caps) != len(prompts):
            raise ValueError(f"VllmEngine.generate: max_new_tokens needs {len(prompts)} entries, got {len(caps)}")
        seeds = [params.seed + i for i in range(len(prompts))] if seeds is None else list(seeds)
        requests = [{"prompt_token_ids": [int(i) for i in p]} for p in prompts]
        sampling = [self._sampling(params, cap, s) for cap, s in zip(caps, seeds)]
        with self._lock:
            outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        same = params.temperature == 1.0 and params.top_p >= 1.0
        completions = []
        for out in outputs:
            seq = out.outputs[0]
            ids = list(seq.token_ids)
            logprobs = [float(step[tok].logprob) for step, tok in zip(seq.logprobs or [], ids)]
            if seq.finish_reason == "length":
                reason = "length"
            elif isinstance(seq.stop_reason, str):
                reason = "stop_string"
            else:
                reason = "stop_token"
            completions.append(Completion(token_ids=ids, logprobs=logprobs,
                                          raw_logprobs=list(logprobs) if same else [], finish_reason=reason))
        return completions

    def submit(self, prompt: Sequence[int], params: SamplingParams = SamplingParams(), *,
               max_new_tokens: int | None = None, episode_id: str | None = None, salt: int = 0) -> Future:
        """One request; vLLM's scheduler batches concurrent calls (the offline `LLM` serialises
        calls, so concurrent episodes should share an `AsyncLLM` on a real deployment)."""
        fut: Future = Future()

        def work():
            try:
                cap = params.max_new_tokens if max_new_tokens is None else max_new_tokens
                fut.set_result(self.generate([prompt], params, [cap], seeds=[(params.seed + salt) & 0x7FFFFFFF])[0])
            except BaseException as exc:  # noqa: BLE001 - delivered to the caller
                fut.set_exception(exc)
        threading.Thread(target=work, daemon=True).start()
        return fut

    def end_episode(self, episode_id: str) -> None:
        """Nothing to free: prefix-cache blocks are shared by content and evicted by vLLM (LRU)."""

    def update_weights(self, weights: Any) -> None:
        """Load new weights on every worker, then drop every cached prefix (no stale KV)."""
        if isinstance(weights, dict) and weights and all(isinstance(k, str) and "." in k for k in weights):
            named = list(weights.items())  # already {hf_name: array}
        else:
            from flax import nnx  # noqa: PLC0415

            if not isinstance(weights, nnx.Module):
                raise ValueError("VllmEngine.update_weights: pass a Decoder (nnx.merge the parameter dict "
                                 "into one) or {hf_name: array}")
            named = list(export_state_dict(weights).items())
        with self._lock:
            self.llm.collective_rpc("tr_load_weights", args=(named,))
            self.llm.reset_prefix_cache()
