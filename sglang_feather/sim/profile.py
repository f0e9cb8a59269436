"""Cost-model profiles: a GPU file and a model file of sourced constants, plus measured override files."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROFILE_DIR = Path(__file__).parent / "profiles"
SOURCES = ("datasheet", "measured", "estimate")
CONSTANT_FIELDS = ("value", "unit", "source", "ref")
GPU_KEYS = {
    "memory": ("hbm_bytes", "hbm_bandwidth", "hbm_efficiency"),
    "compute": ("bf16_tflops", "prefill_efficiency", "num_sms"),
    "decode_attention": ("l2_bytes", "l2_effective_fraction", "l2_bandwidth", "ctas_per_sm"),
    "overhead": ("step_s", "per_request_s"),
}
OPTIONAL_GPU_KEYS = {"decode_attention": ("reuse_window_tokens",)}
MODEL_KEYS = {
    "architecture": (
        "num_layers",
        "hidden_size",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "num_params",
        "dtype_bytes",
    )
}


class ProfileError(ValueError):
    """A profile or override file is missing, malformed or does not apply."""


@dataclass(frozen=True)
class Profile:
    """A loaded GPU x model pair; `constants` maps "gpu.section.key"/"model.section.key" to sourced values."""

    gpu: str
    model: str
    constants: dict[str, dict[str, Any]]
    overrides: tuple[str, ...] = ()

    def value(self, path: str) -> float:
        return float(self.constants[path]["value"])

    def get(self, path: str) -> float | None:
        c = self.constants.get(path)
        return None if c is None else float(c["value"])

    def provenance(self) -> dict[str, Any]:
        by_source: dict[str, list[str]] = {s: [] for s in SOURCES}
        for path, c in sorted(self.constants.items()):
            by_source[c["source"]].append(path)
        return {
            "gpu": self.gpu,
            "model": self.model,
            "overrides": list(self.overrides),
            "by_source": by_source,
        }


def available(kind: str) -> list[str]:
    """Profile names of one kind, "gpu" or "model"."""
    return sorted(p.stem for p in (PROFILE_DIR / kind).glob("*.json"))


def _check_constant(c: Any, where: str) -> None:
    if not isinstance(c, dict) or set(c) != set(CONSTANT_FIELDS):
        raise ProfileError(f"{where}: a constant must have exactly the fields {CONSTANT_FIELDS}")
    if c["source"] not in SOURCES:
        raise ProfileError(f"{where}: source must be one of {SOURCES}, got {c['source']!r}")
    if not isinstance(c["value"], int | float) or c["value"] < 0:
        raise ProfileError(f"{where}: value must be a non-negative number")


def _flatten(kind: str, data: dict, schema: dict, optional: dict, where: str, partial: bool) -> dict:
    out = {}
    for section, body in data.items():
        if section in ("name", "description", "applies_to"):
            continue
        allowed = schema.get(section, ()) + optional.get(section, ())
        if not allowed or not isinstance(body, dict):
            raise ProfileError(f"{where}: unknown section {section!r}")
        for key, c in body.items():
            if key not in allowed:
                raise ProfileError(f"{where}: unknown key {section}.{key}")
            _check_constant(c, f"{where}: {section}.{key}")
            out[f"{kind}.{section}.{key}"] = c
    if not partial:
        missing = [f"{s}.{k}" for s, keys in schema.items() for k in keys if f"{kind}.{s}.{k}" not in out]
        if missing:
            raise ProfileError(f"{where}: missing constants {missing}")
    return out


def _read(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ProfileError(f"cannot read profile file {path}: {e}") from e
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: a profile file holds a JSON object")
    return data


def load_profile(gpu: str, model: str, overrides: tuple[str | Path, ...] = ()) -> Profile:
    files = {"gpu": PROFILE_DIR / "gpu" / f"{gpu}.json", "model": PROFILE_DIR / "model" / f"{model}.json"}
    for kind, path in files.items():
        if not path.exists():
            raise ProfileError(
                f"unknown {kind} profile {path.stem!r}; available: {available(path.parent.name)}"
            )
    constants = _flatten("gpu", _read(files["gpu"]), GPU_KEYS, OPTIONAL_GPU_KEYS, str(files["gpu"]), False)
    constants |= _flatten("model", _read(files["model"]), MODEL_KEYS, {}, str(files["model"]), False)
    for ov in overrides:
        constants = _apply_override(constants, Path(ov), gpu, model)
    return Profile(gpu, model, constants, tuple(str(o) for o in overrides))


def _apply_override(constants: dict, path: Path, gpu: str, model: str) -> dict:
    data = _read(path)
    applies = data.get("applies_to", {})
    if applies.get("gpu", gpu) != gpu or applies.get("model", model) != model:
        raise ProfileError(f"{path}: applies to {applies}, not to gpu={gpu!r} model={model!r}")
    extra = set(data) - {"applies_to", "gpu", "model", "name", "description"}
    if extra:
        raise ProfileError(f"{path}: unknown top-level keys {sorted(extra)}")
    new = copy.deepcopy(constants)
    for kind, schema, optional in (("gpu", GPU_KEYS, OPTIONAL_GPU_KEYS), ("model", MODEL_KEYS, {})):
        for name, c in _flatten(kind, data.get(kind, {}), schema, optional, str(path), True).items():
            base = constants.get(name)
            if base is not None and base["unit"] != c["unit"]:
                raise ProfileError(f"{path}: {name} unit {c['unit']!r} differs from {base['unit']!r}")
            new[name] = c
    return new
