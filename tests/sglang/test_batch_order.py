"""`--feather-batch-order prefix` on real SGLang `ScheduleBatch`es: prefix order, every per-request field moved."""

from __future__ import annotations

import argparse
from array import array
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import FakeClock, feather_policy, make_allocator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.plugins.hook_registry import HookType, _wrap_fn
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sglang_feather.admission import AdmissionConfig
from sglang_feather.offline.sglang_objects import make_radix_cache
from sglang_feather.sglang import batch_order, plugin
from sglang_feather.sglang.metrics import FeatherMetrics
from sglang_feather.sglang.options import (
    FeatherOptions,
    FeatherOptionsError,
    add_cli_args,
    options_from_namespace,
)

TINY_MODEL = Path(__file__).resolve().parents[2] / "models" / "tiny-llama"
CHUNK = 4
PREFIX_OPTIONS = FeatherOptions(AdmissionConfig(stopper="always", chunk_size=CHUNK), batch_order="prefix")

TOKENIZER = SimpleNamespace(eos_token_id=2, additional_stop_token_ids=None)
"""What `min_new_tokens` reads of the tokenizer the scheduler gives each request: the tiny model's EOS id."""

NOT_PERMUTED = {
    "prefix_lens",
    "extend_lens",
    "extend_logprob_start_lens",
    "extend_input_logprob_token_ids",
    "out_cache_loc",
}
"""Prefill-only fields: `merge_batch` does not concatenate them and `prepare_for_extend` rebuilds them, so on a
merged running batch they are stale in SGLang itself (never read by a decode);
`extend_input_logprob_token_ids` is moreover one entry per prefilled token, not per request (it only looks
per-request when every request prefilled one token). And `out_cache_loc`: each decode allocates fresh KV slots
in row order, so it is checked through the request-to-token table instead."""


@pytest.fixture(scope="module")
def model_config() -> ModelConfig:
    if not (TINY_MODEL / "config.json").is_file():
        pytest.fail(f"{TINY_MODEL} does not exist: run `make model` (part of `make setup`)")
    return ModelConfig.from_server_args(ServerArgs(model_path=str(TINY_MODEL), device="cpu"))


class Engine:
    """A CPU request pool, KV allocator and radix cache, and the batch steps SGLang's scheduler runs on them."""

    def __init__(self, model_config: ModelConfig) -> None:
        self.model_config = model_config
        self.pool = ReqToTokenPool(size=256, max_context_len=256, device="cpu", enable_memory_saver=False)
        self.allocator = make_allocator(65536)
        self.cache = make_radix_cache(allocator=self.allocator, req_to_token_pool=self.pool)

    def req(self, rid: str, ids: list[int], index: int) -> Req:
        """Requests differ in every per-request sampling field and in logprob options, by `index`."""
        bias = {str(10 + index % 7): 0.5 + index} if index % 3 == 0 else None
        params = SamplingParams(
            max_new_tokens=64,
            temperature=0.25 + index,
            top_p=1.0 - 0.01 * (index % 5),
            top_k=5 + index,
            min_p=0.001 * (index % 4),
            frequency_penalty=0.1 * (index % 3),
            presence_penalty=0.05 * (index % 2),
            repetition_penalty=1.0 + 0.1 * (index % 2),
            min_new_tokens=index % 4,
            logit_bias=bias,
        )
        params.normalize(TOKENIZER)
        params.verify(self.model_config.vocab_size)
        req = Req(
            rid,
            "",
            array("q", ids),
            params,
            return_logprob=index % 2 == 1,
            top_logprobs_num=index % 5 if index % 2 == 1 else 0,
            token_ids_logprob=[index, index + 1] if index % 4 == 1 else None,
            vocab_size=self.model_config.vocab_size,
        )
        req.tokenizer = TOKENIZER
        return req

    def prefill(self, reqs: list[Req]) -> ScheduleBatch:
        """A prefill batch as the admission loop builds it, after its forward: one sampled token per request."""
        for req in reqs:
            req.init_next_round_input(self.cache)
            req.extend_end = len(req.full_untruncated_fill_ids)
        batch = ScheduleBatch.init_new(
            reqs,
            self.pool,
            self.allocator,
            self.cache,
            self.model_config,
            False,
            SpeculativeAlgorithm.NONE,
        )
        batch.prepare_for_extend()
        sample(batch)
        return batch

    @staticmethod
    def decode(batch: ScheduleBatch) -> None:
        batch.prepare_for_decode()
        sample(batch)


