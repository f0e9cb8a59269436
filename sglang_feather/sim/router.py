"""A model of SMG 1.13.0's `cache_aware` routing policy (HTTP workers, approximate prefix tree), per request."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

# Where the model comes from (smg 1.13.0, `pip install smg==1.13.0`; `smg launch --help` and SMG's
# docs/concepts/routing/cache-aware.md, lightseekorg/smg): for each request SMG
# 1. keeps the *eligible* workers: those worker overload protection has not excluded (a worker whose last load
#    report has `num_waiting_reqs >= --worker-overload-waiting-requests` (8) or `token_usage >=
#    --worker-overload-token-usage` (0.8); on by default in 1.13.0; when every worker is excluded, all are);
# 2. matches the request against its approximate tree, the prefixes it routed to each worker (never what the
#    engines hold; the tree evicts only past --max-tree-size, 64M characters, so never here). A match ratio
#    (matched / request length) above --cache-threshold (0.3) makes the tenants of the deepest matched node the
#    candidates; otherwise the request is a cache miss;
# 3. spill gate: a candidate is hot when its in-flight count exceeds --balance-rel-threshold (1.5) times the
#    eligible workers' mean AND the mean plus a margin: --balance-abs-threshold (64) capped at the in-flight
#    count's natural swing at the current mean, "two standard deviations, never under four unless this value
#    is lower" (1.13.0's help); this model takes a Poisson swing, 2 sqrt(mean). The request goes to the
#    lowest-expected-wait candidate that is not hot; all hot: to the lowest-expected-wait eligible worker that
#    is not hot (or any, when all are hot): a *spill*;
# 4. a cache miss goes to the lowest-expected-wait eligible worker;
# 5. records the chosen worker as a holder of the request's prefix.
# Expected wait: SMG scores it like its least_load policy, queued and in-flight token work over the worker's
# reported throughput, each dispatch credited to the chosen worker until its next load report; this model
# uses the waiting uncached prompt tokens of the last report (what SGLang's load report counts, and what
# Feather reports exactly) plus the prompt tokens dispatched since, then the in-flight count as a tie-break,
# with the same throughput for every instance. Load reports (waiting requests, waiting tokens, KV usage) are
# read every `load_poll_s`; in-flight counts are SMG's own, always current. Not modelled: the warm-up slice
# (--worker-warmup-secs), the wedge and stall detectors, KV-usage triggers (off by default).


@dataclass(frozen=True)
class RouterConfig:
    cache_threshold: float = 0.3
    """smg 1.13.0 `--cache-threshold` default."""
    balance_abs_threshold: int = 64
    """`--balance-abs-threshold` default."""
    balance_rel_threshold: float = 1.5
    """`--balance-rel-threshold` default."""
    overload_waiting_requests: int | None = 8
    """`--worker-overload-waiting-requests` default (protection on by default in 1.13.0); None turns it off."""
    overload_token_usage: float = 0.8
    """`--worker-overload-token-usage` default."""
    load_poll_s: float = 10.0
    """How often SMG reads each worker's load report (`/v1/loads`): `--load-monitor-interval` default, and the
    10 s between `Fetched loads` lines in a live run's debug log (results of `make demo-cluster`)."""


@dataclass(frozen=True)
class InstanceLoad:
    """What SMG knows of one worker when it routes a request."""

    in_flight: int
    """Requests SMG dispatched to it that have not finished (SMG's own count)."""
    waiting: int
    """Requests in its waiting queue (its load report's `num_waiting_reqs`)."""
    waiting_tokens: int
    """Uncached prompt tokens waiting (`num_waiting_uncached_tokens`)."""
    token_usage: float


@dataclass
class CacheAwareRouter:
    num_workers: int
    config: RouterConfig = field(default_factory=RouterConfig)
    branches: dict[str, int] = field(default_factory=dict)
    _holders: dict[int, set[int]] = field(default_factory=dict)
    """Prefix (the hash of a request's first k blocks) -> workers it was routed to."""

    def route(
        self, hashes: Sequence[int], ends: Sequence[int], prompt_len: int, loads: Sequence[InstanceLoad]
    ) -> int:
        eligible = self._eligible(loads)
        matched, tenants = self._match(hashes, ends)
        candidates = [w for w in tenants if w in eligible]
        if prompt_len and matched / prompt_len > self.config.cache_threshold and candidates:
            cool = [w for w in candidates if not self._is_hot(w, loads, eligible)]
            if cool:
                choice, branch = self._least_wait(cool, loads), "tree_match"
            else:
                spill = [w for w in eligible if not self._is_hot(w, loads, eligible)] or eligible
                choice, branch = self._least_wait(spill, loads), "spill"
        elif prompt_len and matched / prompt_len > self.config.cache_threshold:
            choice, branch = self._least_wait(eligible, loads), "spill"
        else:
            choice, branch = self._least_wait(eligible, loads), "expected_wait_fallback"
        self.branches[branch] = self.branches.get(branch, 0) + 1
        for h in hashes:
            self._holders.setdefault(h, set()).add(choice)
        return choice

    def _eligible(self, loads: Sequence[InstanceLoad]) -> list[int]:
        c = self.config
        ok = [
            w
            for w, load in enumerate(loads)
            if (c.overload_waiting_requests is None or load.waiting < c.overload_waiting_requests)
            and load.token_usage < c.overload_token_usage
        ]
        return ok or list(range(len(loads)))

    def _match(self, hashes: Sequence[int], ends: Sequence[int]) -> tuple[int, set[int]]:
        """Tokens of the longest routed prefix and the workers holding it."""
        matched, tenants = 0, set()
        for h, end in zip(hashes, ends, strict=True):
            holders = self._holders.get(h)
            if not holders:
                break
            matched, tenants = end, holders
        return matched, set(tenants)

    def _is_hot(self, worker: int, loads: Sequence[InstanceLoad], eligible: Sequence[int]) -> bool:
        c = self.config
        mean = sum(loads[w].in_flight for w in eligible) / len(eligible)
        margin = min(c.balance_abs_threshold, max(min(4, c.balance_abs_threshold), 2 * math.sqrt(mean)))
        load = loads[worker].in_flight
        return load > c.balance_rel_threshold * mean and load > mean + margin

    @staticmethod
    def _least_wait(workers: Sequence[int], loads: Sequence[InstanceLoad]) -> int:
        return min(workers, key=lambda w: (loads[w].waiting_tokens, loads[w].in_flight, w))
