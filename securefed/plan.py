"""One run plan: every option of a federated job, validated once, frozen, with one vocabulary.

The same options reach securefed three ways — ``securefed run`` flags, estimator parameters and the Flower
run configuration — and :class:`RunPlan` is what all three become. The option names are the same
everywhere (``--local-steps`` on the command line, ``local-steps`` in the Flower run config,
``local_steps`` here); only the estimators keep their scikit-learn style names for a few of them
(:data:`API_NAMES`). Every bad value raises one :class:`~securefed.errors.ConfigError` that names the
option **as the user typed it** (:func:`option_name`), the value and the fix.

Nothing after the plan mutates options: values that depend on the run (γ from the federated median
heuristic, σ from the site sizes announced at ``hello``) are computed by the coordinator
(:mod:`securefed.federation.coordinator`) from the plan and recorded in the run's result.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field, fields

import numpy as np

from .errors import ConfigError, bad_value

__all__ = [
    "RunPlan",
    "option_name",
    "seed_of",
    "API_NAMES",
    "METHODS",
    "NYSTROM_MODES",
    "AGGREGATIONS",
    "LANDMARK_METHODS",
    "DISTRIBUTED_MECHANISMS",
    "INTEGER_MECHANISMS",
    "CHOICES",
    "NOT_CLI_FLAGS",
    "plan_defaults",
    "to_run_config",
    "from_run_config",
    "options_from_args",
]

METHODS = ("tsne", "umap", "spectral", "none")
NYSTROM_MODES = ("local", "rows")
AGGREGATIONS = ("auto", "plain", "secagg", "ckks")
LANDMARK_METHODS = ("auto", "feddl", "cells", "billboard")
DISTRIBUTED_MECHANISMS = ("auto", "gaussian", "ddg", "skellam")
INTEGER_MECHANISMS = ("ddg", "skellam")
ACCOUNTANT_NAMES = ("exact", "prv", "rdp", "paper")
SENSITIVITY_RULES = ("min", "theorem5", "kernel_shape", "lipschitz")
RULES = ("model", "gradient")
WEIGHT_RULES = ("records", "uniform")
NOISE_MODES = ("local", "distributed")
RECONSTRUCTIONS = ("auto", "paper", "features")
CKKS_VERIFY_MODES = ("recompute", "signatures")
COORDINATES = ("send", "keep")
INIT_MODES = ("auto", "moments", "public")
#: landmarks of FedDL and the billboard when ``landmarks`` is auto (the cells' number follows the records instead)
DEFAULT_LANDMARKS = 300

#: every option that takes one of a fixed set of values → the set: the one list the validator, the ``securefed run``
#: flags (argparse ``choices``) and the estimators read
CHOICES = {
    "landmark_method": LANDMARK_METHODS,
    "rule": RULES,
    "weights": WEIGHT_RULES,
    "aggregation": AGGREGATIONS,
    "ckks_verify": CKKS_VERIFY_MODES,
    "accountant": ACCOUNTANT_NAMES,
    "noise": NOISE_MODES,
    "distributed_mechanism": DISTRIBUTED_MECHANISMS,
    "sensitivity_rule": SENSITIVITY_RULES,
    "method": METHODS,
    "nystrom": NYSTROM_MODES,
    "reconstruction": RECONSTRUCTIONS,
    "coordinates": COORDINATES,
}

#: estimator parameter names that differ from the plan's option names (scikit-learn style)
API_NAMES = {"landmarks": "n_landmarks"}


def seed_of(random_state) -> int:
    """The run's statistical seed from a scikit-learn style ``random_state`` (None: fresh OS entropy; an int; a
    Generator: one draw). Statistics only — never masks, keys or DP noise."""
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**31 - 1))
    if random_state is None:
        return int(typing.cast(int, np.random.SeedSequence().entropy) % (2**31 - 1))
    return random_state


def option_name(option: str, source: str) -> str:
    """How the user typed ``option``: ``--local-steps`` (``"cli"``), ``local-steps`` (``"flower"``) or the
    estimator parameter (``"api"``)."""
    if source == "cli":
        return "--" + option.replace("_", "-")
    if source == "flower":
        return option.replace("_", "-")
    return API_NAMES.get(option, option)


@dataclass(frozen=True)
class RunPlan:
    """Every option of one federated job (see the module docstring). Build with :meth:`build`.

    Groups: the landmarks (``landmarks`` … ``monitor``), the secure sum (``aggregation`` …
    ``ckks_verify``), differential privacy (``epsilon`` … ``run_id``; off unless ``epsilon`` or
    ``noise_multiplier``), the audit gate (``audit_holdout`` … ``allow_audit_failure``), the embedding
    (``method`` … ``reconstruction``) and the run (``seed`` … ``readmit``). The operator's guide in the
    README lists every option with its meaning.
    """

    # ---- landmarks (Qiao et al. Algorithm 1)
    landmarks: int | None = None  # None ("auto"): cells as many as the records allow (≤ 4 000), feddl / billboard 300
    landmark_method: str = "auto"  # auto: cells (no rows, no DP), billboard (no rows, DP), feddl (the rows mode)
    cell_floor: int = 15  # cells: a cell's mean is revealed only over at least this many records
    cell_rounds: int = 12  # cells: most growth rounds
    cell_axes: int = 0  # cells: principal axes per cell added as landmarks (μ ± √λ·v; 0: the means only)
    basis_dim: int = 50  # cells: dimensions of the federated PCA basis
    standardize: bool = False  # cells: standardise every feature by its federated mean and variance
    public_basis_dim: int = 64  # billboard: dimensions of the public basis
    count_share: float = 0.2  # billboard: share of μ² spent on the landmarks' counts
    density_share: float = 0.0  # billboard + coordinates keep: share of μ² spent on a noisy 2-D density (0: none)
    density_grid: int = 16  # billboard density: cells per side of the public grid on the landmark map
    rounds: int = 60
    local_steps: int = 5
    rule: str = "model"
    lr: float | None = None  # None: landmarks.default_lr
    gamma: float | None = None  # None: federated median heuristic (1/τ_X² under DP)
    weights: str = "records"
    init: object = "auto"  # "auto", "moments", "public" or an (n_y, m) array
    monitor: bool | None = None  # None: on without DP (the MMD is an unaccounted release)
    # ---- secure sum
    aggregation: str = (
        "auto"  # auto: secagg when a public value bound is known (value_bound or DP clip_norm), else plain
    )
    value_bound: float | None = None  # public bound on |feature values| (secagg/ckks quantise into it)
    modulus_bits: int = 32
    fractional_bits: int | None = None
    degree: int | None = None
    threshold: int | None = None
    stage_timeout: float | None = None
    ckks_precision: float = 1e-6
    key_holder: int = 0
    ckks_min_survivors: int | None = None
    ckks_quorum: int | None = None
    ckks_verify: str = "recompute"
    # ---- differential privacy (Qiao et al. §5)
    epsilon: float | None = None
    noise_multiplier: float | None = None
    delta: float = 1e-5
    accountant: str = "exact"
    noise: str = "local"
    distributed_mechanism: str = (
        "auto"  # noise distributed: ddg / skellam (integers mod 2^k) or gaussian (float shares)
    )
    clip_norm: float | None = None
    sample_rate: float = 1.0
    noise_seed_for_testing: int | None = None  # seeded noise: the ε is void (anyone with the seed removes it)
    min_survivors: int | None = None
    sensitivity_rule: str = "min"
    rows_epsilon: float | None = None
    run_id: str | None = None
    # ---- audit gate
    audit_holdout: float = 0.2
    max_auc: float = 0.6
    max_empirical_epsilon: float = 1.0
    allow_audit_failure: bool = False
    # ---- embedding (Qiao et al. Algorithms 2–3)
    method: str = "tsne"
    nystrom: str = "local"  # local: no per-record rows leave a site; rows: the paper (gives the records back)
    n_components: int = 2
    perplexity: float = 30.0
    placement_perplexity: float | None = None  # a site's placement (t-SNE); None: 5 under DP, else 10
    n_iter: int = 750
    n_neighbors: int = 15
    min_dist: float = 0.1
    n_clusters: int = 8
    kernel_gamma: float | None = None
    reconstruction: str = "auto"
    keep_rows: bool = False
    coordinates: str = "send"  # send: each record's coordinate goes to the coordinator; keep: stays on its site
    # ---- the run
    seed: int = 0
    min_sites: int = 1
    request_timeout: float = 120.0
    readmit: bool = True
    n_jobs: int = 1
    source: str = field(default="api", compare=False, repr=False)

    # ------------------------------------------------------------------------------------ building
    @classmethod
    def build(cls, source: str = "api", **options) -> "RunPlan":
        """The validated plan; ``source`` (``"cli"``, ``"api"``, ``"flower"``) only decides how errors name
        options. Unknown options raise :class:`ConfigError`."""
        known = {f.name for f in fields(cls)} - {"source"}
        for k in options:
            if k not in known:
                raise ConfigError(
                    bad_value(
                        option_name(k, source),
                        options[k],
                        f"is not an option; use one of {', '.join(sorted(option_name(o, source) for o in known))}",
                    )
                )
        return cls(source=source, **options)

    def replace(self, **changes) -> "RunPlan":
        """A new validated plan with some options changed."""
        return dataclasses.replace(self, **changes)

    def __post_init__(self):
        _Validator(self).run()

    # ------------------------------------------------------------------------------------ derived
    @property
    def dp(self) -> bool:
        """Differential privacy is on (``epsilon`` or ``noise_multiplier`` given)."""
        return self.epsilon is not None or self.noise_multiplier is not None

    @property
    def monitoring(self) -> bool:
        """Whether the sites report their MMD each round (never under DP unless asked)."""
        return (not self.dp) if self.monitor is None else bool(self.monitor)

    @property
    def init_mode(self) -> str:
        """``"moments"``, ``"public"`` or ``"array"``."""
        if isinstance(self.init, np.ndarray):
            return "array"
        if self.init == "auto":
            return "public" if self.dp else "moments"
        return str(self.init)

    @property
    def sum_bound(self) -> float | None:
        """The public bound B ≥ |x_ij| every secure-sum range derives from: ``value_bound``, or τ_X under DP."""
        if self.value_bound is not None:
            return float(self.value_bound)
        if self.dp:
            return float(self.clip_norm)
        return None

    def name(self, option: str) -> str:
        """``option`` as the user of this plan typed it (CLI flag, run-config key or parameter)."""
        return option_name(option, self.source)

    def as_dict(self) -> dict:
        """JSON-able options (arrays shown by shape)."""
        out = {}
        for f in fields(self):
            if f.name == "source":
                continue
            v = getattr(self, f.name)
            out[f.name] = f"array{tuple(v.shape)}" if isinstance(v, np.ndarray) else v
        return out


class _Validator:
    """The one validation of a :class:`RunPlan` (one error per bad value, naming the option as typed)."""

    def __init__(self, plan: RunPlan):
        self.p = plan

    def fail(self, option: str, value, fix: str):
        raise ConfigError(bad_value(self.p.name(option), value, fix))

    def int_(self, option: str, minimum: int = 1, maximum: int | None = None, optional: bool = False):
        v = getattr(self.p, option)
        if v is None and optional:
            return
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, np.integer))
            or v < minimum
            or (maximum is not None and v > maximum)
        ):
            rng = f"an integer ≥ {minimum}" if maximum is None else f"an integer in [{minimum}, {maximum}]"
            self.fail(option, v, f"use {rng}")
        object.__setattr__(self.p, option, int(v))

    def pos(self, option: str, optional: bool = False, allow_zero: bool = False):
        v = getattr(self.p, option)
        if v is None and optional:
            return
        ok = (
            isinstance(v, (int, float, np.integer, np.floating))
            and not isinstance(v, bool)
            and math.isfinite(float(v))
            and (float(v) >= 0 if allow_zero else float(v) > 0)
        )
        if not ok:
            self.fail(option, v, "use a positive finite number" if not allow_zero else "use a finite number ≥ 0")
        object.__setattr__(self.p, option, float(v))

    def choice(self, option: str, choices=None):
        choices = CHOICES[option] if choices is None else choices
        v = getattr(self.p, option)
        if v not in choices:
            self.fail(option, v, f"use one of {', '.join(map(str, choices))}")

    def run(self) -> None:
        p = self.p
        for opt in ("lr", "landmarks"):  # "auto" is the unset value
            if isinstance(getattr(p, opt), str) and getattr(p, opt) == "auto":
                object.__setattr__(p, opt, None)
        if p.landmarks is None and isinstance(p.init, np.ndarray) and p.init.ndim == 2:
            object.__setattr__(p, "landmarks", int(p.init.shape[0]))  # as many landmarks as the given start
        self.int_("landmarks", minimum=2, optional=True)
        self.choice("landmark_method")
        self.int_("rounds")
        self.int_("local_steps")
        self.choice("rule")
        self.pos("lr", optional=True)
        self.pos("gamma", optional=True)
        self.choice("weights")
        if isinstance(p.init, np.ndarray):
            if p.init.ndim != 2 or p.init.shape[0] != p.landmarks or not np.all(np.isfinite(p.init)):
                self.fail("init", f"array{p.init.shape}", f"give a finite array with {p.landmarks} rows")
        else:
            self.choice("init", INIT_MODES)
        self.choice("aggregation")
        if p.aggregation == "auto":
            self._auto_aggregation()
        self.pos("value_bound", optional=True)
        self.int_("modulus_bits", minimum=16, maximum=64)
        self.int_("fractional_bits", minimum=0, maximum=62, optional=True)
        self.int_("degree", optional=True)
        self.int_("threshold", optional=True)
        self.pos("stage_timeout", optional=True)
        self.pos("ckks_precision")
        self.int_("key_holder", minimum=0)
        self.int_("ckks_min_survivors", optional=True)
        self.int_("ckks_quorum", optional=True)
        self.choice("ckks_verify")
        self._privacy()
        self.pos("audit_holdout", allow_zero=True)
        if not p.audit_holdout < 0.9:
            self.fail("audit_holdout", p.audit_holdout, "use a fraction in [0, 0.9), e.g. 0.2")
        self.pos("max_auc")
        if not 0.5 <= float(p.max_auc) <= 1.0:  # the audit gate's own range, checked before any file is written
            self.fail("max_auc", p.max_auc, "use a value in [0.5, 1], e.g. 0.6")
        self.pos("max_empirical_epsilon", allow_zero=True)
        self.choice("method")
        if p.nystrom is None:  # unset in a run configuration
            object.__setattr__(p, "nystrom", "local")
        self.choice("nystrom")
        self._landmark_method()
        self.int_("n_components", minimum=1)
        self.pos("perplexity")
        if p.placement_perplexity is None:  # measured (BENCHMARKS §11): 5 is better under DP, 10 without
            object.__setattr__(p, "placement_perplexity", 5.0 if p.dp else 10.0)
        self.pos("placement_perplexity")
        self.int_("n_iter", minimum=1)
        self.int_("n_neighbors", minimum=2)
        self.pos("min_dist", allow_zero=True)
        self.int_("n_clusters", minimum=2)
        self.pos("kernel_gamma", optional=True)
        self.choice("reconstruction")
        self.int_("seed", minimum=0)
        self.int_("min_sites", minimum=1)
        self.pos("request_timeout")
        self.int_("n_jobs", minimum=1)
        if p.aggregation != "plain" and p.sum_bound is None:
            self.fail(
                "value_bound",
                None,
                f"{p.aggregation} aggregation quantises into a public range: give a public bound "
                "on |feature values| of the data (e.g. 16 for digits, 255 for pixels)",
            )
        if p.dp and p.nystrom == "rows" and p.method != "none" and p.rows_epsilon is None:
            self.fail(
                "rows_epsilon",
                None,
                f"with differential privacy and {p.name('nystrom')} rows every record's row is "
                f"a release: give its ε (e.g. 1), or use {p.name('nystrom')} local",
            )

    def _auto_aggregation(self) -> None:
        """``auto``: SecAgg+ whenever a public bound on the values is known, else plain — which a deployed site
        refuses by default, so a Flower plan must name the bound (or choose plain and set the sites' allow-plain)."""
        p = self.p
        known = p.value_bound is not None or (p.dp and p.clip_norm is not None)
        if not known and p.source == "flower":
            self.fail(
                "value_bound",
                None,
                "the default secure sum (secagg) quantises into a public range: give a public "
                "bound on |feature values| (e.g. 16 for digits, 255 for pixels)",
            )
        object.__setattr__(p, "aggregation", "secagg" if known else "plain")

    def _landmark_method(self) -> None:
        p = self.p
        self.int_("cell_floor", minimum=2)
        self.int_("cell_rounds", minimum=1)
        self.int_("cell_axes", minimum=0)
        self.int_("basis_dim", minimum=1)
        self.int_("public_basis_dim", minimum=1)
        if not (isinstance(p.count_share, (int, float)) and 0 < float(p.count_share) < 1):
            self.fail("count_share", p.count_share, "use a share of the budget in (0, 1), e.g. 0.2")
        self.choice("coordinates")
        if p.landmark_method == "auto":
            auto = (
                "feddl"
                if (
                    p.nystrom == "rows"
                    or p.method == "none"
                    or isinstance(p.init, np.ndarray)
                    or (p.dp and p.epsilon is None)
                )
                else ("billboard" if p.dp else "cells")
            )
            object.__setattr__(p, "landmark_method", auto)
        if p.landmarks is None and p.landmark_method != "cells":  # cells: from the records (landmark_stages.cells_plan)
            object.__setattr__(p, "landmarks", DEFAULT_LANDMARKS)
        if p.landmark_method in ("cells", "billboard") and p.nystrom == "rows":
            self.fail(
                "landmark_method",
                p.landmark_method,
                f"the rows mode reproduces the paper: use feddl landmarks, or {p.name('nystrom')} local",
            )
        if p.landmark_method == "cells" and p.dp:
            self.fail(
                "landmark_method",
                "cells",
                "cell counts and means are not covered by differential privacy: use "
                "billboard (the DP landmarks) or feddl",
            )
        if p.landmark_method == "billboard" and not p.dp:
            self.fail(
                "landmark_method",
                "billboard",
                f"is the DP landmark method: give {p.name('epsilon')} (and {p.name('clip_norm')}), or use cells",
            )
        if p.dp and p.noise == "distributed" and p.landmark_method == "feddl" and p.rule == "model":
            self.fail(
                "noise",
                "distributed",
                f"is unsound with model averaging (each site's hidden local steps carry "
                f"only its noise share); use {p.name('rule')} gradient or noise local",
            )
        if p.standardize and p.landmark_method != "cells":
            self.fail(
                "standardize",
                True,
                f"federated standardisation comes with the cell landmarks (their basis sum "
                f"gives the means and variances); {p.landmark_method} landmarks need the "
                "records scaled beforehand (a public scale per feature)",
            )
        if p.coordinates == "keep" and p.nystrom == "rows":
            self.fail("coordinates", "keep", "the rows mode sends rows, not coordinates; use the no-rows mode")
        self._density()

    def _density(self) -> None:
        """The optional third billboard release: a noisy density of every record on the shared map."""
        p = self.p
        self.int_("density_grid", minimum=2)
        if not (isinstance(p.density_share, (int, float)) and 0 <= float(p.density_share) < 1 - float(p.count_share)):
            self.fail(
                "density_share",
                p.density_share,
                f"use a share of the budget in [0, {1 - float(p.count_share):g}) "
                f"({p.name('count_share')} {p.count_share:g} is spent already), "
                "e.g. 0.2; 0 for no density",
            )
        if p.density_share and not (
            p.landmark_method == "billboard" and p.coordinates == "keep" and p.method == "tsne"
        ):
            self.fail(
                "density_share",
                p.density_share,
                f"the DP density is the shared picture when the coordinates stay "
                f"on the sites: it needs {p.name('epsilon')} (the DP billboard), "
                f"{p.name('coordinates')} keep and the t-SNE map; or set it to 0",
            )
        self._distributed_mechanism()

    def _distributed_mechanism(self) -> None:
        """``distributed_mechanism``: how a site's noise share survives the secure sum under ``noise distributed``.

        ``ddg`` (Kairouz, Liu & Steinke, ICML 2021) and ``skellam`` (Agarwal, Kairouz & Liu, NeurIPS 2021): each site
        clips, rotates, rounds its weighted gradient to integers and adds integer noise; SecAgg+ sums the integers
        mod 2^k (:mod:`securefed.accounting.distributed`). ``gaussian``: the continuous shares σ/√t through the
        fixed-point codec (kept to reproduce earlier runs). ``auto``: ddg with SecAgg+ and a target ε, else gaussian.
        The integer mechanisms are accounted by their papers' Rényi bounds: the run's ledgers use the rdp
        accountant (the default exact is switched to rdp; prv and paper are refused).
        """
        p = self.p
        self.choice("distributed_mechanism")
        applies = p.dp and p.noise == "distributed" and p.landmark_method == "feddl"
        shares = p.dp and p.noise == "distributed" and p.landmark_method == "billboard"  # continuous σ/√t shares
        if p.distributed_mechanism == "auto":
            if applies:
                object.__setattr__(
                    p,
                    "distributed_mechanism",
                    "ddg"
                    if (p.aggregation == "secagg" and p.epsilon is not None and p.rule == "gradient")
                    else "gaussian",
                )
        elif shares and p.distributed_mechanism != "gaussian":
            self.fail(
                "distributed_mechanism",
                p.distributed_mechanism,
                "the DP billboard's distributed noise is continuous Gaussian shares σ/√t: use gaussian or auto",
            )
        elif not applies and not shares:
            self.fail(
                "distributed_mechanism",
                p.distributed_mechanism,
                f"applies to FedDL's distributed noise only: give {p.name('epsilon')}, {p.name('noise')} distributed "
                f"and {p.name('landmark_method')} feddl, or leave it auto",
            )
        if p.distributed_mechanism not in INTEGER_MECHANISMS:
            return  # auto where it does not apply, or gaussian
        kind = p.distributed_mechanism
        if p.rule != "gradient":
            self.fail(
                "rule",
                p.rule,
                f"{p.name('distributed_mechanism')} {kind} sums every noisy gradient step: use "
                f"{p.name('rule')} gradient",
            )
        if p.aggregation != "secagg":
            self.fail(
                "aggregation",
                p.aggregation,
                f"{p.name('distributed_mechanism')} {kind} adds integer noise that "
                f"survives only an exact modular sum: use secagg (CKKS sums reals "
                f"approximately), or {p.name('distributed_mechanism')} gaussian",
            )
        if p.epsilon is None:
            self.fail(
                "epsilon",
                None,
                f"{p.name('distributed_mechanism')} {kind} calibrates its own integer noise to a "
                f"target ε: give {p.name('epsilon')} (not {p.name('noise_multiplier')})",
            )
        if p.monitor:
            self.fail(
                "monitor",
                True,
                f"the MMD monitor would ride in the integer sum of {p.name('distributed_mechanism')} "
                f"{kind}; leave it off under DP",
            )
        if p.accountant == "exact":
            object.__setattr__(p, "accountant", "rdp")  # the papers' Rényi bounds compose in RDP
        elif p.accountant != "rdp":
            self.fail(
                "accountant",
                p.accountant,
                f"{p.name('distributed_mechanism')} {kind} is accounted by its paper's "
                "Rényi bound: use rdp (or leave the default)",
            )

    def _privacy(self) -> None:
        p = self.p
        for opt in ("epsilon", "noise_multiplier", "rows_epsilon"):
            v = getattr(p, opt)
            if v is not None and (
                isinstance(v, bool)
                or not isinstance(v, (int, float, np.integer, np.floating))
                or not float(v) > 0
                or not math.isfinite(float(v))
            ):
                self.fail(opt, v, "use a positive finite number (leave it unset for no differential privacy)")
            if v is not None:
                object.__setattr__(p, opt, float(v))
        if p.epsilon is not None and p.noise_multiplier is not None:
            self.fail(
                "noise_multiplier",
                p.noise_multiplier,
                f"give {p.name('epsilon')} or {p.name('noise_multiplier')}, not both",
            )
        if not (isinstance(p.delta, (int, float)) and 0 < float(p.delta) < 1):
            self.fail("delta", p.delta, "use a probability in (0, 1), e.g. 1e-5")
        self.choice("accountant")
        self.choice("noise")
        self.pos("clip_norm", optional=True)
        if not (isinstance(p.sample_rate, (int, float)) and 0 < float(p.sample_rate) <= 1):
            self.fail("sample_rate", p.sample_rate, "use a rate in (0, 1]")
        self.int_("min_survivors", optional=True)
        self.int_("noise_seed_for_testing", minimum=0, optional=True)
        self.choice("sensitivity_rule")
        if p.run_id is not None and (
            not isinstance(p.run_id, str) or not p.run_id or "/" in p.run_id or p.run_id.startswith(".")
        ):
            self.fail("run_id", p.run_id, "use a non-empty name without '/' that does not start with '.'")
        if not p.dp:
            if p.rows_epsilon is not None:
                self.fail(
                    "rows_epsilon",
                    p.rows_epsilon,
                    f"data perturbation of the rows is part of a differentially "
                    f"private run: give {p.name('epsilon')} and {p.name('clip_norm')} too",
                )
            return
        if p.clip_norm is None:
            self.fail(
                "clip_norm",
                None,
                "differential privacy needs a public bound τ_X on record norms, e.g. 10 "
                "(√m always holds for m features in [0, 1])",
            )
        if isinstance(p.init, str) and p.init == "moments":
            self.fail(
                "init", "moments", "with differential privacy use 'public' or 'auto' (the moments are not accounted)"
            )
        if p.sample_rate < 1 and p.accountant == "exact":
            self.fail(
                "accountant",
                "exact",
                f"covers full participation only; with {p.name('sample_rate')} < 1 use 'prv' or 'rdp'",
            )
        if p.noise == "distributed" and p.aggregation == "plain":
            self.fail(
                "aggregation",
                "plain",
                "distributed noise needs a secure sum (the server would see each site's "
                "upload with only its noise share); use secagg or ckks, or noise local",
            )


# ------------------------------------------------------------------------------------- run configs

#: options that make no sense in a Flower run configuration (arrays, process-local settings)
_NOT_IN_RUN_CONFIG = ("source", "n_jobs", "keep_rows", "monitor")
_OPTIONAL_TEXT = ("nystrom", "run_id")  # unset: "" in a run configuration (numbers: 0)
_OPTIONAL_ZERO = (
    "landmarks",
    "nystrom",
    "noise_seed_for_testing",
    "lr",
    "gamma",
    "value_bound",
    "fractional_bits",
    "degree",
    "threshold",
    "stage_timeout",
    "ckks_min_survivors",
    "ckks_quorum",
    "epsilon",
    "noise_multiplier",
    "clip_norm",
    "min_survivors",
    "rows_epsilon",
    "kernel_gamma",
    "placement_perplexity",
)


def plan_defaults() -> dict:
    """``{option: default}`` of every option (the plan's own defaults)."""
    return {f.name: f.default for f in fields(RunPlan) if f.name != "source"}


# ------------------------------------------------------------------------------------- command-line arguments

#: options of the plan that ``securefed run`` does not offer as flags (arrays, process-local switches; the method is
#: the job's ``--method``, which also names the related systems)
NOT_CLI_FLAGS = ("init", "source", "keep_rows", "monitor", "min_sites", "request_timeout", "readmit", "method")


def options_from_args(args) -> dict:
    """The plan options of parsed ``securefed run`` arguments (any object with one attribute per plan flag, given or
    not): ``--no-audit`` (``args.audit`` false) is ``audit_holdout`` 0, and ``--epsilon inf`` is no DP."""
    out = {name: getattr(args, name) for name in plan_defaults() if name not in NOT_CLI_FLAGS}
    if getattr(args, "audit", True) is False:
        out["audit_holdout"] = 0.0
    if out["epsilon"] is not None and out["epsilon"] == float("inf"):
        out["epsilon"] = None  # --epsilon inf: no differential privacy
    return out


def to_run_config(plan_or_options) -> dict:
    """A Flower run configuration (hyphenated keys, TOML scalars: an unset optional number is 0, an unset
    run id ""). ``init`` travels as ``"auto"``, ``"moments"`` or ``"public"`` only."""
    d = plan_or_options.as_dict() if isinstance(plan_or_options, RunPlan) else dict(plan_or_options)
    out = {}
    for k, v in d.items():
        if k in _NOT_IN_RUN_CONFIG:
            continue
        if k == "init" and not isinstance(v, str) or (k == "init" and v.startswith("array")):
            raise ConfigError(
                bad_value(
                    "init",
                    v,
                    "a Flower run configuration carries init as auto, moments, public or "
                    "the path of a .npy file on the coordinator's host",
                )
            )
        if v is None:
            v = "" if k in _OPTIONAL_TEXT else 0
        out[k.replace("_", "-")] = v
    return out


def from_run_config(rc: dict, **overrides) -> RunPlan:
    """The plan of a Flower run configuration (inverse of :func:`to_run_config`); errors name the keys."""
    defaults = plan_defaults()
    opts = {}
    for key, v in rc.items():
        k = key.replace("-", "_")
        if k not in defaults or k in _NOT_IN_RUN_CONFIG:
            raise ConfigError(
                bad_value(
                    "run config key",
                    key,
                    f"use one of "
                    f"{', '.join(sorted(option_name(o, 'flower') for o in defaults if o not in _NOT_IN_RUN_CONFIG))}",
                )
            )
        if k == "init" and isinstance(v, str) and v.endswith(".npy"):
            try:
                v = np.load(v)  # a start array on the coordinator's host
            except (OSError, ValueError) as exc:
                raise ConfigError(bad_value(key, v, f"cannot read the .npy file ({exc})")) from None
        elif k in _OPTIONAL_ZERO and (v == 0 or v == "" or v is None):
            v = None
        elif k in _OPTIONAL_TEXT and v == "":
            v = None
        else:
            v = _cast(key, v, defaults[k])
        opts[k] = v
    opts.update(overrides)
    return RunPlan.build("flower", **opts)


def _cast(key: str, value, default):
    if isinstance(default, bool):
        if isinstance(value, str):
            s = value.strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off", ""):
                return False
            raise ConfigError(bad_value(key, value, "give true or false"))
        return bool(value)
    if default is None or isinstance(default, (int, float)) and not isinstance(value, bool):
        if isinstance(value, str):
            try:
                f = float(value)
            except ValueError:
                if default is None:
                    return value
                raise ConfigError(bad_value(key, value, "give a number")) from None
            return int(f) if (isinstance(default, int) and f == int(f)) else f
        if (
            isinstance(default, int)
            and not isinstance(default, bool)
            and isinstance(value, float)
            and value == int(value)
        ):
            return int(value)
        return value
    return type(default)(value)


#: one line of help per option (the CLI's ``--help``, ``flower-app``'s key list and the README's tables)
HELP = {
    "landmarks": "n_y, the number of landmarks the sites learn together (auto: FedDL and the billboard 300; cells as many "
    "as the records allow, at most N / cell-floor and 4 000; a number caps the cells instead)",
    "landmark_method": "auto, cells (the cell tree; no DP), billboard (DP: 2 noisy releases, 3 with density-share) or feddl "
    "(the paper's Algorithm 1; the rows mode)",
    "cell_floor": "cells: a cell's mean is revealed only over at least this many records",
    "cell_rounds": "cells: most rounds of cell growth",
    "cell_axes": "cells: each cell is also represented by 2 points per principal axis (μ ± √λ·v) for this many axes "
    "(0: the cell means only; they leak more than the means: pair with a larger cell-floor, e.g. 25 with 1)",
    "basis_dim": "cells: dimensions of the federated PCA basis",
    "public_basis_dim": "billboard: dimensions of the public basis (a low-pass DCT for square images, else a random projection)",
    "count_share": "billboard: share of the privacy budget (μ²) spent on the landmarks' counts",
    "density_share": "billboard with coordinates keep: share of the privacy budget (μ²) spent on a noisy density of every "
    "record on the t-SNE map (one more release; 0: none)",
    "density_grid": "billboard density: cells per side of its grid over the landmark map",
    "coordinates": "send: each record's 2-D coordinate goes to the coordinator (outside ε); keep: it stays on its site",
    "rounds": "S, FedDL rounds",
    "local_steps": "Q, local gradient steps per round (gradient averaging: summed steps per round)",
    "rule": "model averaging (Eq. 15) or gradient averaging (Eq. 16)",
    "lr": "FedDL step size (unset: n_y / (8γ), a damped mean-shift step)",
    "gamma": "FedDL kernel bandwidth γ (unset: federated median heuristic; 1/τ_X² under DP)",
    "weights": "each site weighs its upload by its record count (records) or by 1 (uniform)",
    "init": "initial landmarks: auto (moments; the public radius under DP), moments, public (or a .npy path over Flower)",
    "monitor": "sites report their MMD each round (unset: on without DP)",
    "aggregation": "how the server sums the sites' uploads: secagg (SecAgg+), ckks, plain (it sees each), or auto (secagg "
    "when a public value bound is known, else plain)",
    "value_bound": "public bound on |feature values|; secagg and ckks quantise into it (e.g. 16 for digits, 255 for pixels)",
    "modulus_bits": "SecAgg+: bits of the ring Z_2^k (16-64)",
    "fractional_bits": "SecAgg+: fixed-point fractional bits (unset: the largest that cannot overflow)",
    "degree": "SecAgg+: neighbours per site in the masking graph (unset: from the threat model)",
    "threshold": "SecAgg+: Shamir threshold t (unset: from the threat model)",
    "stage_timeout": "seconds each secure-sum stage waits for the sites (unset: the protocol's defaults)",
    "ckks_precision": "CKKS: rounding step of a released sum",
    "key_holder": "CKKS: the site that generates the key pair",
    "ckks_min_survivors": "CKKS: fewest sites a decrypted sum may cover (unset: 2; the DP t under distributed noise)",
    "ckks_quorum": "CKKS: survivor-set signatures the decryptor needs (unset: a majority of all sites)",
    "ckks_verify": "CKKS: recompute (the decryptor re-adds the signed uploads) or signatures (honest-but-curious server only)",
    "epsilon": "differential privacy: target ε per record over the whole run (unset: no DP)",
    "noise_multiplier": "differential privacy: σ/Δ instead of a target ε",
    "delta": "differential privacy: target δ",
    "accountant": "exact (μ-GDP), prv, rdp or paper (Qiao et al. Theorem 5's formula)",
    "noise": "local (full σ on every site) or distributed (shares σ/√t under a secure sum; FedDL: gradient averaging only)",
    "distributed_mechanism": "noise distributed (FedDL): ddg (distributed discrete Gaussian, Kairouz et al. 2021) or "
    "skellam (Agarwal et al. 2021) — integer noise in an exact SecAgg+ sum mod 2^k, rdp "
    "accounting — or gaussian (continuous shares through the fixed-point codec); auto: ddg "
    "with secagg and a target ε, else gaussian",
    "clip_norm": "τ_X, public bound on record norms (required with DP)",
    "sample_rate": "Poisson sampling rate per local step (below 1 needs the prv or rdp accountant)",
    "noise_seed_for_testing": "seed the DP noise (TESTING ONLY: the server knows the seed; the ε is void)",
    "min_survivors": "distributed noise: t, the fewest sites a revealed sum may cover (unset: all)",
    "sensitivity_rule": "Δ used: min of the valid bounds, or the paper's Theorem 5",
    "rows_epsilon": "ε of the data-perturbed rows (DP with the rows mode)",
    "run_id": "privacy-ledger run id (unset: derived from the options)",
    "audit_holdout": "share of each site's records kept out of the landmarks as audit non-members (0: no audit)",
    "max_auc": "audit policy: largest acceptable membership-attack AUC",
    "max_empirical_epsilon": "audit policy: largest acceptable empirical ε lower bound",
    "allow_audit_failure": "continue past a failed audit (recorded in the ledger and the report)",
    "method": "tsne, umap, spectral or none (landmarks only)",
    "standardize": "cells: scale every feature to unit variance with the federated means and variances (from the "
    "basis secure sum; nothing more leaves)",
    "nystrom": "local (default): no per-record rows leave a site, each places its own records on the landmark map; rows: "
    "the paper, one row per record leaves each site (it gives the records back)",
    "n_components": "dimensions of the map",
    "perplexity": "t-SNE perplexity (rows mode: of the map; no-rows mode: of the coordinator's landmark map)",
    "placement_perplexity": "no-rows t-SNE: perplexity of each site's placement of its records against the landmark "
    "map (lower keeps the local structure tighter: digits +2 CA points at 10 against 30); "
    "unset: 5 under differential privacy (+1.5 to +3 CA points against 10 on the DP billboard), "
    "10 otherwise",
    "n_iter": "t-SNE iterations (rows mode: 250 early exaggeration + the rest)",
    "n_neighbors": "UMAP neighbours (spectral: k of the sparse affinity graph)",
    "min_dist": "UMAP minimum distance",
    "n_clusters": "spectral clustering: number of clusters",
    "kernel_gamma": "spectral clustering: bandwidth of the kernel (unset: FedDL's γ)",
    "reconstruction": "rows mode: auto, paper (dense Eq. 21) or features (feature map + kNN, no n×n)",
    "keep_rows": "keep the rows the sites sent (for the reconstruction audit)",
    "seed": "seed of the statistical randomness (never of masks, keys or DP noise)",
    "min_sites": "fewest sites that must answer hello",
    "request_timeout": "seconds the coordinator waits for a reply to a plain request",
    "readmit": "re-admit restarted sites at round boundaries",
    "n_jobs": "worker threads of the embedding libraries",
}
