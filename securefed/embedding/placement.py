"""The no-rows embedding stage over Flower: t-SNE of the landmarks, records placed on their own site.

Same computation as ``FedTSNE(nystrom="local")`` (:mod:`securefed.estimators`): the server fits openTSNE
on the landmarks only, ``TSNE(perplexity=min(perplexity, (n_y − 1)/3), random_state=seed).fit(Y)``;
each site places its records against that model with openTSNE's ``transform`` and only the final
coordinates leave the site (one row of ``n_components`` numbers per record).

The model itself (an openTSNE affinity index over ``Y``) is not serialisable in a portable way, so the
server sends ``Y``, the perplexity, the seed and its landmark embedding; each site refits the same
deterministic model (``n_jobs=1``) and refuses to continue (:class:`~securefed.errors.ProtocolError`)
unless its landmark embedding equals the server's — both then place records with the same model.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError, ProtocolError, bad_value

__all__ = [
    "CellField",
    "OwnRepulsion",
    "PlacementGradient",
    "cells_exact",
    "conditional_affinities",
    "fit_landmark_tsne",
    "gradient_descent",
    "landmark_perplexity",
    "nearest_rows",
    "own_by_tree",
    "place_records",
    "place_records_umap",
    "place_refine",
    "place_weighted",
    "placement_affinities",
    "weighted_tsne",
]


def landmark_perplexity(perplexity: float, n_landmarks: int) -> float:
    """The perplexity used on ``n_landmarks`` points: ``min(perplexity, (n_y − 1) / 3)`` (as FedTSNE)."""
    if not perplexity > 0:
        raise ConfigError(bad_value("perplexity", perplexity, "use a positive number, e.g. 30"))
    return float(min(perplexity, (n_landmarks - 1) / 3.0))


def fit_landmark_tsne(Y: np.ndarray, perplexity: float, seed: int, n_components: int = 2):
    """openTSNE model of the landmarks (deterministic for a given seed with ``n_jobs=1``): the estimator's
    own step, :func:`securefed.estimators.tsne_landmark_model`."""
    from .stages import tsne_landmark_model

    landmark_perplexity(perplexity, len(Y))
    return tsne_landmark_model(Y, perplexity=perplexity, n_components=n_components, seed=int(seed), n_jobs=1)[0]


def place_records(
    Y: np.ndarray,
    X: np.ndarray,
    perplexity: float,
    seed: int,
    expected: np.ndarray | None = None,
    n_components: int = 2,
) -> np.ndarray:
    """Site side: refit the landmark model, check it against the server's, place ``X``; returns coordinates."""
    model = fit_landmark_tsne(Y, perplexity, seed, n_components)
    if expected is not None:
        mine = np.asarray(model)
        if mine.shape != expected.shape or not np.allclose(mine, expected, rtol=0, atol=1e-9):
            raise ProtocolError(
                "the landmark t-SNE model rebuilt on this site differs from the server's "
                "(different openTSNE version?); refusing to place records"
            )
    return np.asarray(model.transform(X, perplexity=landmark_perplexity(perplexity, len(Y))))


def _same(mine: np.ndarray, expected: np.ndarray, what: str) -> None:
    if mine.shape != expected.shape or not np.allclose(mine, expected, rtol=0, atol=1e-9):
        raise ProtocolError(
            f"the landmark {what} model rebuilt on this site differs from the server's "
            "(different library version?); refusing to place records"
        )


def place_records_umap(
    Y: np.ndarray,
    X: np.ndarray,
    n_neighbors: int,
    min_dist: float,
    seed: int,
    expected: np.ndarray | None = None,
    n_components: int = 2,
) -> np.ndarray:
    """Site side of ``umap-local``: refit the server's landmark UMAP (same seed; checked against the server's
    landmark embedding) and place ``X`` with ``transform``, as ``FedUMAP(nystrom="local")``."""
    import warnings

    from .stages import umap_landmark_model

    model = umap_landmark_model(Y, n_neighbors=n_neighbors, min_dist=min_dist, n_components=n_components, seed=seed)
    if expected is not None:
        _same(np.asarray(model.embedding_, dtype=np.float64), expected, "UMAP")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*n_jobs value.*")
        return np.asarray(model.transform(X), dtype=np.float64)


# ------------------------------------------------------------------------------------------------------------
# The no-rows map with cell masses: one objective for the coordinator and the sites. It is the t-SNE of all N
# records in which the records of landmark cell L are collapsed onto one point of mass c_L: the coordinator
# optimises the cells' positions (:func:`weighted_tsne`); each site then optimises its own records (free, mass 1)
# against the cell map held fixed, the other sites' records represented by the cells' masses (:func:`place_refine`).


def _student(A, B):
    from ..kernels import sq_dists

    return 1.0 / (1.0 + sq_dists(A, B))


