"""`static`: the authors' fixed chunk-loss thresholds with a per-pass dynamic floor."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_feather.policy.base import Decision, Observation, PolicyBase


@dataclass(frozen=True)
class StaticConfig:
    """Constants of the authors' `FeatherRequestQueue` (vLLM PR #42134); all counts in chunks/requests."""

    max_chunk_loss: int = 5
    max_chunk_loss_lenient: int = 7
    high_load_sharing: int = 10
    """The lenient ceiling applies when `w` (num_sharing) >= this; the authors' variable is named
    `requests_waiting` but holds the CHT's peer count `w`, which is what we compare."""
    min_floor: int = 1
    max_floor: int = 10
    floor_per_pass: bool = False
    """False (the authors' code as run): the floor lives as long as the policy, so after `max_floor - 1`
    homogeneous admissions every batch below `max_floor` takes any candidate. True (the authors' comment):
    reset at each `begin_pass`; then batch size and floor grow together and the floor never opens."""

    def __post_init__(self) -> None:
        if type(self.floor_per_pass) is not bool:
            raise ValueError(f"static option floor_per_pass must be a bool, got {self.floor_per_pass!r}")
        for name in (
            "max_chunk_loss",
            "max_chunk_loss_lenient",
            "high_load_sharing",
            "min_floor",
            "max_floor",
        ):
            value = getattr(self, name)
            if not (type(value) is int and value >= 0):
                raise ValueError(f"static option {name} must be an int >= 0, got {value!r}")
        if self.min_floor > self.max_floor:
            raise ValueError(f"static min_floor={self.min_floor} exceeds max_floor={self.max_floor}")


class StaticPolicy(PolicyBase):
    """Admit the first request of an empty batch; then a candidate is homogeneous when it costs at most
    `max_chunk_loss` chunks of shared prefix (`max_chunk_loss_lenient` when `w >= high_load_sharing`).
    Each homogeneous admission raises a floor (from `min_floor`, by one, up to `max_floor`); a
    non-homogeneous candidate is admitted only while the batch is smaller than the floor. The authors'
    comment says the floor is reset every scheduling round but their code never resets it; both readings
    are available (`floor_per_pass`), the code's is the default because it produced the paper's numbers.
    """

    name = "static"

    def __init__(self, config: StaticConfig | None = None) -> None:
        super().__init__()
        self.config = config if config is not None else StaticConfig()
        self.floor = self.config.min_floor

    def begin_pass(self) -> None:
        if self.config.floor_per_pass:
            self.floor = self.config.min_floor

    def decide(self, obs: Observation) -> Decision:
        cfg = self.config
        if obs.batch_size == 0:
            return Decision.ADD
        lenient = obs.num_sharing >= cfg.high_load_sharing
        ceiling = cfg.max_chunk_loss_lenient if lenient else cfg.max_chunk_loss
        if obs.delta <= ceiling:
            self.floor = min(self.floor + 1, cfg.max_floor)
            return Decision.ADD
        return Decision.ADD if obs.batch_size < self.floor else Decision.STOP
