"""FedDL with distributed integer noise (issue 14): the distributed discrete Gaussian (Kairouz, Liu & Steinke 2021)
and the distributed Skellam (Agarwal, Kairouz & Liu 2021) through an exact SecAgg+ sum mod 2^k, in process.

What is checked: the run completes; every decoded sum is the sum of the sites' clipped weighted gradients up to
the rounding and the (tiny, seeded) noise; the released ε is the paper's bound recomputed here from the public
numbers; no reply carries a clip count; a site refuses a plan or a round that would give it less noise or fewer
bits than its own computation; the plan validates the option.
"""

import json
import math
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from securefed.federation.messages import request_digest
from securefed.federation.wire import put_array
from securefed.accounting.distributed import (
    _DistributedInteger,
    ddg_epsilon,
    integer_sensitivity,
    padded_dimension,
    skellam_epsilon,
)
from securefed.errors import ConfigError, ProtocolError
from securefed.federation import Coordinator, InMemoryExchange, SiteWorker, drive
from securefed.federation.privacy import ServerPrivacy, open_server_ledger, site_integer_release
from securefed.plan import RunPlan, to_run_config

N_SITES, N_REC, N_Y, M = 3, 60, 8, 3


@pytest.fixture(scope="module")
def sites():
    rng = np.random.default_rng(11)
    return [rng.normal(size=(N_REC, M)) * 0.4 + 0.3 * i for i in range(N_SITES)]


def _plan(kind, **kw):
    base = dict(
        method="none",
        landmark_method="feddl",
        landmarks=N_Y,
        rounds=2,
        local_steps=1,
        rule="gradient",
        aggregation="secagg",
        value_bound=3.0,
        min_sites=N_SITES,
        seed=3,
        audit_holdout=0.0,
        epsilon=2.0,
        clip_norm=2.0,
        noise="distributed",
        distributed_mechanism=kind,
        run_id=f"int-{kind}",
    )
    base.update(kw)
    return RunPlan.build("api", **base)


def _options(budget=5.0, seeded=True):
    return {
        "epsilon-budget": budget,
        "ledger-path": ":memory:",
        "allow-seeded-noise": seeded,
        "allow-distributed-noise": True,
    }


def _workers(sites, **opt):
    return {1000 + i: SiteWorker({"site-name": f"s{i}", **_options(**opt)}, X) for i, X in enumerate(sites)}


def _run(plan, sites, ex=None, **kw):
    ex = ex or InMemoryExchange(_workers(sites), **kw)
    co = Coordinator(plan, ledger=open_server_ledger(plan, plan.run_id, None))
    return drive(co, ex), co


@pytest.fixture
def recorder(monkeypatch):
    """Record what every encoder saw (the site's weighted gradient) and what every decoder returned."""
    seen = {"encode": [], "decode": []}
    enc, dec = _DistributedInteger.encode, _DistributedInteger.decode

    def encode(self, x, *, round, step, src=None):
        seen["encode"].append((round, step, np.array(x, dtype=float), self.clip))
        return enc(self, x, round=round, step=step, src=src)

    def decode(self, total, *, round, step, shape=None):
        out = dec(self, total, round=round, step=step, shape=shape)
        seen["decode"].append((round, step, np.array(out, dtype=float).ravel()))
        return out

    monkeypatch.setattr(_DistributedInteger, "encode", encode)
    monkeypatch.setattr(_DistributedInteger, "decode", decode)
    return seen


