"""One local Ray instance (and one set of actors) for the whole ps test session."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="the ps tests need Ray (pip install trainscale[ps])")


@pytest.fixture(scope="session")
def ray_local():
    """A small local Ray: 2 CPUs, no dashboard; shut down at the end of the session."""
    from trainscale.ps.session import _init

    _init(ray, {"num_cpus": 2}, verbose=False)  # the product's start, with its one retry on a busy machine
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def ps_actors(ray_local):
    """Four learners and two shards shared by the tests (each learner imports torch once)."""
    from trainscale.ps.actors import PsActors

    actors = PsActors(learners=4, shards=2, threads=1, max_restarts=10)
    try:
        yield actors
    finally:
        actors.close()


# Small and fast: an MLP of width 64 on digits.
SMALL = ["--model.width", "64", "--data.batch_size", "32", "--log.progress", "none"]


@pytest.fixture
def ps_config():
    """``ps_config("--ps.mode", "sync", ...)``: a validated Config for a small ps test run."""
    from trainscale.config import load_config

    return lambda *argv: load_config([*SMALL, *argv])
