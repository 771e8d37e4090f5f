"""Attention sparsity as data: how many cached tokens a decoding query needs, by context
length, layer and alpha, loaded from `simulator/catalog/sparsity/*.yaml` (each number with
its source) so that measurements from the real executor can replace the paper's numbers
without code changes.

The count n(c) is interpolated linearly in log(c)-log(n) between the table's points and
extrapolated beyond them with the end segments' log-log slopes (attention-important tokens
grow sub-linearly with context: InfiniGen's OPT-13B numbers grow ~c^0.5). It is clipped to
[1, c]. A per-layer multiplier, when the data gives one, scales n for each layer. Tables are
per alpha; an alpha between two tables is interpolated linearly in alpha, one outside them is
an error (the count depends strongly on alpha and cannot be guessed)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Optional

import numpy as np
from pydantic import BaseModel, Field, PositiveFloat, model_validator

from ..catalog_loader import canonical_names, index_folder, resolve
from ..errors import InfersimError
from ..paths import catalog_dir
from ..registry import name_key
from ..validation import STRICT_CONFIG
from ..yamlio import load_model_file


class ImportantTable(BaseModel):
    model_config = STRICT_CONFIG
    alpha: float
    context: list[PositiveFloat] = Field(min_length=1)
    tokens: list[PositiveFloat] = Field(min_length=1)
    source: str = ""

    @model_validator(mode="after")
    def _shape(self):
        if len(self.context) != len(self.tokens):
            raise ValueError("context and tokens must have the same length")
        if any(b <= a for a, b in zip(self.context, self.context[1:])):
            raise ValueError("context must increase strictly")
        return self


class SparsitySpec(BaseModel):
    model_config = STRICT_CONFIG
    name: str
    model: str = ""
    source: str
    important_tokens: list[ImportantTable] = Field(min_length=1)
    layer_scale: Optional[list[PositiveFloat]] = None
    layer_scale_source: str = ""
    important_mass: float = Field(0.9, gt=0, le=1)
    important_mass_source: str = ""

    @model_validator(mode="after")
    def _alphas(self):
        alphas = [t.alpha for t in self.important_tokens]
        if len(set(alphas)) != len(alphas):
            raise ValueError("one table per alpha")
        return self


def sparsity_dir() -> Path:
    return catalog_dir() / "sparsity"


def sparsity_names() -> list[str]:
    return canonical_names(sparsity_dir())


@lru_cache(maxsize=None)
def _load(path: str) -> SparsitySpec:
    return load_model_file(SparsitySpec, Path(path))


def load_sparsity(name: str) -> SparsitySpec:
    return _load(str(resolve("sparsity data", name, sparsity_dir())))


def default_sparsity_name(model_name: str) -> tuple[str, bool]:
    """The data named after the model when there is one, else OPT-13B's (the only published
    numbers); the flag says whether it was borrowed."""
    found = index_folder(str(sparsity_dir())).get(name_key(model_name))
    if found is not None:
        return found.stem, False
    return "opt-13b", True


def _loglog(x: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    lx, lxs, lys = np.log(np.maximum(x, 1.0)), np.log(xs), np.log(ys)
    if xs.size == 1:
        return np.exp(lys[0] + 1.0 * (lx - lxs[0]))  # one point: proportional to context
    y = np.interp(lx, lxs, lys)
    lo_slope = (lys[1] - lys[0]) / (lxs[1] - lxs[0])
    hi_slope = (lys[-1] - lys[-2]) / (lxs[-1] - lxs[-2])
    y = np.where(lx < lxs[0], lys[0] + lo_slope * (lx - lxs[0]), y)
    y = np.where(lx > lxs[-1], lys[-1] + hi_slope * (lx - lxs[-1]), y)
    return np.exp(y)


class SparsityModel:
    """n(c, layer, alpha): the important tokens of a decoding query with c cached tokens."""

    def __init__(self, spec: SparsitySpec, alpha: float):
        self.spec, self.alpha = spec, float(alpha)
        tables = sorted(spec.important_tokens, key=lambda t: t.alpha)
        alphas = [t.alpha for t in tables]
        if not alphas[0] <= self.alpha <= alphas[-1]:
            raise InfersimError(
                f"sparsity data '{spec.name}' has important-token tables for alpha "
                f"{', '.join(f'{a:g}' for a in alphas)}; alpha {self.alpha:g} is outside them"
            )
        hi = next(i for i, a in enumerate(alphas) if a >= self.alpha)
        lo = hi if alphas[hi] == self.alpha else hi - 1
        self._lo, self._hi = tables[lo], tables[hi]
        self._w = 0.0 if lo == hi else (self.alpha - alphas[lo]) / (alphas[hi] - alphas[lo])
        self.important_mass = spec.important_mass

    def mean_tokens(self, context) -> np.ndarray:
        """Average important tokens over layers (float, clipped to [1, c])."""
        c = np.asarray(context, dtype=np.float64)
        lo = _loglog(c, np.asarray(self._lo.context), np.asarray(self._lo.tokens))
        n = (
            lo
            if self._w == 0.0
            else (1 - self._w) * lo + self._w * _loglog(c, np.asarray(self._hi.context), np.asarray(self._hi.tokens))
        )
        return np.clip(n, 1.0, np.maximum(c, 1.0))

    def layer_scale(self, num_layers: int) -> np.ndarray:
        s = self.spec.layer_scale
        if s is None:
            return np.ones(num_layers)
        if len(s) != num_layers:
            raise InfersimError(
                f"sparsity data '{self.spec.name}' gives layer_scale for {len(s)} layers; "
                f"the model has {num_layers}"
            )
        return np.asarray(s, dtype=np.float64)

    def tokens(self, context, num_layers: int) -> np.ndarray:
        """Important tokens per layer, shape context.shape + (num_layers,), float."""
        c = np.asarray(context, dtype=np.float64)
        n = self.mean_tokens(c)[..., None] * self.layer_scale(num_layers)
        return np.clip(n, 1.0, np.maximum(c, 1.0)[..., None])
