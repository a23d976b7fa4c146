"""Differential privacy for securefed: enforced bounds, sensitivity, accountants, mechanisms, ledger.

See Qiao et al. §5 (Theorems 3 and 5) and docs/maths.md. Every release is a frozen
:class:`~securefed.accounting.events.ReleaseEvent` (mechanism, noise, sensitivity, sampling, count) that its
mechanism produces; every accountant says what it ``supports`` and then ``compose``-s it; the ledger stores events.
Public API:

* events: :class:`ReleaseEvent`, :class:`ComposedEvent`, :func:`gaussian_release` (:mod:`.events`)
* the billboard's μ split and events: :mod:`securefed.accounting.billboard`
* a site's budget over all its runs (one lock, a hash-chained index): :class:`SiteBudget` (:mod:`.site_budget`)
* bounds: :func:`clip_records`, :func:`default_tau_x`, :func:`project_spectral`, :func:`enforced_upsilon`
* sensitivity: :func:`gradient_sensitivity` → :class:`Sensitivity`
* accountants: :func:`get_accountant`, :func:`calibrate_noise_multiplier`, :func:`epsilon_from_noise`,
  :func:`compose_gdp`, :func:`gdp_epsilon`, :func:`gdp_mu`, :func:`gdp_delta`
* mechanisms: :class:`GradientPerturbation` (FedDL's ``LandmarkPrivacy`` hook), :func:`perturb_data`
* ledger: :class:`PrivacyLedger`
* distributed integer noise for modular secure sums: :class:`DistributedDiscreteGaussian`,
  :class:`DistributedSkellam` (:mod:`securefed.accounting.distributed`); CSPRNG samplers in
  :mod:`securefed.accounting.samplers`
* budget figures: :func:`budget_figures` (what ``securefed budget`` prints)
* CLI: :mod:`securefed.cli.budget` (``securefed budget``)
"""

from .accountants import (
    ACCOUNTANTS,
    Accountant,
    calibrate_noise_multiplier,
    compose_gdp,
    epsilon_from_noise,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    get_accountant,
    paper_epsilon,
    paper_noise_multiplier,
)
from .budget import budget_figures
from .events import ComposedEvent, ReleaseEvent, gaussian_release
from .site_budget import SiteBudget
from .distributed import DistributedDiscreteGaussian, DistributedSkellam
from .bounds import clip_records, default_tau_x, default_tau_y, enforced_upsilon, project_spectral
from .ledger import PrivacyLedger
from .mechanisms import (
    DataPerturbation,
    DataPerturbationEvent,
    GradientPerturbation,
    analytic_gaussian_sigma,
    classical_gaussian_sigma,
    data_perturbation_sigma,
    perturb_data,
)
from .sensitivity import Sensitivity, gradient_sensitivity

__all__ = [
    "ACCOUNTANTS",
    "Accountant",
    "calibrate_noise_multiplier",
    "compose_gdp",
    "epsilon_from_noise",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "get_accountant",
    "paper_epsilon",
    "paper_noise_multiplier",
    "clip_records",
    "default_tau_x",
    "default_tau_y",
    "enforced_upsilon",
    "project_spectral",
    "PrivacyLedger",
    "DataPerturbation",
    "DataPerturbationEvent",
    "GradientPerturbation",
    "analytic_gaussian_sigma",
    "classical_gaussian_sigma",
    "data_perturbation_sigma",
    "perturb_data",
    "Sensitivity",
    "gradient_sensitivity",
    "DistributedDiscreteGaussian",
    "DistributedSkellam",
    "budget_figures",
    "ReleaseEvent",
    "ComposedEvent",
    "gaussian_release",
    "SiteBudget",
]
