"""Cost of `--feather-batch-order prefix` per merge, next to SGLang's own `merge_batch`, on real CPU batches."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

from sglang_feather.admission import AdmissionConfig
from sglang_feather.offline.sglang_objects import (
    make_allocator,
    make_radix_cache,
    make_req,
    publish_cpu_context,
    quiet_sglang,
)
from sglang_feather.sglang import batch_order
from sglang_feather.sglang.options import FeatherOptions
from sglang_feather.sglang.policy import FeatherSchedulePolicy
from sglang_feather.workload import SharedPrefixSpec

with quiet_sglang():
    import torch
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH, ScheduleBatch
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

CHUNK = 16
NUM_GROUPS = 16
PREFIX_CHUNKS = 4
QUESTION_LEN = 8
"""Every prompt: a 64-token group prefix, then 8 private tokens (the shared-prefix serving workloads' shape)."""


@dataclass(frozen=True)
class Row:
    num_running: int
    num_merged: int
    num_merges: int
    merge_median_ms: float
    merge_min_ms: float
    merge_max_ms: float
    filter_median_ms: float
    """SGLang's own `filter_batch` dropping `num_merged` finished requests: what every finish costs already."""
    order_median_ms: float
    order_min_ms: float
    order_max_ms: float
    num_moved: int
    """Merges after which the batch was actually permuted (the rest were already in order)."""


class _SchedulerView(SimpleNamespace):
    """The attributes of SGLang's `Scheduler` that Feather reads."""


class _Bench:
    def __init__(self, model_config: ModelConfig, num_rows: int, seed: int) -> None:
        self.model_config = model_config
        self.rng = random.Random(seed)
        spec = SharedPrefixSpec(
            num_groups=NUM_GROUPS,
            num_requests=max(num_rows, NUM_GROUPS),
            prefix_len=PREFIX_CHUNKS * CHUNK,
            question_len=QUESTION_LEN,
            seed=seed,
        )
        self.prompts = iter(spec.prompts())
        self.pool = ReqToTokenPool(
            size=num_rows, max_context_len=256, device="cpu", enable_memory_saver=False
        )
        self.allocator = make_allocator(num_rows * 128)
        self.cache = make_radix_cache(allocator=self.allocator, req_to_token_pool=self.pool)
        policy = FeatherSchedulePolicy("feather", self.cache, False, False, False)
        options = FeatherOptions(
            AdmissionConfig(stopper="always", chunk_size=CHUNK), batch_order=batch_order.PREFIX
        )
        policy.configure(options)
        self.scheduler = _SchedulerView(policy=policy, waiting_queue=[], chunked_req=None, running_batch=None)
        batch_order.attach(self.scheduler, options.batch_order)
        self.count = 0

    def prefill(self, num_reqs: int) -> ScheduleBatch:
        reqs = []
        for _ in range(num_reqs):
            req = make_req(f"b{self.count:06d}", next(self.prompts), max_new_tokens=4096)
            req.init_next_round_input(self.cache)
            req.extend_end = len(req.full_untruncated_fill_ids)
            reqs.append(req)
            self.count += 1
        batch = ScheduleBatch.init_new(
            reqs, self.pool, self.allocator, self.cache, self.model_config, False, SpeculativeAlgorithm.NONE
        )
        batch.prepare_for_extend()
        self._forward(batch)
        return batch

    @staticmethod
    def _forward(batch: ScheduleBatch) -> None:
        for req in batch.reqs:
            req.output_ids.append(7)
        batch.prefill_input_ids_cpu = None
        batch.input_ids = torch.full((len(batch.reqs),), 7, dtype=torch.int64)

    def track(self, *batches: ScheduleBatch) -> None:
        """Feather's reconcile: every request of `batches` running, as after admission."""
        running = [req for batch in batches for req in batch.reqs]
        self.scheduler.policy.feather.mirror.sync([], running, complete=True)


def run(num_running: int, num_merged: int, num_merges: int, model_config: ModelConfig, seed: int = 0) -> Row:
    bench = _Bench(model_config, num_running + num_merged * (num_merges + 2), seed)
    running = bench.prefill(num_running)
    running.prepare_for_decode()
    bench._forward(running)
    bench.scheduler.running_batch = running
    bench.track(running)
    merge_s, order_s, filter_s, moved = [], [], [], 0
    for _ in range(num_merges):
        new = bench.prefill(num_merged)
        bench.track(running, new)
        before = [req.rid for req in running.reqs] + [req.rid for req in new.reqs]
        t0 = time.perf_counter()
        ScheduleBatch.merge_batch(running, new)
        t1 = time.perf_counter()
        batch_order.after_merge(running, new)
        t2 = time.perf_counter()
        merge_s.append(t1 - t0)
        order_s.append(t2 - t1)
        moved += [req.rid for req in running.reqs] != before
        # As many leave as joined, from random places: the batch stays at num_running requests.
        leaving = set(bench.rng.sample(range(len(running.reqs)), num_merged))
        for index in leaving:
            running.reqs[index].finished_reason = FINISH_LENGTH(length=1)
        t0 = time.perf_counter()
        running.filter_batch()
        filter_s.append(time.perf_counter() - t0)
        running.prepare_for_decode()
        bench._forward(running)
    ms = [1e3 * s for s in merge_s], [1e3 * s for s in order_s]
    return Row(
        num_running=num_running,
        num_merged=num_merged,
        num_merges=num_merges,
        merge_median_ms=statistics.median(ms[0]),
        merge_min_ms=min(ms[0]),
        merge_max_ms=max(ms[0]),
        filter_median_ms=1e3 * statistics.median(filter_s),
        order_median_ms=statistics.median(ms[1]),
        order_min_ms=min(ms[1]),
        order_max_ms=max(ms[1]),
        num_moved=moved,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=str(Path(__file__).resolve().parents[2] / "models" / "tiny-llama"))
    parser.add_argument("--running", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--merged", type=int, default=8, help="requests per merged prefill batch")
    parser.add_argument("--merges", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    server_args = publish_cpu_context(args.model, role="bench", fresh=True)
    model_config = ModelConfig.from_server_args(server_args)
    rows = [run(n, args.merged, args.merges, model_config) for n in args.running]
    print(
        "| running R | merged | SGLang merge_batch ms | SGLang filter_batch ms (median) "
        "| prefix order ms (median, min-max) | merges permuted |"
    )
    print("|---:|---:|---|---:|---|---:|")
    for row in rows:
        print(
            f"| {row.num_running} | {row.num_merged} | {row.merge_median_ms:.3f} "
            f"({row.merge_min_ms:.3f}-{row.merge_max_ms:.3f}) | {row.filter_median_ms:.3f} "
            f"| {row.order_median_ms:.3f} ({row.order_min_ms:.3f}-{row.order_max_ms:.3f}) "
            f"| {row.num_moved}/{row.num_merges} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(row) for row in rows], indent=2))


if __name__ == "__main__":
    main()