def sample(batch: ScheduleBatch) -> None:
    """A forward without SGLang's overlap: the inputs are consumed and the sampled tokens are the next inputs.

    Tokens derive from the request (so each row's history is its own)."""
    for req in batch.reqs:
        req.output_ids.append(11 + (sum(map(ord, req.rid)) + 7 * len(req.output_ids)) % 900)
    batch.prefill_input_ids_cpu = None
    batch.input_ids = torch.tensor([req.output_ids[-1] for req in batch.reqs], dtype=torch.int64)


def prompt(path: tuple[int, ...], salt: int) -> list[int]:
    """Chunks named by `path` (shared with every prompt on the same path), then a private partial chunk."""
    ids = [100 + 37 * depth + 5 * part + t for depth, part in enumerate(path) for t in range(CHUNK)]
    return ids + [900 + salt, 901 + salt]


def track(scheduler: SchedulerView, *batches: ScheduleBatch) -> None:
    """Feather's reconcile (its periodic self-check): every request of `batches` running, as after admission."""
    scheduler.policy.feather.mirror.sync([], [req for batch in batches for req in batch.reqs], complete=True)


class SchedulerView(SimpleNamespace):
    """The attributes of SGLang's `Scheduler` that Feather reads (weakly referenced, like a real one)."""


def make_scheduler(engine: Engine, options: FeatherOptions = PREFIX_OPTIONS, metrics=None) -> SchedulerView:
    policy = feather_policy(engine.cache, options, FakeClock(), metrics)
    scheduler = SchedulerView(policy=policy, waiting_queue=[], chunked_req=None, running_batch=None)
    batch_order.attach(scheduler, options.batch_order)
    return scheduler


merge = _wrap_fn(ScheduleBatch.merge_batch, plugin._after_merge_batch, HookType.AFTER)
"""`ScheduleBatch.merge_batch` as the plugin's AFTER hook wraps it in a server."""


# ----------------------------------------------------------------- per-request fields


def per_request_fields(batch: ScheduleBatch) -> dict[str, object]:
    """Every tensor or list with one row per request: the batch's, its sampling info's, its penalizers'."""
    num_reqs = len(batch.reqs)
    owners = {"batch": batch, "sampling": batch.sampling_info}
    for penalizer in batch.sampling_info.penalizer_orchestrator.penalizers.values():
        owners[type(penalizer).__name__] = penalizer
    fields = {}
    for owner_name, owner in owners.items():
        for name, value in vars(owner).items():
            if name in NOT_PERMUTED:
                continue
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == num_reqs:
                fields[f"{owner_name}.{name}"] = value.clone()
            elif isinstance(value, list) and len(value) == num_reqs:
                fields[f"{owner_name}.{name}"] = [
                    item.rid if isinstance(item, Req) else item for item in value
                ]
    return fields


def assert_permuted(before: dict[str, object], after: dict[str, object], keep: list[int]) -> None:
    assert before.keys() == after.keys()
    for name, old in before.items():
        new = after[name]
        if isinstance(old, torch.Tensor):
            assert torch.equal(new, old[keep]), name
        else:
            assert new == [old[i] for i in keep], name


