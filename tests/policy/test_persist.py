import json
import logging
import multiprocessing
import threading
from pathlib import Path

import numpy as np
import pytest

import sglang_feather.policy.persist as persist
from sglang_feather.policy import load_state, make_policy, save_state
from sglang_feather.policy.context import Context
from sglang_feather.policy.persist import FORMAT, VERSION
from sglang_feather.policy.synthetic import GroupedWorkload, draw_episode, play, train

ENV = GroupedWorkload()


def trained(name, episodes=300, seed=0):
    policy = make_policy(name, seed=seed)
    train(policy, ENV, episodes, seed)
    return policy


def decisions_after(policy, seed=5, episodes=200):
    rng = np.random.default_rng(seed)
    return [
        [r.decision.value for r in play(policy, ENV, draw_episode(ENV, rng), rng).records]
        for _ in range(episodes)
    ]


@pytest.mark.parametrize("name", ["always", "static", "ucb", "qlearn", "ucb-adaptive"])
def test_round_trip_restores_state_and_behaviour(tmp_path, name):
    policy = trained(name)
    path = tmp_path / "state.json"
    save_state(policy, path)
    document = json.loads(path.read_text())
    assert (document["format"], document["version"], document["policy"]) == (FORMAT, VERSION, name)
    restored = make_policy(name, seed=99)
    assert load_state(restored, path) is True
    assert restored.state_dict() == policy.state_dict()
    assert decisions_after(restored) == decisions_after(policy)
    assert restored.state_dict() == policy.state_dict()


def test_learned_state_survives_a_restart(tmp_path):
    policy = trained("ucb", episodes=2000)
    persist.save_state(policy, tmp_path / "ucb.json")
    fresh, restored = make_policy("ucb"), make_policy("ucb")
    assert load_state(restored, tmp_path / "ucb.json")
    assert sum(map(sum, restored.counts.values())) == sum(map(sum, policy.counts.values())) > 0
    assert fresh.counts == {}


def test_missing_file_starts_fresh_quietly(tmp_path, caplog):
    policy = make_policy("qlearn")
    with caplog.at_level(logging.WARNING):
        assert load_state(policy, tmp_path / "absent.json") is False
    assert caplog.records == []
    assert policy.q == {}


def write_document(path, **overrides):
    document = {
        "format": FORMAT,
        "version": VERSION,
        "policy": "ucb",
        "state": make_policy("ucb").state_dict(),
    }
    document.update(overrides)
    path.write_text(json.dumps(document))


def test_a_valid_hand_written_file_loads(tmp_path):
    path = tmp_path / "s.json"
    state = {
        "normalizer": {"peak": 900.0, "num_windows": 3},
        "counts": [[2, 3, 0, 4, 1]],
        "sums": [[2, 3, 0, 2.0, 0.1]],
    }
    write_document(path, state=state)
    policy = make_policy("ucb")
    assert load_state(policy, path)
    assert policy.normalizer.peak == 900.0
    assert policy.counts == {Context(2, 3, 0): [4, 1]}  # a saved authors' context loads as the same context


def test_a_file_with_new_group_contexts_loads(tmp_path):
    path = tmp_path / "s.json"
    state = {
        "normalizer": {"peak": 900.0, "num_windows": 3},
        "counts": [[10, 0, 0, 5, 2, 1, 3, 4, 1]],
        "sums": [[10, 0, 0, 5, 2, 1, 3, 2.0, 0.1]],
    }
    write_document(path, state=state)
    policy = make_policy("ucb")
    assert load_state(policy, path)
    assert policy.counts == {Context(10, 0, 0, 5, 2, 1, 3): [4, 1]}


