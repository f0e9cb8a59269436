"""Fixtures of the simulator tests."""

from __future__ import annotations

import pytest
from sim_helpers import h200_cost

from sglang_feather.sim.cost import PhysicsCostModel


@pytest.fixture(scope="session")
def cost() -> PhysicsCostModel:
    return h200_cost()
