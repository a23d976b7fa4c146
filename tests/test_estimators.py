"""Fed-tSNE / Fed-UMAP / Fed-SpeClust estimators (Qiao et al. Algorithms 2-3): quality floors, what each
Nyström mode sends, the audit gate, the scikit-learn parameter protocol and bad input.

(The Nyström algebra itself — kernel form exact when the landmarks are the data, feature-map distances —
is covered by tests/test_nystrom.py and not repeated here.)"""

import warnings

import numpy as np
import pytest

from securefed.data import load_dataset, partition
from securefed.errors import AuditFailedError, ConfigError, DataError
from securefed.estimators import (
    CentralizedSpectralClustering,
    CentralizedTSNE,
    FedSpectralClustering,
    FedTSNE,
    FedUMAP,
)
from securefed.kernels import gaussian_kernel, sq_dists
from securefed.metrics import METRIC_KEYS, classification_accuracy, clustering_metrics, embedding_metrics

pytestmark = pytest.mark.usefixtures("single_blas_thread")


def _split(name, n_sites, scheme, standardize=False):
    ds = load_dataset(name)
    X = ds.X
    if standardize:
        X = (X - X.mean(axis=0)) / X.std(axis=0)
    parts = partition(X, ds.y, n_sites, scheme, random_state=0)
    return [X[i] for i in parts], np.concatenate([ds.y[i] for i in parts])


@pytest.fixture(scope="module")
def iris_label():
    return _split("iris", 3, "label")


@pytest.fixture(scope="module")
def wine_label_std():
    return _split("wine", 3, "label", standardize=True)


SMALL = dict(n_landmarks=40, rounds=20, random_state=0, audit_holdout=0.0, aggregation="plain")  # plain: asked for
ROWS = dict(SMALL, nystrom="rows")  # the paper's mode (explicit since issue 15)


# ----------------------------------------------------------------------------------------------
# quality floor (issue 2): digits, 10 sites, one class each, default parameters
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fed_tsne_digits_quality_floor():
    """The default (private) run on digits, 10 sites split by label: no row leaves a site, the landmark audit
    passes, and the map keeps CA-10NN ≥ 0.915 (centralized openTSNE: 0.978; this run: 0.918–0.920). Issue 15 asks for ≤ 2
    points below centralized; the cells reach 2–6 points below (BENCHMARKS.md, benchmarks/private_map.py) — this
    floor records what is reached, so a regression fails here. It was 0.93 for the federated k-means cells, whose
    centres the coordinator chose and whose small cells released their full second moments (which gave members
    away); the cell tree without either costs about a point here (BENCHMARKS §11c)."""
    sites, y = _split("digits", 10, "label")
    est = FedTSNE(value_bound=16, random_state=0)  # digits' public range, as `securefed run` states it
    E = est.fit_transform(sites)
    X = np.vstack(sites)
    assert E.shape == (len(X), 2) and np.all(np.isfinite(E))
    m = embedding_metrics(X, E, y, random_state=0)
    assert set(m) == set(METRIC_KEYS)
    assert m["ca_10nn"] >= 0.915 and m["trustworthiness"] >= 0.975, m
    # the default is private: no rows, cell means over ≥ 15 records, the audit gate passed
    assert est.rows_sent_ == 0 and est.plan_.nystrom == "local" and est.plan_.landmark_method == "cells"
    assert est.audit_["passed"] and est.audit_["auc"] <= 0.6, est.audit_
    assert 5 <= len(est.landmarks_) <= len(X) // 15


# ----------------------------------------------------------------------------------------------
# Fed-UMAP / Fed-SpeClust: smoke + floor, both reconstructions
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("reconstruction", ["paper", "features"])
def test_fed_umap_floor_both_reconstructions(iris_label, reconstruction):
    sites, y = iris_label
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FedUMAP(reconstruction=reconstruction, **ROWS).fit(sites)
    assert est.reconstruction_ == reconstruction
    assert est.embedding_.shape == (150, 2) and np.all(np.isfinite(est.embedding_))
    ca = classification_accuracy(est.embedding_, y, random_state=0)
    assert ca[10] >= 0.90, ca