BAD_FILES = {
    "truncated json": lambda p: p.write_text('{"format": "sglang-feather/stopping-policy", "vers'),
    "empty": lambda p: p.write_text(""),
    "binary": lambda p: p.write_bytes(b"\xff\xfe\x00garbage"),
    "not an object": lambda p: p.write_text("[1, 2, 3]"),
    "wrong format": lambda p: write_document(p, format="something-else"),
    "wrong version": lambda p: write_document(p, version=VERSION + 1),
    "other policy": lambda p: write_document(p, policy="qlearn"),
    "no state": lambda p: write_document(p, state=None),
    "missing table": lambda p: write_document(p, state={"normalizer": {"peak": None, "num_windows": 0}}),
    "bad row": lambda p: write_document(
        p,
        state={
            "normalizer": {"peak": 5.0, "num_windows": 1},
            "counts": [[1, 2, 3, 4, 5], [1, 2]],
            "sums": [[1, 2, 3, 0.5, 0.5]],
        },
    ),
    "negative count": lambda p: write_document(
        p,
        state={
            "normalizer": {"peak": 5.0, "num_windows": 1},
            "counts": [[1, 2, 3, -4, 5]],
            "sums": [[1, 2, 3, 0.5, 0.5]],
        },
    ),
    "bad peak": lambda p: write_document(
        p, state={"normalizer": {"peak": "fast", "num_windows": 1}, "counts": [], "sums": []}
    ),
    "a directory": lambda p: p.mkdir(),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_warn_and_leave_the_policy_fresh(tmp_path, caplog, case):
    path = tmp_path / "state.json"
    BAD_FILES[case](path)
    policy = make_policy("ucb")
    before = policy.state_dict()
    with caplog.at_level(logging.WARNING, logger="sglang_feather.policy.persist"):
        assert load_state(policy, path) is False
    assert policy.state_dict() == before
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert str(path) in message and "starting fresh" in message


def test_bad_qlearn_rng_state_is_rejected_whole(tmp_path, caplog):
    good = trained("qlearn", episodes=50)
    document = {"format": FORMAT, "version": VERSION, "policy": "qlearn", "state": good.state_dict()}
    document["state"]["rng"] = {"bit_generator": "NoSuchGenerator"}
    path = tmp_path / "q.json"
    path.write_text(json.dumps(document))
    policy = make_policy("qlearn")
    with caplog.at_level(logging.WARNING):
        assert load_state(policy, path) is False
    assert policy.q == {} and "rng" in caplog.text


def test_failed_save_raises_and_keeps_the_old_file(tmp_path):
    policy = trained("ucb", episodes=20)
    with pytest.raises(OSError):
        persist.save_state(policy, tmp_path / "no-such-dir" / "state.json")
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    with pytest.raises(OSError):
        persist.save_state(policy, target)
    assert (target / "keep").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


def states_of_growing_size(name, count):
    """Policies whose JSON sizes differ, so a torn or truncated file could not pass as a complete one."""
    policies = []
    for i in range(count):
        policy = make_policy(name, seed=i)
        train(policy, ENV, 5 + 15 * i, i)
        policies.append(policy)
    return policies


def assert_complete(path, name):
    document = json.loads(Path(path).read_text())
    assert document["policy"] == name
    assert load_state(make_policy(name), path)


def test_concurrent_thread_writers_never_leave_a_truncated_file(tmp_path):
    path = tmp_path / "state.json"
    policies = states_of_growing_size("ucb", 6)
    persist.save_state(policies[0], path)
    stop = threading.Event()
    failures = []

    def reader():
        while not stop.is_set():
            try:
                assert_complete(path, "ucb")
            except Exception as exc:  # collected and reported below
                failures.append(exc)

    def writer(k):
        for i in range(40):
            persist.save_state(policies[(k + i) % len(policies)], path)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    read = threading.Thread(target=reader)
    read.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    read.join()
    assert failures == []
    assert_complete(path, "ucb")
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def _process_writer(path, seed, rounds):
    policy = make_policy("qlearn", seed=seed)
    train(policy, ENV, 10 + 40 * seed, seed)
    for _ in range(rounds):
        persist.save_state(policy, path)


def test_concurrent_process_writers_never_leave_a_truncated_file(tmp_path):
    path = tmp_path / "state.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_process_writer, args=(path, seed, 60)) for seed in range(3)]
    for p in procs:
        p.start()
    while any(p.is_alive() for p in procs):
        if path.exists():
            assert_complete(path, "qlearn")
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert_complete(path, "qlearn")
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


H100 = {"engine": "sglang", "model": "m", "device": "NVIDIA H100"}
H200 = {"engine": "sglang", "model": "m", "device": "NVIDIA H200"}


def test_a_state_learned_elsewhere_is_refused_with_a_warning_and_kept_in_the_file(tmp_path, caplog):
    path = tmp_path / "state.json"
    on_h100 = trained("ucb", episodes=200, seed=1)
    persist.save_state(on_h100, path, tag=H100)
    fresh = make_policy("ucb")
    with caplog.at_level(logging.WARNING, logger="sglang_feather.policy.persist"):
        assert load_state(fresh, path, tag=H200) is False
    assert fresh.state_dict() == make_policy("ucb").state_dict()
    assert "device='NVIDIA H100', not device='NVIDIA H200'" in caplog.records[0].getMessage()
    on_h200 = trained("ucb", episodes=50, seed=2)
    persist.save_state(on_h200, path, tag=H200)
    persist.save_state(on_h200, path, tag=H200)
    document = json.loads(path.read_text())
    assert document["tag"] == H200 and [e["tag"] for e in document["others"]] == [H100]
    for tag, learned in ((H100, on_h100), (H200, on_h200)):
        again = make_policy("ucb")
        assert load_state(again, path, tag=tag) and again.state_dict() == learned.state_dict()


def test_a_file_saved_with_fewer_tag_keys_still_loads(tmp_path):
    path = tmp_path / "state.json"
    learned = trained("ucb", episodes=100)
    persist.save_state(learned, path, tag={"engine": "sglang"})
    again = make_policy("ucb")
    assert load_state(again, path, tag=H200) and again.state_dict() == learned.state_dict()


def test_each_policy_keeps_its_own_state_in_a_shared_file(tmp_path):
    path = tmp_path / "state.json"
    ucb, qlearn = trained("ucb", episodes=100), trained("qlearn", episodes=100)
    persist.save_state(ucb, path, tag=H200)
    persist.save_state(qlearn, path, tag=H200)
    for name, learned in (("ucb", ucb), ("qlearn", qlearn)):
        again = make_policy(name)
        assert load_state(again, path, tag=H200) and again.state_dict() == learned.state_dict()