def assert_rows_match_requests(batch: ScheduleBatch) -> None:
    """Row i of every field describes `batch.reqs[i]` (checked against the request's own state)."""
    info = batch.sampling_info
    penalizers = {type(p).__name__: p for p in info.penalizer_orchestrator.penalizers.values()}
    for i, req in enumerate(batch.reqs):
        params = req.sampling_params
        assert batch.req_pool_indices[i] == req.kv.req_pool_idx
        assert batch.req_pool_indices_cpu[i] == req.kv.req_pool_idx
        kv_len = len(req.origin_input_ids) + len(req.output_ids) - 1
        assert batch.seq_lens[i] == kv_len and batch.seq_lens_cpu[i] == kv_len
        assert batch.orig_seq_lens[i] == kv_len
        assert info.temperatures[i, 0].item() == pytest.approx(params.temperature)
        assert info.top_ps[i].item() == pytest.approx(params.top_p)
        assert info.top_ks[i] == params.top_k
        assert info.min_ps[i].item() == pytest.approx(params.min_p)
        bias = torch.zeros(batch.model_config.vocab_size)
        for token, value in (params.logit_bias or {}).items():
            bias[int(token)] = value
        assert torch.equal(info.logit_bias[i], bias)
        if batch.return_logprob:
            assert batch.top_logprobs_nums[i] == (req.logprob.top_logprobs_num if req.return_logprob else 0)
            assert batch.token_ids_logprobs[i] == (
                req.logprob.token_ids_logprob if req.return_logprob else None
            )
        frequency = penalizers["BatchedFrequencyPenalizer"]
        if frequency.is_prepared():
            assert frequency.frequency_penalties[i, 0].item() == pytest.approx(params.frequency_penalty)
        min_new = penalizers["BatchedMinNewTokensPenalizer"]
        if min_new.is_prepared():
            assert min_new.min_new_tokens[i, 0] == params.min_new_tokens


def assert_prefix_contiguous(reqs: list[Req]) -> None:
    """Brute force over token prefixes: at every depth, the requests sharing that many chunks are contiguous."""
    longest = max(len(req.origin_input_ids) for req in reqs) // CHUNK
    for depth in range(1, longest + 1):
        positions: dict[tuple, list[int]] = {}
        for index, req in enumerate(reqs):
            if len(req.origin_input_ids) >= depth * CHUNK:
                positions.setdefault(tuple(req.origin_input_ids[: depth * CHUNK]), []).append(index)
        for where in positions.values():
            assert where == list(range(where[0], where[0] + len(where))), (depth, [r.rid for r in reqs])


# ----------------------------------------------------------------- tests

FIRST = [(0, 0), (1, 0), (2,), (0, 1), (1, 0, 3)]
SECOND = [(2, 1), (0, 0, 1), (1, 1), (3,)]


def world(model_config, paths_per_prefill, scheduler_options=None):
    """An engine whose running batch decoded once, plus the next prefill batch, ready to merge."""
    engine = Engine(model_config)
    first, second = paths_per_prefill
    running = engine.prefill([engine.req(f"r{i:03d}", prompt(p, i), i) for i, p in enumerate(first)])
    engine.decode(running)
    start = len(first)
    new = engine.prefill(
        [engine.req(f"r{start + i:03d}", prompt(p, start + i), start + i) for i, p in enumerate(second)]
    )
    scheduler = None
    if scheduler_options is not None:
        scheduler = make_scheduler(engine, scheduler_options)
        scheduler.running_batch = running
        track(scheduler, running, new)
    return engine, running, new, scheduler


def rows_by_rid(batch: ScheduleBatch, reference: ScheduleBatch) -> list[int]:
    index = {req.rid: i for i, req in enumerate(reference.reqs)}
    return [index[req.rid] for req in batch.reqs]


def test_merge_puts_the_running_batch_in_prefix_order_and_moves_every_field(model_config):
    plain_engine, plain, plain_new, _ = world(model_config, (FIRST, SECOND))
    engine, running, new, _scheduler = world(model_config, (FIRST, SECOND), PREFIX_OPTIONS)

    ScheduleBatch.merge_batch(plain, plain_new)
    merge(running, new)

    assert_prefix_contiguous(running.reqs)
    keep = rows_by_rid(running, plain)
    assert keep != list(range(len(keep))), "the merge was already in prefix order: nothing was tested"
    assert_permuted(per_request_fields(plain), per_request_fields(running), keep)
    assert_rows_match_requests(running)

    # Both decode on: allocation, penalty accumulation and sampling rows follow the requests.
    for _ in range(3):
        plain_engine.decode(plain)
        engine.decode(running)
    fields = per_request_fields(running)
    assert any(name.endswith("cumulated_frequency_penalties") for name in fields)
    assert_permuted(per_request_fields(plain), fields, keep)
    for i, req in enumerate(running.reqs):
        prompt_slots = len(req.origin_input_ids)
        row = plain.req_pool_indices[keep[i]]
        assert torch.equal(
            engine.pool.req_to_token[req.kv.req_pool_idx, :prompt_slots],
            plain_engine.pool.req_to_token[row, :prompt_slots],
        )
        assert (
            engine.pool.req_to_token[req.kv.req_pool_idx, running.seq_lens[i] - 1] == running.out_cache_loc[i]
        )