@pytest.mark.parametrize("reconstruction", ["paper", "features"])
def test_fed_spectral_floor_both_reconstructions(wine_label_std, reconstruction):
    sites, y = wine_label_std
    est = FedSpectralClustering(n_clusters=3, reconstruction=reconstruction, **ROWS)
    labels = est.fit_predict(sites)
    assert est.reconstruction_ == reconstruction
    assert labels.shape == (len(y),) and set(np.unique(labels)) <= {0, 1, 2}
    cm = clustering_metrics(labels, y)
    assert cm["nmi"] >= 0.75 and cm["ari"] >= 0.75, cm
    # and close to the centralized counterpart on the pooled data
    central = CentralizedSpectralClustering(3, random_state=0).fit_predict(np.vstack(sites))
    assert cm["nmi"] >= clustering_metrics(central, y)["nmi"] - 0.1


@pytest.mark.parametrize("reconstruction", ["paper", "features"])
def test_fed_tsne_small_floor_both_reconstructions(iris_label, reconstruction):
    sites, y = iris_label
    est = FedTSNE(reconstruction=reconstruction, **ROWS).fit(sites)
    assert est.reconstruction_ == reconstruction
    assert classification_accuracy(est.embedding_, y, random_state=0)[10] >= 0.90


# ----------------------------------------------------------------------------------------------
# what leaves the sites
# ----------------------------------------------------------------------------------------------


def test_rows_mode_sends_exactly_the_distance_rows_of_algorithm_2(iris_label):
    sites, _ = iris_label
    est = FedTSNE(keep_sent=True, **ROWS).fit(sites)
    expected = np.vstack([sq_dists(X, est.landmarks_) for X in sites])
    assert est.rows_sent_ == 150
    np.testing.assert_allclose(est.sent_rows_, expected, rtol=1e-12, atol=1e-12)
    assert "squared distances" in est.sent_kind_
    # without keep_sent the rows are not retained
    assert FedTSNE(**ROWS).fit(sites).sent_rows_ is None


def test_spectral_rows_mode_sends_exactly_the_kernel_rows_of_algorithm_3(wine_label_std):
    sites, _ = wine_label_std
    est = FedSpectralClustering(n_clusters=3, keep_sent=True, **ROWS).fit(sites)
    expected = np.vstack([gaussian_kernel(X, est.landmarks_, est.kernel_gamma_) for X in sites])
    np.testing.assert_allclose(est.sent_rows_, expected, rtol=1e-12, atol=1e-15)
    assert est.kernel_gamma_ == est.gamma_ and est.rows_sent_ == len(expected)


def _forbid_rows(monkeypatch, cls=None):
    """Any site asked for its rows fails the test (the site worker's ``rows`` operation)."""
    from securefed.federation import SiteWorker

    calls = []
    monkeypatch.setattr(SiteWorker, "_rows", lambda self, f: calls.append("rows") or pytest.fail("rows computed"))
    return calls


def test_local_mode_tsne_sends_only_coordinates(iris_label, monkeypatch):
    sites, y = iris_label
    calls = _forbid_rows(monkeypatch, FedTSNE)
    est = FedTSNE(nystrom="local", keep_sent=True, **SMALL).fit(sites)
    assert calls == []
    assert est.rows_sent_ == 0 and getattr(est, "sent_rows_", None) is None
    assert est.reconstruction_ == "local" and "coordinates" in est.sent_kind_
    assert est.embedding_.shape == (150, 2) and est.landmark_embedding_.shape == (len(est.landmarks_), 2)
    assert est.landmark_info_["method"] == "cells" and est.landmark_info_["floor"] == 15
    assert classification_accuracy(est.embedding_, y, random_state=0)[10] >= 0.80


