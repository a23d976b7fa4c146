"""The site's placement (``place_refine``) at scale: every approximation against a brute-force sum written here,
the sparse affinities against a dense calibration solved here with a root finder, and memory that grows linearly."""

import tracemalloc

import numpy as np
import pytest
from scipy.optimize import brentq

from securefed.embedding.placement import (
    CellField,
    OwnRepulsion,
    PlacementGradient,
    _MassRepulsion,
    _own_repulsion_bh,
    _weighted_gradient_fft,
    nearest_rows,
    place_refine,
    placement_affinities,
    weighted_tsne,
)


def _cauchy(A, B):
    d2 = ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)
    return 1.0 / (1.0 + d2)


def _brute_repulsion(y, S, q, skip_self=False):
    """Σ_j q_j w(y_i, s_j)² (y_i − s_j), pair by pair."""
    W = _cauchy(y, S)
    if skip_self:
        np.fill_diagonal(W, 0.0)
    A = q[None, :] * W * W
    return (A[:, :, None] * (y[:, None, :] - S[None, :, :])).sum(axis=1)


def _map(seed, k=150, n=2000, spread=25.0):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(k, 2)) * spread
    y = Z[rng.integers(0, k, n)] + rng.normal(size=(n, 2)) * rng.choice([0.3, 1.0, 3.0], size=(n, 1))
    return rng, Z, y


@pytest.mark.parametrize("seed", range(3))
def test_cell_field_is_the_mass_weighted_repulsion_of_the_landmarks(seed):
    rng, Z, y = _map(seed)
    M = rng.uniform(1.0, 300.0, len(Z))
    far = np.array([[1e3, 0.0], [-400.0, 900.0]])  # off the grid: summed exactly
    y = np.vstack([y, far])
    f = CellField(Z, M)
    got, want = f(y), _brute_repulsion(y, Z, M)
    np.testing.assert_allclose(got[-2:], want[-2:], rtol=1e-12, atol=0)
    err = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    assert np.median(err) < 5e-3 and np.quantile(err, 0.99) < 0.05, (np.median(err), np.quantile(err, 0.99))


@pytest.mark.parametrize("method", ["bh", "fft"])
def test_own_repulsion_is_the_pairwise_repulsion_of_the_sites_records(method):
    rng, Z, y = _map(7, n=1500)
    y = np.vstack([y, [[600.0, -50.0]]])  # one record far off the map (the FFT sums it exactly both ways)
    got = _own_repulsion_bh(y) if method == "bh" else OwnRepulsion(Z)(y)
    want = _brute_repulsion(y, y, np.ones(len(y)), skip_self=True)
    err = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    assert np.median(err) < 0.03 and np.quantile(err, 0.95) < 0.15, (np.median(err), np.quantile(err, 0.95))
    assert np.linalg.norm(got[-1] - want[-1]) / np.linalg.norm(want[-1]) < 0.03


@pytest.mark.parametrize("spread", [0.01, 3.0, 25.0])
def test_the_landmark_maps_repulsion_and_normalisation_are_the_mass_weighted_sums(spread):
    """The coordinator's map above WEIGHTED_EXACT_MAX landmarks: Σ_J c_J w² (z_I − z_J) and Σ_{I≠J} c_I c_J w_IJ
    interpolated on a grid, against both sums pair by pair — on a map as tiny as the start of the optimisation,
    a mid-sized one and one as wide as a 20 000-record map (≈ 150 across)."""
    rng, Z, _ = _map(5, k=900, n=1, spread=spread)
    c = rng.uniform(0.5, 80.0, len(Z))
    got, Zn = _MassRepulsion(c)(Z)
    want = _brute_repulsion(Z, Z, c, skip_self=True)
    W = _cauchy(Z, Z)
    np.fill_diagonal(W, 0.0)
    Zx = float(c @ W @ c)
    assert abs(Zn / Zx - 1.0) < 0.02, Zn / Zx
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.08
    err = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    assert np.median(err) < 0.05, np.median(err)


