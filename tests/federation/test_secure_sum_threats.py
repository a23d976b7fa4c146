"""Issue 13 through the sites (SiteWorker) and the coordinator's relay, against a malicious coordinator.

* attack 2 inverted — server-chosen weights: a request carrying ``weight`` (0 for every site but a victim, so
  that the "sum" is the victim's update) is refused by every site; without it each site weighs itself and the
  sum is the rule-weighted one;
* the threat model enforced on the sites: a SecAgg+ spec that could expose a site (t = 1 or 2, the old
  semi-honest defaults, a sparse graph for few sites, a quorum below (n + c)/2, …) is refused before anything
  is computed, naming the site option and the fix; the default parameters pass for every n;
* the relay checks sender identities: a message whose sender field names another site is dropped.
"""

import dataclasses
import json
import os

import numpy as np
import pytest

from securefed.errors import ConfigError
from securefed.federation import Coordinator, InMemoryExchange, SiteWorker
from securefed.federation.coordinator import Sites
from securefed.federation.site import as_task, compute_upload
from securefed.federation.sums import secure_sum
from securefed.federation.messages import request_digest
from securefed.federation.wire import put_array
from securefed.plan import RunPlan
from securefed.securesum.graph import choose_parameters
from securefed.securesum.messages import MaskedInput, decode, encode, peek_header
from securefed.securesum.quantize import dequantize, plan_fixed_point
from securefed.securesum.secagg import DEFAULT_TIMEOUTS, RoundSpec, encode_spec
from securefed.securesum.secagg_server import SecAggServer

TASK = {"task": "stats", "want": ["moments"], "scale": 4.0}


def _sites(n, seed=3):
    rng = np.random.default_rng(seed)
    arrays = [rng.normal(size=(20 + 3 * i, 2)) * 0.5 + 0.2 * i for i in range(n)]
    workers = [SiteWorker({"site-name": f"h{i}", "allow-paper-mode": True}, X) for i, X in enumerate(arrays)]
    keys = tuple(w.handle({"op": "hello"})["identity"] for w in workers)
    return arrays, workers, keys


def _spec(n, keys, k=None, t=None, q=None, weights=None, clip=8.0, d=4, rule="uniform", fields=None):
    """A round spec the (test) server announces, bound to the request every site receives (its task digest)."""
    gp = choose_parameters(n)
    sid = os.urandom(16)
    fp = plan_fixed_point(clip, np.ones(n) if weights is None else weights, modulus_bits=64)
    digest = request_digest(
        fields if fields is not None else dict(TASK, op="secagg-start", site=0, seed=0, weights=rule)
    )
    return RoundSpec(
        sid,
        0,
        n,
        gp.degree if k is None else k,
        gp.threshold if t is None else t,
        sid,
        d,
        fp,
        keys,
        tuple(DEFAULT_TIMEOUTS.items()),
        gp.quorum if q is None else q,
        False,
        digest,
    )


def _start(spec, i, rule="uniform", **extra):
    return dict(TASK, op="secagg-start", site=i, seed=0, spec=encode_spec(spec), weights=rule, **extra)


def _clients(worker):
    """The SecAgg+ client machines a site keeps (by round)."""
    return [k for k in worker.state if k.startswith("secagg/") and k.endswith("/client")]


def _drive(workers, spec, fields):
    """A coordinator that relays honestly, given the secagg-start fields it chose for each site."""
    server = SecAggServer(spec)
    out, errors = [], {}
    for i, w in enumerate(workers):
        rep = w.handle(fields(i))
        if "error" in rep:
            errors[i] = rep["error"]
            continue
        for m in rep["msgs"]:
            out += server.receive(m)
    while out and not server.done:
        by = {}
        for rid, data in out:
            by.setdefault(rid, []).append(data)
        out = []
        for rid, msgs in sorted(by.items()):
            rep = workers[rid].handle({"op": "secagg", "msgs": msgs})
            for m in rep.get("msgs", []):
                out += server.receive(m)
    return server, errors


# ------------------------------------------------------------------------------------------- weights


