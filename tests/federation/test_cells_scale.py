"""The cells' scale warning and --standardize, from the one basis secure sum (issue 16): breast_cancer's features
differ in scale by thousands (the map would follow 'worst area'), digits' do not (its constant border pixels are
not a reason to warn); with standardize the warning goes and the basis is the correlation matrix's."""

import numpy as np

from securefed.data import load_dataset, partition
from securefed.federation import run_in_process
from securefed.plan import RunPlan


def _sites(name, n=3):
    ds = load_dataset(name)
    return [ds.X[i] for i in partition(ds.X, ds.y, n, "iid", random_state=0)]


def _warned(res):
    return [w for w in res.warnings if "feature scales differ" in w]


def test_breast_cancer_warns_and_standardize_removes_the_warning():
    sites = _sites("breast_cancer")
    plain = dict(aggregation="plain", method="none", audit_holdout=0.0, seed=0, landmark_method="cells", cell_floor=10)
    opts = {"allow-plain": True}
    res = run_in_process(RunPlan.build("api", **plain), sites, site_options=opts)
    (w,) = _warned(res)
    assert "standardize" in w and "×" in w
    res_std = run_in_process(RunPlan.build("api", standardize=True, **plain), sites, site_options=opts)
    assert not _warned(res_std)
    # the standardized run's cells live in the basis of the correlation matrix: unit-variance features, so the
    # landmark space's spread is of the order of √(basis dimensions), not of 'worst area' (≈ 570)
    spread = float(np.sqrt(np.mean(np.sum(res_std.landmarks**2, axis=1))))
    assert 0.5 < spread < 10.0, spread


def test_digits_does_not_warn():
    res = run_in_process(
        RunPlan.build("api", aggregation="plain", method="none", audit_holdout=0.0, seed=0, landmark_method="cells"),
        _sites("digits"),
        site_options={"allow-plain": True},
    )
    assert not _warned(res)