@pytest.mark.parametrize("kind", ["ddg", "skellam"])
def test_integer_run_decodes_the_sum_of_clipped_gradients(sites, recorder, kind):
    """Huge ε (tiny noise) and seeded noise: each decoded sum equals Σ_p clip(w_p ∇f_p) within the rounding and
    noise scale; nothing else (e.g. a wrong rotation, a lost site or a wrapped word) would be that close."""
    replies = []
    ex = InMemoryExchange(_workers(sites, budget=500.0), after_reply=lambda a, f, r: replies.append(r))
    res, co = _run(_plan(kind, epsilon=500.0, noise_seed_for_testing=7), sites, ex)
    assert res.survivors == [0, 1, 2] and not res.site_errors
    assert len(recorder["decode"]) == 2 and len(recorder["encode"]) == 2 * N_SITES
    mech = co.privacy.integer
    per_coord = mech.granularity * math.sqrt(
        N_SITES * (1.0 + 2.0 * float(getattr(mech, "sigma2", 0.0)) + 2.0 * getattr(mech, "lam", 0.0))
    )
    for rnd, step, out in recorder["decode"]:
        xs = [x * min(1.0, c / np.linalg.norm(x)) for r, s, x, c in recorder["encode"] if (r, s) == (rnd, step)]
        assert len(xs) == N_SITES
        want = np.sum(xs, axis=0)
        err = np.linalg.norm(out - want)
        assert err <= 8.0 * per_coord * math.sqrt(mech.padded_dim)  # rounding + noise, 8 standard deviations
        assert err <= 0.02 * np.linalg.norm(want)
    # no clip count in the clear: the integer rounds carry none, in any reply
    assert replies and not any("secagg_clipped" in r for r in replies)
    assert all(st["clipped"] == 0 for st in res.steps)
    assert res.privacy["epsilon_void"] is True  # seeded noise


@pytest.mark.parametrize("kind", ["ddg", "skellam"])
def test_released_epsilon_is_the_papers_bound_recomputed(sites, kind):
    res, co = _run(_plan(kind, epsilon=2.0), sites, InMemoryExchange(_workers(sites, seeded=False), fresh_process=True))
    priv = res.privacy
    sizes = np.array(res.site_sizes, dtype=float)
    w = sizes / sizes.sum()
    delta_int_input = float(max(w[p] * priv["sensitivity_per_site"][p] for p in range(N_SITES)))
    d = padded_dimension(N_Y * M)
    g = priv["integer"]["granularity"]
    l2, l1 = integer_sensitivity(dim=d, granularity=g, adjacency="record", l2_sensitivity=delta_int_input)
    assert l2 == pytest.approx(delta_int_input / g + math.sqrt(d), rel=1e-12)  # Δ/γ + √d' (module docstring)
    R = priv["releases"]
    assert R == 2
    if kind == "ddg":
        want = ddg_epsilon(
            l2=l2,
            l1=l1,
            sigma2=float(Fraction(priv["integer"]["sigma2_site_integer"])),
            n_sites=N_SITES,
            min_survivors=N_SITES,
            dim=d,
            releases=R,
            delta=1e-5,
        )
    else:
        want = skellam_epsilon(
            l2=l2, l1=l1, lam=priv["integer"]["lambda_site_integer"], min_survivors=N_SITES, releases=R, delta=1e-5
        )
    assert priv["epsilon"] == pytest.approx(want, rel=1e-9)
    assert 0.9 * 2.0 < priv["epsilon"] <= 2.0
    assert priv["epsilon_ledger"] <= 2.0 * (1 + 1e-9)  # the ledger's dominating bound fits the budget too
    assert priv["wrap_probability"] <= 2.0**-40 and priv["modulus_bits"] == priv["integer"]["modulus_bits"]
    assert priv["epsilon_void"] is False and priv["noise_source"].startswith("secure")
    assert priv["mechanism"] == ("distributed-discrete-gaussian" if kind == "ddg" else "distributed-skellam")
    # every site's ledger booked an rdp release per aggregation with the mechanism's modulus
    events = co.privacy.ledger.events("release")
    assert len(events) == N_SITES * R and {e["modulus_bits"] for e in events} == {priv["modulus_bits"]}


