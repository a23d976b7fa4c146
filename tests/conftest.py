"""Shared pytest set-up for the core-pipeline tests (markers and two tiny seeded fixtures)."""

import os

import numpy as np
import pytest
from hypothesis import settings

# Property tests: no per-example deadline (a loaded 2-core CI machine is slow, not wrong) and derandomized
# example generation, so a failure reproduces on the next run.
settings.register_profile("securefed", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("securefed")

# headless plotting for every test that writes embedding.png
os.environ.setdefault("MPLBACKEND", "Agg")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes several seconds (numba JIT, full digits fit, subprocess)")
    # CI (.ci/run sets SECUREFED_CI=1) must run the Flower subprocess tests, not skip them: flwr is in the
    # [test] extra, so a missing flwr there means the install went wrong.
    if os.environ.get("SECUREFED_CI") == "1":
        import importlib.util

        if importlib.util.find_spec("flwr") is None:
            raise pytest.UsageError("SECUREFED_CI=1 but flwr is not importable: install the test extra "
                                    "(pip install '.[test]'), which pins flwr==1.41.0")


@pytest.fixture(scope="module")
def single_blas_thread():
    """Limit BLAS to one thread for a module. On the shared 2-core machine, OpenBLAS's 2 threads on FedDL's
    small matrix products ran ~10x slower under load (fed_dl on digits: 10.8 s vs 1.1 s for 10 rounds)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="session")
def repo_root() -> str:
    """The repository root (where README.md, pyproject.toml and .ci/run live)."""
    return REPO_ROOT


@pytest.fixture
def blob_sites():
    """Three small seeded Gaussian sites in R^3 with different means and sizes (rows = records)."""
    rng = np.random.default_rng(1234)
    return [
        rng.normal(0.0, 1.0, size=(24, 3)),
        rng.normal(1.5, 0.7, size=(17, 3)),
        rng.normal(-1.0, 1.2, size=(31, 3)),
    ]
