"""The one coordinator and the site workers, driven over the in-memory exchange (no Flower).

The exchange here rebuilds every site worker from its stored state before each message (as a Flower
ClientApp process is), so these tests also prove that a site's protocol machines and DP calibration survive
the store/load between messages; comparisons are with :func:`run_in_process` (live workers).
"""

import json

import numpy as np
import pytest

from securefed.accounting import PrivacyLedger
from securefed.errors import (
    AuditFailedError,
    ConfigError,
    DecodeError,
    ProtocolAbortedError,
    ProtocolError,
    ProtocolTimeoutError,
)
from securefed.federation import Coordinator, InMemoryExchange, ListNodes, Request, SiteWorker, drive, run_in_process
from securefed.federation.privacy import ServerPrivacy, open_server_ledger
from securefed.federation.wire import get_array, put_array
from securefed.plan import RunPlan
from securefed.securesum import SecAggAggregator
from securefed.securesum.secagg_codec import decode_spec, encode_spec

NAMES = ["s0", "s1", "s2"]


@pytest.fixture
def sites():
    rng = np.random.default_rng(5)
    return [rng.normal(size=(30 + 5 * i, 3)) * 0.4 + 0.3 * i for i in range(3)]


def _plan(**kw):
    base = dict(
        method="none",
        landmarks=6,
        rounds=2,
        local_steps=2,
        aggregation="secagg",
        value_bound=3.0,
        degree=2,
        threshold=2,
        min_sites=3,
        seed=3,
        audit_holdout=0.0,
    )
    base.update(kw)
    return RunPlan.build("flower", **base)


def _dp_options(tmp_path, budget=5.0, n=3, **extra):
    return {
        i: {
            "epsilon-budget": budget,
            "allow-seeded-noise": "true",
            "ledger-path": str(tmp_path / f"ledgers{i}"),
            "allow-plain": True,
            "allow-distributed-noise": True,
            **extra,
        }
        for i in range(n)
    }


def _exchange(arrays, options=None, **kw):
    workers = {
        1000 + i: SiteWorker(
            {
                "site-name": NAMES[i],
                "allow-plain": True,
                "require-audit": False,
                "allow-paper-mode": True,  # these tests drive the paper's FedDL / rows mode
                **(options or {}).get(i, {}),
            },
            X,
        )
        for i, X in enumerate(arrays)
    }
    return InMemoryExchange(workers, fresh_process=True, **kw)


def _run(plan, arrays, tmp_path=None, options=None, ex=None, **kw):
    ex = ex or _exchange(arrays, options, **kw)
    ledger = open_server_ledger(plan, plan.run_id, str(tmp_path / "ledger.jsonl")) if plan.dp else None
    return drive(Coordinator(plan, ledger=ledger), ex)


def _site_ledger(tmp_path, site, run_id):
    path = tmp_path / f"ledgers{site}" / f"{run_id}.jsonl"
    head = json.loads(path.read_text().splitlines()[0])
    return PrivacyLedger(str(path), run_id, delta=head["delta"], accountant=head["accountant"])


# ------------------------------------------------------------------------------------ one implementation


def test_plain_fresh_processes_equal_the_live_in_process_run(sites):
    plan = _plan(aggregation="plain")
    res = _run(plan, sites)
    ref = run_in_process(plan, sites, names=NAMES)
    assert res.gamma == ref.gamma
    np.testing.assert_array_equal(res.landmarks, ref.landmarks)
    assert res.survivors == [0, 1, 2] and res.round_trips == ref.round_trips


@pytest.mark.parametrize("rule", ["model", "gradient"])
def test_secagg_is_within_quantisation_of_plain(sites, rule):
    res = _run(_plan(rule=rule), sites)
    ref = run_in_process(_plan(rule=rule, aggregation="plain"), sites, names=NAMES)
    f = min(st["details"]["fixed_point"]["fractional_bits"] for st in res.steps)
    err = np.max(np.abs(res.landmarks - ref.landmarks))
    assert err < 1e3 * 2.0**-f  # a few steps, each within n·2^-f, amplified by at most the local steps
    assert err > 0 or f >= 40
    assert res.survivors == [0, 1, 2]


def test_the_statistics_are_one_secure_sum(sites):
    res = _run(_plan(aggregation="plain"), sites)
    labels = [st["label"] for st in res.steps]
    assert labels[0] == "statistics" and labels.count("statistics") == 1
    assert any("median squared distance" in r for r in res.released) and any(
        "sums of squares" in r for r in res.released
    )