def _lying_exchange(sites, change):
    def lie(a, f):  # the coordinator lies to s0 and signs its lie in the round spec (else the digest check bites first)
        if "dp" in f and a == 1000:
            plan = json.loads(f["dp"])
            change(plan)
            f["dp"] = json.dumps(plan)
        return f

    return InMemoryExchange(_workers(sites), before_request=lie, sign_lies=True)


@pytest.mark.parametrize(
    "lie,why",
    [
        ("noise", "own calibration"),
        ("bits", "wrap-around"),
        ("granularity", "granularity"),
        ("weight", "weighs this site"),
    ],
)
def test_site_refuses_a_plan_with_less_noise_or_fewer_bits(sites, lie, why):
    def change(plan):
        c = plan["integer_claim"]
        if lie == "noise":
            c["noise"] = str(float(Fraction(c["noise"])) * 0.5)
        elif lie == "bits":
            c["modulus_bits"] -= 1
        elif lie == "granularity":
            c["granularity"] *= 2
        else:
            plan["weights"][0] *= 3

    plan = _plan("ddg", noise_seed_for_testing=1)
    co = Coordinator(plan, ledger=open_server_ledger(plan, plan.run_id, None))
    with pytest.raises(ProtocolError):  # t = all 3 sites: the round cannot complete without s0
        drive(co, _lying_exchange(sites, change))
    assert co.sites.silent[0].startswith("ProtocolError") and "refusing" in co.sites.silent[0]
    assert why in co.sites.silent[0]
    assert "ProtocolError" not in co.sites.silent.get(1, "") + co.sites.silent.get(2, "")
    assert all(e["site"] != 0 for e in co.privacy.ledger.events("release"))  # s0 released nothing


def test_site_refuses_a_secagg_round_below_its_modulus_or_without_integer_input():
    plan = _plan("ddg", noise_seed_for_testing=1)
    sp = ServerPrivacy(plan, plan.run_id, [N_REC] * N_SITES, [1 / N_SITES] * N_SITES, 0.25, n_features=M)
    mech, gp = sp.integer, sp.gp
    wire = json.loads(sp.wire_plan())
    g = np.zeros((N_Y, M))

    def spec(bits, integer=True, length=mech.padded_dim):
        return SimpleNamespace(integer=integer, fixed_point=SimpleNamespace(modulus_bits=bits), length=length)

    for bad, match in (
        (spec(mech.modulus_bits - 1), "below"),
        (spec(32, integer=False), "integer input"),
        (spec(32, length=mech.padded_dim + 1), "words"),
    ):
        with pytest.raises(ProtocolError, match=match):
            site_integer_release(gp, mech, wire, g, site=0, rnd=0, step=0, spec=bad)
    assert gp.ledger.events("release") == []
    words = site_integer_release(gp, mech, wire, g, site=0, rnd=0, step=0, spec=spec(max(16, mech.modulus_bits)))
    assert words.dtype == np.uint64 and words.shape == (mech.padded_dim,) and int(words.max()) < 2**mech.modulus_bits
    assert len(gp.ledger.events("release")) == 1


def test_plan_validation_of_the_distributed_mechanism():
    common = dict(
        landmark_method="feddl", epsilon=1.0, clip_norm=2.0, noise="distributed", rule="gradient", value_bound=3.0
    )
    p = RunPlan.build("api", **common)
    assert p.distributed_mechanism == "ddg" and p.aggregation == "secagg" and p.accountant == "rdp"
    assert RunPlan.build("api", **dict(common, aggregation="ckks")).distributed_mechanism == "gaussian"
    assert RunPlan.build("api", **dict(common, distributed_mechanism="gaussian")).accountant == "exact"
    assert RunPlan.build("api").distributed_mechanism == "auto"
    bad = [
        (dict(aggregation="ckks", distributed_mechanism="ddg"), "--aggregation='ckks'.*secagg"),
        (dict(distributed_mechanism="skellam", accountant="prv"), "--accountant='prv'.*rdp"),
        (dict(distributed_mechanism="ddg", epsilon=None, noise_multiplier=2.0), "--epsilon=None"),
        (dict(distributed_mechanism="ddg", rule="model"), "--noise='distributed'|--rule='model'"),
        (dict(distributed_mechanism="ddg", noise="local"), "--distributed-mechanism='ddg'.*applies"),
        (dict(distributed_mechanism="ddg", monitor=True), "monitor"),
        (dict(distributed_mechanism="gauss"), "--distributed-mechanism='gauss'.*auto, gaussian, ddg, skellam"),
    ]
    for extra, match in bad:
        with pytest.raises(ConfigError, match=match):
            RunPlan.build("cli", **dict(common, **extra))
    assert to_run_config(p)["distributed-mechanism"] == "ddg"