def test_the_scalable_landmark_gradient_is_the_weighted_objectives_gradient():
    """_weighted_gradient_fft against the mass-weighted t-SNE gradient summed pair by pair with dense affinities
    calibrated here (β by a root finder): the sparse affinities drop only the mass beyond each landmark's 3·perplexity
    nearest, the grid interpolates the repulsion."""
    rng = np.random.default_rng(3)
    k, m, perp = 400, 6, 5.0
    Y = rng.normal(size=(12, m))[rng.integers(0, 12, k)] * 4 + rng.normal(size=(k, m))
    c = rng.uniform(1.0, 40.0, k)
    N = c.sum()
    D2 = ((Y[:, None] - Y[None]) ** 2).sum(-1)
    pc = np.zeros((k, k))
    for i in range(k):
        d = np.delete(D2[i], i)
        lm = np.log(np.delete(c, i))

        def row(beta, d=d, lm=lm):
            e = lm - beta * d
            e = np.exp(e - e.max())
            return e / e.sum()

        def gap(lb, row=row):
            p = row(np.exp(lb))
            return -(p * np.log(np.maximum(p, 1e-300))).sum() - np.log(perp)

        pc[i, np.arange(k) != i] = row(np.exp(brentq(gap, -20, 20)))
    P = (c[:, None] * pc + (c[:, None] * pc).T) / (2 * N)
    z = rng.normal(size=(k, 2)) * 8
    W = _cauchy(z, z)
    np.fill_diagonal(W, 0.0)
    Zn = float(c @ W @ c)
    diff = z[:, None] - z[None]
    for exag in (12.0, 1.0):
        want = 4 * (
            ((exag * P / c[:, None] * W)[:, :, None] * diff).sum(1)
            - ((c[None, :] * W * W)[:, :, None] * diff).sum(1) / Zn
        )
        got = _weighted_gradient_fft(Y, c, perp)(z, exag)
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.05, exag


def test_the_scalable_landmark_map_keeps_the_exact_maps_neighbourhoods():
    """weighted_tsne on 1 200 landmarks of 8 clusters, by the grid (the default above WEIGHTED_EXACT_MAX) and pair by
    pair: both maps keep every cluster together (10-NN label accuracy), and the masses act (a heavy landmark gets
    more room: its nearest neighbour is farther away than a light one's, on average)."""
    rng = np.random.default_rng(0)
    k = 1200
    lab = rng.integers(0, 8, k)
    Y = rng.normal(size=(8, 20))[lab] * 6 + rng.normal(size=(k, 20))
    c = np.where(rng.random(k) < 0.5, 1.0, 30.0)
    from sklearn.neighbors import KNeighborsClassifier

    room = []
    for exact in (False, True):
        Z, Zn = weighted_tsne(Y, c, perplexity=30.0, seed=0, n_iter=500, early_iter=150, exact=exact)
        W = _cauchy(Z, Z)
        np.fill_diagonal(W, 0.0)
        assert abs(Zn / float(c @ W @ c) - 1) < 0.02
        acc = KNeighborsClassifier(10).fit(Z, lab).score(Z, lab)
        assert acc > 0.97, (exact, acc)
        d1 = np.sort(((Z[:, None] - Z[None]) ** 2).sum(-1), axis=1)[:, 1]
        room.append(np.median(d1[c > 1]) / np.median(d1[c == 1]))
    assert room[1] > 1.2 and 0.75 < room[0] / room[1] < 1.33, room