def test_a_site_sends_into_a_secure_sum_only_unless_its_operator_allows_plain(sites):
    """The coordinator chooses the aggregation; a site does not follow it into plain sums by default (with plain
    aggregation the coordinator reads each site's upload)."""
    ex = InMemoryExchange(
        {1000 + i: SiteWorker({"allow-paper-mode": True, "site-name": NAMES[i]}, X) for i, X in enumerate(sites)}
    )
    with pytest.raises(ProtocolAbortedError, match="allow-plain"):
        drive(Coordinator(_plan(aggregation="plain")), ex)
    assert set(ex.ops) == {"hello", "plain"}  # nothing but the refused request went out


def test_identity_fingerprints_for_an_out_of_band_check(sites):
    ex = _exchange(sites)
    res = _run(_plan(aggregation="plain", rounds=1), sites, ex=ex)
    assert res.identity_fingerprints == {NAMES[i]: ex.workers[1000 + i].fingerprint() for i in range(3)}


def test_weights_are_the_sites_own(sites):
    """A site weighs its own upload by its record count (or 1): the coordinator's sum is the record-weighted one."""
    rec = _run(_plan(aggregation="plain", gamma=1.0), sites)
    uni = _run(_plan(aggregation="plain", gamma=1.0, weights="uniform"), sites)
    assert not np.allclose(rec.landmarks, uni.landmarks)
    seen = []
    ex = _exchange(
        sites, after_reply=lambda a, f, r: seen.append((a, r.get("weight"))) if f.get("op") == "plain" else None
    )
    _run(_plan(aggregation="plain", gamma=1.0), sites, ex=ex)
    assert {(a, w) for a, w in seen} == {(1000 + i, float(len(X))) for i, X in enumerate(sites)}


# ------------------------------------------------------------------------------------ scripted faults


def test_scripted_exchange_dropped_site_and_late_reply_without_flower(sites):
    """The coordinator alone, fed by hand: a site that never answers and one whose reply comes after the
    deadline are both dropped at that step; plain aggregation completes with the one left."""
    plan = _plan(aggregation="plain", gamma=1.0, rounds=1, local_steps=1, min_sites=1, init="public")
    workers = {
        a: SiteWorker({"allow-paper-mode": True, "site-name": NAMES[a], "allow-plain": True}, X)
        for a, X in enumerate(sites)
    }
    co = Coordinator(plan)
    step = co.start([0, 1, 2])
    assert isinstance(step, Request) and set(step.payloads) == {0, 1, 2}
    now = 0.0
    while step is not None:
        if isinstance(step, ListNodes):  # re-admission asks which addresses exist: the same three
            step = co.receive([0, 1, 2], now)
            continue
        replies = {}
        for a, f in step.payloads.items():
            if f["op"] == "plain" and a in (1, 2):
                continue  # site 1 never answers; site 2 answers after the deadline, so the driver drops its reply
            replies[a] = workers[a].handle(f)
        if len(replies) < len(step.payloads):
            now = step.deadline  # the driver waited until the deadline
        step = co.receive(replies, now)
    res = co.result
    assert res.survivors == [0] and res.site_errors == {
        "s1": "no reply before the deadline",
        "s2": "no reply before the deadline",
    }
    assert co.done and np.all(np.isfinite(res.landmarks))


def test_late_reply_in_the_exchange_is_a_silent_site(sites):
    res = _run(_plan(aggregation="plain", gamma=1.0, rounds=1), sites, late={1001: ("plain", 1e9)})
    assert res.survivors == [0, 2]


def test_site_dropping_at_masked_stage_aborts_with_typed_error(sites):
    ex = _exchange(sites, silent_from={1002: "secagg-input"})
    with pytest.raises((ProtocolAbortedError, ProtocolTimeoutError)) as ei:
        _run(_plan(gamma=1.0), sites, ex=ex)
    assert "aborted" in str(ei.value)


def test_plain_completes_without_a_dropped_site(sites):
    res = _run(_plan(aggregation="plain", gamma=1.0, rounds=1), sites, silent_from={1001: "plain"})
    assert res.survivors == [0, 2] and np.all(np.isfinite(res.landmarks))


def test_a_failed_coordinator_asks_nothing_more(sites):
    co = Coordinator(_plan(aggregation="plain", min_sites=3))
    co.start([0, 1, 2])
    with pytest.raises(ProtocolAbortedError):
        co.receive({0: {"error": "x"}}, 0.0)
    assert co.done and co.error is not None
    with pytest.raises(ProtocolError, match="not running"):
        co.receive({}, 1.0)