def conditional_affinities(D2: np.ndarray, logmass: np.ndarray, perplexity: float, iters: int = 60) -> np.ndarray:
    """Rows ``p_{j|i} ∝ m_j exp(−β_i d²_ij)`` with entropy ``log(perplexity)`` (``D2`` may hold +inf: excluded).

    ``logmass``: ``log m_j``, one per column, or one per entry (``D2``'s shape) when each row has its own candidates."""
    n = D2.shape[0]
    target = np.log(perplexity)
    logmass = np.asarray(logmass, dtype=np.float64)
    if logmass.ndim == 1:
        logmass = logmass[None, :]
    fin = np.isfinite(D2)
    if fin.all():
        scale = np.median(D2, axis=1)
    else:
        some = fin.any(axis=1)
        scale = np.ones(n)
        scale[some] = np.nanmedian(np.where(fin[some], D2[some], np.nan), axis=1)
    Dn = np.where(fin, D2 / np.maximum(scale[:, None], 1e-12), np.inf)
    lo, hi, beta = np.full(n, 1e-6), np.full(n, 1e6), np.ones(n)
    P = None
    for _ in range(iters):
        L = logmass - beta[:, None] * Dn
        L -= L.max(axis=1, keepdims=True)
        E = np.exp(L)
        P = E / E.sum(axis=1, keepdims=True)
        H = -(P * np.log(np.maximum(P, 1e-300))).sum(axis=1)
        big = H > target  # too flat: sharpen
        lo = np.where(big, beta, lo)
        hi = np.where(big, hi, beta)
        beta = np.sqrt(lo * hi)
    return P


def gradient_descent(y0, grad, n_iter: int, lr: float, momentum: float):
    """t-SNE's optimiser: momentum with per-coordinate gains (as openTSNE)."""
    y = np.array(y0, dtype=np.float64, copy=True)
    upd = np.zeros_like(y)
    gains = np.ones_like(y)
    for _ in range(n_iter):
        g = grad(y)
        inc = np.sign(g) != np.sign(upd)
        gains = np.where(inc, gains + 0.2, gains * 0.8).clip(0.01)
        upd = momentum * upd - lr * gains * g
        y = y + upd
    return y


#: landmarks above which the coordinator's map (:func:`weighted_tsne`) is drawn with sparse affinities and
#: FFT-interpolated repulsion instead of exactly. The exact map is quadratic: on one quiet machine 13.0 CPU s for 1 017
#: landmarks and 70.8 for 2 034, against 10.6 and 21.1 on the grid, the placed map's CA-10NN within 0.3 points
#: (BENCHMARKS §13i); below about 1 000 the two cost about the same and the exact map keeps small runs unchanged
WEIGHTED_EXACT_MAX = 1000


def weighted_tsne(
    Y: np.ndarray,
    c: np.ndarray,
    *,
    perplexity: float = 30.0,
    seed: int = 0,
    n_iter: int = 750,
    early_iter: int = 250,
    exaggeration: float = 12.0,
    n_components: int = 2,
    exact: bool | None = None,
):
    """The coordinator's map of the landmarks: t-SNE in which landmark L stands for ``c_L`` collapsed records
    (mass-weighted affinities; repulsion ∝ c_I c_J; openTSNE's schedule). Returns ``(Z, Zn)``: the 2-D coordinates
    and the normalisation ``Zn = Σ_{I≠J} c_I c_J w_IJ`` of the final map (both broadcast).

    Up to ``WEIGHTED_EXACT_MAX`` landmarks (or ``exact=True``, or a map of other than 2 dimensions) every pair is
    summed exactly; above it (:func:`_weighted_gradient_fft`) each landmark's affinities are taken over its
    ``⌈3·perplexity⌉`` nearest landmarks and the repulsion and ``Zn`` are interpolated on a grid (FIt-SNE with each
    landmark's mass as its charge), as openTSNE does for unit masses: it grows like ``k log k``, not ``k²``."""
    from ..kernels import sq_dists

    k = len(Y)
    c = np.asarray(c, dtype=np.float64)
    N = c.sum()
    if exact is None:
        exact = k <= WEIGHTED_EXACT_MAX or n_components != 2
    rng = np.random.default_rng(seed)
    Yc = Y - (c[:, None] * Y).sum(axis=0) / N
    U, S, _ = np.linalg.svd(Yc, full_matrices=False)
    z0 = U[:, :n_components] * S[:n_components]
    if z0.shape[1] < n_components:  # fewer landmark dimensions than map dimensions: pad with small noise
        z0 = np.hstack([z0, rng.standard_normal((k, n_components - z0.shape[1]))])
    z0 = z0 / np.std(z0[:, 0]) * 1e-4 + 1e-6 * rng.standard_normal(z0.shape)
    perp = min(perplexity, (k - 1) / 3.0)
    if exact:
        D2 = sq_dists(Y)
        np.fill_diagonal(D2, np.inf)
        pc = conditional_affinities(D2, np.log(c), perp)
        P = (c[:, None] * pc + (c[:, None] * pc).T) / (2 * N)
        cc = np.outer(c, c)
        np.fill_diagonal(cc, 0.0)

        def grad(z, exag):
            W = _student(z, z)
            np.fill_diagonal(W, 0.0)
            A = exag * P / c[:, None] * W - (c[None, :] * W * W) / (cc * W).sum()
            return 4 * (A.sum(axis=1)[:, None] * z - A @ z)

    else:
        grad = _weighted_gradient_fft(Y, c, perp)

    z = gradient_descent(z0, lambda z: grad(z, exaggeration), early_iter, max(N / exaggeration, 50), 0.5)
    z = gradient_descent(z, lambda z: grad(z, 1.0), n_iter - early_iter, max(N, 50), 0.8)
    if exact:
        W = _student(z, z)
        np.fill_diagonal(W, 0.0)
        return z, float((cc * W).sum())
    return z, float(_MassRepulsion(c)(z)[1])