def test_an_ordered_batch_is_left_alone_and_the_cost_is_exported(model_config):
    registry = CollectorRegistry()
    metrics = FeatherMetrics({"model_name": "tiny"}, registry=registry)
    engine = Engine(model_config)
    running = engine.prefill([engine.req(f"r{i:03d}", prompt((0, i // 2), i), i) for i in range(4)])
    scheduler = make_scheduler(engine, PREFIX_OPTIONS, metrics)
    scheduler.running_batch = running
    gathers = []
    filter_batch = running.filter_batch
    running.filter_batch = lambda **kwargs: (gathers.append(kwargs), filter_batch(**kwargs))

    def sample_value(name: str) -> float | None:
        return registry.get_sample_value(name, {"model_name": "tiny"})

    in_order = engine.prefill([engine.req("r004", prompt((5,), 4), 4)])
    track(scheduler, running, in_order)
    merge(running, in_order)
    assert [req.rid for req in running.reqs] == ["r000", "r001", "r002", "r003", "r004"]
    assert gathers == []
    assert sample_value("sglang:feather_batch_order_seconds_count") == 1
    assert sample_value("sglang:feather_batch_reorders_total") == 0

    joining = engine.prefill([engine.req("r005", prompt((0, 0), 5), 5)])
    track(scheduler, running, joining)
    merge(running, joining)
    assert [req.rid for req in running.reqs] == ["r000", "r001", "r005", "r002", "r003", "r004"]
    assert len(gathers) == 2
    assert sample_value("sglang:feather_batch_order_seconds_count") == 2
    assert sample_value("sglang:feather_batch_reorders_total") == 1
    assert sample_value("sglang:feather_batch_order_seconds_sum") > 0


def test_only_the_schedulers_running_batch_is_permuted(model_config):
    """Mixed chunked prefill merges the running batch *into* a prefill batch: that merge must stay as it is."""
    _, running, new, scheduler = world(model_config, (FIRST, SECOND), PREFIX_OPTIONS)
    scheduler.running_batch = new
    before = [req.rid for req in running.reqs] + [req.rid for req in new.reqs]
    merge(running, new)
    assert [req.rid for req in running.reqs] == before


@pytest.mark.parametrize("order", ["admission", None])
def test_admission_order_and_other_policies_keep_sglangs_order(model_config, order):
    options = replace(PREFIX_OPTIONS, batch_order="admission") if order else PREFIX_OPTIONS
    _, running, new, scheduler = world(model_config, (FIRST, SECOND), options)
    if order is None:  # a scheduler without Feather: attach() ignores the requested order
        scheduler.policy.feather = None
        batch_order.attach(scheduler, "prefix")
        scheduler.policy.feather = feather_policy(scheduler.policy.tree_cache).feather
    before = [req.rid for req in running.reqs] + [req.rid for req in new.reqs]
    merge(running, new)
    assert [req.rid for req in running.reqs] == before


def test_requests_the_tree_does_not_track_follow_in_their_order(model_config):
    _, running, new, scheduler = world(model_config, (FIRST, SECOND), PREFIX_OPTIONS)
    untracked = {"r001", "r006"}
    for req in [*running.reqs, *new.reqs]:
        if req.rid in untracked:
            scheduler.policy.feather.admission.tree.finish(req.rid)
    merge(running, new)
    rids = [req.rid for req in running.reqs]
    assert rids[-2:] == ["r001", "r006"]
    assert_prefix_contiguous(running.reqs[:-2])
    assert_rows_match_requests(running)


def test_keep_indices():
    assert batch_order.keep_indices(None, ["a", "b"]) is None
    assert batch_order.keep_indices(["a", "b"], ["a", "b"]) is None
    assert batch_order.keep_indices(["c", "a"], ["a", "b", "c"]) == [2, 0, 1]
    with pytest.raises(ValueError, match="twice"):
        batch_order.keep_indices(["a"], ["a", "a"])
    with pytest.raises(ValueError, match="twice"):
        batch_order.keep_indices(["a", "a"], ["a", "b"])


def test_permute_refuses_a_non_permutation(model_config):
    engine = Engine(model_config)
    running = engine.prefill([engine.req(f"r{i}", prompt((i,), i), i) for i in range(3)])
    with pytest.raises(ValueError, match="permutation"):
        batch_order.permute(running, [0, 0, 1])
    assert [req.rid for req in running.reqs] == ["r0", "r1", "r2"]


paths = st.lists(st.integers(0, 2), min_size=1, max_size=3).map(tuple)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(
        st.tuples(st.lists(paths, min_size=1, max_size=5), st.sets(st.integers(0, 12), max_size=3)),
        min_size=1,
        max_size=5,
    )
)
def test_random_merges_finishes_and_decodes_keep_rows_consistent(model_config, steps):
    """Merges of random prefix groups, requests finishing in between, decodes: after every merge the batch is
    in prefix order and row i of every field is request i's, as against SGLang's own merge of a twin engine."""
    plain_engine, engine = Engine(model_config), Engine(model_config)
    scheduler = make_scheduler(engine)
    plain = running = None
    count = 0
    for new_paths, finishing in steps:
        batches = []
        for eng in (plain_engine, engine):
            reqs = [
                eng.req(f"r{count + i:03d}", prompt(p, count + i), count + i) for i, p in enumerate(new_paths)
            ]
            batches.append(eng.prefill(reqs))
        count += len(new_paths)
        plain_new, new = batches
        if running is None:
            plain, running = plain_new, new
            scheduler.running_batch = running
            track(scheduler, running)
            continue
        track(scheduler, running, new)
        ScheduleBatch.merge_batch(plain, plain_new)
        merge(running, new)
        assert_prefix_contiguous(running.reqs)
        keep = rows_by_rid(running, plain)
        assert_permuted(per_request_fields(plain), per_request_fields(running), keep)
        assert_rows_match_requests(running)
        done = {plain.reqs[index].rid for index in finishing if index < len(plain.reqs) - 1}
        for batch in (plain, running):
            for req in batch.reqs:
                if req.rid in done:
                    req.finished_reason = FINISH_LENGTH(length=1)
            batch.filter_batch()
        plain_engine.decode(plain)
        engine.decode(running)
        assert_rows_match_requests_after_decode(running)
        assert [r.rid for r in running.reqs] == [plain.reqs[i].rid for i in rows_by_rid(running, plain)]


def assert_rows_match_requests_after_decode(batch: ScheduleBatch) -> None:
    for i, req in enumerate(batch.reqs):
        assert batch.req_pool_indices[i] == req.kv.req_pool_idx
        assert batch.seq_lens_cpu[i] == len(req.origin_input_ids) + len(req.output_ids) - 1


# ----------------------------------------------------------------- options and wiring


def _parse(argv: list[str]):
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedule-policy")
    add_cli_args(parser)
    return options_from_namespace(parser.parse_args(argv))


def test_the_flag():
    assert FeatherOptions().batch_order == "admission"
    assert _parse(["--schedule-policy", "feather", "--feather-batch-order", "prefix"]).batch_order == "prefix"
    with pytest.raises(FeatherOptionsError, match="--feather-batch-order must be one of"):
        _parse(["--schedule-policy", "feather", "--feather-batch-order", "dfs"])
    with pytest.raises(FeatherOptionsError, match="only apply with --schedule-policy feather"):
        _parse(["--schedule-policy", "lpm", "--feather-batch-order", "prefix"])


def test_the_plugin_registers_the_merge_hook_and_the_startup_guard_accepts_it():
    target = f"{plugin.SCHEDULE_BATCH}.merge_batch"
    assert plugin.HOOKS[target] == (plugin._after_merge_batch, ("self", "other"))
    assert plugin.check_sglang() is None