def test_spec_codec_round_trip_and_strictness():
    agg = SecAggAggregator(clip_range=1.0, degree=2, threshold=2)
    spec = agg.round_spec(3, 10, [1.0, 1.0, 1.0])
    back = decode_spec(encode_spec(spec))
    assert back == spec and back.neighbours == spec.neighbours
    with pytest.raises(DecodeError):
        decode_spec(encode_spec(spec).replace(b'"v": 2', b'"v": 3'))
    with pytest.raises(DecodeError):
        decode_spec(b"{not json")


def test_site_reports_protocol_errors_instead_of_crashing(sites):
    w = SiteWorker({"allow-paper-mode": True, "site-name": "s0", "allow-plain": True}, sites[0])
    assert w.handle({"op": "secagg", "msgs": [b"junk"]})["error"].startswith(("ProtocolError", "DecodeError"))
    assert "unknown operation" in w.handle({"op": "nope"})["error"]
    assert w.handle({"op": "plain", "task": "model"})["error"].startswith("DecodeError")


# ------------------------------------------------------------------------------------ embedding


def test_no_rows_tsne_embedding_is_the_sites_own_placement(sites):
    """The landmark map is the coordinator's count-weighted t-SNE of the landmarks; each site's coordinates are its
    own placement against that broadcast, recomputed here from the broadcast and the site's records alone."""
    from securefed.embedding.placement import place_refine, weighted_tsne

    res = _run(_plan(aggregation="plain", method="tsne", nystrom="local", perplexity=30.0), sites)
    emb = res.embedding
    Y, c, space = res.landmarks, res.masses, res.landmark_space
    assert res.landmark_info["method"] == "cells" and c is not None and np.all(c >= 15)
    E, Zn = weighted_tsne(Y, c, perplexity=30.0, seed=emb["model_seed"], n_components=2)
    np.testing.assert_array_equal(emb["landmark_embedding"], E)
    assert list(emb["coordinates"]) == NAMES and not emb["missing"]
    for name, X in zip(NAMES, sites):
        own = place_refine(space.features(X), Y, E, c, Zn, perplexity=10.0)  # the plan's placement_perplexity
        np.testing.assert_allclose(emb["coordinates"][name], own, rtol=0, atol=1e-9)


def test_site_refuses_a_landmark_map_that_does_not_match_the_landmarks(sites):
    Y = np.random.default_rng(0).normal(size=(6, 3))
    req = put_array(
        put_array(
            put_array({"op": "place", "method": "tsne", "perplexity": 30.0, "Zn": 1.0, "space": "raw"}, "Y", Y),
            "landmark_embedding",
            np.zeros((5, 2)),
        ),
        "masses",
        np.ones(6),
    )
    rep = SiteWorker({"allow-paper-mode": True, "site-name": "s0"}, sites[0]).handle(req)
    assert rep["error"].startswith("ProtocolError") and "does not match" in rep["error"]


@pytest.mark.parametrize("method", ["tsne", "spectral", "umap"])
def test_rows_mode_equals_the_estimator(sites, method):
    """The estimators run the same coordinator: same data and seed, the same rows-mode result."""
    from securefed.estimators import FedSpectralClustering, FedTSNE, FedUMAP

    est = {
        "tsne": FedTSNE(n_iter=300, perplexity=10.0),
        "spectral": FedSpectralClustering(n_clusters=3),
        "umap": FedUMAP(n_neighbors=10),
    }[method]
    ex = _exchange(sites)
    res = _run(
        _plan(
            aggregation="plain",
            method=method,
            nystrom="rows",
            n_iter=300,
            perplexity=10.0,
            n_clusters=3,
            n_neighbors=10,
        ),
        sites,
        ex=ex,
    )
    est.set_params(
        n_landmarks=6,
        rounds=2,
        local_steps=2,
        nystrom="rows",
        random_state=3,
        keep_sent=True,
        value_bound=3.0,
        aggregation="plain",
        audit_holdout=0.0,
    )
    est.fit(sites)
    np.testing.assert_array_equal(res.landmarks, est.landmarks_)
    if method == "spectral":
        np.testing.assert_array_equal(res.stacked("labels"), est.labels_)
    else:
        np.testing.assert_array_equal(res.stacked("coordinates"), est.embedding_)
    assert res.embedding["reconstruction"] == est.reconstruction_ and res.embedding["sent_kind"] == est.sent_kind_
    assert res.embedding["rows_per_site"] == {k: len(X) for k, X in zip(NAMES, sites)}
    assert any("give every record back" in w for w in res.warnings) and any(est.sent_kind_ in r for r in res.released)
    assert ex.ops.count("rows") == 3


