"""The estimators on a user's own arrays: no silent fall-back to plain aggregation (a typed error naming
``value_bound``; plain only when asked for, with a warning), and progress shown by default on a terminal — a bar —
but nothing in logs, pipes and tests."""

import io
import warnings

import pytest

from securefed.data import load_dataset, partition
from securefed.errors import ConfigError
from securefed.estimators import FedSpectralClustering, FedTSNE, FedUMAP

pytestmark = pytest.mark.usefixtures("single_blas_thread")

FAST = dict(n_landmarks=12, cell_floor=5, audit_holdout=0.0, random_state=0, n_iter=300)


@pytest.fixture(scope="module")
def iris_sites():
    ds = load_dataset("iris")
    return [ds.X[i] for i in partition(ds.X, ds.y, 3, "iid", random_state=0)]


@pytest.mark.parametrize(
    "make",
    [
        lambda: FedTSNE(random_state=0),
        lambda: FedUMAP(random_state=0),
        lambda: FedSpectralClustering(n_clusters=3, random_state=0),
    ],
    ids=["tsne", "umap", "spectral"],
)
def test_no_silent_fall_back_to_plain_aggregation(iris_sites, make, monkeypatch):
    """Issue 25: ``FedTSNE(random_state=0).fit(sites)`` without a bound ran plain sums and said nothing."""

    def no_run(*a, **k):
        raise AssertionError("the run started")

    monkeypatch.setattr("securefed.federation.run_in_process", no_run)
    with pytest.raises(ConfigError, match=r"^value_bound=None is invalid: the default secure sum \(SecAgg\+\)") as info:
        make().fit(iris_sites)
    assert "never read off the records" in str(info.value) and "aggregation='plain'" in str(info.value)


def test_plain_only_when_asked_for_and_then_with_a_warning(iris_sites):
    with pytest.warns(UserWarning, match="aggregation='plain': the coordinator sees every site's own uploads"):
        est = FedTSNE(aggregation="plain", n_components=2, **FAST).fit(iris_sites)
    assert est.result_.aggregation["protocol"] == "plain"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a stated bound: SecAgg+, no warning
        est = FedTSNE(value_bound=8.0, **FAST).fit(iris_sites)
    assert est.result_.aggregation["protocol"] == "secagg"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_by_default_is_a_bar_on_a_terminal_and_silent_elsewhere(iris_sites, monkeypatch, capsys):
    FedTSNE(value_bound=8.0, **FAST).fit(iris_sites)  # pytest's capture is no terminal: nothing
    assert capsys.readouterr().err == ""
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    FedTSNE(value_bound=8.0, **FAST).fit(iris_sites)
    text = term.getvalue()
    assert text.startswith("\r[securefed] ") and text.endswith("\n") and text.count("\n") == 1
    assert "landmarks: cells round" in text and "audit" not in text.split("\r")[-1] and "done:" in text
    assert "█" * 24 in text.split("\r")[-1]  # the bar is full at the end
    lines = io.StringIO()
    monkeypatch.setattr("sys.stderr", lines)
    FedTSNE(value_bound=8.0, verbose=1, **FAST).fit(iris_sites)
    assert "\r" not in lines.getvalue() and "[landmarks] cells round 1" in lines.getvalue()
    with pytest.raises(ConfigError, match="^verbose='loud'"):
        FedTSNE(value_bound=8.0, verbose="loud", **FAST).fit(iris_sites)
