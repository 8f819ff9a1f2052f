"""vllm (vllm-tpu) engine behind the `SamplerEngine` interface, imported only when constructed.

Token ids in, token ids out: prompts are passed as `prompt_token_ids`, and the returned
`logprobs` are vllm's log-probabilities of the sampled tokens requested as raw (temperature 1,
unprocessed) values via `logprobs_mode='raw_logprobs'`, matching `JaxSampler` and the trainer's
`token_logprobs`. vllm is not installed on CPU machines; this adapter is exercised on TPU hosts.
"""

from __future__ import annotations

from typing import Any, Sequence

from tr.sampling.sampler import Completion, SamplingParams

_INSTALL_HINT = ("vllm is not installed: on a TPU host run `pip install vllm-tpu` (see requirements-tpu.txt), "
                 "or use the JAX sampler (tr.sampling.sampler.JaxSampler)")


class VllmUnavailableError(ImportError):
    """Raised when the vllm package is absent."""


def _import_vllm() -> Any:
    try:
        import vllm  # noqa: PLC0415 - optional heavy dependency
    except ImportError as exc:
        raise VllmUnavailableError(_INSTALL_HINT) from exc
    return vllm


class VllmEngine:
    """`generate(prompts, params, max_new_tokens=None) -> list[Completion]` on a vllm `LLM`."""

    def __init__(self, model_path: str, **llm_kwargs: Any):
        vllm = _import_vllm()
        self._vllm = vllm
        llm_kwargs.setdefault("logprobs_mode", "raw_logprobs")
        self.llm = vllm.LLM(model=model_path, skip_tokenizer_init=False, **llm_kwargs)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams = SamplingParams(),
                 max_new_tokens: Sequence[int] | None = None) -> list[Completion]:
        caps = [params.max_new_tokens] * len(prompts) if max_new_tokens is None else list(max_new_tokens)
        if len(caps) != len(prompts):
            raise ValueError(f"VllmEngine.generate: max_new_tokens needs {len(prompts)} entries, got {len(caps)}")
        requests = [{"prompt_token_ids": [int(i) for i in p]} for p in prompts]
        sampling = [self._vllm.SamplingParams(
            temperature=params.temperature, top_p=params.top_p, max_tokens=int(cap), seed=params.seed,
            stop=list(params.stop_strings) or None, stop_token_ids=list(params.stop_token_ids) or None,
            include_stop_str_in_output=True, logprobs=0, detokenize=bool(params.stop_strings))
            for cap in caps]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
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
            completions.append(Completion(token_ids=ids, logprobs=logprobs, raw_logprobs=[],
                                          finish_reason=reason))
        return completions