def test_spectral_local_equals_the_estimator(sites):
    from securefed.estimators import FedSpectralClustering

    res = _run(_plan(aggregation="plain", method="spectral", nystrom="local", landmarks=8, n_clusters=3), sites)
    est = FedSpectralClustering(
        n_clusters=3,
        n_landmarks=8,
        rounds=2,
        local_steps=2,
        nystrom="local",
        random_state=3,
        value_bound=3.0,
        aggregation="plain",
        audit_holdout=0.0,
    ).fit(sites)
    np.testing.assert_array_equal(res.stacked("labels"), est.labels_)


# ------------------------------------------------------------------------------------ differential privacy


def test_dp_sites_keep_their_own_ledgers_and_the_coordinator_mirrors_them(sites, tmp_path):
    plan = _plan(aggregation="plain", epsilon=2.0, clip_norm=2.0, run_id="dp1", noise_seed_for_testing=3)
    res = _run(plan, sites, tmp_path, options=_dp_options(tmp_path))
    ref = run_in_process(plan, sites, names=NAMES, site_options=[{"allow-seeded-noise": True}] * 3)
    np.testing.assert_array_equal(res.landmarks, ref.landmarks)  # seeded noise: the same stream, fresh processes or not
    assert res.privacy["epsilon"] <= 2.0 + 1e-9 and res.privacy["releases"] == 4
    server = PrivacyLedger(str(tmp_path / "ledger.jsonl"), "dp1", accountant="exact")
    for p in range(3):
        mine = _site_ledger(tmp_path, p, "dp1")
        assert {e["site"] for e in mine.events("release")} == {p}
        assert [e["id"] for e in mine.events("release")] == [
            e["id"] for e in server.events("release") if e["site"] == p
        ]
        assert mine.spent(p)[0] == pytest.approx(res.privacy["epsilon_per_site"][str(p)], rel=1e-12)


def test_dp_landmarks_are_projected_after_every_server_step(sites):
    """Δ assumes the landmarks inside the τ_Y ball at every step: gradient averaging with Q > 1 projects after
    each server step, not only after the round."""
    from securefed.accounting.bounds import default_tau_y

    events = []
    plan = _plan(
        aggregation="plain",
        rule="gradient",
        epsilon=50.0,
        clip_norm=0.5,
        rounds=2,
        local_steps=3,
        lr=50.0,
        gamma=1e-3,
        noise_seed_for_testing=1,
    )
    res = run_in_process(
        plan,
        sites,
        names=NAMES,
        site_options=[{"allow-seeded-noise": True}] * 3,
        exchange={
            "after_reply": lambda a, f, r: events.append(get_array(f, "Y")) if f.get("task") == "gradient" else None
        },
    )
    tau_y = default_tau_y(0.5, 6)
    for Y in events:
        assert np.linalg.norm(Y, 2) <= tau_y * (1 + 1e-9)
        assert np.all(np.linalg.norm(Y, axis=1) <= 0.5 * (1 + 1e-9))
    assert np.all(np.isfinite(res.landmarks))


def test_dp_distributed_noise_secagg_gradient_settles_with_survivors(sites, tmp_path):
    plan = _plan(
        rule="gradient",
        epsilon=3.0,
        clip_norm=2.0,
        noise="distributed",
        rounds=1,
        local_steps=2,
        run_id="dp2",
        noise_seed_for_testing=3,
        distributed_mechanism="gaussian",
    )
    res = _run(plan, sites, tmp_path, options=_dp_options(tmp_path))
    server = PrivacyLedger(str(tmp_path / "ledger.jsonl"), "dp2", accountant="exact")
    assert len(server.events("settle")) == 2 and all(e["survivors"] == [0, 1, 2] for e in server.events("settle"))
    # every site survived (= t): the worst case each site booked at release is the actual spending, so a
    # site records no settlement on the server's word (site_settle records only ones that raise its ε)
    assert _site_ledger(tmp_path, 0, "dp2").events("settle") == []
    assert _site_ledger(tmp_path, 0, "dp2").spent()[0] == pytest.approx(res.privacy["epsilon"], rel=1e-9)


def test_site_refuses_over_its_budget_and_writes_nothing(sites, tmp_path):
    options = _dp_options(tmp_path)
    options[1]["epsilon-budget"] = 0.5  # site s1 allows less than the run's ε = 2
    res = _run(
        _plan(aggregation="plain", epsilon=2.0, clip_norm=2.0, run_id="dp3", noise_seed_for_testing=1),
        sites,
        tmp_path,
        options=options,
    )
    assert res.survivors == [0, 2] and res.site_errors["s1"].startswith("BudgetExceededError")
    assert (
        not (tmp_path / "ledgers1" / "dp3.jsonl").exists() or _site_ledger(tmp_path, 1, "dp3").events("release") == []
    )
    (tmp_path / "o4").mkdir()
    with pytest.raises(ProtocolAbortedError, match="BudgetExceededError"):
        _run(
            _plan(aggregation="plain", epsilon=2.0, clip_norm=2.0, run_id="dp4", noise_seed_for_testing=1),
            sites,
            tmp_path / "o4",
            options=_dp_options(tmp_path, budget=0.5),
        )