def test_own_repulsion_follows_records_that_leave_the_map():
    """Records spread far beyond the landmark map (as under DP): the grid is rebuilt over them instead of summing
    each off-grid record exactly against all (quadratic), and the sum still matches the pair-by-pair one."""
    rng = np.random.default_rng(3)
    Z = rng.uniform(-3, 3, size=(40, 2))
    y = rng.uniform(-25, 25, size=(12, 2))[rng.integers(0, 12, 1500)] + rng.normal(0, 2.0, (1500, 2))  # a map's blobs
    rep = OwnRepulsion(Z)
    before = rep.grid.side
    got = rep(y)
    assert rep.grid.side > 60 > before and rep.grid.inside(y).all()
    want = _brute_repulsion(y, y, np.ones(len(y)), skip_self=True)
    err = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    assert np.median(err) < 0.03 and np.quantile(err, 0.95) < 0.15, (np.median(err), np.quantile(err, 0.95))
    few = np.vstack([rng.uniform(-2, 2, size=(1000, 2)), [[50.0, 50.0]]])  # one record off the grid: summed exactly
    rep2 = OwnRepulsion(Z)
    side = rep2.grid.side
    got = rep2(few)
    assert rep2.grid.side == side
    want = _brute_repulsion(few, few, np.ones(len(few)), skip_self=True)
    assert np.linalg.norm(got[-1] - want[-1]) / np.linalg.norm(want[-1]) < 1e-9


