"""Subprocess probe: parse `--schedule-policy feather` like the launcher, then order and admit one queue.

Run as `python probe_admission.py POLICY[,POLICY...] [FEATHER-FLAG...]`; prints one JSON line mapping each
policy to its result, or to {"error": ...} when the launcher's argument parsing rejects it.
It goes through SGLang's own entry points: `load_plugins()`, `prepare_server_args`, the Scheduler's
`init_schedule_policy` / `get_prefill_adder_class` / `_add_request_to_queue` / `_release_aborted_request`
(called on a stand-in object holding only the attributes they read; no model, no GPU), a real RadixCache, token allocator, ScheduleBatch and Req objects.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace


def main(argv: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    from sglang.srt.plugins import load_plugins

    load_plugins()
    results = {}
    for policy in argv[0].split(","):
        flags = argv[1:] if policy == "feather" else []
        try:
            results[policy] = probe(["--schedule-policy", policy, *flags])
        except SystemExit as exc:
            results[policy] = {"error": f"argument parsing exited with {exc.code}"}
    try:
        results["attention"] = probe_attention()
    except SystemExit as exc:
        results["attention"] = {"error": f"argument parsing exited with {exc.code}"}
    print(json.dumps(results))


def probe_attention() -> dict:
    """`--attention-backend feather_grouped` as the launcher parses and resolves it for a CUDA server (the
    resolution reads the tiny model's config and needs no GPU), beside torch_native's."""
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.arg_groups.pipeline import run_resolution_pipeline
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils.common import support_triton

    model = str(Path(__file__).resolve().parents[2] / "models" / "tiny-llama")
    result = {"registered": "feather_grouped" in ATTENTION_BACKENDS}
    for backend in ("feather_grouped", "torch_native"):
        server_args = prepare_server_args(
            ["--model-path", model, "--device", "cuda", "--attention-backend", backend]
        )
        run_resolution_pipeline(server_args)
        graphs = resolved_view(server_args).cuda_graph_config
        result[backend] = {
            "cuda_graphs": [str(graphs.decode.backend), str(graphs.prefill.backend)],
            "support_triton": support_triton(backend),
        }
    return result


def probe(argv: list[str]) -> dict:
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import AddReqResult
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import prepare_server_args

    from sglang_feather.offline.sglang_objects import make_allocator, make_radix_cache, make_req

    server_args = prepare_server_args(["--model-path", "dummy", "--device", "cpu", *argv])
    reset_context()
    publish(server_args, role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None))

    allocator = make_allocator(8192)
    cache = make_radix_cache(allocator=allocator)
    scheduler = SimpleNamespace(
        waiting_queue=[],
        disaggregation_mode=DisaggregationMode.NULL,
        processed_tokens_counter=0,
        _set_or_validate_priority=lambda req: True,
        _abort_on_queued_limit=lambda req: False,
        _prefetch_kvcache=lambda req: None,
        schedule_policy=server_args.schedule_policy,
        server_args=server_args,
        tree_cache=cache,
        enable_hierarchical_cache=False,
        enable_priority_scheduling=False,
        schedule_low_priority_values_first=False,
        metrics_collector_context=None,
        metrics_collector=None,
        metrics_reporter=SimpleNamespace(enable_metrics=False),
    )
    Scheduler.init_schedule_policy(scheduler)
    adder_cls = Scheduler.get_prefill_adder_class(scheduler)

    groups = [list(range(g * 1000 + 1, g * 1000 + 1 + 192)) for g in range(3)]
    queue = []
    for i in range(12):
        g = (i * 7) % 3
        ids = groups[g][: 64 + 64 * ((i // 3) % 3)] + [50_000 + i] * (10 + i)
        queue.append(make_req(f"r{i:02d}-g{g}", ids, max_new_tokens=8))

    running = ScheduleBatch(reqs=[], batch_is_full=False)
    scheduler.policy.calc_priority(queue, running)
    order = [req.rid for req in queue]
    adder = adder_cls(1, cache, allocator, running, 0.5, 16384, None)
    for req in queue:
        req.init_next_round_input(cache)
        if (
            adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
            is not AddReqResult.CONTINUE
        ):
            break
    # SGLang's own queue events: two arrivals through `_add_request_to_queue`, then one of them aborted.
    late = [make_req(f"late{i}", [90_000 + i] * 40, max_new_tokens=8) for i in range(2)]
    for req in late:
        Scheduler._add_request_to_queue(scheduler, req)
    scheduler.waiting_queue.remove(late[0])
    Scheduler._release_aborted_request(scheduler, late[0])
    feather = getattr(scheduler.policy, "feather", None)
    return {
        "tracked": sorted(feather.mirror.tracked()) if feather is not None else None,
        "policy_class": type(scheduler.policy).__name__,
        "adder_class": adder_cls.__name__,
        "options": repr(feather.options) if feather is not None else None,
        "state_tag": dict(feather.config.state_tag) if feather is not None else None,
        "order": order,
        "admitted": [req.rid for req in adder.can_run_list],
    }


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main(sys.argv[1:])