def test_site_budget_covers_all_its_runs(sites, tmp_path):
    """epsilon-budget is the site's total over the runs in its ledger directory (basic composition)."""
    options = _dp_options(tmp_path, budget=3.5)
    common = dict(aggregation="plain", clip_norm=2.0, rounds=1, local_steps=2, noise_seed_for_testing=1)
    (tmp_path / "o1").mkdir()
    first = _run(_plan(epsilon=2.0, run_id="life1", **common), sites, tmp_path / "o1", options=options)
    assert first.privacy["epsilon"] == pytest.approx(2.0, rel=1e-9)
    (tmp_path / "o2").mkdir()
    with pytest.raises(ProtocolAbortedError, match="BudgetExceededError.*other run"):  # 1.5 left < 2
        _run(_plan(epsilon=2.0, run_id="life2", **common), sites, tmp_path / "o2", options=options)
    (tmp_path / "o3").mkdir()
    third = _run(_plan(epsilon=1.0, run_id="life3", **common), sites, tmp_path / "o3", options=options)
    assert third.survivors == [0, 1, 2]
    led = _site_ledger(tmp_path, 0, "life3")
    assert led.budget_epsilon == 3.5  # the site's budget; every booking adds what its other runs spent
    assert led.spent()[0] + first.privacy["epsilon_per_site"]["0"] <= 3.5 * (1 + 1e-9)


def test_site_checks_sigma_seeded_noise_and_distributed_rules(sites, tmp_path):
    plan = _plan(
        rule="gradient",
        epsilon=2.0,
        clip_norm=2.0,
        noise="distributed",
        run_id="dp5",
        noise_seed_for_testing=3,
        distributed_mechanism="gaussian",
    )
    sp = ServerPrivacy(plan, "dp5", [30, 35, 40], [1 / 3] * 3, 0.25)
    wire = json.loads(sp.wire_plan())
    task = put_array(
        {"op": "secagg-start", "task": "gradient", "gamma": 0.25, "round": 0, "step": 0, "site": 0, "seed": 3},
        "Y",
        np.zeros((6, 3)),
    )
    node = {"site-name": "s0", "epsilon-budget": 5.0, "ledger-path": str(tmp_path / "l"), "allow-plain": True}
    X = sites[0]
    rep = SiteWorker(dict(node, **{"allow-seeded-noise": True}), X).handle(dict(task, op="plain", dp=json.dumps(wire)))
    assert rep["error"].startswith("ConfigError") and "secure sum" in rep["error"]
    local = dict(wire, noise="local", aggregation="plain")
    rep = SiteWorker(node, X).handle(dict(task, op="plain", dp=json.dumps(local)))
    assert rep["error"].startswith("ConfigError") and "seeded" in rep["error"]
    low = dict(local, sigma=[v * 0.5 for v in wire["sigma"]])
    rep = SiteWorker(dict(node, **{"allow-seeded-noise": True}), X).handle(dict(task, op="plain", dp=json.dumps(low)))
    assert rep["error"].startswith("ProtocolError") and "own calibration" in rep["error"]
    rep = SiteWorker(
        {"allow-paper-mode": True, "site-name": "s0", "allow-seeded-noise": True, "allow-plain": True}, X
    ).handle(dict(task, op="plain", dp=json.dumps(local)))
    assert "epsilon-budget" in rep["error"]
    strict = SiteWorker({"allow-paper-mode": True, "site-name": "s0", "require-dp": "true", "allow-plain": True}, X)
    rep = strict.handle({"op": "plain", "task": "stats", "want": ["moments"], "scale": 1.0, "site": 0, "seed": 0})
    assert rep["error"].startswith("ConfigError") and "require-dp" in rep["error"]
    rep = strict.handle(put_array({"op": "rows", "kind": "distance", "site": 0}, "Y", np.zeros((6, 3))))
    assert "require-dp" in rep["error"]


