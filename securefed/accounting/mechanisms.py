"""Gaussian mechanisms of Qiao et al. §5 with enforced bounds, exact accounting and a write-ahead ledger.

* :class:`GradientPerturbation` — the ``LandmarkPrivacy`` hook FedDL calls (docs/architecture.md): Sec. 5.2 /
  Theorem 5 gradient perturbation, per local step ("+" variants), local or distributed noise.
* :func:`perturb_data` — Sec. 5.1 data perturbation with the corrected Theorem 3.

Noise modes
-----------
``noise="local"`` (the paper's "+" mode): every site adds the full ``σ_p = z·Δ_p`` to every gradient it
computes; each site's releases are private on their own, whatever the aggregator. A site makes
``S·Q`` releases (one per local step), and that is what is accounted (the paper counts ``S``).

``noise="distributed"``: under secure aggregation the server sees only the (weighted) sum, so each
site adds only a share. With ``t = min_survivors`` and weights ``w`` known, site ``p`` adds
``N(0, s_p²)`` with ``w_p s_p = z·M/√t``, ``M = max_q w_q Δ_q``; then for any ``k ≥ t`` survivors the
sum carries noise of std ``z·M·√(k/t) ≥ z·M`` and each record's release has ``μ ≤ 1/z``. Without the
weights, ``s_p = z·Δ_max/√t``, which is safe for uniform and record-proportional weights. Assumptions,
stated in the report: (i) the aggregator reveals only the sum (SecAgg+ or CKKS — refused with plain
aggregation when the aggregator is passed to :meth:`prepare`), (ii) honest sites add their share,
(iii) the aggregator never reveals a sum of fewer than ``t`` inputs. Each aggregation is settled in
the ledger with the actual survivors (:meth:`after_aggregate`); if (iii) is violated the actual ε is
recorded and the run stops with :class:`BudgetExceededError` once over budget.

Real-valued shares cannot go through an integer secure sum unchanged (quantising and clipping them to
an aggregation range breaks the "sum of Gaussians" the analysis assumes — issue 14 §3). For SecAgg+ use
the integer mechanisms of :mod:`securefed.accounting.distributed` instead
(:meth:`GradientPerturbation.distributed_mechanism`): distributed discrete Gaussian or Skellam noise
added to rounded integers mod ``2^bits``, with their own accounting and a bounded wrap-around probability.

Distributed noise is sound only when what the server learns is a function of the noisy *sum*
alone, i.e. with gradient averaging (every noisy step is summed; the server steps and projects).
With model averaging and ``Q > 1`` local steps a site's hidden trajectory ``Y_p^{s,1..Q}`` depends on
its own small noise share; and even with ``Q = 1`` each site projects ``Y_p = Π(Y − η(g_p + e_p))``
onto the τ_Y ball *before* upload, a non-linear map, so ``Σ_p w_p Y_p`` is not post-processing of
``Σ_p w_p (g_p + e_p)``. :meth:`prepare` therefore refuses distributed noise with model averaging
(stricter than "Q = 1 is fine": the per-site projection breaks it).

Subsampling (``sample_rate = q < 1``): Poisson sampling per step with the fixed normaliser ``q·n_p``,
where ``n_p`` is the site's **public, announced** size (``sizes[site]`` of :meth:`GradientPerturbation.calibrate`),
never ``len(X)`` — under add/remove adjacency the neighbour holds one record more or less, and a
normaliser read off the data would change with it. Accounted by Opacus' PRV or RDP accountant.

Noise is secret by default
--------------------------
Every release draws its noise from the CSPRNG (:func:`~securefed.accounting.noise.secure_standard_normal`:
ChaCha20 keyed by ``os.urandom``). Reproducible noise exists only for tests, behind
``insecure_noise_seed_for_testing=<int>``; then anyone who knows the seed can subtract the noise, so
``report()`` says ``"epsilon_void": True`` and every ledger event records ``noise_source: "seeded-testing"``.
The Poisson sample is as secret as the noise (the subsampling amplification assumes nobody knows which records a
step used): it comes from the OS source too (:func:`~securefed.accounting.noise.secure_uniform`), never from a
run's printed seed or ``random_state``; with ``insecure_noise_seed_for_testing`` it is reproducible from that seed
(tests only; the ε is void anyway).

Sensitivity and the projection
------------------------------
Δ is computed with ``y_domain="any"`` (:mod:`securefed.accounting.sensitivity`): it holds at every
landmark matrix ``Y``, projected or not, so neither a caller that forgets to project nor a server that
sends an arbitrary ``Y`` to a site can push a release over Δ. Callers must still project ``Y`` with
:meth:`GradientPerturbation.project` after **every** local and server step (``fed_dl``, the Flower
coordinator and each site on the ``Y`` it receives): it keeps the landmarks near the data (utility)
and is what the paper's Theorem 5 figure (reported as ``epsilon_paper_recipe``) assumes.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ConfigError, bad_value
from .accountants import (
    ACCOUNTANTS,
    calibrate_noise_multiplier,
    check_delta,
    check_epsilon,
    check_noise_multiplier,
    check_sample_rate,
    gdp_mu,
    paper_epsilon,
)
from .bounds import check_bound, clip_records, default_tau_y, enforced_upsilon, project_spectral
from .events import ReleaseEvent, gaussian_release
from .ledger import PrivacyLedger, array_digest
from .noise import secure_standard_normal, secure_uniform, seed_entropy, seed_tag, seeded_standard_normal
from .sensitivity import SENSITIVITY_RULES, data_sensitivity, gradient_sensitivity

__all__ = [
    "GradientPerturbation",
    "DataPerturbation",
    "perturb_data",
    "DataPerturbationEvent",
    "data_perturbation_sigma",
    "data_perturbation_event",
    "classical_gaussian_sigma",
    "analytic_gaussian_sigma",
]

_DATA_ROUND = None  # data perturbation is one-shot, outside the FedDL rounds
_DATA_KEY = 2**31  # seeded-noise key component for data releases
_SAMPLE_KEY = 2**31 + 1  # seeded-testing key component of the Poisson sample


SEEDED_NOISE = "seeded-testing"
SECURE_NOISE = "secure"
VOID_REASON = "seeded noise: anyone who knows the seed can subtract it"


def _check_testing_seed(seed):
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or int(seed) < 0:
        raise ConfigError(
            bad_value(
                "insecure_noise_seed_for_testing",
                seed,
                "use None (secret CSPRNG noise, the default) or, for reproducible tests only, a non-negative int",
            )
        )
    return int(seed)


def _check_legacy_secure_mode(secure_mode):
    """``secure_mode`` is gone: noise is secure by default. ``True`` is accepted (a no-op) for old callers;
    ``False`` is refused with the fix, since it used to mean seeded noise."""
    if secure_mode is None or secure_mode is True:
        return
    raise ConfigError(
        bad_value(
            "secure_mode",
            secure_mode,
            "noise is now drawn from the CSPRNG by default and secure_mode "
            "was removed; for reproducible tests pass insecure_noise_seed_for_testing=<int> (the "
            "report then marks the ε void)",
        )
    )


class _NoiseSource:
    """Secure (default) or seeded-testing standard normals plus the idempotent write-ahead release."""

    def __init__(self, insecure_seed):
        seed = _check_testing_seed(insecure_seed)
        self.secure = seed is None
        self.entropy = None if self.secure else seed_entropy(seed)
        self.tag = None if self.secure else seed_tag(self.entropy)

    @property
    def name(self) -> str:
        return SECURE_NOISE if self.secure else SEEDED_NOISE

    def uniform(self, key, n: int) -> np.ndarray:
        """``n`` uniforms in [0, 1): the OS source, or (seeded testing) PCG64 keyed by ``key``."""
        if self.secure:
            return secure_uniform(n)
        ss = np.random.SeedSequence(self.entropy, spawn_key=tuple(int(k) for k in key))
        return np.random.Generator(np.random.PCG64(ss)).random(n)

    def normal(self, key, shape):
        if self.secure:
            return secure_standard_normal(tuple(shape))
        return seeded_standard_normal(self.entropy, key, shape)

    def release(
        self, ledger: PrivacyLedger, value: np.ndarray, *, event: ReleaseEvent, site, round, step, key, **fields
    ):
        """Return ``value + N(0, σ²)`` (σ: the event's noise share, else its σ) after the release's ``event`` is on disk
        (or the identical earlier release)."""
        sigma = event.noise.share if event.noise.share is not None else event.noise.sigma
        existing = ledger.releases_at(site, round, step)
        if not self.secure:
            for ev in existing:
                if ev.get("noise_source") in (SEEDED_NOISE, "seeded") and ev.get("seed_tag") == self.tag:
                    noisy = value + sigma * self.normal(key + (ev["attempt"],), value.shape)
                    if array_digest(noisy) == ev.get("release_digest"):
                        return noisy, ev, True
        attempt = len(existing)
        noisy = value + sigma * self.normal(key + (attempt,), value.shape)
        extra: dict = {"noise_source": self.name}
        if not self.secure:
            extra.update(seed_tag=self.tag, release_digest=array_digest(noisy))
        ev = ledger.record(event, site=site, round=round, step=step, attempt=attempt, **fields, **extra)
        return noisy, ev, False


def _mechanism_ledger(ledger, budget, delta, accountant, epsilon_target) -> PrivacyLedger:
    """The ledger a :class:`GradientPerturbation` writes to: ``ledger`` once checked to agree with the mechanism's
    delta, accountant and budget, or a new in-memory one (budget: ``budget``, else the ε target) when it is None."""
    if ledger is None:
        ledger = PrivacyLedger(
            None,
            f"mem-{uuid.uuid4().hex[:12]}",
            budget_epsilon=budget if budget is not None else epsilon_target,
            delta=delta,
            accountant=accountant,
        )
    elif not isinstance(ledger, PrivacyLedger):
        raise ConfigError(
            bad_value("ledger", type(ledger).__name__, "pass a PrivacyLedger (or None for an in-memory one)")
        )
    else:
        if ledger.delta != delta or ledger.accountant_name != accountant:
            raise ConfigError(
                bad_value(
                    "ledger",
                    ledger.path,
                    f"was opened with delta={ledger.delta}, "
                    f"accountant={ledger.accountant_name!r}; "
                    f"use the same as the mechanism (delta={delta}, accountant={accountant!r})",
                )
            )
        if budget is not None and ledger.budget_epsilon is not None and not math.isclose(budget, ledger.budget_epsilon):
            raise ConfigError(
                bad_value("budget", budget, f"the ledger's budget is {ledger.budget_epsilon}; give one budget")
            )
        if budget is not None and ledger.budget_epsilon is None:
            raise ConfigError(
                bad_value(
                    "budget",
                    budget,
                    "the ledger has no budget; pass budget_epsilon when creating "
                    "the PrivacyLedger (it is stored in the ledger's header)",
                )
            )
    return ledger


class GradientPerturbation:
    """Gaussian gradient perturbation for FedDL (Qiao et al. §5.2, Theorem 5) — the ``LandmarkPrivacy`` hook.

    Parameters
    ----------
    epsilon : float, optional
        Target ε per record over the whole run (all ``S·Q`` releases). Give this or ``noise_multiplier``.
    delta : float
        Target δ (default 1e-5).
    noise_multiplier : float, optional
        ``z = σ/Δ`` directly (then ε is computed, not targeted).
    accountant : {"exact", "prv", "rdp", "paper"}
        Accountant used to calibrate and spend. ``"exact"`` needs ``sample_rate = 1``.
    noise : {"local", "distributed"}
        Full σ per site and step, or σ²/t shares under secure aggregation (module docstring).
    tau_x : float
        Public clip norm of the records (required; :func:`securefed.accounting.default_tau_x`).
    tau_y : float, optional
        Spectral-norm bound of ``Y``; default ``√n_y · τ_X``.
    sample_rate : float
        Poisson sampling rate per step (1.0 = full batch).
    ledger : PrivacyLedger, optional
        Where releases are written (write-ahead). Default: an in-memory ledger.
    budget : float, optional
        ε budget (default: ``epsilon``). With a ledger, it must agree with the ledger's budget.
    random_state : None, int or Generator
        Accepted for old callers; it seeds nothing: the noise and the Poisson sample come from the OS source (or,
        for tests, from ``insecure_noise_seed_for_testing``).
    insecure_noise_seed_for_testing : int, optional
        Reproducible (PCG64) noise for tests. Anyone who knows the seed can subtract the noise: the
        report then carries ``"epsilon_void": True`` and every ledger event ``noise_source:
        "seeded-testing"``. Default ``None``: secret CSPRNG noise.
    secure_mode : None or True
        Removed (noise is secure by default); ``True`` is accepted as a no-op, ``False`` is refused.
    sensitivity_rule : {"min", "theorem5", "kernel_shape", "lipschitz"}
        Which Δ to use (``"theorem5"`` reproduces the paper's recipe).
    min_survivors : int, optional
        ``t`` for distributed noise (default: all sites must survive).
    landmark_radius : float, "tau_x" or None
        After every step each landmark is also projected onto the ball ``‖y‖ ≤ r`` (default ``r = τ_X``).
        Free post-processing of the noisy releases (no privacy cost), and sound for utility: every
        clipped record lies in the τ_X ball, and projecting onto a convex set that contains a point never
        increases the distance to it, so no landmark moves away from any record. Without it the noise's
        random walk carries landmarks where ``e^{−γ‖x−y‖²}`` vanishes and the gradient cannot pull them
        back (MNIST-5k, ε = 1: landmark norms ≈ 135 against record norms ≈ 9). ``None`` disables it
        (the paper's spectral ball only). The projection never increases the spectral norm, so the
        τ_Y / Υ bounds behind Δ still hold.
    """

    mechanism = "gaussian-gradient"

    def __init__(
        self,
        epsilon=None,
        delta=1e-5,
        noise_multiplier=None,
        accountant="exact",
        noise="local",
        tau_x=None,
        tau_y=None,
        sample_rate=1.0,
        ledger=None,
        budget=None,
        random_state=None,
        sensitivity_rule="min",
        min_survivors=None,
        landmark_radius="tau_x",
        *,
        insecure_noise_seed_for_testing=None,
        secure_mode=None,
    ):
        _check_legacy_secure_mode(secure_mode)
        if (epsilon is None) == (noise_multiplier is None):
            raise ConfigError(
                bad_value(
                    "epsilon/noise_multiplier",
                    (epsilon, noise_multiplier),
                    "give exactly one: a target epsilon (e.g. 1.0) or a noise multiplier",
                )
            )
        self.epsilon_target = None if epsilon is None else check_epsilon(epsilon)
        self.delta = check_delta(delta)
        self.noise_multiplier_given = None if noise_multiplier is None else check_noise_multiplier(noise_multiplier)
        if accountant not in ACCOUNTANTS:
            raise ConfigError(bad_value("accountant", accountant, f"use one of {', '.join(ACCOUNTANTS)}"))
        self.accountant = accountant
        if noise not in ("local", "distributed"):
            raise ConfigError(
                bad_value(
                    "noise",
                    noise,
                    "use 'local' (full σ per site) or 'distributed' (σ²/P shares under secure aggregation)",
                )
            )
        self.noise = noise
        if tau_x is None:
            raise ConfigError(
                bad_value(
                    "tau_x",
                    None,
                    "give a public clip norm for the records (see securefed.accounting.default_tau_x); "
                    "a norm read off the data would leak",
                )
            )
        self.tau_x = check_bound("tau_x", tau_x)
        self.tau_y_given = None if tau_y is None else check_bound("tau_y", tau_y)
        if landmark_radius == "tau_x":
            self.landmark_radius = self.tau_x
        elif landmark_radius is None:
            self.landmark_radius = None
        else:
            self.landmark_radius = check_bound("landmark_radius", landmark_radius)
        self.sample_rate = check_sample_rate(sample_rate)
        if self.sample_rate < 1.0 and accountant == "exact":
            raise ConfigError(
                bad_value(
                    "accountant", "exact", "covers full participation only; with sample_rate < 1 use 'prv' or 'rdp'"
                )
            )
        if sensitivity_rule not in SENSITIVITY_RULES:
            raise ConfigError(
                bad_value("sensitivity_rule", sensitivity_rule, f"use one of {', '.join(SENSITIVITY_RULES)}")
            )
        if self.sample_rate < 1.0 and sensitivity_rule not in ("min", "kernel_shape"):
            raise ConfigError(
                bad_value(
                    "sensitivity_rule",
                    sensitivity_rule,
                    "with subsampling (add/remove adjacency) use 'min' or 'kernel_shape'",
                )
            )
        self.sensitivity_rule = sensitivity_rule
        if min_survivors is not None and (
            isinstance(min_survivors, bool) or not isinstance(min_survivors, (int, np.integer)) or min_survivors < 1
        ):
            raise ConfigError(
                bad_value("min_survivors", min_survivors, "use a positive integer (the secure aggregator's threshold)")
            )
        self.min_survivors_given = None if min_survivors is None else int(min_survivors)
        budget = None if budget is None else check_epsilon(budget)
        self.ledger = _mechanism_ledger(ledger, budget, self.delta, accountant, self.epsilon_target)
        self._noise = _NoiseSource(insecure_noise_seed_for_testing)
        #: the testing seed (None = secret noise); public so that a run plan can pass it on to the sites
        self.insecure_noise_seed_for_testing = _check_testing_seed(insecure_noise_seed_for_testing)
        self._prepared = False
        self._plan_rechecked = False
        self._pending: dict[tuple, dict[int, str]] = {}
        self.clipped_records = 0

    @property
    def secure_mode(self) -> bool:
        """True unless ``insecure_noise_seed_for_testing`` was given (kept for callers that read it)."""
        return self._noise.secure

    @property
    def epsilon_void(self) -> bool:
        """True when the noise is seeded (anyone who knows the seed can subtract it): the ε means nothing."""
        return not self._noise.secure

    # ------------------------------------------------------------------ LandmarkPrivacy protocol

    def prepare(
        self, sites, *, gamma, n_landmarks, rounds, local_steps, rule, n_clients, weights=None, aggregator=None
    ):
        """Clip, derive Δ per site and σ, check the configuration and the budget; return the clipped sites."""
        if len(sites) != int(n_clients):
            raise ConfigError(bad_value("n_clients", n_clients, f"must equal the number of sites ({len(sites)})"))
        clipped, counts = [], []
        for X in sites:
            Xc, nc = clip_records(X, self.tau_x)
            clipped.append(Xc)
            counts.append(nc)
        self.calibrate(
            [len(X) for X in clipped],
            gamma=gamma,
            n_landmarks=n_landmarks,
            rounds=rounds,
            local_steps=local_steps,
            rule=rule,
            weights=weights,
            aggregator=aggregator,
        )
        self.clipped_per_site = counts
        self.clipped_records = int(sum(counts))
        return clipped

    def calibrate(
        self,
        sizes,
        *,
        gamma,
        n_landmarks,
        rounds,
        local_steps,
        rule,
        weights=None,
        aggregator=None,
        noise_multiplier=None,
    ):
        """Everything :meth:`prepare` derives from **public numbers** only — Δ per site, z, σ per site, the
        plan in the ledger — given the site sizes instead of the sites (no clipping; the clipping counts
        stay unknown, ``None``, until a site reports them). Over Flower the server and every site call this
        with the announced sizes and so compute the same σ as ``fed_dl`` in process.

        ``noise_multiplier``: a z already known for this plan (skips the accountant's calibration, which takes
        seconds with the numerical accountants); the ε target is kept."""
        sizes = [int(n) for n in sizes]
        n_clients = len(sizes)
        if n_clients < 1 or min(sizes) < 1:
            raise ConfigError(bad_value("sizes", sizes, "give one positive record count per site"))
        if rule not in ("model", "gradient"):
            raise ConfigError(bad_value("rule", rule, "use 'model' or 'gradient'"))
        P = n_clients
        self._check_secure_sum(rule, local_steps, aggregator)
        self.gamma = float(gamma)
        self.n_landmarks = int(n_landmarks)
        self.rounds, self.local_steps, self.rule, self.n_clients = int(rounds), int(local_steps), rule, P
        self.releases_planned = self.rounds * self.local_steps
        self.clipped_per_site = [None] * P
        self.clipped_records = None
        self.tau_y = self.tau_y_given if self.tau_y_given is not None else default_tau_y(self.tau_x, self.n_landmarks)
        self.upsilon = enforced_upsilon(self.tau_x, self.tau_y)
        q = self.sample_rate
        self.adjacency = "replace" if q == 1.0 else "add_remove"
        self.sizes = list(sizes)
        self.n_norm = [n if q == 1.0 else q * n for n in self.sizes]
        # Δ valid at every Y (y_domain="any"): it does not rely on the caller projecting before each release
        self.sens = [
            gradient_sensitivity(
                n,
                self.n_landmarks,
                self.gamma,
                self.tau_x,
                self.tau_y,
                None,
                rule=self.sensitivity_rule,
                adjacency=self.adjacency,
                y_domain="any",
            )
            for n in self.n_norm
        ]
        self.paper_sens = [
            gradient_sensitivity(
                n, self.n_landmarks, self.gamma, self.tau_x, self.tau_y, self.upsilon, rule="theorem5", y_domain="ball"
            ).value
            for n in self.sizes
        ]
        R = self.releases_planned
        if self.noise_multiplier_given is not None:
            self.z = self.noise_multiplier_given
        elif noise_multiplier is not None:
            self.z = check_noise_multiplier(noise_multiplier)
        else:
            self.z = calibrate_noise_multiplier(self.epsilon_target, self.delta, R, self.accountant, q)
        self._set_sigmas(np.array([s.value for s in self.sens]), P, weights)
        self.plan_epsilon = [self.ledger.set_plan(p, self.z, q, R) for p in range(P)]
        self._prepared = True

    def _check_secure_sum(self, rule, local_steps, aggregator) -> None:
        """Refuse distributed noise where it is unsound (model averaging, a plain sum) and note in ``secure_sum``
        what makes the sum secure."""
        if self.noise == "distributed":
            if rule == "model":
                why = (
                    f"with local_steps={local_steps} each site's hidden local trajectory carries only its noise share"
                    if local_steps > 1
                    else "each site projects its own Y_p onto the τ_Y ball before upload, so the revealed sum is not a "
                    "function of the noisy gradient sum"
                )
                raise ConfigError(
                    bad_value(
                        "noise",
                        "distributed",
                        f"is unsound with model averaging: {why}; "
                        "use rule='gradient' (every noisy step summed, projected by the server) "
                        "or noise='local'",
                    )
                )
            name = aggregator if isinstance(aggregator, str) else getattr(aggregator, "name", None)
            if name == "plain":
                raise ConfigError(
                    bad_value(
                        "aggregation",
                        "plain",
                        "distributed noise needs a secure sum (the server "
                        "would see each site's upload with only its noise share); use 'secagg' or "
                        "'ckks', or noise='local'",
                    )
                )
            self.secure_sum = (
                "asserted by aggregator " + repr(name) if name else "assumed (aggregator not passed to prepare)"
            )
        else:
            self.secure_sum = "not needed (local noise)"

    def _set_sigmas(self, deltas: np.ndarray, P: int, weights) -> None:
        """The noise std per site (``sigma``) from z and the sensitivities ``deltas``: ``z·Δ_p`` with local noise, the
        σ²/t shares with distributed noise (``t`` survivors needed), with ``weights`` each site's share scaled by
        ``1/w_p`` to the largest weighted Δ."""
        if self.noise == "local":
            self.t = None
            self.weights = None
            self.sigma = [self.z * d for d in deltas]
        else:
            t = self.min_survivors_given if self.min_survivors_given is not None else P
            if t > P:
                raise ConfigError(bad_value("min_survivors", t, f"cannot exceed the number of sites ({P})"))
            self.t = t
            if weights is not None:
                w = np.asarray(weights, dtype=float)
                if w.shape != (P,) or np.any(w < 0) or not np.all(np.isfinite(w)) or w.sum() <= 0:
                    raise ConfigError(bad_value("weights", weights, f"give {P} finite non-negative weights"))
                self.weights = w / w.sum()
                M = float(np.max(self.weights * deltas))
                self.sigma = [
                    float(self.z * M / (wp * math.sqrt(t))) if wp > 0 else float(self.z * d / math.sqrt(t))
                    for wp, d in zip(self.weights, deltas)
                ]
            else:
                self.weights = None
                self.sigma = [float(self.z * deltas.max() / math.sqrt(t))] * P

    def _need_prepared(self):
        if not self._prepared:
            raise ConfigError(bad_value("GradientPerturbation", "unprepared", "call prepare(...) first (fed_dl does)"))

    def batch(self, site, round, step, X, rng):
        """The records and normaliser of one release (Qiao et al. Eq. 13 with ``n_norm``).

        Full batch: ``(X, n_p)`` with ``n_p = sizes[site]``, the public announced size (``len(X)`` must equal
        it: σ was calibrated for that count). Poisson subsampling: each record independently with
        probability ``q`` — from the OS source (:func:`~.noise.secure_uniform`), as secret as the noise: the
        amplification by subsampling holds only for a sample nobody can predict; ``rng`` is accepted for the caller
        protocol and never used (seeded only with ``insecure_noise_seed_for_testing``, keyed by the coordinates) — and the fixed
        normaliser ``q·sizes[site]`` — public, hence identical on add/remove neighbours, which is what the
        add/remove Δ assumes (``q·len(X)`` would change with the added record).
        """
        self._need_prepared()
        site = int(site)
        if not (0 <= site < self.n_clients):
            raise ConfigError(bad_value("site", site, f"use 0..{self.n_clients - 1}"))
        n_pub = self.sizes[site]
        if self.sample_rate == 1.0:
            if len(X) != n_pub:
                raise ConfigError(
                    bad_value(
                        "len(X)",
                        len(X),
                        f"site {site} announced {n_pub} records and its noise was "
                        "calibrated for that count; pass the site's announced records",
                    )
                )
            return X, n_pub
        mask = self._noise.uniform((site, int(round), int(step), _SAMPLE_KEY), len(X)) < self.sample_rate
        return X[mask], self.sample_rate * n_pub

    def project(self, Y):
        """Rows onto the ball ``‖y‖ ≤ landmark_radius``, then ``Y`` onto the spectral ball ``‖Y‖₂ ≤ τ_Y``.

        **Callers must apply it after every local and server step** (and a site to the ``Y`` it receives):
        it keeps the landmarks near the data and is the assumption of the paper's Theorem 5 figure. Δ itself
        does not depend on it (it holds at every ``Y``; module docstring). Idempotent on a projected ``Y``;
        the second step never undoes the first."""
        self._need_prepared()
        if self.landmark_radius is not None:
            Y = clip_records(Y, self.landmark_radius)[0]
        return project_spectral(Y, self.tau_y)

    def perturb(self, grad, *, site, round, step):
        """``grad + N(0, σ_p²)``, returned only after the release is in the ledger (write-ahead)."""
        self._need_prepared()
        site, round, step = int(site), int(round), int(step)
        if not (0 <= site < self.n_clients):
            raise ConfigError(bad_value("site", site, f"use 0..{self.n_clients - 1}"))
        g = np.asarray(grad, dtype=np.float64)
        if g.shape[0] != self.n_landmarks or not np.all(np.isfinite(g)):
            raise ConfigError(bad_value("grad", f"array{g.shape}", f"give a finite ({self.n_landmarks}, m) gradient"))
        if not self._plan_rechecked:
            self.check_remaining_plan(round=round, step=step)
        noisy, ev, _ = self._noise.release(
            self.ledger,
            g,
            event=self.release_event(site),
            site=site,
            round=round,
            step=step,
            key=(site, round, step),
            noise=self.noise,
            nominal_noise_multiplier=float(self.z),
            min_survivors=self.t,
            sensitivity_rule=self.sens[site].rule,
            adjacency=self.adjacency,
        )
        self._pending.setdefault((round, step), {})[site] = ev["id"]
        return noisy

    def release_event(self, site: int, count: int = 1) -> ReleaseEvent:
        """The event of one of ``site``'s noisy gradients (Qiao et al. §5.2): Gaussian noise of std σ_p (its share under
        distributed noise) on Δ_p, accounted at the plan's z (under distributed noise the worst case over every
        survivor set of at least t sites), at the Poisson rate q."""
        self._need_prepared()
        return gaussian_release(
            self.mechanism,
            sigma=float(self.sigma[int(site)]),
            sensitivity=float(self.sens[int(site)].value),
            noise_multiplier=float(self.z),
            sample_rate=self.sample_rate,
            count=int(count),
        )

    def remaining_releases(self, round: int, step: int, site: int) -> int:
        """Releases ``site`` will still make from ``(round, step)`` on (this one included), counting a
        coordinate already in the ledger again — with secret noise a redo is a fresh release — except a
        seeded-testing redo with the same seed, which reproduces the logged value and is not counted."""
        self._need_prepared()
        first = int(round) * self.local_steps + int(step)
        n = 0
        for k in range(max(first, 0), self.releases_planned):
            r, t = divmod(k, self.local_steps)
            if not self._noise.secure and any(
                ev.get("noise_source") in (SEEDED_NOISE, "seeded") and ev.get("seed_tag") == self._noise.tag
                for ev in self.ledger.releases_at(int(site), r, t)
            ):
                continue
            n += 1
        return n

    def check_remaining_plan(self, *, round: int, step: int) -> None:
        """Before the first release of this mechanism (e.g. after reopening a ledger to resume): refuse with
        :class:`BudgetExceededError` — before anything is released — when any site's spent ε plus the
        releases the plan still makes from ``(round, step)`` (:meth:`remaining_releases`) would exceed its
        budget (:meth:`PrivacyLedger.check_plan`). :meth:`perturb` calls it once, on its first release."""
        self._need_prepared()
        for p in range(self.n_clients):
            self.ledger.check_plan(p, self.z, self.sample_rate, self.remaining_releases(round, step, p))
        self._plan_rechecked = True

    def gradient_norm_bound(self, site: int) -> float:
        """A public bound on ``‖mmd_grad(Xb, Y, γ, n_norm)‖_F`` at any ``Y`` (Qiao et al. Eq. 13).

        Every row of the data term is a sum of ``n_b`` vectors ``φ(x − y)`` of norm ``≤ h(∞) = e^{−1/2}/√(2γ)``
        and every row of the repulsion term a sum of ``n_y − 1`` such vectors, so
        ``‖∇‖_F ≤ 4γ h(∞)/√n_y · (n_b/n_norm + 1)``. Full batch: ``n_b = n_norm``. Subsampled: ``n_b`` is
        random; the bound takes ``n_b ≤ n_norm (1 + 4√((1 − q)/(q n_p)))`` (4 standard deviations) — a rarer
        larger batch is clipped, which costs accuracy, never privacy (clipping is 1-Lipschitz).
        """
        from .sensitivity import kernel_shape_peak

        self._need_prepared()
        h = kernel_shape_peak(self.gamma)
        q, n = self.sample_rate, self.sizes[int(site)]
        ratio = 1.0 if q == 1.0 else 1.0 + 4.0 * math.sqrt((1.0 - q) / (q * n))
        return 4.0 * self.gamma * h / math.sqrt(self.n_landmarks) * (ratio + 1.0)

    def distributed_mechanism(
        self,
        kind: str = "ddg",
        *,
        n_features: int,
        rotation_seed: str,
        weights=None,
        clip=None,
        epsilon=None,
        **options,
    ):
        """The integer distributed-noise mechanism for this run's landmark gradients (:mod:`securefed.accounting.distributed`).

        Each site ``p`` sends ``w_p · g_p`` (its batched gradient times its aggregation weight, default 1) through
        ``encode``; the server ``decode``-s the secure sum, which is ``Σ_p w_p g_p`` plus integer noise, and takes
        the server step with it. Public numbers only: record sensitivity ``max_p w_p Δ_p`` (this mechanism's Δ,
        valid at any ``Y``), clip ``max_p w_p · gradient_norm_bound(p)``, ``dim = n_landmarks · n_features``,
        ``releases = rounds · local_steps``, the sites and the secure sum's threshold ``min_survivors``, and
        this mechanism's ε target and δ. Needs ``rule="gradient"`` (model averaging would release each site's
        hidden trajectory) and an ε target.

        Parameters
        ----------
        kind : {"ddg", "skellam"}
        n_features : int
        rotation_seed : str
            Public, shared by all sites (e.g. the run id).
        weights : sequence of float, optional
            The aggregation weights ``w_p`` the sites apply before encoding (default: all 1).
        clip : float, optional
            Override the public clip norm (default from :meth:`gradient_norm_bound`).
        epsilon : float, optional
            Override the ε target (default: this mechanism's), e.g. a little below it so that the ledger's
            dominating Gaussian bound also fits the budget (:func:`securefed.federation.privacy.integer_mechanism`).
        **options
            Passed on (``granularity``, ``rounding_slack``, ``wrap_probability``, ``max_bits``).

        Returns
        -------
        DistributedDiscreteGaussian or DistributedSkellam
        """
        from .distributed import DistributedDiscreteGaussian, DistributedSkellam

        self._need_prepared()
        if kind not in ("ddg", "skellam"):
            raise ConfigError(bad_value("kind", kind, "use 'ddg' (distributed discrete Gaussian) or 'skellam'"))
        if self.rule != "gradient":
            raise ConfigError(
                bad_value(
                    "rule",
                    self.rule,
                    "integer distributed noise needs rule='gradient' (every noisy step "
                    "is summed and the server steps); with model averaging each site's hidden local "
                    "trajectory carries only its noise share",
                )
            )
        if self.epsilon_target is None:
            raise ConfigError(
                bad_value(
                    "epsilon",
                    None,
                    "the integer mechanisms calibrate their own noise: build "
                    "GradientPerturbation with a target epsilon",
                )
            )
        P = self.n_clients
        w = np.ones(P) if weights is None else np.asarray(weights, dtype=float)
        if w.shape != (P,) or not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise ConfigError(bad_value("weights", weights, f"give {P} positive finite weights"))
        sens = float(max(w[p] * self.sens[p].value for p in range(P)))
        c = float(max(w[p] * self.gradient_norm_bound(p) for p in range(P))) if clip is None else clip
        cls = DistributedDiscreteGaussian if kind == "ddg" else DistributedSkellam
        t = self.min_survivors_given if self.min_survivors_given is not None else P
        return cls(
            dim=self.n_landmarks * int(n_features),
            n_sites=P,
            min_survivors=t,
            rotation_seed=rotation_seed,
            epsilon=self.epsilon_target if epsilon is None else epsilon,
            delta=self.delta,
            releases=self.releases_planned,
            l2_sensitivity=sens,
            clip=c,
            adjacency="record",
            **options,
        )

    def _mu_sum(self, site: int, survivors) -> float:
        """μ of ``site``'s record in the revealed sum of the survivors' noisy uploads."""
        deltas = np.array([s.value for s in self.sens])
        sig = np.array(self.sigma)
        K = np.array(sorted(int(k) for k in survivors))
        weightings = (
            [self.weights] if self.weights is not None else [np.ones(self.n_clients), np.array(self.n_norm, float)]
        )
        mus = []
        for w in weightings:
            w = w / w.sum()
            var = float(np.sum((w[K] * sig[K]) ** 2))
            mus.append(w[site] * deltas[site] / math.sqrt(var))
        return max(mus)

    def settle(self, *, round, step, survivors, release_ids) -> None:
        """Settle one aggregation whose releases were made elsewhere (each site's own mechanism, over Flower):
        register ``release_ids = {site: ledger release id}`` as that aggregation's releases, then
        :meth:`after_aggregate` with the actual survivors — the same settlement ``fed_dl`` makes in process."""
        self._need_prepared()
        self._pending[(int(round), int(step))] = {int(p): str(r) for p, r in dict(release_ids).items()}
        self.after_aggregate(round=int(round), step=int(step), survivors=[int(k) for k in survivors])

    def after_aggregate(self, *, round, step, survivors):
        """Settle distributed-noise releases with the actual survivors (server-side accounting)."""
        self._need_prepared()
        pend = self._pending.pop((int(round), int(step)), {})
        if self.rule == "model":
            for key in [k for k in self._pending if k[0] == int(round)]:
                self._pending.pop(key)
        if self.noise == "local" or not pend:
            return
        surv = [int(s) for s in survivors]
        if not surv:
            return
        settled = {rid: 1.0 / self._mu_sum(p, surv) for p, rid in pend.items() if p in surv}
        if settled:
            self.ledger.record_settlement(round=int(round), step=int(step), survivors=surv, releases=settled)

    def report(self) -> dict:
        """The ``metrics.json`` ``"privacy"`` block.

        Keys of note: ``epsilon`` (the ledger's ε with the run's accountant — an upper bound),
        ``epsilon_void`` / ``epsilon_void_reason`` (seeded noise: the ε means nothing),
        ``epsilon_paper_formula`` (Qiao et al. Theorem 5's formula at this noise multiplier and release
        count — a formula, not a bound), ``paper_formula_below_true_epsilon`` (True where that formula is
        below ``epsilon``), ``epsilon_paper_recipe`` (the same formula at the paper's own Theorem 5 Δ),
        ``sensitivity_domain`` (Δ holds at any ``Y``) and ``normaliser`` (announced site sizes).
        """
        self._need_prepared()
        eps, delta = self.ledger.spent()
        releases = max(
            (
                sum(1 for e in self.ledger.events("release") if e["site"] == p and e["mechanism"] == self.mechanism)
                for p in range(self.n_clients)
            ),
            default=0,
        )
        R = max(releases, 1)
        worst = int(np.argmax([s.value for s in self.sens]))
        sigma_sum = self.z * max(s.value for s in self.sens)
        paper_formula = paper_epsilon(self.z, R, self.delta)
        return {
            "epsilon": eps,
            "delta": delta,
            "accountant": self.accountant,
            "epsilon_target": self.epsilon_target,
            "epsilon_void": self.epsilon_void,
            "epsilon_void_reason": VOID_REASON if self.epsilon_void else None,
            "epsilon_paper_formula": paper_formula,
            "paper_formula_below_true_epsilon": bool(paper_formula < eps),
            "epsilon_paper_recipe": paper_epsilon(sigma_sum / max(self.paper_sens), R, self.delta),
            "noise_multiplier": self.z,
            "sensitivity": self.sens[worst].value,
            "sensitivity_rule": self.sens[worst].rule,
            "sensitivity_per_site": [s.value for s in self.sens],
            "sensitivity_bounds": {
                k: v for k, v in asdict(self.sens[worst]).items() if k in ("theorem5", "kernel_shape", "lipschitz")
            },
            "sensitivity_domain": "any Y (valid whether or not the landmarks were projected)",
            "normaliser": ("announced site size" if self.sample_rate == 1.0 else "sample_rate × announced site size"),
            "adjacency": self.adjacency,
            "sigma_per_site": list(map(float, self.sigma)),
            "releases": releases,
            "releases_planned": self.releases_planned,
            "clipped_records": self.clipped_records,
            "clipped_per_site": list(self.clipped_per_site),
            "tau_x": self.tau_x,
            "tau_y": self.tau_y,
            "upsilon": self.upsilon,
            "landmark_radius": self.landmark_radius,
            "gamma": self.gamma,
            "sample_rate": self.sample_rate,
            "noise": self.noise,
            "min_survivors": self.t,
            "secure_sum": self.secure_sum,
            "noise_source": (
                "secure (ChaCha20 / os.urandom, Box-Muller; float caveat)"
                if self._noise.secure
                else f"{SEEDED_NOISE} (insecure_noise_seed_for_testing: anyone who knows the seed can subtract it)"
            ),
            "epsilon_by_round": [[r, e] for r, e in self.ledger.epsilon_by_round()],
            "epsilon_per_site": self.ledger.summary()["epsilon_per_site"],
            "budget_epsilon": self.ledger.budget_epsilon,
            "ledger": self.ledger.path,
            "ledger_recovered": self.ledger.recovered or None,
        }


# ----------------------------------------------------------------------------------------------
# data perturbation (Sec. 5.1, corrected Theorem 3)
# ----------------------------------------------------------------------------------------------


def classical_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Corrected Theorem 3 of Qiao et al. (Dwork & Roth 2014, Thm A.1): ``σ = cΔ/ε`` with
    ``c² > 2 ln(1.25/δ)`` (c is taken one ulp above the root); valid only for ``ε < 1``."""
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    if epsilon >= 1.0:
        raise ConfigError(
            bad_value(
                "epsilon",
                epsilon,
                "the classical Gaussian mechanism (Theorem 3) needs epsilon < 1; "
                "use method='analytic' (Balle & Wang 2018)",
            )
        )
    c = np.nextafter(math.sqrt(2.0 * math.log(1.25 / delta)), math.inf)
    return float(c * sensitivity / epsilon)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Analytic Gaussian mechanism (Balle & Wang 2018, Thm 8): the smallest σ with
    ``Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ) ≤ δ`` — i.e. ``σ = Δ/μ(ε, δ)`` in μ-GDP terms. Valid for all ε."""
    return float(sensitivity / gdp_mu(check_epsilon(epsilon), check_delta(delta)))


def data_perturbation_sigma(epsilon, delta, tau_x, method: str = "auto") -> tuple[float, str]:
    """σ for releasing clipped records plus Gaussian noise (Qiao et al. §5.1), sensitivity ``2τ_X``.

    ``method="theorem3"``: corrected Theorem 3 (``σ ≥ 2cτ_X/ε``, ``c² > 2 ln(1.25/δ)``, ε < 1).
    ``"analytic"``: analytic Gaussian mechanism (tighter, any ε). ``"auto"``: Theorem 3 for ε < 1
    (the paper's mechanism), analytic for ε ≥ 1 where Theorem 3 does not apply.
    """
    sens = data_sensitivity(tau_x)
    epsilon = check_epsilon(epsilon)
    if method not in ("auto", "theorem3", "analytic"):
        raise ConfigError(bad_value("method", method, "use 'auto', 'theorem3' or 'analytic'"))
    if method == "auto":
        method = "theorem3" if epsilon < 1.0 else "analytic"
    if method == "theorem3":
        return classical_gaussian_sigma(epsilon, delta, sens), method
    return analytic_gaussian_sigma(epsilon, delta, sens), method


@dataclass(frozen=True)
class DataPerturbationEvent:
    """What one data-perturbation release cost (also written to the ledger when one is given)."""

    site: int
    epsilon: float
    delta: float
    sigma: float
    sensitivity: float
    noise_multiplier: float
    method: str
    n_records: int
    n_clipped: int
    sigma_theorem3: float | None
    sigma_analytic: float
    noise_source: str
    ledger_id: str | None
    epsilon_void: bool = False


def data_perturbation_event(sigma: float, sensitivity: float) -> ReleaseEvent:
    """The event of one site's perturbed rows (Qiao et al. §5.1): one Gaussian release of every record, std σ per
    coordinate, sensitivity ``2τ_X`` (replace-one)."""
    return gaussian_release("gaussian-data", sigma=sigma, sensitivity=sensitivity)


def perturb_data(
    X,
    epsilon,
    delta,
    tau_x,
    *,
    method="auto",
    ledger=None,
    site: int = 0,
    insecure_noise_seed_for_testing=None,
    secure_mode=None,
):
    """Clip records to ``τ_X`` and add ``N(0, σ²)`` to every coordinate (Qiao et al. §5.1, Theorem 3).

    Each record appears in one row, so releasing all rows is one Gaussian mechanism per record with
    ℓ₂ sensitivity ``2τ_X`` (replace-one). Anything computed from the noisy rows — FedDL on them, or the
    Nyström rows ``D(X̃_p, Y)`` / ``K(X̃_p, Y)`` — is post-processing and costs nothing more.

    The noise is secret (CSPRNG) unless ``insecure_noise_seed_for_testing=<int>`` is given (tests only;
    the event then has ``epsilon_void=True`` and the ledger ``noise_source: "seeded-testing"``).

    Returns
    -------
    (X_noisy, DataPerturbationEvent)
    """
    sigma, used = data_perturbation_sigma(epsilon, delta, tau_x, method)
    Xc, nc = clip_records(X, tau_x)
    sens = data_sensitivity(tau_x)
    sig_a = analytic_gaussian_sigma(epsilon, delta, sens)
    sig_c = classical_gaussian_sigma(epsilon, delta, sens) if float(epsilon) < 1.0 else None
    _check_legacy_secure_mode(secure_mode)
    src = _NoiseSource(insecure_noise_seed_for_testing)
    led = (
        ledger if ledger is not None else PrivacyLedger(None, f"mem-{uuid.uuid4().hex[:12]}", delta=check_delta(delta))
    )
    release = data_perturbation_event(float(sigma), float(sens))
    noisy, ev, _ = src.release(
        led,
        Xc,
        event=release,
        site=int(site),
        round=_DATA_ROUND,
        step=None,
        key=(int(site), _DATA_KEY, 0),
        method=used,
        n_records=int(len(Xc)),
        epsilon_requested=float(epsilon),
    )
    event = DataPerturbationEvent(
        site=int(site),
        epsilon=float(epsilon),
        delta=float(delta),
        sigma=float(sigma),
        sensitivity=float(sens),
        noise_multiplier=float(sigma / sens),
        method=used,
        n_records=int(len(Xc)),
        n_clipped=nc,
        sigma_theorem3=sig_c,
        sigma_analytic=sig_a,
        noise_source=src.name,
        ledger_id=ev["id"] if ledger is not None else None,
        epsilon_void=not src.secure,
    )
    return noisy, event


class DataPerturbation:
    """Sec. 5.1 data perturbation of the rows a site sends for the Nyström stage (``rows_privacy=``).

    Each site clips its records to ``τ_X`` and adds ``N(0, σ²)`` per coordinate
    (:func:`perturb_data`, corrected Theorem 3 / analytic Gaussian mechanism); the rows
    ``D(X̃_p, Y)`` or ``K(X̃_p, Y)`` computed from them are post-processing. With a shared ledger the
    release composes with the site's landmark releases (size the budget for both).

    Parameters
    ----------
    epsilon, delta : float
        (ε, δ) of the one-shot release of each record.
    tau_x : float
        Public clip norm.
    method : {"auto", "theorem3", "analytic"}
        See :func:`data_perturbation_sigma`.
    ledger : PrivacyLedger, optional
    insecure_noise_seed_for_testing : int, optional
        Reproducible noise for tests (site ``p`` uses the seed plus its index as a key); the report then
        says ``"epsilon_void": True``. Default: secret CSPRNG noise.
    secure_mode : None or True
        Removed (secure is the default); ``False`` is refused with the fix.
    random_state : ignored
        Accepted for old callers; it never seeds noise any more.
    """

    def __init__(
        self,
        epsilon,
        delta=1e-5,
        tau_x=None,
        method="auto",
        secure_mode=None,
        ledger=None,
        random_state=None,
        *,
        insecure_noise_seed_for_testing=None,
    ):
        _check_legacy_secure_mode(secure_mode)
        self.epsilon = check_epsilon(epsilon)
        self.delta = check_delta(delta)
        if tau_x is None:
            raise ConfigError(
                bad_value(
                    "tau_x", None, "give a public clip norm for the records (see securefed.accounting.default_tau_x)"
                )
            )
        self.tau_x = check_bound("tau_x", tau_x)
        self.sigma, self.method = data_perturbation_sigma(self.epsilon, self.delta, self.tau_x, method)
        self.insecure_seed = _check_testing_seed(insecure_noise_seed_for_testing)
        self.secure_mode = self.insecure_seed is None
        if ledger is not None and not isinstance(ledger, PrivacyLedger):
            raise ConfigError(bad_value("ledger", type(ledger).__name__, "pass a PrivacyLedger or None"))
        self.ledger = ledger
        self.events: list[DataPerturbationEvent] = []

    def perturb_site(self, X, *, site, rng=None):
        """Return site ``site``'s clipped records plus Gaussian noise (ledger event written first).

        ``rng`` is accepted for the caller protocol and never used: the noise is secret (CSPRNG) unless the
        object was built with ``insecure_noise_seed_for_testing``."""
        Xn, ev = perturb_data(
            X,
            self.epsilon,
            self.delta,
            self.tau_x,
            method=self.method,
            ledger=self.ledger,
            site=int(site),
            insecure_noise_seed_for_testing=self.insecure_seed,
        )
        self.events.append(ev)
        return Xn

    def report(self) -> dict:
        """The report block of the rows' data perturbation."""
        out = {
            "mechanism": "gaussian-data (Qiao et al. Sec. 5.1, corrected Theorem 3)",
            "epsilon": self.epsilon,
            "delta": self.delta,
            "method": self.method,
            "sigma": self.sigma,
            "sensitivity": data_sensitivity(self.tau_x),
            "tau_x": self.tau_x,
            "sites": len(self.events),
            "clipped_records": int(sum(e.n_clipped for e in self.events)),
            "noise_source": SECURE_NOISE if self.secure_mode else SEEDED_NOISE,
            "epsilon_void": not self.secure_mode,
            "epsilon_void_reason": None if self.secure_mode else VOID_REASON,
        }
        if self.ledger is not None:
            out["epsilon_total_with_ledger"] = self.ledger.spent()[0]
        return out