def test_local_mode_spectral_sends_only_labels(wine_label_std, monkeypatch):
    sites, y = wine_label_std
    calls = _forbid_rows(monkeypatch, FedSpectralClustering)
    est = FedSpectralClustering(n_clusters=3, nystrom="local", keep_sent=True, **SMALL).fit(sites)
    assert calls == [] and est.rows_sent_ == 0 and getattr(est, "sent_rows_", None) is None
    assert "label" in est.sent_kind_ and est.labels_.shape == (len(y),)
    assert clustering_metrics(est.labels_, y)["nmi"] >= 0.6


@pytest.mark.slow
def test_local_mode_umap_sends_only_coordinates(iris_label, monkeypatch):
    sites, y = iris_label
    calls = _forbid_rows(monkeypatch, FedUMAP)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = FedUMAP(nystrom="local", **SMALL).fit(sites)
    assert calls == [] and est.rows_sent_ == 0
    assert est.embedding_.shape == (150, 2) and est.landmark_embedding_.shape == (len(est.landmarks_), 2)
    assert classification_accuracy(est.embedding_, y, random_state=0)[10] >= 0.75


# ----------------------------------------------------------------------------------------------
# the audit gate stops the fit before any row is computed
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls, extra", [(FedTSNE, {}), (FedSpectralClustering, {"n_clusters": 3})])
def test_failing_audit_stops_the_fit_before_any_row(iris_label, monkeypatch, cls, extra):
    from securefed.federation import SiteWorker
    from securefed.federation.inprocess import site_names

    sites, _ = iris_label
    calls = _forbid_rows(monkeypatch)
    # landmarks that are the FedDL members themselves (given as the start, a negligible step) must fail the audit
    members = np.vstack([SiteWorker({"site-name": n}, X).split(0.2, 0)[0] for n, X in zip(site_names(3), sites)])
    est = cls(
        keep_sent=True,
        init=members,
        lr=1e-12,
        gamma=1.0,
        **extra,
        **dict(ROWS, audit_holdout=0.2, n_landmarks=len(members), rounds=1),
    )
    with pytest.raises(AuditFailedError, match="audit failed"):
        est.fit(sites)
    assert calls == []  # no Nyström row was computed at any site
    assert not hasattr(est, "embedding_") and not hasattr(est, "labels_")


def test_passing_audit_result_is_recorded(iris_label):
    sites, _ = iris_label
    est = FedTSNE(**dict(ROWS, audit_holdout=0.2)).fit(sites)
    assert est.audit_["verdict"] == "pass" and est.rows_sent_ == 150
    assert est.embedding_.shape == (150, 2)  # holdout records are still embedded
    # the holdout (non-members) was kept out of FedDL: 20 % of each 50-record site
    assert est.result_.site_sizes == [40, 40, 40] and est.result_.holdouts == [10, 10, 10]
    assert est.audit_["mia"]["n_members"] == 120 and est.audit_["mia"]["n_nonmembers"] == 30


# ----------------------------------------------------------------------------------------------
# scikit-learn parameter protocol, determinism, bad input
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [FedTSNE, FedUMAP, FedSpectralClustering, CentralizedTSNE])
def test_get_params_set_params_and_clone(cls):
    from sklearn.base import clone

    est = cls()
    params = est.get_params()
    assert set(params) == set(cls._get_param_names())
    assert est.set_params(random_state=7) is est and est.get_params()["random_state"] == 7
    c = clone(est)
    assert type(c) is cls and c is not est and c.get_params() == est.get_params()
    with pytest.raises(ConfigError, match="^no_such_param="):
        est.set_params(no_such_param=1)
    assert repr(est).startswith(cls.__name__ + "(")