def test_ledger_event_is_on_disk_before_the_reply_leaves_the_site(sites, tmp_path):
    seen = []

    def check(address, fields, reply):
        if "dp_events" not in reply:
            return
        site = address - 1000
        on_disk = {
            json.loads(line)["id"] for line in (tmp_path / f"ledgers{site}" / "dp6.jsonl").read_text().splitlines()[1:]
        }
        ids = {json.loads(e)["id"] for e in reply["dp_events"]}
        assert ids and ids <= on_disk
        seen.append(len(ids))

    _run(
        _plan(
            aggregation="plain",
            epsilon=2.0,
            clip_norm=2.0,
            rounds=2,
            local_steps=3,
            run_id="dp6",
            noise_seed_for_testing=1,
        ),
        sites,
        tmp_path,
        options=_dp_options(tmp_path),
        after_reply=check,
    )
    assert seen == [3] * 6  # 3 sites × 2 rounds, 3 local-step releases each


@pytest.mark.parametrize("lie", ["size", "gamma", "landmarks"])
def test_site_refuses_a_request_that_disagrees_with_its_dp_plan(sites, tmp_path, lie):
    """A coordinator that announces numbers in the DP plan other than those it uses would shrink the site's noise:
    the site checks and refuses before any release reaches its ledger."""

    def lying(a, f):
        if "dp" in f and a == 1000:
            if lie == "size":
                plan = json.loads(f["dp"])
                plan["sizes"][0] *= 100
                f["dp"] = json.dumps(plan)
            elif lie == "gamma":
                f["gamma"] = float(f["gamma"]) * 10
            else:
                put_array(f, "Y", get_array(f, "Y")[:-1])
        return f

    workers = {
        1000 + i: SiteWorker({"allow-paper-mode": True, "site-name": NAMES[i], **_dp_options(tmp_path)[i]}, X)
        for i, X in enumerate(sites)
    }
    res = _run(
        _plan(aggregation="plain", epsilon=2.0, clip_norm=2.0, rounds=2, run_id="lie", noise_seed_for_testing=1),
        sites,
        tmp_path,
        ex=InMemoryExchange(workers, fresh_process=True, before_request=lying),
    )
    assert res.survivors == [1, 2]
    assert res.site_errors["s0"].startswith("ProtocolError") and "refusing" in res.site_errors["s0"]
    assert _site_ledger(tmp_path, 0, "lie").events("release") == []


def test_rows_under_dp_need_rows_epsilon_and_are_data_perturbed(sites, tmp_path):
    from securefed.kernels import sq_dists

    with pytest.raises(ConfigError, match="rows-epsilon"):
        _plan(aggregation="plain", epsilon=1.0, clip_norm=2.0, method="tsne", nystrom="rows")
    rows_seen = {}

    def grab(address, fields, reply):
        if fields["op"] == "rows":
            rows_seen[address - 1000] = get_array(reply, "rows")

    res = _run(
        _plan(
            aggregation="plain",
            epsilon=1.0,
            clip_norm=2.0,
            rows_epsilon=1.0,
            rounds=1,
            method="tsne",
            nystrom="rows",
            n_iter=300,
            perplexity=10.0,
            run_id="r1",
            noise_seed_for_testing=1,
        ),
        sites,
        tmp_path,
        options=_dp_options(tmp_path, budget=3.0),
        after_reply=grab,
    )
    rp = res.privacy["rows"]
    assert rp["epsilon"] == 1.0 and rp["sites"] == 3 and res.privacy["epsilon_total"] > res.privacy["epsilon"]
    Y = res.landmarks
    for p, X in enumerate(sites):
        resid = rows_seen[p] - sq_dists(X, Y)  # ≈ ‖e‖² + 2e·(x − y): mean ≈ m·σ² for noise e ~ N(0, σ²I)
        assert rp["sigma"] > 1 and np.mean(resid) > rp["sigma"]
    server = PrivacyLedger(str(tmp_path / "ledger.jsonl"), "r1", accountant="exact")
    assert sum(e["mechanism"] == "gaussian-data" for e in server.events("release")) == 3


# ------------------------------------------------------------------------------------ audit gate


