"""Hugging Face Qwen3 safetensors <-> NNX parameters (import and export, names, shapes, dtypes).

HF `Qwen3ForCausalLM` stores linear weights as `[out, in]`; this decoder stores them as
`[in, out]` with heads split out (`q_proj [d, H, hd]`, `o_proj [H, hd, d]`), and stacks the blocks:
every block parameter has a leading layer axis (`layers.self_attn.q_proj [n_layers, d, H, hd]`),
whose slice `l` is HF's `model.layers.{l}.self_attn.q_proj.weight` (converted). The table below is
the whole mapping (a block entry's HF name holds `{layer}`); `export` and `import` are its two
directions, so a round trip is exact.
The critic adds `score.weight [1, d]` and `score.bias [1]` (HF token-classification naming) and
`value_start [1]` (this project's empty-history value).
Files: one `model.safetensors`, or shards with `model.safetensors.index.json`; `config.json`
follows HF's Qwen3 config keys.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any, Callable, Iterator, Mapping

import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from tr.models.config import ModelConfig
from tr.models.critic import CriticModel
from tr.models.decoder import Decoder

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}

# (our path, hf name, to_hf(ours, config), from_hf(hf, config))
Converter = tuple[tuple[Any, ...], str, Callable[[np.ndarray, ModelConfig], np.ndarray],
                  Callable[[np.ndarray, ModelConfig], np.ndarray]]


def _same(x, c):
    return x


def _transpose(x, c):
    return x.T


def _heads_in_to_hf(n_heads_attr: str):
    return lambda x, c: x.reshape(c.d_model, getattr(c, n_heads_attr) * c.head_dim).T


def _heads_in_from_hf(n_heads_attr: str):
    return lambda x, c: x.T.reshape(c.d_model, getattr(c, n_heads_attr), c.head_dim)


def _o_to_hf(x, c):
    return x.reshape(c.n_heads * c.head_dim, c.d_model).T


def _o_from_hf(x, c):
    return x.T.reshape(c.n_heads, c.head_dim, c.d_model)


def _hf_shape(name: str, c: ModelConfig) -> tuple[int, ...]:
    """Expected HF tensor shape for `name` (used to name the fault in errors)."""
    d, hd = c.d_model, c.head_dim
    table = {
        "embed_tokens.weight": (c.vocab_size, d), "lm_head.weight": (c.vocab_size, d), "norm.weight": (d,),
        "input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
        "q_proj.weight": (c.n_heads * hd, d), "k_proj.weight": (c.n_kv_heads * hd, d),
        "v_proj.weight": (c.n_kv_heads * hd, d), "o_proj.weight": (d, c.n_heads * hd),
        "q_norm.weight": (hd,), "k_norm.weight": (hd,),
        "gate_proj.weight": (c.d_ff, d), "up_proj.weight": (c.d_ff, d), "down_proj.weight": (d, c.d_ff),
        "score.weight": (1, d), "score.bias": (1,), "value_start": (1,),
    }
    key = re.sub(r"^model\.(layers\.\d+\.(self_attn\.|mlp\.)?)?", "", name)
    return table[key]


def decoder_mapping(config: ModelConfig, *, lm_head: bool = True, prefix: tuple[Any, ...] = ()) -> list[Converter]:
    """The mapping for a `Decoder` (paths relative to `prefix` inside the module)."""
    out: list[Converter] = [(prefix + ("embed_tokens",), "model.embed_tokens.weight", _same, _same)]
    q_conv = (_heads_in_to_hf("n_heads"), _heads_in_from_hf("n_heads"))
    kv_conv = (_heads_in_to_hf("n_kv_heads"), _heads_in_from_hf("n_kv_heads"))
    p, h = prefix + ("layers",), "model.layers.{layer}."
    out += [
        (p + ("input_layernorm", "weight"), h + "input_layernorm.weight", _same, _same),
        (p + ("self_attn", "q_proj"), h + "self_attn.q_proj.weight", *q_conv),
        (p + ("self_attn", "k_proj"), h + "self_attn.k_proj.weight", *kv_conv),
        (p + ("self_attn", "v_proj"), h + "self_attn.v_proj.weight", *kv_conv),
        (p + ("self_attn", "o_proj"), h + "self_attn.o_proj.weight", _o_to_hf, _o_from_hf),
        (p + ("self_attn", "q_norm", "weight"), h + "self_attn.q_norm.weight", _same, _same),
        (p + ("self_attn", "k_norm", "weight"), h + "self_attn.k_norm.weight", _same, _same),
        (p + ("post_attention_layernorm", "weight"), h + "post_attention_layernorm.weight", _same, _same),
        (p + ("mlp", "gate_proj"), h + "mlp.gate_proj.weight", _transpose, _transpose),
        (p + ("mlp", "up_proj"), h + "mlp.up_proj.weight", _transpose, _transpose),
        (p + ("mlp", "down_proj"), h + "mlp.down_proj.weight", _transpose, _transpose),
    ]
    out.append((prefix + ("norm", "weight"), "model.norm.weight", _same, _same))
    if lm_head and not config.tie_embeddings:
        out.append((prefix + ("lm_head",), "lm_head.weight", _transpose, _transpose))
    return out


def _hf_names(hf_name: str, config: ModelConfig) -> list[str]:
    """The HF tensor names of one mapping entry: one per layer for a stacked block parameter."""
    if "{layer}" not in hf_name:
        return [hf_name]
    return [hf_name.format(layer=i) for i in range(config.n_layers)]


def model_mapping(model: nnx.Module) -> list[Converter]:
    """Mapping for a `Decoder` or a `CriticModel`."""
    if isinstance(model, CriticModel):
        reshape_1 = (lambda x, c: x.reshape(1, -1), lambda x, c: x.reshape(-1))
        scalar = (lambda x, c: x.reshape(1), lambda x, c: x.reshape(()))
        return decoder_mapping(model.config, lm_head=False, prefix=("backbone",)) + [
            (("value_head",), "score.weight", *reshape_1),
            (("value_bias",), "score.bias", *scalar),
            (("value_start",), "value_start", *scalar),
        ]
    if isinstance(model, Decoder):
        return decoder_mapping(model.config, lm_head=model.lm_head is not None)
    raise TypeError(f"no Hugging Face mapping for {type(model).__name__}")


def _variables(model: nnx.Module) -> dict[tuple[Any, ...], nnx.Variable]:
    return {path: var for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def assign_params(model: nnx.Module, params) -> nnx.Module:
    """`model` (in place) with the parameters of `params`, a pure dict of its `nnx.Param` state
    (as training states and stage checkpoints hold them); returns `model`."""
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, params)
    nnx.update(model, state)
    return model


def export_state_dict(model: nnx.Module, dtype: str | None = None) -> dict[str, np.ndarray]:
    """HF-named numpy tensors of `model` (in `dtype`, default the parameter's own dtype)."""
    variables = _variables(model)
    mapping = model_mapping(model)
    unmapped = set(variables) - {m[0] for m in mapping}
    if unmapped:
        raise ValueError(f"export: parameters without a Hugging Face name: {sorted(unmapped)[:5]}")
    tensors = {}
    for path, hf_name, to_hf, _ in mapping:
        value = np.asarray(variables[path].get_value())
        if dtype is not None:
            value = value.astype(_NP_DTYPES[dtype])
        names = _hf_names(hf_name, model.config)
        if len(names) == 1 and "{layer}" not in hf_name:
            tensors[hf_name] = np.ascontiguousarray(to_hf(value, model.config))
        else:
            for layer, name in enumerate(names):
                tensors[name] = np.ascontiguousarray(to_hf(value[layer], model.config))
    return tensors


def import_state_dict(model: nnx.Module, tensors: Mapping[str, np.ndarray], *, source: str = "<tensors>",
                      origin: Mapping[str, str] | None = None) -> nnx.Module:
    """Load HF-named tensors into `model` in place (cast to each parameter's dtype); returns `model`.

    Every mapped name must be present with its HF shape; unknown names are an error (except
    `lm_head.weight` for tied embeddings and rotary caches), so a wrong checkpoint fails loudly.
    `origin` maps tensor names to the file they came from (for error messages).
    """
    origin = origin or {}
    config = model.config
    variables = _variables(model)
    mapping = model_mapping(model)
    names = {name for m in mapping for name in _hf_names(m[1], config)}
    missing = sorted(names - set(tensors))
    if missing:
        raise ValueError(f"{source}: missing {len(missing)} tensor(s) for model {config.name!r}, e.g. {missing[:4]}")
    ignorable = {"lm_head.weight"} if config.tie_embeddings or isinstance(model, CriticModel) else set()
    extra = sorted(n for n in tensors if n not in names and n not in ignorable
                   and not n.endswith(_IGNORED_SUFFIXES))
    if extra:
        raise ValueError(f"{source}: {len(extra)} unexpected tensor(s) for model {config.name!r}, e.g. {extra[:4]} "
                         "(wrong architecture or config?)")
    updates = []
    for path, hf_name, _, from_hf in mapping:
        var = variables[path]
        target_dtype = np.asarray(var.get_value()).dtype
        slices = []
        for name in _hf_names(hf_name, config):
            value = np.asarray(tensors[name])
            expected = _hf_shape(name, config)
            if tuple(value.shape) != expected:
                raise ValueError(f"{origin.get(name, source)}: tensor {name!r} has shape {tuple(value.shape)}, "
                                 f"expected {expected} for model {config.name!r}")
            slices.append(np.asarray(from_hf(value, config)).astype(target_dtype))
        value = slices[0] if "{layer}" not in hf_name else np.stack(slices)
        updates.append((path, var.replace(value)))
    nnx.update(model, nnx.from_flat_state(updates))
    return model


def hf_config_dict(config: ModelConfig) -> dict[str, Any]:
    """`config.json` content in Hugging Face Qwen3 terms, readable by both config generations:
    transformers >= 5 (`dtype`, `rope_parameters`) and 4.x (`torch_dtype`, `rope_theta`,
    `rope_scaling`)."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling == "yarn":
        rope.update(rope_type="yarn", factor=config.rope_factor, beta_fast=config.rope_beta_fast,
                    beta_slow=config.rope_beta_slow, truncate=config.rope_truncate,
                    original_max_position_embeddings=config.rope_original_max_len or config.max_seq_len)
        if config.rope_attention_factor:
            rope["attention_factor"] = config.rope_attention_factor
    out = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": config.vocab_size, "hidden_size": config.d_model, "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads, "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim, "intermediate_size": config.d_ff,
        "rms_norm_eps": config.rms_eps, "tie_word_embeddings": config.tie_embeddings,
        "max_position_embeddings": config.max_seq_len, "hidden_act": "silu", "attention_bias": False,
        "use_sliding_window": False,
        "dtype": config.param_dtype, "rope_parameters": rope,
        "torch_dtype": config.param_dtype, "rope_theta": config.rope_theta,
    }
    if config.rope_scaling == "yarn":
        out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return out


# config.json keys (and rope keys) whose feature this decoder does not implement: refused by name.
_UNSUPPORTED_ROPE_TYPES = ("linear", "dynamic", "longrope", "llama3", "mrope", "proportional")
_SUPPORTED_ROPE_KEYS = {"rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings",
                        "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim",
                        "truncate", "partial_rotary_factor"}


def _rope_fields(source: Mapping[str, Any], where: str) -> dict[str, Any]:
    """ModelConfig RoPE fields from either config generation: `rope_parameters` (transformers >= 5,
    holds `rope_theta`) or top-level `rope_theta` + `rope_scaling` (4.x)."""
    params = source.get("rope_parameters")
    legacy = source.get("rope_scaling")
    if params is not None and not isinstance(params, Mapping):
        raise ValueError(f"{where}: rope_parameters must be an object, got {params!r}")
    if isinstance(params, Mapping) and any(isinstance(v, Mapping) for v in params.values()):
        raise ValueError(f"{where}: rope_parameters per layer type ({sorted(params)}) are not supported "
                         "(one RoPE for every layer only)")
    rope = dict(legacy or {})
    rope.update(params or {})
    theta = rope.get("rope_theta", source.get("rope_theta", 1e6))  # neither: Qwen3's default
    if "rope_theta" in source and "rope_theta" in rope and float(source["rope_theta"]) != float(rope["rope_theta"]):
        raise ValueError(f"{where}: rope_theta={source['rope_theta']} disagrees with "
                         f"rope_parameters.rope_theta={rope['rope_theta']}")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in _UNSUPPORTED_ROPE_TYPES or kind not in ("default", "yarn"):
        raise ValueError(f"{where}: rope_type {kind!r} is not supported (supported: 'default', 'yarn')")
    unknown = sorted(set(rope) - _SUPPORTED_ROPE_KEYS)
    if unknown:
        raise ValueError(f"{where}: RoPE parameter(s) {unknown} are not supported")
    partial = float(rope.get("partial_rotary_factor", source.get("partial_rotary_factor", 1.0)))
    if partial != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor={partial} is not supported (rotary over "
                         "the whole head only)")
    fields: dict[str, Any] = {"rope_theta": float(theta)}
    if kind == "yarn":
        max_len = int(source.get("max_position_embeddings", 40960))
        original = int(rope.get("original_max_position_embeddings") or max_len)
        factor = rope.get("factor")
        factor = float(factor) if factor is not None else max_len / original
        attention = rope.get("attention_factor")
        mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
        if attention is None and mscale and mscale_all:
            def m(scale, k):
                return 1.0 if scale <= 1 else 0.1 * k * math.log(scale) + 1.0
            attention = m(factor, float(mscale)) / m(factor, float(mscale_all))
        fields.update(rope_scaling="yarn", rope_factor=factor, rope_original_max_len=original,
                      rope_beta_fast=float(rope.get("beta_fast") or 32.0),
                      rope_beta_slow=float(rope.get("beta_slow") or 1.0),
                      rope_attention_factor=float(attention or 0.0),
                      rope_truncate=bool(rope.get("truncate", True)))
    return fields


def _dtype_field(source: Mapping[str, Any], where: str) -> str:
    """`dtype` (transformers >= 5) or `torch_dtype` (4.x); absent means float32 (as HF loads it)."""
    new, old = source.get("dtype"), source.get("torch_dtype")
    if new is not None and old is not None and str(new) != str(old):
        raise ValueError(f"{where}: dtype={new!r} disagrees with torch_dtype={old!r}")
    dtype = str(new if new is not None else old if old is not None else "float32")
    dtype = dtype.removeprefix("torch.")
    if dtype not in _NP_DTYPES:
        raise ValueError(f"{where}: dtype {dtype!r} is not supported (supported: {sorted(_NP_DTYPES)})")
    return dtype


def config_from_hf(source: str | os.PathLike | Mapping[str, Any], name: str = "hf", **overrides: Any) -> ModelConfig:
    """A `ModelConfig` from an HF Qwen3 `config.json` (path, its folder, or the parsed dict).

    Reads both config generations (`dtype` / `torch_dtype`; `rope_parameters.rope_theta` /
    top-level `rope_theta` + `rope_scaling`), including YaRN RoPE scaling. A feature this decoder
    does not implement is refused by name: sliding-window attention (`use_sliding_window`, or a
    `layer_types` entry other than 'full_attention'), attention biases, activations other than
    silu, other RoPE types, partial rotary embeddings, other architectures (e.g. MoE).
    """
    where = "<dict>"
    if not isinstance(source, Mapping):
        where = os.fspath(source)
        if os.path.isdir(where):
            where = os.path.join(where, "config.json")
        with open(where) as f:
            source = json.load(f)
    required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    missing = [k for k in required if k not in source]
    if missing:
        raise ValueError(f"{where}: config.json lacks {missing}")
    model_type = source.get("model_type", "qwen3")
    if model_type != "qwen3" or source.get("num_experts") or source.get("num_local_experts"):
        raise ValueError(f"{where}: model_type {model_type!r} is not supported (dense Qwen3 only)")
    if source.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: hidden_act {source['hidden_act']!r} is not supported (silu only)")
    if source.get("attention_bias", False):
        raise ValueError(f"{where}: attention_bias=true is not supported (Qwen3 has no attention biases)")
    if source.get("use_sliding_window", False):
        raise ValueError(f"{where}: use_sliding_window=true (sliding_window={source.get('sliding_window')}) "
                         "is not supported: every layer attends to the whole context here")
    layer_types = source.get("layer_types") or []
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        raise ValueError(f"{where}: layer_types {other} are not supported (full_attention only)")
    dtype = _dtype_field(source, where)
    fields = dict(
        vocab_size=source["vocab_size"], d_model=source["hidden_size"], n_layers=source["num_hidden_layers"],
        n_heads=source["num_attention_heads"],
        n_kv_heads=source.get("num_key_value_heads") or source["num_attention_heads"],
        head_dim=source.get("head_dim") or source["hidden_size"] // source["num_attention_heads"],
        d_ff=source["intermediate_size"], rms_eps=float(source.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(source.get("tie_word_embeddings", False)),
        max_seq_len=source.get("max_position_embeddings", 40960), dtype=dtype, param_dtype=dtype,
        **_rope_fields(source, where))
    return ModelConfig(name=name, **{**fields, **overrides})


def save_safetensors(model: nnx.Module, directory: str | os.PathLike, *, dtype: str | None = None,
                     max_shard_bytes: int | None = None) -> list[str]:
    """Write HF-named `model.safetensors` (or shards + index) and `config.json`; returns the files."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    tensors = export_state_dict(model, dtype)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, value in tensors.items():
        if max_shard_bytes is not None and shards[-1] and size + value.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = value
        size += value.nbytes
    files = []
    if len(shards) == 1:
        files.append(SINGLE_FILE)
        save_file(shards[0], os.path.join(directory, SINGLE_FILE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for k, shard in enumerate(shards, start=1):
            fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, os.path.join(directory, fname), metadata={"format": "pt"})
            weight_map.update({name: fname for name in shard})
            files.append(fname)
        total = sum(v.nbytes for v in tensors.values())
        with open(os.path.join(directory, INDEX_FILE), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
        files.append(INDEX_FILE)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config_dict(model.config), f, indent=1)
    files.append("config.json")
    return files


def iter_safetensors(path: str | os.PathLike) -> Iterator[tuple[str, np.ndarray, str]]:
    """`(name, tensor, file)` for every tensor of a file, a folder, or an index json."""
    path = os.fspath(path)
    if os.path.isdir(path):
        index = os.path.join(path, INDEX_FILE)
        if os.path.isfile(index):
            path = index
        elif os.path.isfile(os.path.join(path, SINGLE_FILE)):
            path = os.path.join(path, SINGLE_FILE)
        else:
            raise FileNotFoundError(f"{path}: no {SINGLE_FILE} or {INDEX_FILE}")
    if path.endswith(".json"):
        with open(path) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{path}: index has no 'weight_map' object")
        files = sorted(set(weight_map.values()))
        folder = os.path.dirname(path)
        paths = [os.path.join(folder, f) for f in files]
    else:
        paths = [path]
    for file in paths:
        if not os.path.isfile(file):
            raise FileNotFoundError(f"safetensors file {file!r} not found")
        with safe_open(file, framework="numpy") as f:
            for name in f.keys():
                yield name, f.get_tensor(name), file


def load_safetensors(model: nnx.Module, path: str | os.PathLike) -> nnx.Module:
    """Load an HF checkpoint (file, folder or index) into `model` in place; returns `model`."""
    tensors, origin = {}, {}
    for name, value, file in iter_safetensors(path):
        tensors[name], origin[name] = value, file
    return import_state_dict(model, tensors, source=os.fspath(path), origin=origin)