def test_same_random_state_same_embedding(iris_label):
    sites, _ = iris_label
    a = FedTSNE(**SMALL).fit_transform(sites)
    b = FedTSNE(**SMALL).fit_transform(sites)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda s: (FedTSNE(nystrom="all"), s), ConfigError, "^nystrom='all'"),
        (lambda s: (FedTSNE(audit_holdout=0.95), s), ConfigError, "^audit_holdout="),
        (lambda s: (FedTSNE(n_landmarks=1), s), ConfigError, "^n_landmarks=1"),
        (lambda s: (FedTSNE(rule="mean"), s), ConfigError, "^rule="),
        pytest.param(lambda s: (FedTSNE(aggregation="magic"), s), ConfigError, "^aggregation="),
        (lambda s: (FedTSNE(reconstruction="dense"), s), ConfigError, "^reconstruction='dense'"),
        (lambda s: (FedSpectralClustering(n_clusters=1), s), ConfigError, "^n_clusters=1"),
        (lambda s: (FedTSNE(), [s[0], s[1][:, :2]]), DataError, r"sites\[1\]"),
        (lambda s: (FedTSNE(), [s[0], s[1][:1]]), DataError, r"sites\[1\]"),
        (lambda s: (FedUMAP(), [s[0], np.where(s[1] > 6, np.inf, s[1])]), DataError, r"sites\[1\]"),
        (lambda s: (FedSpectralClustering(n_clusters=3), []), DataError, "^sites="),
    ],
    ids=[
        "nystrom",
        "holdout",
        "landmarks",
        "rule",
        "aggregation",
        "reconstruction",
        "n_clusters",
        "features",
        "one-record",
        "inf",
        "empty",
    ],
)
def test_estimator_bad_input(iris_label, make, exc, match):
    sites, _ = iris_label
    est, data = make(sites)
    est.set_params(rounds=2, n_landmarks=est.n_landmarks if est.n_landmarks != 300 else 10)
    with pytest.raises(exc, match=match):
        est.fit(data)


# ----------------------------------------------------------------------------------------------
# issue 16: transform / predict of new records, pickling, scikit-learn's checks
# ----------------------------------------------------------------------------------------------


def test_transform_places_new_records_like_the_fitted_ones(iris_label):
    """A site's new records land where that site's own records of the same class landed; spectral predict agrees
    with the fitted labels on the fitted records."""
    sites, y = iris_label
    est = FedTSNE(cell_floor=5, **dict(SMALL, aggregation="secagg", value_bound=8.0)).fit(sites)
    X = np.vstack(sites)
    Z = est.transform(X)
    assert Z.shape == (150, 2) and np.all(np.isfinite(Z))
    # a new record's nearest fitted neighbour on the map has its class (the map's own 10-NN accuracy level)
    from sklearn.neighbors import KNeighborsClassifier

    knn = KNeighborsClassifier(10).fit(est.embedding_, y)
    assert (knn.predict(Z) == y).mean() >= 0.85
    sc = FedSpectralClustering(n_clusters=3, cell_floor=5, **SMALL).fit(sites)
    assert (sc.predict(X) == sc.labels_).mean() >= 0.9
    with pytest.raises(ConfigError, match="features"):
        est.transform(X[:, :3])
    rows = FedTSNE(**ROWS).fit(sites)
    with pytest.raises(ConfigError, match="nystrom"):
        rows.transform(X)


def test_a_pickled_fitted_secagg_model_loads_and_transforms(iris_label):
    import pickle

    sites, _ = iris_label
    est = FedTSNE(cell_floor=5, **dict(SMALL, aggregation="secagg", value_bound=8.0)).fit(sites)
    blob = pickle.dumps(est)
    for secret in (b"cryptography", b"PrivateKey", b"PRIVATE KEY"):  # no key object or key material kept after fit
        assert secret not in blob
    back = pickle.loads(blob)
    np.testing.assert_array_equal(back.transform(sites[0]), est.transform(sites[0]))
    assert back.result_.aggregation["protocol"] == "secagg"


@pytest.mark.parametrize("cls", [FedTSNE, FedUMAP, FedSpectralClustering])
def test_scikit_learn_parameter_checks(cls):
    """The documented subset of scikit-learn's estimator checks (docs/api.md): those that do not call fit(X) — our
    fit takes one array per site, not one X, so the checks that fit on a single array do not apply."""
    from sklearn.utils import estimator_checks as ec

    est = cls()
    name = cls.__name__
    ec.check_parameters_default_constructible(name, est)
    ec.check_no_attributes_set_in_init(name, est)
    ec.check_get_params_invariance(name, est)
    ec.check_set_params(name, est)
    assert est.__sklearn_tags__() is not None