def test_audit_gate_stops_before_anything_per_record_leaves(sites):
    """Landmarks that are the members themselves (given as the start, a negligible step) must fail the default
    policy; nothing per record may leave a site after that."""
    members = [SiteWorker({"allow-paper-mode": True, "site-name": n}, X).split(0.3, 3)[0] for n, X in zip(NAMES, sites)]
    init = np.vstack(members)
    strict = dict(
        aggregation="plain",
        method="tsne",
        nystrom="rows",
        landmarks=len(init),
        rounds=1,
        local_steps=1,
        lr=1e-12,
        gamma=1.0,
        init=init,
        audit_holdout=0.3,
    )
    ex = _exchange(sites)
    co = Coordinator(RunPlan.build("api", **{**dict(min_sites=3, seed=3), **strict}))
    with pytest.raises(AuditFailedError, match="audit failed"):
        drive(co, ex)
    assert "rows" not in ex.ops and "place" not in ex.ops
    block = co.partial["audit"]
    assert block["verdict"] == "fail" and block["auc"] > 0.9 and block["failures"]
    res = run_in_process(
        RunPlan.build("api", **{**dict(min_sites=3, seed=3, n_iter=300, allow_audit_failure=True), **strict}),
        sites,
        names=NAMES,
    )
    audit = res.audit
    assert audit["verdict"] == "fail (overridden)" and audit["failures"] and audit["auc"] > 0.9
    assert audit["mia"]["n_members"] == sum(res.site_sizes)
    assert audit["mia"]["n_members"] + audit["mia"]["n_nonmembers"] == 30 + 35 + 40
    assert sum(res.embedding["rows_per_site"].values()) == 30 + 35 + 40  # hold-out records are embedded too


def test_audit_counts_through_secagg_equal_plain(sites):
    common = dict(gamma=1.0, rounds=1, local_steps=1, audit_holdout=0.3)
    a = _run(_plan(aggregation="plain", **common), sites).audit
    b = _run(_plan(**common), sites).audit
    assert b["mia"]["aggregation"] == "secagg"
    assert a["mia"]["n_members"] == b["mia"]["n_members"] and a["mia"]["n_nonmembers"] == b["mia"]["n_nonmembers"]
    assert abs(a["auc"] - b["auc"]) < 0.05


# ------------------------------------------------------------------------------------ restarted sites


def test_restarted_site_is_readmitted_with_its_ledger(sites, tmp_path):
    restarted = {}

    class Restarting(InMemoryExchange):
        def request(self, payloads, deadline):
            rounds = [f.get("round") for f in payloads.values()]
            if 1 in rounds and not restarted and 1002 not in self.silent_from:
                self.silent_from[1002] = "plain"  # s2 crashes when round 2 starts
            out = super().request(payloads, deadline)
            if 1 in rounds and not restarted:
                restarted["address"] = self.restart(1002)  # ... and comes back with a new address
            return out

    workers = {
        1000 + i: SiteWorker({"allow-paper-mode": True, "site-name": NAMES[i], **_dp_options(tmp_path)[i]}, X)
        for i, X in enumerate(sites)
    }
    ex = Restarting(workers, fresh_process=True)
    res = _run(
        _plan(
            aggregation="plain",
            epsilon=3.0,
            clip_norm=2.0,
            rounds=3,
            local_steps=1,
            run_id="rs1",
            noise_seed_for_testing=1,
        ),
        sites,
        tmp_path,
        ex=ex,
    )
    assert res.readmitted == [{"site": "s2", "at": "before round 3"}]
    assert res.survivors == [0, 1, 2]
    assert ex.workers[restarted["address"]].state["identity"] != ex.workers[1002].state["identity"]
    led = _site_ledger(tmp_path, 2, "rs1")
    assert sorted(e["round"] for e in led.events("release")) == [0, 2]  # down in round 1; its ledger carried on
    assert res.privacy["epsilon_per_site"]["2"] < res.privacy["epsilon_per_site"]["0"]


def test_restarted_site_with_other_data_is_not_readmitted(sites):
    class Restarting(InMemoryExchange):
        def request(self, payloads, deadline):
            out = super().request(payloads, deadline)
            if any(f.get("op") == "plain" for f in payloads.values()) and 1002 in self.dead and len(self.workers) == 3:
                new = self.restart(1002)
                self.workers[new] = SiteWorker(
                    {"allow-paper-mode": True, "site-name": "s2", "allow-plain": True}, sites[0]
                )  # another file
            return out

    res = _run(
        _plan(aggregation="plain", gamma=1.0, rounds=3),
        sites,
        ex=Restarting(
            {
                1000 + i: SiteWorker({"allow-paper-mode": True, "site-name": NAMES[i], "allow-plain": True}, X)
                for i, X in enumerate(sites)
            },
            silent_from={1002: "plain"},
        ),
    )
    assert res.readmitted == [] and res.survivors == [0, 1]


