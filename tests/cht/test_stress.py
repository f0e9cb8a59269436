"""A shorter run of `make stress` (which does 1M operations) in CI."""

import pytest

from sglang_feather.cht.stress import run_stress


@pytest.mark.parametrize("seed", [0, 1])
def test_stress_against_reference(seed, tree_cls):
    result = run_stress(num_ops=30_000, seed=seed, check_every=500, tree_cls=tree_cls)
    assert result.num_checks == 61
