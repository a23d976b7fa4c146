"""The landmark stage of a federated run, one function per method (each a generator the coordinator runs).

* :func:`feddl` — FedDL (Qiao et al. Algorithm 1; docs/paper-equations.md), optionally with the paper's gradient
  perturbation (DP); landmarks in the records' own space.
* :func:`cells` — the cell tree in a federated PCA basis, every released cell over ≥ the floor, each query
  recomputed by every site (:mod:`securefed.landmarks.celltree`): the default of the no-rows mode without DP.
* :func:`billboard` — the DP billboard: a random-feature mean embedding and the landmarks' counts, two noisy
  releases in a public basis (:mod:`securefed.landmarks.merf`): the default of the no-rows mode under DP.

Each returns ``{"Y", "space", "masses", "gamma", "lr", "history", "rng", "info"}``: the landmarks, the space they
live in (:class:`~.space.LandmarkSpace`), their masses (records per landmark, or None), the kernel bandwidth the
later stages use, FedDL's step size and MMD history, the coordinator's statistical Generator and figures for the
result. Every sum goes through :func:`securefed.federation.sums.secure_sum`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from ..errors import ConfigError, ProtocolAbortedError, bad_value
from .space import LandmarkSpace
from .sums import secure_sum
from . import messages as M

__all__ = ["LandmarkResult", "feddl", "cells", "cells_plan", "cells_floor", "billboard", "billboard_density"]


@dataclass
class LandmarkResult:
    """What a landmark stage gives the later stages.

    ``Y`` the landmarks (rows) in ``space``; ``masses`` records per landmark (None: uniform); ``gamma`` the kernel
    bandwidth the audit and the map use; ``lr`` and ``history`` FedDL's step size and MMD history; ``rng`` the
    coordinator's statistical Generator for the later stages; ``info`` figures for the result. ``relay``: what the
    next request must carry for the sites to check these landmarks themselves (cells: the pinned plan and the total
    of the last cells sum, which no site has seen yet).
    """

    Y: np.ndarray
    space: LandmarkSpace
    masses: np.ndarray | None
    gamma: float
    lr: float | None
    history: list
    rng: np.random.Generator
    info: dict
    relay: dict = field(default_factory=dict)


def feddl(co):
    """FedDL (Qiao et al. Algorithm 1): γ and the start from one secure sum of statistics, then ``S`` rounds
    of model averaging (Eq. 15) or gradient averaging (Eq. 16) through the secure sum (generator)."""
    from ..kernels import check_gamma, median_gamma
    from ..landmarks.feddl import default_lr, init_landmarks, release_bounds

    plan, s = co.plan, co.sites
    m = s.n_features
    rng = np.random.default_rng(plan.seed)
    w_norm = s.weights(plan.weights) / s.weights(plan.weights).sum()
    if plan.dp:
        from .privacy import ServerPrivacy

        gamma0 = plan.gamma if plan.gamma is not None else 1.0 / float(plan.clip_norm) ** 2  # public: τ_X only
        co.privacy = ServerPrivacy(plan, co.run_id, s.sizes, w_norm, check_gamma(gamma0), co.ledger, n_features=m)
    B = plan.sum_bound
    ck = co.resume
    gamma = co.privacy.plan["gamma"] if co.privacy else plan.gamma
    want = ([] if gamma is not None or ck else ["gamma"]) + (
        ["moments"] if plan.init_mode == "moments" and not ck else []
    )
    stats = {}
    if want:
        length = (1 if "gamma" in want else 0) + (2 * m if "moments" in want else 0)
        task = M.Stats(want=want, scale=1.0 if B is None else float(B))
        a = yield from secure_sum(co, task, "statistics", B, weights="records", out_shape=[length])
        tot = a.total / a.weight_sum
        if "gamma" in want:
            gamma = median_gamma([tot[0] * 4.0 * m * (1.0 if B is None else B)])
            tot = tot[1:]
            co.release("the sum over sites of each site's median squared distance × its record count (for γ)")
        if "moments" in want:
            scale = 1.0 if B is None else B
            stats = {"mean": tot[:m], "std": np.sqrt(np.maximum(tot[m:] * scale - tot[:m] ** 2, 0.0))}
            co.release("the sum over sites of per-feature sums and sums of squares (for the initial landmarks)")
    gamma = check_gamma(ck["gamma"] if ck else gamma)
    lr = float(ck["lr"]) if ck else (plan.lr if plan.lr is not None else default_lr(plan.landmarks, gamma))
    if ck:
        Y, start, history = np.array(ck["Y"], dtype=np.float64), int(ck["round"]), list(ck["history"])
        rng.bit_generator.state = ck["rng"]
    else:
        Y, start, history = _init_landmarks(co, stats, gamma, rng, init_landmarks), 0, []
    if Y.shape[1] != m:
        raise ConfigError(bad_value(plan.name("init"), f"array{Y.shape}", f"give {m} columns (the sites' features)"))
    clip = release_bounds(B, m, plan.landmarks, gamma).get(plan.rule)
    spread0 = _spread(Y)
    for rnd in range(start, plan.rounds):
        if rnd > start:
            yield from co.readmit(f"before round {rnd + 1}")
        Y, mmd0 = yield from _round(co, Y, rnd, gamma, lr, clip)
        spread = _spread(Y)
        if not math.isfinite(spread) or spread > 20.0 * (spread0 + 1.0 / math.sqrt(gamma)):
            raise ConfigError(
                bad_value(
                    plan.name("lr"),
                    lr,
                    f"landmarks diverged in round {rnd + 1} (spread {spread:.3g}, "
                    f"kernel width {1 / math.sqrt(gamma):.3g}); use the automatic step or a smaller one",
                )
            )
        if mmd0 is not None:
            history.append(mmd0)  # MMD of Y^rnd, the landmarks round rnd + 1 started from
        co.emit(
            "round",
            round=rnd + 1,
            rounds=plan.rounds,
            mmd_at_start=mmd0,
            epsilon=float(co.privacy.ledger.spent()[0]) if co.privacy else None,
        )
        co.emit(
            "checkpoint",
            state={
                "round": rnd + 1,
                "Y": Y,
                "gamma": gamma,
                "lr": lr,
                "history": history,
                "rng": rng.bit_generator.state,
                "mmd_pending": mmd0 is not None,
            },
        )
    _inventory_rounds(co)
    return LandmarkResult(Y, LandmarkSpace(), None, gamma, lr, history, rng, {"method": "feddl", "rounds": plan.rounds})


def _inventory_rounds(co) -> None:
    plan = co.plan
    covered = f"yes (noise: {plan.noise})" if plan.dp else False
    n = plan.rounds * (plan.local_steps if plan.rule == "gradient" else 1)
    what = (
        "each site's own landmark update"
        if plan.aggregation == "plain"
        else f"only the sum over sites of the landmark updates ({plan.aggregation})"
    )
    co.release(f"{what}, {n} times", covered=covered)
    if plan.monitoring:
        co.release("the sum over sites of each site's MMD to the landmarks, every round (progress monitor)")
    co.release(
        "the landmarks and γ, every round",
        to="every site",
        covered="post-processing of the DP releases" if plan.dp else False,
    )


def _init_landmarks(co, stats: dict, gamma: float, rng, init_landmarks) -> np.ndarray:
    plan, m = co.plan, co.sites.n_features
    mode = plan.init_mode
    if mode == "moments":
        Y = init_landmarks(plan.landmarks, m, mean=stats["mean"], std=stats["std"], rng=rng)
    elif mode == "public":
        radius = float(plan.clip_norm) if plan.dp else float(np.sqrt(1.0 / gamma))
        Y = init_landmarks(plan.landmarks, m, radius=radius, rng=rng)
    else:
        Y = np.array(plan.init, dtype=np.float64)
    return co.privacy.project(Y) if co.privacy is not None else Y


def _round(co, Y, rnd: int, gamma: float, lr: float, clip):
    """One FedDL round (generator); returns ``(Y, MMD of the Y the round started from or None)``."""
    from ..landmarks.feddl import server_gradient_step, server_model_average
    from .site import monitor_scale

    plan = co.plan
    monitor = plan.monitoring
    mmd0 = None
    integer = co.privacy.integer if co.privacy is not None else None  # ddg / skellam: integers mod 2^k
    steps = [plan.local_steps - 1] if plan.rule == "model" else list(range(plan.local_steps))
    for t in steps:
        kw = {"Y": Y, "gamma": gamma}
        if plan.rule == "model":
            kw.update(lr=lr, local_steps=plan.local_steps)
        with_mmd = monitor and t == steps[0]
        if with_mmd:
            kw.update(monitor=True, clip=clip)
        out_shape = [Y.size + 1] if with_mmd else list(Y.shape)
        if integer is not None:
            out_shape = [integer.padded_dim]  # the rotated, padded encoding (plan: no monitor)
        tap = None
        if co.privacy is not None:
            kw.update(_dp_fields(co, rnd, t))
            released_steps = range(plan.local_steps) if plan.rule == "model" else [t]
            tap = _mirror(co, rnd, released_steps)
        task = (M.Model if plan.rule == "model" else M.Gradient)(**kw)
        label = f"round {rnd + 1}" + (f" step {t + 1}" if plan.rule == "gradient" else "")
        a = yield from secure_sum(
            co,
            task,
            label,
            clip,
            tap=tap,
            out_shape=out_shape,
            integer_bits=None if integer is None else co.privacy.secagg_bits,
        )
        if integer is not None:
            a = co.privacy.decode(a, rnd, t, Y.shape)  # un-rotate, centre mod 2^bits, × granularity (KLS / AKL)
        total = a.total
        if with_mmd:
            mmd0 = float(total[-1] / a.weight_sum / monitor_scale(clip))
            total = total[:-1].reshape(Y.shape)
            a = type(a)(total, a.survivors, a.weight_sum, a.protocol, a.clipped)
        if co.privacy is not None:
            _settle(co, rnd, t, a)
        Y = server_model_average(a) if plan.rule == "model" else server_gradient_step(Y, a, lr)
        if co.privacy is not None:
            Y = co.privacy.project(Y)  # after every server step: Δ assumes Y inside the τ_Y ball at every step
    return Y, mmd0


def _dp_fields(co, rnd: int, step: int) -> dict:
    settle = co.privacy.unsettled
    co.privacy.unsettled = []
    return {"dp": json.loads(co.privacy.wire_plan()), "dp_settle": list(settle), "round": rnd, "step": step}


def _mirror(co, rnd: int, steps):
    def hook(site: int, fields: dict) -> None:
        if "dp_events" in fields:
            co.privacy.mirror(site, fields, rnd, steps)

    return hook


def _settle(co, rnd: int, step: int, a) -> None:
    have = co.privacy.reported(rnd, step)
    missing = [i for i in a.survivors if i not in have]
    if missing:
        raise ProtocolAbortedError(
            f"round {rnd + 1}: sites {missing} were summed without reporting their ledger "
            "events; the aggregate ledger would be incomplete"
        )
    co.privacy.after_aggregate(rnd, step, a.survivors)


def _spread(Y: np.ndarray) -> float:
    if not np.all(np.isfinite(Y)):
        return math.inf
    return float(np.sqrt(np.max(np.sum((Y - Y.mean(axis=0)) ** 2, axis=1))))


# ------------------------------------------------------------------------------------------------ cells


def _scaled_sum(
    co,
    task,
    label: str,
    parts,
    out_shape,
    weights: str = "uniform",
    tap=None,
    site_scaled: bool = False,
    binding: dict | None = None,
):
    """A secure sum whose upload is made of consecutive parts, each bounded per coordinate by a public number:
    ``parts = [(length, bound), …]`` (or one bound for the whole vector). Each site divides every part by its bound
    (``scale_lengths``, ``scale_bounds``: two flat lists, as a Flower ``ConfigRecord`` requires) so the fixed-point
    range of SecAgg+ / CKKS is used well; returns the unscaled total and the AggregateResult (generator)."""
    n = int(np.prod(out_shape))
    parts = [(n, float(cast(float, parts)))] if np.isscalar(parts) else [(int(k), float(b)) for k, b in parts]
    if sum(k for k, _ in parts) != n:
        raise ConfigError(bad_value("scale parts", parts, f"the parts must cover the {n} coordinates"))
    a = yield from secure_sum(
        co,
        task,
        label,
        1.0,
        weights=weights,
        tap=tap,
        out_shape=out_shape,
        scales=None if site_scaled else parts,
        binding=binding,
    )  # site_scaled: the site derives the parts itself
    return a.total * np.concatenate([np.full(k, b) for k, b in parts]), a


def cells_floor(floor: int, n_records: int, landmarks: int | None) -> int:
    """The floor the cells use: the plan's ``cell_floor``; with a landmark cap (``landmarks`` given), raised to the
    average cell the cap leaves (``N / landmarks``) up to 4 × the floor, so that a cap far below the records does not
    leave small cells where membership leaks most. With ``landmarks`` auto (None) there is no cap: the floor stays the
    plan's, and each cell's own floor rises with its effective dimension (:meth:`CellTree.floor_of`) — on 10 000
    50-dimensional blob records the audit passes either way (``tests/federation/test_cells_audit_sizes.py``).
    Public: the sizes come from hello; each site accepts any floor at least its own."""
    if landmarks is None:
        return int(floor)
    return int(max(floor, min(n_records // max(landmarks, 1), 4 * floor)))


#: the most cells ``landmarks`` auto allows. At 70 000 Fashion-MNIST records (10 sites) the floors stop the tree at
#: 3 519 cells: CA-10NN 0.800 (2 000 cells: 0.795; 1 000: 0.783) at 1.25× centralized openTSNE's wall time (same run)
#: and 2.2 GB (BENCHMARKS §13i: the landmark map on a grid above 1 000 landmarks, the mixture's nearest centres in
#: blocks).
#: The cap bounds the mixture landmarks' k-means (draws × cells per step) where millions of records would allow
#: tens of thousands of cells.
AUTO_MAX_CELLS = 4000


def most_cells(n_records: int, floor: int, landmarks: int | None) -> int:
    """The most cells of the run: ``N / floor`` (each cell holds at least the floor), capped by ``landmarks`` when
    the plan gives a number, else by ``AUTO_MAX_CELLS``. With ``landmarks`` auto the tree grows as far as the floors
    and ``cell_rounds`` allow up to that: on Fashion-MNIST ≈ 1 000 cells at 20 000 records (CA-10NN 0.779 against
    0.751 with the former fixed cap of 300), ≈ 3 500 at 70 000 (0.800 against 0.767; BENCHMARKS §13g, §13i)."""
    cap = n_records // max(int(floor), 1)
    return int(max(2, min(AUTO_MAX_CELLS if landmarks is None else int(landmarks), cap)))


def cells_plan(co):
    """The run's public cells plan (:class:`securefed.landmarks.celltree.CellsPlan`), from the run plan and the sizes
    announced at ``hello``: every site pins it at its first cells sum and checks it against its own floor."""
    from ..landmarks.celltree import CellsPlan

    plan, s = co.plan, co.sites
    N = int(sum(s.sizes))
    floor = cells_floor(int(plan.cell_floor), N, plan.landmarks)
    return CellsPlan(
        floor=floor,
        basis_dim=int(plan.basis_dim),
        max_cells=most_cells(N, floor, plan.landmarks),
        max_levels=int(plan.cell_rounds),
        scale=float(plan.sum_bound or 1.0),
        n_max=int(max(s.sizes)),
        standardize=bool(plan.standardize),
        axes=int(plan.cell_axes),
    )


def cells(co):
    """The cell tree (:mod:`securefed.landmarks.celltree`): one secure sum for the basis, then per level a count pass
    and a sum pass — each sum's query recomputed by every site from the pinned plan and the totals so far, so the
    coordinator only relays: it asks for step k with the total of step k − 1 and aggregates (generator)."""
    from ..data import scale_warning
    from ..landmarks.celltree import CellTree

    plan, s = co.plan, co.sites
    cp = cells_plan(co)
    tree = CellTree(cp, s.n_features)
    survivors, previous = None, None
    labels = {"basis": "basis", "counts": "cells {level}: counts", "sums": "cells {level}: sums"}
    while (q := tree.next_query()) is not None:
        task = M.Cells(cells=cp.to_json(), step=q.step, previous=previous)
        total, a = yield from _scaled_sum(
            co,
            task,
            labels[q.kind].format(level=tree.level + 1),
            list(q.parts),
            [q.length],
            site_scaled=True,
            binding=q.digest_doc(),
        )
        if survivors is None:
            survivors = tuple(a.survivors)
        elif tuple(a.survivors) != survivors:
            raise ProtocolAbortedError(
                f"cells: the sum '{q.kind}' of step {q.step} has survivors {list(a.survivors)}, the "
                f"cells began with {list(survivors)}: every site must answer every cells sum (a "
                "sum over fewer sites would isolate the missing site's records in its cells); "
                "rerun with the sites that are up"
            )
        tree.absorb(q, total)
        previous = total
        if q.kind == "basis":
            co.release(
                "the sum over sites of [record count, Σx, Σxxᵀ] (one secure sum, for the PCA basis"
                + (" and the standardisation)" if plan.standardize else ")")
            )
            if not plan.standardize:
                warn = scale_warning(tree.sd, flag=plan.name("standardize"))
                if warn:
                    co.warnings.append(warn)
        else:
            co.emit("cells", round=tree.level + (1 if q.kind == "counts" else 0), cells=len(tree.leaves()))
    return _cells_result(co, tree, cp, previous)


def _cells_result(co, tree, cp, previous) -> LandmarkResult:
    """The finished tree's landmarks, the releases they make and the stage's result (a map needs ≥ ``MIN_CELLS``)."""
    from ..landmarks.celltree import MIN_CELLS

    plan, N = co.plan, float(sum(co.sites.sizes))
    n_leaves = len(tree.leaves())
    Y, c = tree.landmarks(seed=plan.seed)
    if tree.root.count < cp.floor or len(Y) < MIN_CELLS:
        raise ConfigError(
            bad_value(
                plan.name("cell_floor"),
                cp.floor,
                f"{n_leaves} cell(s) of at least {cp.floor} records "
                f"formed from {int(N)} records, {len(Y)} landmarks; a map needs at least {MIN_CELLS}: "
                f"lower {plan.name('cell_floor')} (the membership audit measures what smaller cells "
                "leak) or bring more records",
            )
        )
    sums = len(tree.history)
    co.release(
        f"{tree.level} levels of a cell tree: per level the record count of each candidate child cell, then the "
        f"sums of the features (and of their squares, and of their products on as many public axes as the cell's "
        f"size allows) of each child of an accepted split — every split accepted only when each child holds "
        f"≥ {cp.floor} records, each query recomputed by every site",
        note=f"the released cells are nested (a laminar family): no set of fewer than {cp.floor} records is a "
        "combination of the released sums, checked by every site before it answers",
    )
    space = LandmarkSpace("pca", tree.mu, tree.V)
    co.release(
        "the PCA basis, the cell landmarks ("
        + (
            f"each cell's mean and 2 × {min(plan.cell_axes, tree.d)} points along its principal axes"
            if plan.cell_axes > 0
            else "the cell means"
        )
        + ") and their counts",
        to="every site",
    )
    return LandmarkResult(
        Y,
        space,
        c,
        1.0 / max(2.0 * tree.trace, 1e-300),
        None,
        [],
        np.random.default_rng([plan.seed, 0xCE11]),
        {
            "method": "cells",
            "rounds": tree.level,
            "levels": tree.level,
            "cells": n_leaves,
            "released_counts": sorted(int(round(c)) for c in tree.released_counts()),
            "landmarks": len(Y),
            "floor": cp.floor,
            "axes": int(min(plan.cell_axes, tree.d)),
            "basis_dim": tree.d,
            "secure_sums": sums,
        },
        relay={"cells": cp.to_json(), "previous": previous},
    )


# ------------------------------------------------------------------------------------------------ billboard


def billboard(co):
    """The DP billboard (:mod:`securefed.landmarks.merf`): release 1 = the sum of a bounded random-feature map of
    every record, release 2 = the landmarks' counts, both with Gaussian noise added on every site (the full σ each:
    each site's upload is private on its own, whatever the coordinator does), each written to the site's ledger
    before it leaves.
    Everything else — the landmarks, their masses, their map — is post-processing."""
    from ..landmarks.merf import (
        DEFAULT_FREQUENCIES,
        DEFAULT_LENGTHSCALES,
        billboard_noise,
        fit_to_embedding,
        rff_frequencies,
    )
    from .privacy import BillboardPrivacy

    plan, s = co.plan, co.sites
    m, N = s.n_features, float(sum(s.sizes))
    scale = float(plan.value_bound) if plan.value_bound is not None else float(plan.clip_norm) / math.sqrt(m)
    space = LandmarkSpace("public", dim=min(plan.public_basis_dim, m), scale=scale, seed=0)
    d = space.dim if m > space.dim else m
    noise = (
        billboard_noise(plan.epsilon, plan.delta, plan.count_share, plan.density_share)
        if plan.epsilon is not None
        else None
    )
    if noise is None:
        raise ConfigError(
            bad_value(
                plan.name("epsilon"),
                None,
                "the DP billboard needs a target ε (noise-multiplier is "
                "for FedDL's gradient perturbation): give epsilon",
            )
        )
    co.privacy = priv = BillboardPrivacy(plan, co.run_id, s.sizes, noise, co.ledger, scale=scale)
    n_max = float(max(s.sizes))
    share1, share2 = noise["sigma1"], noise["sigma2"]  # every site adds the full σ (noise local)
    W = rff_frequencies(d, DEFAULT_FREQUENCIES, DEFAULT_LENGTHSCALES)
    task = M.Rff(
        space=space,
        n_freq=DEFAULT_FREQUENCIES,
        lengthscales=list(DEFAULT_LENGTHSCALES),
        billboard=json.loads(priv.wire_plan()),
        release=0,
    )
    bound = n_max / math.sqrt(DEFAULT_FREQUENCIES) + 12.0 * share1  # |noise share| > 12σ: probability < 1e-32
    total, a = yield from _scaled_sum(
        co,
        task,
        "billboard: random-feature sums",
        bound,
        [2 * DEFAULT_FREQUENCIES],
        tap=lambda i, reply: priv.mirror(i, reply, 0),
    )
    priv.check_reported(0, a.survivors)
    rng = np.random.default_rng([plan.seed, 0xB1B])
    Y = fit_to_embedding(total / N, W, plan.landmarks, rng)
    task = M.BillboardCounts(space=space, billboard=json.loads(priv.wire_plan()), release=1, Y=Y)
    counts, a = yield from _scaled_sum(
        co,
        task,
        "billboard: landmark counts",
        n_max + 12.0 * share2,
        [len(Y)],
        tap=lambda i, reply: priv.mirror(i, reply, 1),
    )
    priv.check_reported(1, a.survivors)
    return _billboard_result(co, Y, space, counts, noise, priv)


def _billboard_result(co, Y, space, counts, noise, priv) -> LandmarkResult:
    """The billboard's landmarks with their masses (the noisy counts, at least 1, rescaled to N), the releases named
    and the stage's result (γ from the landmarks' median squared distance: post-processing)."""
    from ..kernels import sq_dists

    plan, m = co.plan, co.sites.n_features
    c = np.maximum(counts, 1.0)
    c *= float(sum(co.sites.sizes)) / c.sum()
    co.release(
        "the sum over sites of a random-feature map of every record, with Gaussian noise",
        covered=f"yes (μ₁ = {noise['mu1']:.3g}, σ = {noise['sigma1']:.3g})",
    )
    co.release(
        "the sum over sites of each landmark's record count, with Gaussian noise",
        covered=f"yes (μ₂ = {noise['mu2']:.3g}, σ = {noise['sigma2']:.3g})",
    )
    co.release(
        "the DP landmarks, their masses and their map (the billboard)",
        to="every site",
        covered="post-processing of the two DP releases",
    )
    D2 = sq_dists(Y)
    gamma = 1.0 / max(float(np.median(D2[np.triu_indices(len(Y), 1)])), 1e-300)
    return LandmarkResult(
        Y,
        space,
        c,
        gamma,
        None,
        [],
        np.random.default_rng([plan.seed, 0xB1C]),
        {
            "method": "billboard",
            "landmarks": len(Y),
            "basis": space.basis_name(m),
            "releases": 2,
            "sigma1": noise["sigma1"],
            "sigma2": noise["sigma2"],
            "noise": priv.noise_note,
        },
    )


def billboard_density(co, lm: LandmarkResult, emb: dict):
    """Release 3 of the DP billboard (``density_share`` > 0, coordinates kept on the sites): one noisy secure sum of
    every record's count per cell of a public grid over the landmark map (:func:`securefed.landmarks.merf.
    density_counts`; each site adds its noise — the full σ₃, or σ₃/√t with noise distributed — and books it first). The shared picture of all records on the map,
    computed from each record's landmark-only position (placed against the landmark map alone: a function of that
    record and the billboard). Returns
    ``{"counts": grid × grid, "lo", "hi", "grid", "sigma_per_cell"}`` (the noisy counts, not clipped)."""
    from ..landmarks.merf import density_box

    plan, s, priv = co.plan, co.sites, co.privacy
    E, G = np.asarray(emb["landmark_embedding"], dtype=np.float64), int(plan.density_grid)
    sigma = float(priv.noise["sigma3"])
    n_max = float(max(n + h for n, h in zip(s.sizes, s.holdouts)))
    task = M.BillboardDensity(
        space=lm.space,
        billboard=json.loads(priv.wire_plan()),
        release=2,
        Y=lm.Y,
        landmark_embedding=E,
        masses=np.asarray(emb["landmark_masses"], dtype=np.float64),
        Zn=float(emb["Zn"]),
        perplexity=float(plan.placement_perplexity),
    )
    total, a = yield from _scaled_sum(
        co,
        task,
        "billboard: density on the map",
        n_max + 12.0 * sigma,
        [G * G],
        tap=lambda i, reply: priv.mirror(i, reply, 2),
    )
    priv.check_reported(2, a.survivors)
    lo, hi = density_box(E)
    co.release(
        f"the sum over sites of every record's count per cell of a {G} × {G} grid over the landmark map, with "
        "Gaussian noise",
        covered=f"yes (μ₃ = {priv.noise['mu3']:.3g}, σ = {sigma:.3g})",
        note="each record counted at its landmark-only position; no record's coordinate leaves its site",
    )
    co.emit("density", grid=G)
    return {
        "counts": total.reshape(G, G),
        "lo": lo,
        "hi": hi,
        "grid": G,
        "sigma_per_cell": sigma * math.sqrt(len(a.survivors) / priv.plan["t"]),
        "sites": len(a.survivors),
    }