def _weighted_gradient_fft(Y: np.ndarray, c: np.ndarray, perplexity: float):
    """The gradient of the mass-weighted t-SNE of :func:`weighted_tsne` at scale: ``grad(z, exag)`` =
    ``4 [exag Σ_J (P_IJ / c_I) w_IJ (z_I − z_J) − Σ_J c_J w_IJ² (z_I − z_J) / Zn]`` with ``P`` sparse (each
    landmark's ``p_{J|I} ∝ c_J exp(−β_I d²_IJ)`` over its ``⌈3·perplexity⌉`` nearest landmarks, symmetrised as
    ``(c_I p_{J|I} + c_J p_{I|J}) / 2N``; attraction by openTSNE's sparse sum) and the repulsion and
    ``Zn = Σ_{I≠J} c_I c_J w_IJ`` from :class:`_MassRepulsion`."""
    import scipy.sparse as sp

    k = len(Y)
    N = float(c.sum())
    K = int(min(k - 1, np.ceil(3 * perplexity)))
    idx, d2 = nearest_rows(Y, None, K)
    pc = conditional_affinities(d2, np.log(c)[idx], perplexity)
    A = sp.csr_matrix(((c[:, None] * pc).ravel(), (np.repeat(np.arange(k), K), idx.ravel())), shape=(k, k))
    P = ((A + A.T) / (2.0 * N)).tocsr()
    Pc = (sp.diags(1.0 / c) @ P).tocsr()  # P_IJ / c_I
    Pc.sort_indices()
    rep = _MassRepulsion(c)
    scaled: dict = {}

    def grad(z, exag):
        z = np.ascontiguousarray(z, dtype=np.float64)
        r, Zn = rep(z)
        return 4 * (_attraction(_exaggerated(Pc, exag, scaled), z, z) - r / Zn)

    return grad


class _MassRepulsion:
    """``(Σ_J c_J w_IJ² (z_I − z_J), Σ_{I≠J} c_I c_J w_IJ)`` for landmarks of masses ``c`` at ``z`` by FFT
    interpolation (:class:`_Grid`, 3 nodes per box as openTSNE, kernels ``w²`` and ``w``; the self terms cancel in
    the first and are subtracted from the second). The grid covers the map with a quarter's margin and is rebuilt
    only when a landmark leaves it or the map has shrunk to under half of it (the kernels' spectra are computed at
    each rebuild, not at each iteration); its boxes are at most ``BOX`` wide whatever the map's extent, as openTSNE's
    (3 nodes in boxes 2–3 wide interpolate the near pairs 40–60 % off: measured, not used)."""

    P, BOX, GROW = 3, 1.0, 0.25

    def __init__(self, c: np.ndarray):
        self.c = np.asarray(c, dtype=np.float64)
        self.grid: _Grid | None = None

    def _fits(self, z: np.ndarray) -> bool:
        g = self.grid
        if g is None or not g.inside(z).all():
            return False
        built = (g.side - 2.0 * self.BOX) / (1.0 + 2.0 * self.GROW)  # the map's extent when the grid was built
        return float(np.max(np.ptp(z, axis=0))) >= 0.5 * built

    def __call__(self, z: np.ndarray) -> tuple[np.ndarray, float]:
        if not self._fits(z):
            lo, side = _square(z, self.GROW, self.BOX)
            self.grid = _Grid(lo, side, p=self.P, box=self.BOX, powers=(1, 2))
        g, c = self.grid, self.c
        st = g.stencil(z)
        phi = g.interpolate(g.potentials(st, np.column_stack([c, c * z[:, 0], c * z[:, 1]])), st)
        psi = g.interpolate(g.potentials(st, c[:, None], power=1), st)[:, 0]
        # the self terms: they cancel exactly in the repulsion (c_I s_I z_I − c_I s_I z_I); in Zn each landmark's own
        # interpolated c_I² s_I is subtracted (c_I² would leave the interpolation's error on the largest terms)
        return phi[:, :1] * z - phi[:, 1:], float(c @ psi - (c * c) @ g.self_kernel(st, 1))


