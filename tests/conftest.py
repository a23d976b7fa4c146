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
            raise pytest.UsageError(
                "SECUREFED_CI=1 but flwr is not importable: install the test extra "
                "(pip install '.[test]'), which pins flwr==1.41.0"
            )


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


class ClosedForm:
    """Differential-privacy figures written out here from their papers, independently of securefed's code, so that
    tests compare the code's σ and ε with a value it did not compute itself."""

    @staticmethod
    def gdp_delta(epsilon: float, mu: float) -> float:
        """δ(ε) of μ-GDP (Dong, Roth & Su 2022, Cor. 2.13): Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
        from scipy.stats import norm

        return float(norm.cdf(-epsilon / mu + mu / 2) - np.exp(epsilon + norm.logcdf(-epsilon / mu - mu / 2)))

    @staticmethod
    def gdp_epsilon(mu: float, delta: float) -> float:
        """The smallest ε with δ(ε) ≤ δ for μ-GDP (root of the decreasing δ(ε))."""
        from scipy.optimize import brentq

        if ClosedForm.gdp_delta(0.0, mu) <= delta:
            return 0.0
        hi = 1.0
        while ClosedForm.gdp_delta(hi, mu) > delta:
            hi *= 2
        return float(brentq(lambda e: ClosedForm.gdp_delta(e, mu) - delta, 0.0, hi, xtol=1e-13, rtol=1e-13))

    @staticmethod
    def gdp_mu(epsilon: float, delta: float) -> float:
        """The μ whose μ-GDP curve passes through (ε, δ) (δ(ε) grows with μ)."""
        from scipy.optimize import brentq

        hi = 1.0
        while ClosedForm.gdp_delta(epsilon, hi) < delta:
            hi *= 2
        return float(brentq(lambda m: ClosedForm.gdp_delta(epsilon, m) - delta, 1e-9, hi, xtol=1e-14, rtol=1e-13))

    @staticmethod
    def gaussian_mu(*sigma_over_sensitivity) -> float:
        """μ of composed Gaussian releases, each N(0, σ²) at L2 sensitivity Δ: √Σ (Δ/σ)² (μ-GDP composition)."""
        return float(np.sqrt(sum(1.0 / z**2 for z in sigma_over_sensitivity)))

    @staticmethod
    def perfect_test_epsilon(n: int, confidence: float, delta: float = 0.0) -> float:
        """The ε lower bound of a test that is right on all ``n`` trials of each class, from Clopper–Pearson
        intervals computed with scipy's beta quantiles: TPR ≥ Beta⁻¹(a; n, 1), FPR ≤ Beta⁻¹(1 − a; 1, n),
        a = (1 − confidence)/2, and ε = log((TPR − δ)/FPR)."""
        from scipy.stats import beta

        a = (1.0 - confidence) / 2.0
        tpr_lo, fpr_hi = beta.ppf(a, n, 1), beta.ppf(1.0 - a, 1, n)
        return float(np.log((tpr_lo - delta) / fpr_hi))

    @staticmethod
    def analytic_gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
        """δ of the Gaussian mechanism at σ (Balle & Wang 2018, Thm. 8): Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ)."""
        return ClosedForm.gdp_delta(epsilon, sensitivity / sigma)


@pytest.fixture(scope="session")
def closed_form():
    """:class:`ClosedForm`: independent DP closed forms for tests."""
    return ClosedForm
