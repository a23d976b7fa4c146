"""Issue 25, property: for random requests, two sites' task digests (the digest bound into the secure sum's round spec
and so signed by every site) are equal exactly when every field that shapes the upload is equal — whatever differs
only in the transport (the site's index, the operation, the round spec, forwarded messages, the proof)."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from securefed.federation import messages as M
from securefed.federation.space import LandmarkSpace

floats = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False).map(lambda v: v + 0.0)  # no -0.0


@st.composite
def tasks(draw):
    kind = draw(st.sampled_from(["stats", "gradient", "model", "cells", "audit"]))
    Y = np.array(draw(st.lists(floats, min_size=4, max_size=4))).reshape(2, 2)
    if kind == "stats":
        return M.Stats(want=draw(st.sampled_from([["gamma"], ["moments"], ["gamma", "moments"]])), scale=draw(floats))
    if kind == "gradient":
        return M.Gradient(Y=Y, gamma=draw(floats), monitor=draw(st.booleans()))
    if kind == "model":
        return M.Model(Y=Y, gamma=draw(floats), lr=draw(floats), local_steps=draw(st.integers(1, 5)))
    if kind == "cells":
        plan = {
            "floor": draw(st.integers(2, 40)),
            "basis_dim": 50,
            "max_cells": 300,
            "max_levels": 12,
            "scale": draw(floats),
            "n_max": 100,
            "standardize": False,
            "axes": 0,
            "margin": 2.0,
            "version": 1,
        }
        prev = None if draw(st.booleans()) else np.array(draw(st.lists(floats, min_size=3, max_size=3)))
        return M.Cells(cells=plan, step=draw(st.integers(0, 9)), previous=prev)
    space = LandmarkSpace("pca", np.array(draw(st.lists(floats, min_size=2, max_size=2))), np.eye(2))
    return M.Audit(space=space, Y=Y, gamma=draw(floats))


@st.composite
def requests(draw):
    return M.SumRequest(
        op="secagg-input",
        site=draw(st.integers(0, 9)),
        task=draw(tasks()),
        weights=draw(st.sampled_from(["records", "uniform"])),
        seed=draw(st.integers(0, 5)),
        audit_holdout=draw(st.sampled_from([0.0, 0.2])),
        scale_lengths=None,
        scale_bounds=None,
        spec=b"input part",
        round_index=draw(st.integers(0, 9)),
        msgs=[b"shares"],
        proof=draw(st.one_of(st.none(), st.binary(min_size=1, max_size=8))),
    )


def _eq(x, y) -> bool:
    """Field-by-field equality of two values (arrays by shape and value, dataclasses by their fields) — independent
    of the digest's own encoding."""
    import dataclasses

    if dataclasses.is_dataclass(x) or dataclasses.is_dataclass(y):
        return type(x) is type(y) and all(_eq(getattr(x, f.name), getattr(y, f.name)) for f in dataclasses.fields(x))
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.shape == y.shape and np.array_equal(x, y)
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_eq(x[k], y[k]) for k in x)
    return type(x) is type(y) and x == y


@given(a=requests(), b=requests())
def test_digests_equal_iff_the_upload_fields_are_equal(a, b):
    same = _eq(a.task, b.task) and (a.weights, a.seed, a.audit_holdout) == (b.weights, b.seed, b.audit_holdout)
    assert (M.upload_digest(a) == M.upload_digest(b)) == same


@given(a=requests(), site=st.integers(0, 9), rnd=st.integers(0, 9), proof=st.binary(max_size=8))
def test_the_transport_is_outside_the_digest_and_one_changed_number_is_not(a, site, rnd, proof):
    import dataclasses

    moved = dataclasses.replace(a, site=site, round_index=rnd, proof=proof or None, msgs=[], spec=b"other")
    assert M.upload_digest(moved) == M.upload_digest(a)
    bumped = dataclasses.replace(a, seed=a.seed + 1)
    assert M.upload_digest(bumped) != M.upload_digest(a)
    assert M.upload_digest(a, {"step": 1}) != M.upload_digest(a, {"step": 2})  # the site's derived query counts too