def test_weight_attack_is_refused_and_the_sites_weigh_themselves():
    n, victim = 5, 3
    arrays, workers, keys = _sites(n)
    sizes = np.array([len(X) for X in arrays], float)
    spec = _spec(n, keys, weights=sizes)
    zero = np.zeros(n)
    zero[victim] = 1.0
    server, errors = _drive(workers, spec, lambda i: _start(spec, i, "records", weight=float(zero[i])))
    assert sorted(errors) == list(range(n)) and server.result is None
    assert all("weight" in e and "never takes a weight from the server" in e for e in errors.values())
    assert all(not _clients(w) and "rng" not in w.state for w in workers)  # nothing computed
    # the same round without the server's weights: each site weighs itself by its own record count
    spec = _spec(n, keys, weights=sizes, rule="records")
    server, errors = _drive(workers, spec, lambda i: _start(spec, i, "records"))
    assert errors == {} and server.survivors == tuple(range(n))
    ups = [compute_upload(dict(TASK), X, np.random.default_rng([0, i])) for i, X in enumerate(arrays)]
    want = sum(sizes[i] * ups[i] for i in range(n))
    got = dequantize(server.result, spec.fixed_point)
    assert np.max(np.abs(got - want)) <= n * spec.fixed_point.step * 2
    assert np.max(np.abs(got - ups[victim])) > 1.0  # not the victim's update


def test_ckks_site_refuses_a_server_weight():
    from securefed.securesum.ckks import CKKSRoundSpec, choose_ckks_parameters, encode_ckks_spec

    arrays, workers, keys = _sites(3)
    params = choose_ckks_parameters(4, 1e-6, 200.0, 3)
    spec = CKKSRoundSpec(
        b"w" * 16,
        0,
        3,
        0,
        params,
        8.0,
        keys,
        2,
        max_abs_sum=200.0,
        task_digest=request_digest(dict(TASK, op="ckks-start", site=1, seed=0, weights="records")),
    )
    rep = workers[1].handle(
        dict(TASK, op="ckks-start", site=1, seed=0, weights="records", weight=0.0, spec=encode_ckks_spec(spec))
    )
    assert rep["error"].startswith("ProtocolError") and "weight" in rep["error"]
    assert "ckks_client" not in workers[1].state


# ------------------------------------------------------------------------------------------- floors


def _refusal(n, keys, workers, options=None, **spec_kw):
    """Site 1's answer to a secagg-start with this spec: its error, or None when it started its client."""
    spec = _spec(n, keys, **spec_kw)
    w = SiteWorker(
        {"allow-paper-mode": True, "site-name": "h1", **(options or {})},
        workers[1]._records,
        state=dict(workers[1].state),
    )
    rep = w.handle(_start(spec, 1))
    if "error" in rep:
        assert not _clients(w) and "rng" not in w.state  # refused before anything was computed
        return rep["error"]
    assert _clients(w) and len(rep["msgs"]) == 1
    return None


@pytest.mark.parametrize("n", range(3, 13))
def test_default_parameters_pass_the_site_floors(n):
    _, workers, keys = _sites(n)
    assert _refusal(n, keys, workers) is None


