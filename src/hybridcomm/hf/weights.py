"""Where weights come from: every source answers `tensor(name, shape)` for a whole
parameter and `expert(name, e, shape)` for expert e of a fused 3-D expert parameter, so a
rank reads only the experts it owns.

- RandomWeights: deterministic random weights, one seed per parameter and per expert, so the
  single-device model and every shard draw exactly the same numbers (no downloads).
- ModelWeights: the state of a materialised transformers model.
- CheckpointWeights: a local Hugging Face checkpoint directory (safetensors), read lazily:
  per-expert tensors on disk (`...experts.{e}.gate_proj.weight`) are read one expert at a time.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch

from .families import Family


def _seed(*parts) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode())


class RandomWeights:
    """Normal(0, std) weights, RMSNorm weights 1 + 0.1 * normal, drawn per parameter and per
    expert from `seed` on `device` (CPU and CUDA draw different numbers: compare like with like).
    std defaults to the config's initializer_range."""

    def __init__(self, seed: int = 0, device="cpu", std: float | None = None):
        self.seed, self.device, self.std = seed, torch.device(device), std

    def _draw(self, key, shape, name: str, config) -> torch.Tensor:
        g = torch.Generator(device=self.device)
        g.manual_seed(_seed(self.seed, *key))
        x = torch.randn(tuple(shape), generator=g, device=self.device)
        if name.endswith("norm.weight"):
            return 1 + 0.1 * x
        std = self.std if self.std is not None else getattr(config, "initializer_range", 0.02)
        return x * std

    def tensor(self, name: str, shape, config) -> torch.Tensor:
        return self._draw((name,), shape, name, config)

    def expert(self, name: str, e: int, shape, config) -> torch.Tensor:
        return self._draw((name, e), shape, name, config)


class ModelWeights:
    """Weights of a materialised model (its own parameters, not copies)."""

    def __init__(self, model):
        self.state = model.state_dict()

    def tensor(self, name, shape, config):
        return self.state[name]

    def expert(self, name, e, shape, config):
        return self.state[name][e]


class CheckpointWeights:
    """A local checkpoint directory: *.safetensors (with or without an index file)."""

    def __init__(self, path, family: Family):
        from safetensors import safe_open

        self.path, self.family, self._open = Path(path), family, safe_open
        index = self.path / "model.safetensors.index.json"
        if index.exists():
            self.files = {k: self.path / f for k, f in json.loads(index.read_text())["weight_map"].items()}
        else:
            self.files = {}
            for f in sorted(self.path.glob("*.safetensors")):
                with safe_open(f, "pt") as s:
                    self.files.update({k: f for k in s.keys()})
        if not self.files:
            raise FileNotFoundError(f"checkpoint: no *.safetensors files in {self.path}")

    def _disk_name(self, name: str) -> str:
        if name in self.files:
            return name
        for old, new in self.family.disk_renames.items():
            renamed = name.replace(old, new)
            if renamed in self.files:
                return renamed
        raise KeyError(f"checkpoint {self.path}: no tensor {name!r} (nor a renamed form of it)")

    def _read(self, disk_name: str, index: int | None = None) -> torch.Tensor:
        with self._open(self.files[disk_name], "pt") as s:
            if index is None:
                return s.get_tensor(disk_name)
            return s.get_slice(disk_name)[index]

    def tensor(self, name, shape, config):
        return self._read(self._disk_name(name))

    def expert(self, name, e, shape, config):
        if any(n in self.files for n in (name, *(name.replace(o, w) for o, w in self.family.disk_renames.items()))):
            return self._read(self._disk_name(name), e)  # fused on disk: read expert e's slice
        prefix, kind = name.rsplit(".", 1)
        gate, up, down = self.family.disk_expert_names
        one = lambda proj: self._read(self._disk_name(f"{prefix}.{e}.{proj}.weight"))  # noqa: E731
        return torch.cat([one(gate), one(up)]) if kind == "gate_up_proj" else one(down)
