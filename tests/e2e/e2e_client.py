"""Async HTTP client for SGLang's native /generate API and shared-prefix prompt construction."""

import asyncio
import json
import random
import time
import urllib.request
from collections.abc import Sequence

import aiohttp

from sglang_feather.serving.completions import FIRST_TOKEN_ID, TINY_VOCAB_SIZE
from sglang_feather.serving.metrics import MetricsSnapshot, scrape
from sglang_feather.workload import SharedPrefixSpec

DRIFT = "sglang:feather_drift_total"
"""Requests Feather's self-check found out of step with SGLang (a scheduler event it missed)."""
CHT_REQUESTS = "sglang:feather_tracked_requests"
"""Gauge of requests Feather's CHT tracks (waiting + active), labelled by `state`; 0 when idle."""
FEATHER_CHECKS_EVERY_STEP = ("--feather-self-check-interval-s", "0")
"""Reconcile the CHT with SGLang's full picture at every scheduler step, so any drift shows in DRIFT."""
FLOAT32 = ("--dtype", "float32")
"""For tests that compare greedy outputs across servers. Scheduling must not change a result, but bfloat16 turns
any change of batch shape into last-bit differences of the hidden states: on this random tiny model, where top-2
logits often tie within a bfloat16 step, two servers whose batches differ only by timing flipped 2 of 450 greedy
outputs on a loaded CI machine (and vLLM's twin test 1 of 200). In float32 such flips need ties 65,536 times
closer, so a mismatch left is the scheduler's fault."""
BUSY = ("sglang:num_running_reqs", "sglang:num_queue_reqs", CHT_REQUESTS)


def shared_prefix_prompts(
    num_groups: int, per_group: int, prefix_len: int, suffix_lens: tuple[int, int], seed: int
) -> list[list[int]]:
    """The shared-prefix workload, groups interleaved, for the tiny model's vocabulary; each question is cut
    to a seeded random length in `suffix_lens` (a shorter question is a prefix of the longer one)."""
    spec = SharedPrefixSpec.per_group(
        num_groups,
        per_group,
        prefix_len=prefix_len,
        question_len=suffix_lens[1],
        order="interleaved",
        seed=seed,
    )
    rng = random.Random(seed)
    prompts = spec.prompts(low=FIRST_TOKEN_ID, high=TINY_VOCAB_SIZE)
    return [p[: prefix_len + rng.randint(*suffix_lens)].tolist() for p in prompts]


def greedy_payload(input_ids: list[int], max_new_tokens: int, **extra) -> dict:
    params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    return {"input_ids": input_ids, "sampling_params": params, **extra}


async def _post_text(session: aiohttp.ClientSession, url: str, payload: dict) -> str:
    async with session.post(url, json=payload) as response:
        body = await response.text()
        if response.status != 200:
            raise AssertionError(f"{url} answered {response.status}: {body[:500]}")
        return body


async def _post(session: aiohttp.ClientSession, url: str, payload: dict) -> dict:
    return json.loads(await _post_text(session, url, payload))


def _session(timeout_s: float) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=timeout_s)
    )


def generate_all(base_url: str, payloads: Sequence[dict], timeout_s: float = 600.0) -> list[dict]:
    """Send every payload at once (no client-side concurrency limit) and return the responses in order."""

    async def run() -> list[dict]:
        async with _session(timeout_s) as session:
            return await asyncio.gather(*(_post(session, base_url + "/generate", p) for p in payloads))

    return asyncio.run(run())


def client_session(timeout_s: float = 300.0) -> aiohttp.ClientSession:
    return _session(timeout_s)


async def stream_until_told(
    session: aiohttp.ClientSession,
    base_url: str,
    payload: dict,
    leave: asyncio.Event,
    *,
    abort: bool,
    decoding: asyncio.Event | None = None,
) -> int:
    """Stream (counting chunks) until `leave` is set, then POST /abort_request (abort=True) or drop the
    connection; returns the number of chunks that arrived before leaving. `decoding` is set once a second
    chunk arrived (the request is past its prefill and decoding)."""
    seen = 0

    async def consume(response: aiohttp.ClientResponse) -> None:
        nonlocal seen
        async for line in response.content:
            if line.startswith(b"data:") and b"[DONE]" not in line:
                seen += 1
                if seen >= 2 and decoding is not None:
                    decoding.set()

    async with session.post(base_url + "/generate", json={**payload, "stream": True}) as response:
        if response.status != 200:
            raise AssertionError(f"streaming /generate answered {response.status}")
        reader = asyncio.create_task(consume(response))
        await leave.wait()
        reader.cancel()
        if abort:
            await _post_text(session, base_url + "/abort_request", {"rid": payload["rid"]})
        else:
            response.close()
    return seen


def post_json(base_url: str, path: str, body: dict, timeout_s: float = 60.0) -> str:
    request = urllib.request.Request(
        base_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return response.read().decode()


def wait_drained(base_url: str, timeout_s: float = 90.0) -> MetricsSnapshot:
    """Poll /metrics until nothing is running, nothing queued and nothing left in Feather's tree.

    SGLang publishes its running and queue gauges at prefill reports, every 40th decode step and when it goes
    idle, so one of them can read 0 while requests still run; Feather's gauge is set at the end of every
    scheduler step. Waiting for all three to read 0 together does not trust a stale one."""
    deadline = time.monotonic() + timeout_s
    while True:
        snapshot = scrape(base_url)
        left = {name: snapshot.total(name) or 0 for name in BUSY}
        if not any(left.values()):
            return snapshot
        if time.monotonic() > deadline:
            raise AssertionError(f"{base_url} still holds requests after {timeout_s:.0f} s: {left}")
        time.sleep(0.5)