def test_nearest_rows_is_exact():
    rng = np.random.default_rng(1)
    A, B = rng.normal(size=(300, 6)), rng.normal(size=(80, 6))
    idx, d = nearest_rows(A, B, 7, block=64)
    D = ((A[:, None] - B[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(idx, np.argsort(D, axis=1)[:, :7])
    np.testing.assert_allclose(d, np.sort(D, axis=1)[:, :7], rtol=1e-10, atol=1e-10)
    own, _ = nearest_rows(A, None, 3, block=50)
    D = ((A[:, None] - A[None]) ** 2).sum(-1)
    np.fill_diagonal(D, np.inf)
    np.testing.assert_array_equal(own, np.argsort(D, axis=1)[:, :3])


def _dense_conditional(d2, mass, perplexity):
    """p_j ∝ m_j exp(−β d²_j) with Shannon entropy log(perplexity), β found by a root finder on log β."""

    def entropy_gap(logb):
        a = np.log(mass) - np.exp(logb) * d2
        p = np.exp(a - a.max())
        p /= p.sum()
        return -(p * np.log(np.maximum(p, 1e-300))).sum() - np.log(perplexity)

    logb = brentq(entropy_gap, -40.0, 40.0, xtol=1e-13)
    a = np.log(mass) - np.exp(logb) * d2
    p = np.exp(a - a.max())
    return p / p.sum()


def test_sparse_affinities_are_the_dense_ones_when_the_candidates_cover_every_point():
    """With fewer records and landmarks than 3·perplexity each, the sparse affinities must be exactly the N-record
    t-SNE's rows restricted to this site (the previous dense placement's): records (p_j|i + p_i|j)/2N, cells p_L|i/N."""
    rng = np.random.default_rng(3)
    n, k, perp = 20, 12, 10.0
    F, Y = rng.normal(size=(n, 4)), rng.normal(size=(k, 4)) * 1.5
    c = rng.uniform(2.0, 40.0, k)
    N = c.sum()
    pc = np.zeros((n, n + k))
    for i in range(n):
        d_own = ((F[i] - F) ** 2).sum(1)
        keep = np.arange(n) != i
        d = np.concatenate([d_own[keep], ((F[i] - Y) ** 2).sum(1)])
        p = _dense_conditional(d / np.median(d), np.concatenate([np.ones(n - 1), c]), min(perp, (n + k - 1) / 3))
        pc[i, np.concatenate([np.flatnonzero(keep), n + np.arange(k)])] = p
    want = np.hstack([(pc[:, :n] + pc[:, :n].T) / (2 * N), pc[:, n:] / N])
    got = placement_affinities(F, Y, c, perp).toarray()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    alone = placement_affinities(F, Y, c, perp, interact=False).toarray()
    for i in range(n):  # without interaction: each row over the cells alone
        d = ((F[i] - Y) ** 2).sum(1)
        np.testing.assert_allclose(
            alone[i], _dense_conditional(d / np.median(d), c, min(perp, (k - 1) / 3)) / N, rtol=1e-6, atol=1e-12
        )


def test_gradient_is_the_objectives_gradient():
    """PlacementGradient against the objective's gradient summed pair by pair with the same affinities."""
    rng, Z, _ = _map(11, k=60, n=10, spread=12.0)
    n, m = 400, 5
    Y = rng.normal(size=(60, m)) * 3
    F = Y[rng.integers(0, 60, n)] + rng.normal(size=(n, m))
    c = rng.uniform(5.0, 50.0, 60)
    Zn = 3e4
    y = Z[rng.integers(0, 60, n)] + rng.normal(size=(n, 2))
    for interact, exag in ((True, 4.0), (True, 1.0), (False, 1.0)):
        g = PlacementGradient(F, Y, Z, c, Zn, perplexity=10.0, interact=interact)
        P = g.P.toarray() * exag
        M = g.M
        Wl = _cauchy(y, Z)
        want = ((exag * 0 + P[:, -60:] * Wl)[:, :, None] * (y[:, None] - Z[None])).sum(1)
        want -= _brute_repulsion(y, Z, M) / Zn
        if interact:
            Wf = _cauchy(y, y)
            np.fill_diagonal(Wf, 0.0)
            want += ((P[:, :n] * Wf)[:, :, None] * (y[:, None] - y[None])).sum(1)
            want -= _brute_repulsion(y, y, np.ones(n), skip_self=True) / Zn
        got = g(y, exag)
        rel = np.linalg.norm(got - 4 * want) / np.linalg.norm(4 * want)
        assert rel < 0.01, (interact, exag, rel)


@pytest.mark.slow
def test_memory_grows_linearly_with_the_site():
    """12 000 records: one dense records × records matrix would be 1.15 GB; the placement stays far below."""
    rng = np.random.default_rng(5)
    k, n = 40, 12_000
    Y = rng.normal(size=(k, 4)) * 4
    F = Y[rng.integers(0, k, n)] + rng.normal(size=(n, 4))
    Z = rng.normal(size=(k, 2)) * 20
    c = np.full(k, 2.0 * n / k)
    calls = []
    tracemalloc.start()
    try:
        out = place_refine(
            F, Y, Z, c, 1e6, perplexity=10.0, n_iter=2, early_iter=1, progress=lambda d, t: calls.append((d, t))
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.shape == (n, 2) and np.all(np.isfinite(out))
    assert peak < 250e6, peak / 1e6
    assert calls[0] == (0, 3) and calls[-1] == (3, 3)


def test_a_site_reports_its_placement_progress_and_the_printer_shows_it():
    """In process, a site's placement emits "placement" events on the run's callback; the printer says when each
    site is done (and no more than every few seconds while it runs)."""
    import io

    from securefed.federation.inprocess import run_in_process
    from securefed.plan import RunPlan
    from securefed.progress import ProgressPrinter

    rng = np.random.default_rng(0)
    sites = [rng.normal(size=(120, 3)) + 3.0 * i for i in range(3)]
    plan = RunPlan.build(
        "api", method="tsne", landmark_method="cells", value_bound=12.0, cell_floor=10, audit_holdout=0.0, seed=0
    )
    seen: list = []
    res = run_in_process(plan, sites, on_event=seen.append)
    assert sum(len(v) for v in res.embedding["coordinates"].values()) == 360
    events = [e for e in seen if e.get("event") == "placement" and e["site"] == "site-00"]
    assert events[0] == {"event": "placement", "site": "site-00", "records": 120, "done": 0, "total": 250}
    assert events[-1]["done"] == 250 and [e["done"] for e in events] == list(range(0, 251, 25))
    out = io.StringIO()
    printer = ProgressPrinter(out, placement_every=3600.0)
    for ev in events:
        printer(ev)
    assert out.getvalue().count("\n") == 1 and "[embedding] site-00 placed its 120 records" in out.getvalue()
    out = io.StringIO()
    printer = ProgressPrinter(out, placement_every=0.0)  # a long placement: a line per event after the start
    for ev in events:
        printer(ev)
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and "placing (25/250 iterations) its 120 records" in lines[0]
