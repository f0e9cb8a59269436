"""`static`: the authors' fixed chunk-loss thresholds with a per-pass dynamic floor, and a new-group rule."""

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
    max_groups: int | None = None
    """A candidate that adds a prefix group is stopped while this many groups run (None: no cap). Physical
    reading: a decode step reads every running group's prefix; where those prefixes outgrow the GPU's L2
    (a concurrent attention window of A100 x Llama-3-8B holds one 4K prefix) each group's readers fetch it
    from DRAM again, so fewer groups per step means more L2 hits per request."""
    min_new_group: int = 1
    """A candidate that adds a prefix group is stopped unless at least this many requests of its group wait
    (itself included). Physical reading: a group's prefix is served from L2 only to readers in the same
    concurrent attention window (SMs x thread blocks per SM / KV heads requests: 27 on A100, 33 on H200, 35
    on RTX 6000 Ada for Llama-3-8B), so a group too small to fill one is read from DRAM by each request and
    breaks the window it lands in. 1 admits every group."""

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
        if not (type(self.min_new_group) is int and self.min_new_group >= 1):
            raise ValueError(f"static option min_new_group must be an int >= 1, got {self.min_new_group!r}")
        if self.max_groups is not None and not (type(self.max_groups) is int and self.max_groups >= 1):
            raise ValueError(f"static option max_groups must be an int >= 1 or None, got {self.max_groups!r}")
        if self.min_floor > self.max_floor:
            raise ValueError(f"static min_floor={self.min_floor} exceeds max_floor={self.max_floor}")


class StaticPolicy(PolicyBase):
    """Admit the first request of an empty batch; then a candidate is homogeneous when it costs at most
    `max_chunk_loss` chunks of shared prefix (`max_chunk_loss_lenient` when `w >= high_load_sharing`).
    Each homogeneous admission raises a floor (from `min_floor`, by one, up to `max_floor`); a
    non-homogeneous candidate is admitted only while the batch is smaller than the floor. The authors'
    comment says the floor is reset every scheduling round but their code never resets it; both readings
    are available (`floor_per_pass`), the code's is the default because it produced the paper's numbers.

    A candidate that adds a prefix group to the running batch (continuous batching: its Δ is 0 in a mixed
    batch, so the authors' rule always admits it) is stopped while `max_groups` groups run, or when fewer
    than `min_new_group` requests of its group wait; both rules are off by default (the authors' rule alone).
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
        if obs.adds_group and self._holds_back_group(obs):
            return Decision.STOP
        lenient = obs.num_sharing >= cfg.high_load_sharing
        ceiling = cfg.max_chunk_loss_lenient if lenient else cfg.max_chunk_loss
        if obs.delta <= ceiling:
            self.floor = min(self.floor + 1, cfg.max_floor)
            return Decision.ADD
        return Decision.ADD if obs.batch_size < self.floor else Decision.STOP

    def _holds_back_group(self, obs: Observation) -> bool:
        cfg = self.config
        if cfg.max_groups is not None and obs.num_groups_running >= cfg.max_groups:
            return True
        return obs.num_group_waiting + 1 < cfg.min_new_group
