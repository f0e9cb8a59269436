"""ucb and qlearn learn the known optimal stopping rule of the synthetic environments."""

import numpy as np
import pytest

from sglang_feather.policy import Decision, Observation, make_policy
from sglang_feather.policy.synthetic import GroupedWorkload, greedy_score, train

ENVIRONMENTS = {
    "grouped": GroupedWorkload(),
    "homogeneous": GroupedWorkload(small_batch=4, max_good_delta=0),
}
EPISODES = 6000
"""The stated convergence budget: one episode = one scheduling pass and its window."""
MIN_GREEDY_MATCH = {"ucb": 0.99, "qlearn": 0.97}
WELL_VISITED = 150


def visited_contexts(policy):
    table = policy.counts if policy.name == "ucb" else policy.visits
    return {ctx for ctx, n in table.items() if sum(n) >= WELL_VISITED}


@pytest.mark.parametrize("env_name", sorted(ENVIRONMENTS))
@pytest.mark.parametrize("name", ["ucb", "qlearn"])
def test_learners_converge_to_the_optimal_rule_with_sublinear_regret(name, env_name):
    env = ENVIRONMENTS[env_name]
    policy = make_policy(name, seed=1)
    training = train(policy, env, EPISODES, seed=1)
    regret = np.cumsum(training.regrets)
    quarter = EPISODES // 4
    per_quarter = np.diff(regret[[0, quarter - 1, 2 * quarter - 1, 3 * quarter - 1, EPISODES - 1]])
    assert np.all(training.regrets >= -1e-12)
    # Sublinear: the second half costs well under the first, the last quarter under half the first.
    assert regret[-1] - regret[EPISODES // 2 - 1] < 0.6 * regret[EPISODES // 2 - 1]
    assert per_quarter[-1] < 0.5 * per_quarter[0]
    # Far below the non-learning baselines over the same episodes.
    always = train(make_policy("always"), env, EPISODES // 4, seed=1).regrets.sum()
    assert regret[quarter - 1] < 0.25 * always

    match, greedy_regret = greedy_score(policy, env, 500, seed=10_001)
    assert match >= MIN_GREEDY_MATCH[name]
    assert greedy_regret < 0.01
    contexts = visited_contexts(policy)
    assert len(contexts) >= 10
    for batch_bucket, delta, sharing_bucket, *new_group_buckets in contexts:
        assert new_group_buckets == [0, 0, 0, 0]  # the synthetic candidates never add a prefix group
        obs = Observation(4 * batch_bucket, 40, 40 - delta, 4 * sharing_bucket, 1, 0.0)
        assert policy.greedy(obs) is env.optimal(obs), (batch_bucket, delta, sharing_bucket)


def test_the_two_environments_need_different_rules():
    big_small_delta = Observation(10, 40, 39, 0, 3, 0.0)
    assert ENVIRONMENTS["grouped"].optimal(big_small_delta) is Decision.ADD
    assert ENVIRONMENTS["homogeneous"].optimal(big_small_delta) is Decision.STOP


def test_static_and_always_do_not_learn():
    env = ENVIRONMENTS["grouped"]
    for name in ("always", "static"):
        regrets = train(make_policy(name), env, 2000, seed=2).regrets
        first, second = regrets[:1000].sum(), regrets[1000:].sum()
        assert second > 0.8 * first > 0


@pytest.mark.parametrize("name", ["ucb", "qlearn"])
def test_training_is_deterministic_given_the_seed(name):
    env = ENVIRONMENTS["grouped"]
    runs = []
    for _ in range(2):
        policy = make_policy(name, seed=4)
        runs.append((train(policy, env, 400, seed=4).regrets, policy.state_dict()))
    assert np.array_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]


def test_synthetic_environment_needs_a_known_optimum():
    with pytest.raises(ValueError, match="known optimum"):
        GroupedWorkload(gain=0.2, loss=0.3)


def test_convergence_script_prints_a_table_and_writes_the_png(tmp_path, capsys):
    from sglang_feather.policy.convergence import main

    out = tmp_path / "conv.png"
    main(["--episodes", "60", "--seeds", "1", "--runs", "always", "ucb", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "grouped" in printed and "homogeneous" in printed and "R2/R1" in printed
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
