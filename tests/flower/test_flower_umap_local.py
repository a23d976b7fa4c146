"""``umap-local`` over the in-memory exchange: the no-rows Fed-UMAP equals ``FedUMAP(nystrom="local")``.

Separate from test_flower_logic.py because UMAP's numba compilation of ``fit`` + ``transform`` costs
≈ 20 s on first use (2 shared cores).
"""

import numpy as np
import pytest

from securefed.flower.coordinator import FlowerRunConfig, run_feddl
from securefed.flower.site import SiteState, handle
from securefed.flower.transport import array_to_bytes, payload_size


class _Exchange:
    """Minimal in-memory exchange: every request goes to ``site.handle`` with a state rebuilt from bytes."""

    def __init__(self, paths):
        self.paths = paths
        self.nodes = {i: 1000 + i for i in range(len(paths))}
        self.states = {n: {} for n in self.nodes.values()}
        self.bytes_to = {i: 0 for i in self.nodes}
        self.bytes_from = {i: 0 for i in self.nodes}
        self.silent, self.messages = {}, 0

    def now(self):
        return 0.0

    def request(self, payloads, deadline, on_reply=None):
        out = {}
        for cid, fields in payloads.items():
            node = self.nodes[cid]
            st = SiteState(dict(self.states[node]))
            rep = handle(dict(fields), {"data-path": self.paths[node - 1000], "site-name": f"s{node - 1000}"}, st)
            self.states[node] = dict(st.data)
            self.messages += 1
            self.bytes_to[cid] += payload_size(fields)
            self.bytes_from[cid] += payload_size(rep)
            out[cid] = rep
            if on_reply is not None:
                on_reply(cid, rep)
        return out


@pytest.mark.slow
def test_umap_local_equals_the_estimator_and_sends_only_coordinates(tmp_path):
    from securefed.estimators import FedUMAP

    rng = np.random.default_rng(5)
    arrays = [rng.normal(size=(30 + 5 * i, 3)) * 0.4 + 0.3 * i for i in range(3)]
    paths = []
    for i, X in enumerate(arrays):
        np.save(tmp_path / f"s{i}.npy", X)
        paths.append(str(tmp_path / f"s{i}.npy"))
    cfg = FlowerRunConfig(embedding="umap-local", out_dir=str(tmp_path / "out"), landmarks=8, rounds=2, local_steps=2,
                          aggregation="plain", min_sites=3, seed=3, n_neighbors=5)
    res = run_feddl(_Exchange(paths), cfg)
    est = FedUMAP(n_neighbors=5, n_landmarks=8, rounds=2, local_steps=2, nystrom="local", random_state=3,
                  refine_rounds=0).fit(arrays)
    emb = res["embedding"]
    np.testing.assert_array_equal(emb["landmark_embedding"], est.landmark_embedding_)
    np.testing.assert_array_equal(np.vstack([emb["coordinates"][f"s{i}"] for i in range(3)]), est.embedding_)
    for i, X in enumerate(arrays):
        assert emb["bytes_from_site"][f"s{i}"] < 8 * 2 * len(X) + 200  # n_p × 2 coordinates, nothing else
    # a site refuses to place its records against a model that is not the one it rebuilds
    Y = res["landmarks"]
    rep = handle({"op": "embed-umap", "Y": array_to_bytes(Y), "shape": list(Y.shape), "n_neighbors": 5, "min_dist": 0.1,
                  "model_seed": emb["model_seed"], "landmark_embedding": array_to_bytes(np.zeros((8, 2))),
                  "embedding_shape": [8, 2]}, {"data-path": paths[0]}, SiteState())
    assert rep["error"].startswith("ProtocolError") and "differs" in rep["error"]