def test_restarted_site_rejoins_secagg_with_its_new_identity_key(tmp_path):
    """5 sites, SecAgg+ with the sites' safe defaults (complete graph, t = 3, q = 4): s3 crashes in round 1 (the round completes without it), comes
    back with a new address and key, and round 2 sums all 5 — its signed messages verify only because the
    re-hello announced the new key in round 2's spec."""
    rng = np.random.default_rng(7)
    arrays = [rng.normal(size=(25, 3)) * 0.5 for _ in range(5)]

    class Restarting(InMemoryExchange):
        def request(self, payloads, deadline):
            out = super().request(payloads, deadline)
            if 3 in self.dead and any(f["op"] == "secagg" for f in payloads.values()) and len(self.workers) == 5:
                self.restart(3)
            return out

    ex = Restarting(
        {i: SiteWorker({"allow-paper-mode": True, "site-name": f"q{i}"}, X) for i, X in enumerate(arrays)},
        silent_from={3: "secagg-input"},
        fresh_process=True,
    )
    res = drive(
        Coordinator(_plan(gamma=1.0, init="public", rounds=2, local_steps=1, degree=None, threshold=None, min_sites=5)),
        ex,
    )
    rounds = [st for st in res.steps if st["label"].startswith("round")]
    assert rounds[0]["survivors"] == [0, 1, 2, 4] and rounds[1]["survivors"] == [0, 1, 2, 3, 4]
    assert res.readmitted == [{"site": "q3", "at": "before round 2"}]


# ------------------------------------------------------------------------------------ CKKS


def test_ckks_aggregation_with_distributed_noise_matches_secagg(sites, tmp_path):
    common = dict(
        rule="gradient",
        rounds=1,
        local_steps=2,
        epsilon=3.0,
        clip_norm=2.0,
        noise="distributed",
        noise_seed_for_testing=1,
        distributed_mechanism="gaussian",
    )  # CKKS sums the continuous shares
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _run(
        _plan(aggregation="ckks", run_id="ck1", **common), sites, tmp_path / "a", options=_dp_options(tmp_path / "a")
    )
    b = _run(_plan(run_id="ck2", **common), sites, tmp_path / "b", options=_dp_options(tmp_path / "b"))
    assert [st["details"]["key_holder"] for st in a.steps] == [0, 0]
    np.testing.assert_allclose(a.landmarks, b.landmarks, rtol=0, atol=1e-4)
    assert a.privacy["epsilon"] == pytest.approx(b.privacy["epsilon"], rel=1e-12)
    led = PrivacyLedger(str(tmp_path / "a" / "ledger.jsonl"), "ck1", accountant="exact")
    assert len(led.events("release")) == 6 and len(led.events("settle")) == 2


def test_distributed_noise_with_a_dropout_is_settled_with_the_actual_survivors(sites, tmp_path):
    res = _run(
        _plan(
            aggregation="ckks",
            rule="gradient",
            rounds=1,
            local_steps=1,
            epsilon=3.0,
            clip_norm=2.0,
            noise="distributed",
            min_survivors=2,
            run_id="ck3",
            noise_seed_for_testing=1,
        ),
        sites,
        tmp_path,
        options=_dp_options(tmp_path),
        silent_from={1002: "ckks-start"},
    )
    assert res.survivors == [0, 1]
    events = [json.loads(x) for x in (tmp_path / "ledger.jsonl").read_text().splitlines()[1:]]
    settle = [e for e in events if e["type"] == "settle"]
    assert len(settle) == 1 and settle[0]["survivors"] == [0, 1]
    pr = res.privacy
    w = np.array(res.site_sizes, float) / sum(res.site_sizes)
    sig, dl = np.array(pr["sigma_per_site"]), np.array(pr["sensitivity_per_site"])
    for p in (0, 1):
        rid = next(e["id"] for e in events if e["type"] == "release" and e["site"] == p)
        mu = w[p] * dl[p] / np.sqrt(np.sum((w[:2] * sig[:2]) ** 2))
        assert settle[0]["releases"][rid] == pytest.approx(1.0 / mu, rel=1e-12)
    assert not any(e["type"] == "release" and e["site"] == 2 for e in events)


def test_distributed_noise_sets_the_secagg_clients_survivor_floor():
    from securefed.federation.site import _dp_min_survivors

    plan = {"noise": "distributed", "min_survivors": None, "sizes": [30, 35, 40]}
    assert _dp_min_survivors({"dp": json.dumps(plan)}, 3) == 3
    assert _dp_min_survivors({"dp": json.dumps(dict(plan, min_survivors=2))}, 3) == 2
    assert _dp_min_survivors({"dp": json.dumps(dict(plan, noise="local"))}, 3) == 1
    assert _dp_min_survivors({}, 3) == 1


def test_secagg_clipping_is_counted_and_warned(sites):
    from securefed.securesum.quantize import ClippingWarning

    with pytest.warns(ClippingWarning, match="SecAgg"):
        res = _run(_plan(value_bound=0.01, gamma=1.0, rounds=1, local_steps=1), sites)
    assert sum(st["clipped"] for st in res.steps) > 0