def test_unsafe_specs_are_refused_naming_the_option():
    n = 10
    _, workers, keys = _sites(n)
    gp = choose_parameters(n)  # k = 9, t = 6, q = 6, c = 1
    semi = choose_parameters(n, server_model="semi-honest")  # the pre-issue-13 default: (9, 4)
    cases = {
        "t=1": dict(t=1),
        "t=2": dict(t=2),
        "old default t=4": dict(k=semi.degree, t=semi.threshold),
        "2t = k + c": dict(t=(gp.degree + gp.colluders) // 2),
        "sparse H(10,4)": dict(k=4, t=3),
        "quorum below (n+c)/2": dict(q=n // 2),
    }
    for what, kw in cases.items():
        err = _refusal(n, keys, workers, **kw)
        assert err is not None and err.startswith("ProtocolError") and "refused before anything is computed" in err, (
            what
        )
        assert "secagg-" in err, what  # names the site option to relax
    # a site that assumes more colluders refuses the default too; one that assumes fewer accepts t = 5
    err = _refusal(n, keys, workers, {"secagg-max-colluders": 3})
    assert "2t > k + c" in err and "c = 3" in err
    assert _refusal(n, keys, workers, {"secagg-max-colluders": 0}, t=5, q=6) is None
    assert _refusal(n, keys, workers, {"secagg-min-threshold": 7}) is not None
    # a sparse graph where the operator allows one (complete-up-to below n): the leak and cut bounds decide
    sparse = {"secagg-complete-up-to": 4, "secagg-max-colluders": 2}
    assert "2t - k colluding neighbours" in _refusal(n, keys, workers, sparse, k=4, t=3)
    assert "cut next to an honest survivor" in _refusal(n, keys, workers, sparse, k=4, t=4, q=7)
    assert _refusal(n, keys, workers, {"secagg-complete-up-to": 4}, k=4, t=4) is None  # c = 1: safe
    err = _refusal(n, keys, workers, {"secagg-max-colluders": "many"})
    assert err.startswith("ConfigError") and "secagg-max-colluders" in err


def test_the_default_choice_satisfies_the_sites_rule_for_every_n():
    """graph.choose_parameters (what the coordinator announces) passes graph.check_parameters (what every site
    with default options enforces) for every federation size: complete graphs up to 128 sites, sparse above."""
    from securefed.securesum.graph import check_parameters

    for n in list(range(3, 141)) + [200, 300, 500]:
        gp = choose_parameters(n)
        assert check_parameters(n, gp.degree, gp.threshold, gp.quorum, gp.colluders) == [], n
        assert gp.colluders >= 1 and (gp.degree == n - 1) == (n <= 128)


def test_too_few_sites_for_any_safe_choice_fail_loudly():
    with pytest.raises(ConfigError, match="no safe SecAgg parameters exist for 2 sites"):
        choose_parameters(2)
    with pytest.raises(ConfigError, match="no safe SecAgg parameters"):
        choose_parameters(3, colluders=2)
    gp = choose_parameters(3)
    assert (gp.degree, gp.threshold, gp.quorum, gp.colluders) == (2, 2, 3, 1)


def test_distributed_dp_floor_counts_the_colluders():
    n = 4
    _, workers, keys = _sites(n)
    plan = {"noise": "distributed", "min_survivors": 3, "sizes": [20, 23, 26, 29]}
    fields = {k: v for k, v in _start(_spec(n, keys), 1).items() if k not in TASK}  # a gradient upload, DP plan
    fields = put_array(dict(fields, task="gradient", gamma=1.0, dp=json.dumps(plan)), "Y", np.zeros((2, 2)))
    fields["spec"] = encode_spec(_spec(n, keys, fields=fields))
    w = SiteWorker(
        {"allow-paper-mode": True, "site-name": "h1", "dp-colluders": 2},
        workers[1]._records,
        state=dict(workers[1].state),
    )
    err = w.handle(fields)["error"]
    assert "t = 3 and dp-colluders = 2" in err and "needs 5 survivors" in err and not _clients(w)


# ------------------------------------------------------------------------------------------- the relay


def test_relay_drops_a_message_whose_sender_is_another_site():
    """Site 1's reply carries a MaskedInput relabelled as site 2's: the coordinator's relay drops it (site 1 is
    then missing and dropped); the sum over the others is exact."""
    n = 5
    arrays, workers, keys = _sites(n)

    def relabel(address, request, reply):
        if address == 1 and request.get("op") in ("secagg", "secagg-input"):
            msgs = []
            for m in reply.get("msgs", []):
                if peek_header(m)[0] is MaskedInput:
                    m = encode(dataclasses.replace(decode(m), sender=2))
                msgs.append(m)
            reply["msgs"] = msgs

    ex = InMemoryExchange({i: w for i, w in enumerate(workers)}, after_reply=relabel)
    plan = RunPlan.build("flower", aggregation="secagg", value_bound=8.0, method="none", seed=0, audit_holdout=0.0)
    co = Coordinator(plan)
    co.sites = Sites(
        [f"h{i}" for i in range(n)], [len(X) for X in arrays], [0] * n, 2, list(keys), list(range(n)), set(range(n))
    )
    gen = secure_sum(co, as_task(TASK), "moments", 8.0, weights="uniform", out_shape=[4])
    step = next(gen)
    try:
        while True:
            reply = ex.request(step.payloads, step.deadline)
            co.now = ex.now()
            step = gen.send(reply)
    except StopIteration as stop:
        res = stop.value
    assert res.survivors == (0, 2, 3, 4)
    assert any("site 1: a message that does not name site 1 as its sender" in r for r in res.details["rejected"])
    ups = [compute_upload(dict(TASK), X, None) for X in arrays]
    assert np.max(np.abs(res.total - sum(ups[i] for i in res.survivors))) <= 1e-6