def place_weighted(F: np.ndarray, Y: np.ndarray, Z: np.ndarray, *, perplexity: float = 5.0, k: int | None = None):
    """Each record at the perplexity-weighted mean of its ``k`` nearest landmarks' positions."""
    from ..kernels import sq_dists

    k = int(min(len(Y), k or max(3 * perplexity, 10)))
    D2 = sq_dists(F, Y)
    idx = np.argpartition(D2, k - 1, axis=1)[:, :k] if k < len(Y) else np.tile(np.arange(len(Y)), (len(F), 1))
    d = np.take_along_axis(D2, idx, axis=1)
    P = conditional_affinities(d, np.zeros(k), perplexity)
    return np.einsum("nk,nkc->nc", P, Z[idx])


def nearest_rows(
    A: np.ndarray, B: np.ndarray | None, k: int, *, block: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Exact ``k`` nearest rows of ``B`` for every row of ``A``: ``(indices, squared distances)``, each ``(n_A, k)``,
    nearest first. ``B=None``: among the rows of ``A`` themselves, each row's own index left out. Rows of ``A`` are
    taken ``block`` at a time (default: about 2 million distances, 16 MB, at a time; time ``n_A · n_B`` at
    matrix-product speed); row i's answer depends on row i and ``B`` only."""
    A = np.asarray(A, dtype=np.float64)
    same = B is None
    B = A if same else np.asarray(B, dtype=np.float64)
    block = int(block) if block else max(1, 2_000_000 // max(len(B), 1))
    b2 = np.einsum("ij,ij->i", B, B)
    n = len(A)
    k = int(k)
    idx = np.empty((n, k), dtype=np.int64)
    dist = np.empty((n, k))
    for a in range(0, n, block):
        Ab = A[a : a + block]
        D = Ab @ B.T  # ‖a − b‖² − ‖a‖² = ‖b‖² − 2 a·b ranks the rows of B for each a
        D *= -2.0
        D += b2[None, :]
        if same:
            rows = np.arange(len(D))
            D[rows, rows + a] = np.inf
        part = np.argpartition(D, k - 1, axis=1)[:, :k] if k < D.shape[1] else np.tile(np.arange(k), (len(D), 1))
        d = np.take_along_axis(D, part, axis=1)
        order = np.argsort(d, axis=1, kind="stable")
        idx[a : a + block] = np.take_along_axis(part, order, axis=1)
        dist[a : a + block] = np.maximum(
            np.take_along_axis(d, order, axis=1) + np.einsum("ij,ij->i", Ab, Ab)[:, None], 0.0
        )
    return idx, dist


def placement_affinities(F: np.ndarray, Y: np.ndarray, c: np.ndarray, perplexity: float, *, interact: bool = True):
    """The affinities of :func:`place_refine`, sparse: ``P`` (CSR, ``n × (n + k)``, or ``n × k`` without
    ``interact``) over the site's records (columns ``0…n−1``) and the landmarks (columns ``n…n+k−1``), scaled by
    ``1/N``, ``N = Σ c``.

    Row i's conditional ``p_{j|i} ∝ m_j exp(−β_i d²_ij)`` (mass 1 for a record, ``c_L`` for a landmark; entropy
    ``log(perplexity)``; perplexity at most ``(n + k − 1)/3``, as before) is taken over its ``⌈3·perplexity⌉``
    nearest own records and its ``⌈3·perplexity⌉`` nearest landmarks (exact, :func:`nearest_rows`) — the
    candidates that carry its mass, as openTSNE keeps ``3·perplexity`` neighbours. (openTSNE finds its neighbours
    with Annoy above 1 000 points; on the sites' clustered cell features Annoy's queries were slower than the exact
    blocked search at these sizes, and exact neighbours keep a site's result a function of its records alone.)
    Records: ``(p_{j|i} + p_{i|j}) / 2N``; landmarks: ``p_{L|i} / N``. Without
    ``interact`` row i depends on record i and the landmarks only."""
    import scipy.sparse as sp

    n, k = len(F), len(Y)
    c = np.asarray(c, dtype=np.float64)
    N = float(c.sum())
    K = int(np.ceil(3 * perplexity))
    kl = min(k, K)
    li, ld = nearest_rows(F, Y, kl)
    logc = np.log(np.maximum(c, 1e-300))
    if not interact:
        pc = conditional_affinities(ld, logc[li], min(perplexity, (k - 1) / 3.0))
        return sp.csr_matrix((pc.ravel() / N, li.ravel(), np.arange(0, n * kl + 1, kl)), shape=(n, k))
    kf = min(n - 1, K)
    fi, fd = nearest_rows(F, None, kf)
    D2 = np.hstack([fd, ld])
    logm = np.hstack([np.zeros((n, kf)), logc[li]])
    pc = conditional_affinities(D2, logm, min(perplexity, (n + k - 1) / 3.0))
    rows = np.repeat(np.arange(n), kf)
    Pff = sp.csr_matrix((pc[:, :kf].ravel(), (rows, fi.ravel())), shape=(n, n))
    Pff = (Pff + Pff.T) / (2.0 * N)
    Pfl = sp.csr_matrix((pc[:, kf:].ravel() / N, (np.repeat(np.arange(n), kl), li.ravel())), shape=(n, k))
    P = sp.hstack([Pff, Pfl], format="csr")
    P.sort_indices()
    return P


class _Grid:
    """A regular grid of interpolation nodes over the square ``[lo, lo + side]²`` for the FFT-accelerated sums
    ``φ(y) = Σ_j q_j w(y, s_j)²`` (FIt-SNE, Linderman et al. 2019, as openTSNE's ``negative_gradient_method="fft"``):
    boxes at most ``box`` wide with ``p`` equispaced nodes per side; a source's charge is spread onto the ``p × p``
    nodes of its box by Lagrange interpolation, the nodes' potentials are one convolution with the kernel ``w²`` (a
    Toeplitz product, done by FFT with the kernel's spectrum computed once), and a target's potential is interpolated
    back from the nodes of its box. ``powers``: the kernels ``w^a`` whose spectra are kept (``potentials(...,
    power=a)``; the normalisation ``Σ w`` needs ``a = 1``)."""

    def __init__(self, lo: np.ndarray, side: float, *, p: int, box: float, min_boxes: int = 10, powers=(2,)):
        import scipy.fft

        self.p = int(p)
        self.n_boxes = max(int(min_boxes), int(np.ceil(side / box)))
        self.width = side / self.n_boxes
        self.lo, self.side = np.asarray(lo, dtype=np.float64), float(side)
        G = self.G = self.n_boxes * self.p
        h = self.width / self.p
        self.nodes = (np.arange(self.p) + 0.5) / self.p  # node positions inside a unit box
        # the kernel w² between nodes at every offset −(G−1)…G−1, embedded circulantly in L × L (L ≥ 2G − 1)
        L = self.L = scipy.fft.next_fast_len(2 * G - 1, real=True)
        off = np.arange(L)
        off2 = (np.where(off < G, off, off - L) * h) ** 2
        gap = (off >= G) & (off <= L - G)
        self.spectra = {}
        for a in powers:
            kern = 1.0 / (1.0 + off2[:, None] + off2[None, :]) ** int(a)
            kern[gap, :] = 0.0
            kern[:, gap] = 0.0
            self.spectra[int(a)] = scipy.fft.rfft2(kern)
        a, b = np.meshgrid(np.arange(self.p), np.arange(self.p), indexing="ij")
        self._a, self._b = a.ravel(), b.ravel()

    def inside(self, y: np.ndarray) -> np.ndarray:
        return np.all((y >= self.lo) & (y <= self.lo + self.side), axis=1)

    def _lagrange(self, u: np.ndarray) -> np.ndarray:
        t = self.nodes
        out = np.ones((len(u), self.p))
        for j in range(self.p):
            for m in range(self.p):
                if m != j:
                    out[:, j] *= (u - t[m]) / (t[j] - t[m])
        return out

    def stencil(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(node row, node column, weight)`` of each point's ``p²`` nodes: ``(n, p²)`` arrays."""
        out = []
        for d in range(2):
            r = (y[:, d] - self.lo[d]) / self.width
            bi = np.clip(np.floor(r).astype(np.int64), 0, self.n_boxes - 1)
            out.append((bi * self.p, self._lagrange(r - bi)))
        (rx, wx), (ry, wy) = out
        return rx[:, None] + self._a, ry[:, None] + self._b, wx[:, self._a] * wy[:, self._b]

    def potentials(self, stencil, charges: np.ndarray, power: int = 2) -> np.ndarray:
        """The nodes' potentials ``Σ_j q_j w(node, s_j)^power`` of charges ``(n, c)`` at the sources of ``stencil``:
        a ``(G·G, c)`` array."""
        import scipy.fft

        rx, ry, w = stencil
        L, G = self.L, self.G
        flat = (rx * L + ry).ravel()
        grid = np.stack([np.bincount(flat, (w * q[:, None]).ravel(), minlength=L * L).reshape(L, L) for q in charges.T])
        conv = scipy.fft.irfft2(scipy.fft.rfft2(grid) * self.spectra[int(power)], s=(L, L))[:, :G, :G]
        return np.ascontiguousarray(conv.reshape(len(charges.T), G * G).T)

    def self_kernel(self, stencil, power: int) -> np.ndarray:
        """What a unit charge contributes to its own interpolated potential through the grid (the kernel between the
        nodes of its box, weighted by its stencil on both sides; 1 = ``w(0)`` only as the boxes shrink): subtracting
        it, rather than 1, removes the self term exactly."""
        rx, ry, w = stencil
        h = self.width / self.p
        da = (self._a[:, None] - self._a[None, :]) * h
        db = (self._b[:, None] - self._b[None, :]) * h
        K = 1.0 / (1.0 + da * da + db * db) ** int(power)
        return np.einsum("na,ab,nb->n", w, K, w)

    def interpolate(self, potential: np.ndarray, stencil) -> np.ndarray:
        rx, ry, w = stencil
        return np.einsum("nk,nkc->nc", w, potential[rx * self.G + ry])


def _square(Z: np.ndarray, margin: float, pad: float) -> tuple[np.ndarray, float]:
    lo, hi = Z.min(axis=0), Z.max(axis=0)
    side = float(np.max(hi - lo)) * (1.0 + 2.0 * margin) + 2.0 * pad
    return (lo + hi) / 2.0 - side / 2.0, side


class CellField:
    """The repulsion of the fixed landmark map on a record at ``y``: ``Σ_L M_L w(y, z_L)² (y − z_L)``,
    ``w = 1/(1 + ‖y − z_L‖²)``, for any number of records at O(1) each.

    The two potentials ``Σ_L M_L w²`` and ``Σ_L M_L w² z_L`` are computed once on a :class:`_Grid` over the map
    (plus a margin of a tenth of its span on every side) — FIt-SNE's interpolation with each landmark's mass as its
    charge, done once because the landmarks do not move — and interpolated at the records' positions. Boxes at most 1
    wide with ``p = 5`` nodes per side (openTSNE uses 3 per box of width 1 for its whole gradient; built once, the
    field can afford 5: the median relative error of a record's cell repulsion falls from about 2 % to 0.1 %). A
    record outside the grid gets the exact sum. ``exact=True``: the sum landmark by landmark everywhere (cheaper than
    the grid for a few hundred records, :func:`cells_exact`). Each record's value depends on its own position and the
    broadcast only."""

    def __init__(
        self, Z: np.ndarray, M: np.ndarray, *, exact: bool = False, p: int = 5, box: float = 1.0, margin: float = 0.1
    ):
        Z = np.ascontiguousarray(Z, dtype=np.float64)
        if Z.ndim != 2 or Z.shape[1] != 2:
            raise ConfigError(
                bad_value(
                    "n_components",
                    Z.shape[1] if Z.ndim == 2 else Z.shape,
                    "the no-rows t-SNE placement draws 2-D maps; use n_components=2",
                )
            )
        self.Z, self.M = Z, np.asarray(M, dtype=np.float64)
        self.grid = None
        if not exact:
            lo, side = _square(Z, margin, box)
            self.grid = _Grid(lo, side, p=p, box=box)
            self.potential = self.grid.potentials(
                self.grid.stencil(Z), np.stack([self.M, self.M * Z[:, 0], self.M * Z[:, 1]], axis=1)
            )

    @staticmethod
    def grid_size(Z: np.ndarray, *, p: int = 5, box: float = 1.0, margin: float = 0.1) -> int:
        """The side ``L`` of the FFT the grid would need (its cost grows as ``L² log L``)."""
        import scipy.fft

        _, side = _square(np.asarray(Z, dtype=np.float64), margin, box)
        return scipy.fft.next_fast_len(2 * max(10, int(np.ceil(side / box))) * p - 1, real=True)

    def exact(self, y: np.ndarray) -> np.ndarray:
        """The repulsion summed landmark by landmark (records outside the grid; tests)."""
        out = np.empty_like(y)
        for a in range(0, len(y), 4096):
            W = _student(y[a : a + 4096], self.Z)
            A = self.M[None, :] * W * W
            out[a : a + 4096] = A.sum(axis=1)[:, None] * y[a : a + 4096] - A @ self.Z
        return out

    def __call__(self, y: np.ndarray) -> np.ndarray:
        if self.grid is None:
            return self.exact(y)
        ins = self.grid.inside(y)
        if not ins.all():
            out = np.empty_like(y)
            out[~ins] = self.exact(y[~ins])
            out[ins] = self(y[ins])
            return out
        phi = self.grid.interpolate(self.potential, self.grid.stencil(y))
        return phi[:, :1] * y - phi[:, 1:]


def cells_exact(evaluations: int, k: int, L: int) -> bool:
    """Whether ``evaluations`` record positions (records × iterations) against ``k`` cells cost less summed exactly
    (about 14 ns per record–cell pair, measured) than through a grid with an ``L × L`` FFT (about 200 ns per FFT point
    to build, then about 2 µs per interpolated position): up to about 140 cells always, beyond that a few hundred
    records (MNIST-5k sites) but not thousands."""
    return float(evaluations) * (14.0 * float(k) - 2000.0) <= 200.0 * float(L) ** 2


def own_by_tree(n: int, L: int) -> bool:
    """Barnes–Hut (about 0.37 µs · n log₂ n per iteration, measured) or the FFT grid (about 0.01 µs · L² log₂ L plus
    1.3 µs per record) for the repulsion among a site's ``n`` own records: openTSNE switches at 10 000 points; here the
    map's extent, hence the grid's side ``L``, is known before the first iteration, so the cheaper one is chosen."""
    n = max(int(n), 2)
    return 0.37 * n * np.log2(n) <= 0.01 * float(L) ** 2 * np.log2(max(L, 2)) + 1.3 * n


_FIELDS: dict = {}


def _cell_field(Z: np.ndarray, M: np.ndarray, exact: bool) -> CellField:
    """:class:`CellField` for the broadcast ``(Z, M)``, remembered for the next call with the same broadcast (every
    site's density placement uses the same field)."""
    key = (bool(exact), Z.shape, np.ascontiguousarray(Z).tobytes(), np.ascontiguousarray(M).tobytes())
    if key not in _FIELDS:
        if len(_FIELDS) >= 2:
            _FIELDS.pop(next(iter(_FIELDS)))
        _FIELDS[key] = CellField(Z, M, exact=exact)
    return _FIELDS[key]


def _own_repulsion_bh(y: np.ndarray, theta: float = 0.5) -> np.ndarray:
    """``Σ_{j≠i} w_ij² (y_i − y_j)`` among a site's own records, by openTSNE's Barnes–Hut tree (θ = 0.5, its
    default)."""
    from openTSNE import _tsne
    from openTSNE.quad_tree import QuadTree

    y = np.ascontiguousarray(y, dtype=np.float64)
    g = np.zeros_like(y)
    sum_q = _tsne.estimate_negative_gradient_bh(QuadTree(y), y, g, theta=theta, dof=1, num_threads=1)
    return -g * (sum_q + np.finfo(np.float64).eps)  # openTSNE returns it divided by Σ w: undo that


class OwnRepulsion:
    """``Σ_{j≠i} w_ij² (y_i − y_j)`` among a site's own records by FFT-accelerated interpolation on a fixed
    :class:`_Grid` over the landmark map (openTSNE's defaults: 3 nodes per box of width at most 1), its kernel's
    spectrum computed once. The self term ``w_ii = 1`` cancels (``y_i·1 − 1·y_i``). Records outside the grid are
    summed exactly, as targets and as sources — while they are few: when more than ``max(64, 1 %)`` of the records
    have left it (under DP the records spread beyond a coarse landmark map), the grid is rebuilt over the records and
    the map together (a quarter wider, so that it is not rebuilt every iteration) instead of summing thousands of
    records exactly against all (quadratic: a 70 000-record DP run spent minutes there)."""

    P, BOX, MARGIN, GROW = 3, 1.0, 0.1, 0.25

    def __init__(self, Z: np.ndarray):
        self.Z = np.asarray(Z, dtype=np.float64)
        lo, side = _square(self.Z, self.MARGIN, self.BOX)
        self.grid = _Grid(lo, side, p=self.P, box=self.BOX)

    def _cover(self, y: np.ndarray) -> None:
        lo, side = _square(np.vstack([self.Z, y]), self.GROW, self.BOX)
        self.grid = _Grid(lo, side, p=self.P, box=self.BOX)

    @classmethod
    def grid_size(cls, Z: np.ndarray) -> int:
        return CellField.grid_size(Z, p=cls.P, box=cls.BOX, margin=cls.MARGIN)

    def __call__(self, y: np.ndarray) -> np.ndarray:
        ins = self.grid.inside(y)
        if int(np.count_nonzero(~ins)) > max(64, len(y) // 100):
            self._cover(y)
            ins = self.grid.inside(y)
        g = self.grid
        yi = y[ins]
        st = g.stencil(yi)
        phi = g.interpolate(g.potentials(st, np.column_stack([np.ones(len(yi)), yi])), st)
        out = np.empty_like(y)
        out[ins] = phi[:, :1] * yi - phi[:, 1:]
        if not ins.all():  # the few records off the grid: exact, both ways
            out[~ins] = 0.0
            W = _student(y[~ins], y)
            W[np.arange(len(W)), np.flatnonzero(~ins)] = 0.0
            A = W * W
            out[~ins] = A.sum(axis=1)[:, None] * y[~ins] - A @ y
            Ai = A[:, ins]
            out[ins] += Ai.sum(axis=0)[:, None] * yi - Ai.T @ y[~ins]
        return out


def _exaggerated(P, exag: float, cache: dict):
    """``exag · P`` (sparse), one copy per factor kept in ``cache`` (t-SNE's schedule uses two)."""
    if exag not in cache:
        Pe = P.copy()
        Pe.data = Pe.data * exag
        cache[exag] = Pe
    return cache[exag]


def _attraction(P, y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """``Σ_j P_ij w_ij (y_i − ref_j)`` over the sparse affinities, by openTSNE's own routine."""
    from openTSNE import _tsne

    g = np.zeros_like(y)
    _tsne.estimate_positive_gradient_nn(
        P.indices, P.indptr, P.data, y, ref, g, dof=1, num_threads=1, should_eval_error=False
    )
    return g


class PlacementGradient:
    """The gradient of :func:`place_refine`'s objective at the site's positions ``y`` (n × 2), attraction scaled by
    ``exag``::

        ∂/∂y_i = 4 [ exag Σ_j P_ij w_ij (y_i − y_j) + exag Σ_L P_iL w_iL (y_i − z_L)
                     − (Σ_{j≠i} w_ij² (y_i − y_j) + Σ_L M_L w_iL² (y_i − z_L)) / Zn ],   w = 1/(1 + d²),

    j over the site's own records, L over the cells. ``P``: :func:`placement_affinities`; the cells' repulsion:
    :class:`CellField` (summed exactly where :func:`cells_exact` says it is cheaper, with ``interact`` only); the own
    records' repulsion: openTSNE's Barnes–Hut estimate or :class:`OwnRepulsion`, whichever :func:`own_by_tree` finds
    cheaper; the attraction: openTSNE's sparse sum. ``interact=False`` drops both sums over j and uses ``M = c``; ``counted=False`` uses ``M = c``."""

    def __init__(
        self,
        F,
        Y,
        Z,
        c,
        Zn: float,
        *,
        perplexity: float,
        counted: bool = True,
        interact: bool = True,
        iterations: int = 250,
    ):
        from ..landmarks.cells import cell_counts

        n = len(F)
        c = np.asarray(c, dtype=np.float64)
        self.M = np.maximum(c - cell_counts(F, Y), 0.0) if counted and interact else c
        self.Z = np.ascontiguousarray(Z, dtype=np.float64)
        self.Zn = float(Zn)
        self.own = bool(interact) and n > 1
        self.P = placement_affinities(F, Y, c, perplexity, interact=self.own)
        # the cells summed exactly when that is cheaper — decided from the broadcast alone without interact (then
        # each record's position must be a function of that record and the broadcast: always the grid)
        exact = bool(interact) and cells_exact(n * int(iterations), len(self.Z), CellField.grid_size(self.Z))
        self.field = _cell_field(self.Z, self.M, exact)
        self.own_rep = None
        if self.own:
            self.own_rep = _own_repulsion_bh if own_by_tree(n, OwnRepulsion.grid_size(self.Z)) else OwnRepulsion(self.Z)
        self._exag: dict = {}

    def __call__(self, y: np.ndarray, exag: float = 1.0) -> np.ndarray:
        y = np.ascontiguousarray(y, dtype=np.float64)
        rep = self.field(y)
        if self.own_rep is not None:
            rep = rep + self.own_rep(y)
        ref = np.vstack([y, self.Z]) if self.own else self.Z
        return 4 * (_attraction(_exaggerated(self.P, exag, self._exag), y, ref) - rep / self.Zn)


def place_refine(
    F: np.ndarray,
    Y: np.ndarray,
    Z: np.ndarray,
    c: np.ndarray,
    Zn: float,
    *,
    perplexity: float = 30.0,
    n_iter: int = 150,
    early_iter: int = 100,
    exaggeration: float = 4.0,
    init_perplexity: float = 5.0,
    counted: bool = True,
    interact: bool = True,
    progress=None,
) -> np.ndarray:
    """A site's step: its records' t-SNE against the fixed cell map (``F`` its records in the landmarks' space).

    The affinities are the N-record t-SNE's restricted to this site's rows: over its own records (mass 1 each) and
    the cells (mass ``c_L``); attraction to a cell uses its whole mass, repulsion only the other sites' mass
    ``M_L = c_L − own_L`` (a site's own records repel each other directly); ``Zn`` is the coordinator's
    normalisation. Starts at :func:`place_weighted`; t-SNE's schedule in miniature: ``early_iter`` iterations with the
    attraction exaggerated ``exaggeration``-fold at momentum 0.5 (records settle into their cells' neighbourhoods
    before repulsion spreads them: +1–2 CA-10NN points on digits and MNIST-5k against none), then ``n_iter`` at
    momentum 0.8; learning rate N/12. Uses
    nothing but the broadcast (Y, Z, c, Zn) and the site's own records. ``counted=False`` places new records that
    the masses do not include (``transform``): every cell then repels with its whole mass. ``interact=False``
    places every record against the cells alone (no affinity to, no repulsion from the site's other records, every
    cell with its whole mass): each coordinate is then a function of its own record and the broadcast — what the DP
    density counts (:func:`securefed.landmarks.merf.density_counts`).

    It grows like openTSNE, not like n² (:class:`PlacementGradient`): the affinities are sparse (each record's
    ``⌈3·perplexity⌉`` nearest own records and nearest cells), the cells' repulsion is a fixed field interpolated from
    a grid, the own records' repulsion openTSNE's Barnes–Hut estimate or an FFT-interpolated sum (the cheaper), the
    attraction openTSNE's sparse sum. ``progress(done, total)`` (optional) is called after the affinities
    (``done = 0``) and every 25 iterations.
    """
    c = np.asarray(c, dtype=np.float64)
    N = float(c.sum())
    y0 = place_weighted(F, Y, Z, perplexity=init_perplexity)
    total = int(early_iter) + int(n_iter)
    grad = PlacementGradient(
        F, Y, Z, c, Zn, perplexity=perplexity, counted=counted, interact=interact, iterations=total
    )
    done = [0]
    if progress is not None:
        progress(0, total)

    def gradient(exag: float):
        def g(y):
            done[0] += 1
            if progress is not None and (done[0] % 25 == 0 or done[0] == total):
                progress(done[0], total)
            return grad(y, exag)

        return g

    lr = max(N / 12.0, 50.0)
    y = gradient_descent(y0, gradient(float(exaggeration)), int(early_iter), lr, 0.5) if early_iter else y0
    return gradient_descent(y, gradient(1.0), n_iter, lr, 0.8)
