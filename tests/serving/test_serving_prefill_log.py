"""Prefill totals from SGLang server logs captured from real runs (tests/serving/data), and from its format."""

from pathlib import Path

import pytest

from sglang_feather.serving.prefill_log import (
    PrefillTotals,
    log_size,
    parse_prefill_lines,
    read_prefill_totals,
)

DATA = Path(__file__).parent / "data"
KV_PRESSURE_LOG = DATA / "kv_pressure_fcfs.log"
"""An fcfs server of `python -m sglang_feather.demo --kv-pressure` (8192-token pool): startup, the harness's
health checks, bench_serving's warmup request, its cache flush, then the run's first prefill and decode lines."""
RETRACT_LOG = DATA / "test_retract.log"
"""A server run with SGLANG_TEST_RETRACT=1 (a retraction every third decode step), 4 requests of 64 tokens."""

AFTER_FLUSH = PrefillTotals(
    batches=9,
    new_seqs=16,
    new_tokens=2669 + 4091 + 1237 + 4084 + 1267 + 4095 + 3863 + 4082 + 2536,
    cached_tokens=2624 + 1376,
)


def test_the_run_after_bench_servings_cache_flush_is_counted():
    assert read_prefill_totals(KV_PRESSURE_LOG) == AFTER_FLUSH


def test_without_a_flush_health_checks_and_warmup_count_too():
    lines = [line for line in KV_PRESSURE_LOG.read_text().splitlines() if "Cache flushed" not in line]
    totals = parse_prefill_lines(lines)
    assert totals.new_tokens == AFTER_FLUSH.new_tokens + 18 + 1 + 2669
    assert (totals.batches, totals.new_seqs) == (AFTER_FLUSH.batches + 3, AFTER_FLUSH.new_seqs + 3)


def test_decode_and_request_lines_count_nothing():
    lines = [line for line in KV_PRESSURE_LOG.read_text().splitlines() if "Prefill batch" not in line]
    assert parse_prefill_lines(lines) == PrefillTotals()


def test_retractions_are_counted_and_their_prefills_with_them():
    totals = read_prefill_totals(RETRACT_LOG)
    assert totals.retracted_reqs == 2
    # Each retracted request came back with its prompt cached and its output so far to prefill again.
    assert totals.new_tokens == 18 + 1 + 64 + 192 + 1 + 2
    assert totals.cached_tokens == 64 + 64


def test_reading_starts_at_the_offset(tmp_path):
    log = tmp_path / "server.log"
    assert log_size(log) == 0
    lines = RETRACT_LOG.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:10]))
    offset = log_size(log)
    log.write_text("".join(lines))
    assert read_prefill_totals(log, offset) == PrefillTotals(
        batches=4, new_seqs=6, new_tokens=64 + 192 + 1 + 2, cached_tokens=64 + 64, retracted_reqs=2
    )


@pytest.mark.parametrize(
    ("line", "new_tokens"),
    [
        # SGLANG_LOG_FORWARD_ITERS=1 adds the forward iteration after "Prefill batch".
        ("[t] Prefill batch [42], #new-seq: 2, #new-token: 100, #cached-token: 7, token usage: 0.10, ", 100),
        # A replay (encoder sliding-window reset) is computed on top of #new-token.
        (
            "[t] Prefill batch, #new-seq: 1, #new-token: 10, #cached-token: 0, token usage: 0.00, "
            "#running-req: 0, #queue-req: 0, #pending-token: 0, #replay-token: 5, cpu graph: False",
            15,
        ),
    ],
)
def test_other_spellings_of_metrics_reporters_line(line, new_tokens):
    assert parse_prefill_lines([line]).new_tokens == new_tokens


def test_hit_rate_is_cached_over_all_prefill_tokens():
    assert AFTER_FLUSH.hit_rate == pytest.approx(4000 / (4000 + AFTER_FLUSH.new_tokens))
    assert PrefillTotals().hit_rate is None
