"""``umap`` in the no-rows mode over the in-memory exchange equals ``FedUMAP(nystrom="local")`` and sends only
coordinates. Separate because UMAP's numba compilation of ``fit`` + ``transform`` costs ≈ 20 s on first use."""

import numpy as np
import pytest

from securefed.federation import Coordinator, InMemoryExchange, SiteWorker, drive
from securefed.federation.wire import put_array
from securefed.plan import RunPlan


@pytest.mark.slow
def test_umap_local_equals_the_estimator_and_sends_only_coordinates():
    from securefed.estimators import FedUMAP

    rng = np.random.default_rng(5)
    arrays = [rng.normal(size=(30 + 5 * i, 3)) * 0.4 + 0.3 * i for i in range(3)]
    plan = RunPlan.build(
        "flower",
        method="umap",
        nystrom="local",
        landmarks=8,
        rounds=2,
        local_steps=2,
        aggregation="plain",
        min_sites=3,
        seed=3,
        n_neighbors=5,
        cell_floor=5,
        audit_holdout=0.0,
    )
    ex = InMemoryExchange(
        {
            1000 + i: SiteWorker(
                {"site-name": f"s{i}", "allow-plain": True, "cell-floor": 5, "require-audit": False}, X
            )
            for i, X in enumerate(arrays)
        },
        fresh_process=True,
    )
    res = drive(Coordinator(plan), ex)
    est = FedUMAP(
        n_neighbors=5,
        n_landmarks=8,
        rounds=2,
        local_steps=2,
        nystrom="local",
        random_state=3,
        aggregation="plain",
        cell_floor=5,
        audit_holdout=0.0,
    ).fit(arrays)
    emb = res.embedding
    np.testing.assert_array_equal(emb["landmark_embedding"], est.landmark_embedding_)
    np.testing.assert_array_equal(res.stacked("coordinates"), est.embedding_)
    for i, X in enumerate(arrays):
        assert emb["bytes_from_site"][f"s{i}"] < 8 * 2 * len(X) + 200  # n_p × 2 coordinates, nothing else
    req = put_array(
        put_array({"op": "place", "method": "umap", "space": "raw"}, "Y", res.landmarks),
        "landmark_embedding",
        np.zeros((7, 2)),
    )
    rep = SiteWorker({"site-name": "s0"}, arrays[0]).handle(req)  # a map of 7 points for 8 landmarks: refused
    assert rep["error"].startswith("ProtocolError") and "does not match" in rep["error"]
