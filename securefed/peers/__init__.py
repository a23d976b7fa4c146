"""The other source papers as working systems: dSNE / F-dSNE / DP-dSNE (Saha et al. 2023) and distributed
GTM from local Gaussian abstractions (Zhang & Cheung).

:data:`PEER_METHODS` maps the CLI method names to factories ``(random_state=None, **opts) -> estimator``;
every estimator has ``fit_transform(sites) -> embedding of the concatenated site records in site order``.
:data:`WHAT_LEAVES` says, per method, what each site sends.
"""

from __future__ import annotations

from typing import Any, Callable

from .adaclip import AdaCliP, adaclip_scale, noise_addition
from .affinities import calibrate_perplexity, joint_probabilities, knn_affinities, row_entropies
from .dsne import WHAT_LEAVES as _DSNE_LEAVES
from .dsne import FedDSNE, default_reference, kl_divergence, kl_gradient
from .gtm import WHAT_LEAVES as _GTM_LEAVES
from .gtm import CentralizedGTM, DistributedGTM, local_abstraction

__all__ = [
    "PEER_METHODS",
    "WHAT_LEAVES",
    "FedDSNE",
    "CentralizedGTM",
    "DistributedGTM",
    "AdaCliP",
    "adaclip_scale",
    "noise_addition",
    "calibrate_perplexity",
    "joint_probabilities",
    "knn_affinities",
    "row_entropies",
    "kl_divergence",
    "kl_gradient",
    "default_reference",
    "local_abstraction",
    "make_dsne",
    "make_fdsne",
    "make_dp_dsne",
    "make_gtm",
]

WHAT_LEAVES = {**_DSNE_LEAVES, **_GTM_LEAVES}

#: Total gradient steps of the dSNE factories (openTSNE's 250 exaggerated + 500 normal).
N_ITER = 750


def make_dsne(random_state=None, **opts) -> FedDSNE:
    """dSNE (Saha et al. 2017): one step per communication, reference updates in the clear."""
    params = {"local_iters": 1, "rounds": N_ITER, "noise": None}
    params.update(opts)
    return FedDSNE(random_state=random_state, **params)


def make_fdsne(random_state=None, **opts) -> FedDSNE:
    """F-dSNE (Saha et al. 2023): ``k = 10`` local steps per communication, AdaCliP noise on each release.

    Default ``noise_multiplier`` (AdaCliP σ) 1.0 unless ``epsilon`` is given; ``rounds`` defaults to
    ``750 // local_iters`` so the total number of gradient steps matches dSNE.
    """
    k = int(opts.pop("local_iters", 10))
    params = {"local_iters": k, "rounds": max(1, N_ITER // max(k, 1)), "noise": "adaclip"}
    if "epsilon" not in opts:
        params["noise_multiplier"] = 1.0
    params.update(opts)
    return FedDSNE(random_state=random_state, **params)


def make_dp_dsne(random_state=None, **opts) -> FedDSNE:
    """DP-dSNE (Saha et al. 2022): AdaCliP noise on every one-step release (default σ = 1.0)."""
    params = {"local_iters": 1, "rounds": N_ITER, "noise": "adaclip"}
    if "epsilon" not in opts:
        params["noise_multiplier"] = 1.0
    params.update(opts)
    return FedDSNE(random_state=random_state, **params)


def make_gtm(random_state=None, **opts) -> DistributedGTM:
    """Distributed GTM (Zhang & Cheung) from per-site Ward abstractions (default 60 components per site)."""
    return DistributedGTM(random_state=random_state, **opts)


PEER_METHODS: dict[str, Callable[..., Any]] = {
    "dsne": make_dsne,
    "fdsne": make_fdsne,
    "dp-dsne": make_dp_dsne,
    "gtm": make_gtm,
}
