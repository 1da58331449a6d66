"""Per-turn latency injection: a distribution of extra seconds added to every environment step (benchmarks).

Specs, as text (seconds):
    none | fixed(0.2) | constant(0.2) | normal(mu, sigma) | lognormal(mean, stddev) | uniform(a, b)
    | exponential(mean)
optionally followed by clamps: ``normal(0.5, 0.25) clip(0, 2)``. Normal draws are clipped at 0 (a latency is
never negative); every draw is clipped to [min, max] when given. ``lognormal`` takes the mean and standard
deviation of the latency itself (not of its logarithm), as the proto's ``LatencyDistribution`` does.
Each environment loop draws from its own stream: ``spec.sampler(stream=loop_index)``.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import time
from dataclasses import dataclass
from typing import Any

from rollart.runtime import timeutil

KINDS = ("none", "constant", "normal", "lognormal", "uniform", "exponential")
_ALIASES = {"fixed": "constant", "const": "constant", "gaussian": "normal", "exp": "exponential"}
_CALL = re.compile(r"^\s*([a-z_]+)\s*(?:\(([^)]*)\))?\s*(?:clip\s*\(([^)]*)\))?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class LatencySpec:
    kind: str = "none"
    mean: float = 0.0  # constant value; normal mu; lognormal/exponential mean; uniform low bound is `low`
    stddev: float = 0.0
    low: float = 0.0  # lower clamp and uniform's lower bound
    high: float = 0.0  # upper clamp and uniform's upper bound (0: no upper clamp)
    seed: int = 0  # 0: unseeded

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown latency distribution {self.kind!r} (one of {', '.join(KINDS)})")
        for name in ("mean", "stddev", "low", "high"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"latency {name} must be a finite number >= 0, got {v}")
        if self.kind == "uniform" and self.high < self.low:
            raise ValueError("uniform latency needs low <= high")
        if self.kind == "lognormal" and self.mean <= 0:
            raise ValueError("lognormal latency needs mean > 0")
        if self.high and self.high < self.low:
            raise ValueError("latency clamp needs min <= max")

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> LatencySpec:
        m = _CALL.match(text or "none")
        if not m:
            raise ValueError(f"cannot parse latency spec {text!r}")
        kind = _ALIASES.get(m.group(1).lower(), m.group(1).lower())
        args = _floats(m.group(2))
        clip = _floats(m.group(3))
        lo, hi = (clip + [0.0, 0.0])[:2] if clip else (0.0, 0.0)
        need = {"none": 0, "constant": 1, "normal": 2, "lognormal": 2, "uniform": 2, "exponential": 1}.get(kind)
        if need is None:
            raise ValueError(f"unknown latency distribution {kind!r} (one of {', '.join(KINDS)})")
        if len(args) != need:
            raise ValueError(f"{kind} takes {need} argument(s), got {len(args)} in {text!r}")
        if kind == "uniform":
            return cls(kind, low=args[0], high=args[1], seed=seed)
        if kind in ("normal", "lognormal"):
            return cls(kind, mean=args[0], stddev=args[1], low=lo, high=hi, seed=seed)
        if kind in ("constant", "exponential"):
            return cls(kind, mean=args[0], low=lo, high=hi, seed=seed)
        return cls("none", seed=seed)

    @classmethod
    def from_proto(cls, msg: Any) -> LatencySpec:
        """From a ``rollart.v1.LatencyDistribution``."""

        secs = timeutil.seconds
        names = {0: "none", 1: "none", 2: "constant", 3: "normal", 4: "lognormal", 5: "uniform", 6: "exponential"}
        kind = names.get(int(msg.kind))
        if kind is None:
            raise ValueError(f"unknown latency distribution kind {msg.kind}")
        return cls(kind, mean=secs(msg.mean), stddev=secs(msg.stddev), low=secs(msg.min), high=secs(msg.max),
                   seed=int(msg.seed))

    def sampler(self, stream: int | str = 0) -> LatencySampler:
        return LatencySampler(self, stream)

    @property
    def enabled(self) -> bool:
        return self.kind != "none"


def _floats(raw: str | None) -> list[float]:
    if raw is None or not raw.strip():
        return []
    try:
        return [float(x) for x in raw.split(",")]
    except ValueError:
        raise ValueError(f"latency arguments must be numbers: {raw!r}") from None


class LatencySampler:
    """Draws latencies of one spec from one stream (seeded specs: reproducible per (seed, stream))."""

    def __init__(self, spec: LatencySpec, stream: int | str = 0) -> None:
        self.spec = spec
        if spec.seed:
            digest = hashlib.sha256(f"{spec.seed}/{stream}".encode()).digest()
            self.rng = random.Random(int.from_bytes(digest[:8], "big"))
        else:
            self.rng = random.Random()

    def sample(self) -> float:
        s = self.spec
        if s.kind == "none":
            return 0.0
        if s.kind == "constant":
            value = s.mean
        elif s.kind == "normal":
            value = self.rng.gauss(s.mean, s.stddev)
        elif s.kind == "lognormal":
            sigma2 = math.log1p((s.stddev / s.mean) ** 2)
            value = self.rng.lognormvariate(math.log(s.mean) - sigma2 / 2, math.sqrt(sigma2))
        elif s.kind == "uniform":
            return self.rng.uniform(s.low, s.high)
        else:
            value = self.rng.expovariate(1.0 / s.mean) if s.mean > 0 else 0.0
        value = max(value, s.low, 0.0)
        if s.high > 0:
            value = min(value, s.high)
        return value

    def sleep(self) -> float:
        """Sleeps one draw (blocking); returns it. Async callers use ``await asyncio.sleep(sampler.sample())``."""
        delay = self.sample()
        if delay > 0:
            time.sleep(delay)
        return delay