def test_cli_offers_the_flag():
    import argparse

    from securefed.cli.run import register

    sub = argparse.ArgumentParser().add_subparsers()
    parser = register(sub)
    ns = parser.parse_args(["--distributed-mechanism", "skellam"])
    assert ns.distributed_mechanism == "skellam"
    assert parser.parse_args([]).distributed_mechanism == "auto"


@pytest.mark.parametrize("kind,integer", [("ddg", False), ("gaussian", True)])
def test_site_refuses_a_round_whose_input_kind_does_not_match_its_plan(sites, kind, integer):
    """An integer plan goes only into an integer SecAgg+ round and a real-valued one only into the fixed-point
    codec: the site refuses the mismatch before computing or booking anything."""
    import os

    from securefed.securesum import crypto
    from securefed.securesum.quantize import integer_plan, plan_fixed_point
    from securefed.securesum.secagg import DEFAULT_TIMEOUTS, RoundSpec, encode_spec

    plan = _plan(kind, noise_seed_for_testing=1)
    sp = ServerPrivacy(plan, plan.run_id, [N_REC] * N_SITES, [1 / N_SITES] * N_SITES, 0.25, n_features=M)
    fp = integer_plan(32, N_SITES) if integer else plan_fixed_point(1.0, np.ones(N_SITES), modulus_bits=32)
    sid = os.urandom(16)
    keys = tuple(crypto.ed25519_public_bytes(crypto.ed25519_keypair()[0]) for _ in range(N_SITES))
    fields = put_array(
        {
            "op": "secagg-start",
            "site": 0,
            "dp": sp.wire_plan(),
            "task": "gradient",
            "weights": "records",
            "gamma": 0.25,
        },
        "Y",
        np.zeros((N_Y, M)),
    )
    spec = RoundSpec(
        sid,
        0,
        N_SITES,
        N_SITES - 1,
        2,
        sid,
        N_Y * M,
        fp,
        keys,
        tuple(DEFAULT_TIMEOUTS.items()),
        0,
        integer,
        request_digest(fields),
    )
    worker = SiteWorker({"site-name": "s0", **_options()}, sites[0])
    rep = worker.handle(dict(fields, spec=encode_spec(spec)))
    assert rep["error"].startswith("ProtocolError") and "refusing" in rep["error"]
    assert "the request's upload is" in rep["error"], rep["error"]


def test_a_gradient_perturbation_object_keeps_its_gaussian_shares():
    """The estimators and fed_dl pass a GradientPerturbation (the Gaussian mechanism, with the caller's ledger and
    accountant): its distributed noise stays the continuous shares."""
    from securefed.accounting import GradientPerturbation
    from securefed.estimators import privacy_options

    gp = GradientPerturbation(epsilon=1.0, noise="distributed", tau_x=2.0)
    opts = privacy_options(gp)
    assert opts["distributed_mechanism"] == "gaussian"
    plan = RunPlan.build("api", landmark_method="feddl", rule="gradient", value_bound=3.0, **opts)
    assert plan.distributed_mechanism == "gaussian" and plan.accountant == "exact"
    assert "distributed_mechanism" not in privacy_options(GradientPerturbation(epsilon=1.0, tau_x=2.0))
