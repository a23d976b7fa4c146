"""The Flower deployment's logic without Flower: coordinator + site handlers over an in-memory exchange.

Every site request goes through ``site.handle`` with a fresh state object rebuilt from stored bytes
(as in a fresh ClientApp process), so these tests also prove the SecAgg+ client state survives the
store/load between messages. Results are compared with in-process ``fed_dl``.
"""

import numpy as np
import pytest

from securefed.errors import DecodeError, ProtocolAbortedError, ProtocolTimeoutError
from securefed.landmarks import fed_dl
from securefed.securesum import SecAggAggregator
from securefed.flower.coordinator import FlowerRunConfig, run_feddl
from securefed.flower.site import SiteState, handle
from securefed.flower.transport import decode_spec, encode_spec, payload_size


class MemoryExchange:
    """Same interface as transport.Exchange; delivers to site.handle in process.

    ``drop={site: op}`` makes a site silent from the first request with that op on (a crashed SuperNode).
    ``node_config={site: {...}}`` adds node-config keys; ``after_reply(node, fields, reply)`` runs after a
    site produced its reply and before the coordinator gets it. :meth:`restart` brings a site back as a
    new node (new node id, empty state), as a restarted SuperNode.
    """

    def __init__(self, paths, drop=None, node_config=None, after_reply=None):
        self.paths = paths
        self.nodes = {i: 1000 + i for i in range(len(paths))}
        self.site_of = {1000 + i: i for i in range(len(paths))}
        self.states = {1000 + i: {} for i in range(len(paths))}
        self.bytes_to = {i: 0 for i in self.nodes}
        self.bytes_from = {i: 0 for i in self.nodes}
        self.silent, self.messages, self.clock = {}, 0, 0.0
        self.drop, self.dead = dict(drop or {}), set()
        self.node_config = dict(node_config or {})
        self.after_reply = after_reply
        self.ops: list = []

    def now(self):
        return self.clock

    def available_nodes(self):
        return sorted(n for n in self.site_of if n not in self.dead)

    def restart(self, site):
        node = max(self.site_of) + 1
        self.site_of[node] = site
        self.states[node] = {}
        self.drop.pop(site, None)
        return node

    def config_of(self, node):
        site = self.site_of[node]
        return {"data-path": self.paths[site], "site-name": f"s{site}", **self.node_config.get(site, {})}

    def request(self, payloads, deadline, on_reply=None):
        out = {}
        for cid, fields in payloads.items():
            node = self.nodes[cid]
            self.messages += 1
            self.bytes_to[cid] += payload_size(fields)
            self.ops.append(fields["op"])
            if node in self.dead or self.drop.get(self.site_of[node]) == fields["op"]:
                self.dead.add(node)
                self.silent[cid] = "no reply"
                continue
            st = SiteState(dict(self.states[node]))
            rep = handle(dict(fields), self.config_of(node), st)
            self.states[node] = dict(st.data)
            if self.after_reply is not None:
                self.after_reply(node, fields, rep)
            self.bytes_from[cid] += payload_size(rep)
            out[cid] = rep
            if on_reply is not None:
                on_reply(cid, rep)
        if len(out) < len(payloads):
            self.clock = max(self.clock, deadline)  # the missing replies time out
        return out


@pytest.fixture
def sites(tmp_path):
    rng = np.random.default_rng(5)
    arrays = [rng.normal(size=(30 + 5 * i, 3)) * 0.4 + 0.3 * i for i in range(3)]
    paths = []
    for i, X in enumerate(arrays):
        p = tmp_path / f"s{i}.npy"
        np.save(p, X)
        paths.append(str(p))
    return arrays, paths


def _cfg(tmp_path, **kw):
    base = dict(embedding="none", out_dir=str(tmp_path / "out"), landmarks=6, rounds=2, local_steps=2, gamma=0.0, init="auto",
                aggregation="secagg", value_bound=3.0, degree=2, threshold=2, min_sites=3, seed=3)
    base.update(kw)
    return FlowerRunConfig(**base)


def test_plain_equals_in_process_fed_dl(sites, tmp_path):
    arrays, paths = sites
    res = run_feddl(MemoryExchange(paths), _cfg(tmp_path, aggregation="plain"))
    ref = fed_dl(arrays, 6, rounds=2, local_steps=2, random_state=3)
    assert res["gamma"] == pytest.approx(ref.gamma, rel=1e-12)
    # same functions, same order; only BLAS summation order may differ (a few ulp)
    np.testing.assert_allclose(res["landmarks"], ref.landmarks, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rule", ["model", "gradient"])
def test_secagg_equals_in_process_within_quantisation(sites, tmp_path, rule):
    arrays, paths = sites
    res = run_feddl(MemoryExchange(paths), _cfg(tmp_path, rule=rule))
    ref = fed_dl(arrays, 6, rounds=2, local_steps=2, rule=rule, random_state=3, value_bound=3.0,
                 aggregator=SecAggAggregator(clip_range=1.0, degree=2, threshold=2, random_state=0))
    f = min(st["details"]["fixed_point"]["fractional_bits"] for st in res["steps"])
    err = np.max(np.abs(res["landmarks"] - ref.landmarks))
    assert err < 1e3 * 2.0 ** -f  # a few steps, each within n·2^-f, amplified by at most the local steps
    assert err > 0 or f >= 40
    assert res["survivors"] == [0, 1, 2]


def test_site_dropping_at_masked_stage_aborts_with_typed_error(sites, tmp_path):
    _, paths = sites
    ex = MemoryExchange(paths, drop={2: "secagg-start"})
    with pytest.raises((ProtocolAbortedError, ProtocolTimeoutError)) as ei:
        run_feddl(ex, _cfg(tmp_path, gamma=1.0))
    assert "aborted" in str(ei.value)


def test_plain_completes_without_a_dropped_site(sites, tmp_path):
    arrays, paths = sites
    res = run_feddl(MemoryExchange(paths, drop={1: "plain"}), _cfg(tmp_path, aggregation="plain", gamma=1.0, rounds=1))
    assert res["survivors"] == [0, 2]
    assert np.all(np.isfinite(res["landmarks"]))


def test_spec_codec_round_trip_and_strictness():
    agg = SecAggAggregator(clip_range=1.0, degree=2, threshold=2)
    spec = agg.round_spec(3, 10, [1.0, 1.0, 1.0])
    back = decode_spec(encode_spec(spec))
    assert back == spec and back.neighbours == spec.neighbours
    with pytest.raises(DecodeError):
        decode_spec(encode_spec(spec).replace(b'"v": 1', b'"v": 2'))
    with pytest.raises(DecodeError):
        decode_spec(b"{not json")


def test_site_reports_protocol_errors_instead_of_crashing(sites):
    _, paths = sites
    st = SiteState()
    rep = handle({"op": "secagg", "msgs": [b"junk"]}, {"data-path": paths[0]}, st)
    assert rep["error"].startswith("ProtocolError")
    rep = handle({"op": "nope"}, {"data-path": paths[0]}, st)
    assert "unknown operation" in rep["error"]


def test_no_rows_tsne_embedding_matches_in_process_placement(sites, tmp_path):
    from openTSNE import TSNE

    arrays, paths = sites
    res = run_feddl(MemoryExchange(paths), _cfg(tmp_path, aggregation="plain", embedding="tsne-local", perplexity=30.0,
                                                tsne_seed=7))
    Y = res["landmarks"]
    perp = min(30.0, (len(Y) - 1) / 3.0)
    model = TSNE(perplexity=perp, random_state=7, n_jobs=1).fit(Y)
    emb = res["embedding"]
    np.testing.assert_array_equal(emb["landmark_embedding"], np.asarray(model))
    assert list(emb["coordinates"]) == ["s0", "s1", "s2"] and not emb["missing"]
    for name, X in zip(["s0", "s1", "s2"], arrays):
        np.testing.assert_allclose(emb["coordinates"][name], model.transform(X, perplexity=perp), rtol=0, atol=1e-9)
        # only n_p × 2 coordinates came back from the site
        assert emb["bytes_from_site"][name] < 8 * 2 * len(X) + 200


def test_site_refuses_to_place_records_against_a_different_model(sites):
    _, paths = sites
    from securefed.flower.transport import array_to_bytes

    Y = np.random.default_rng(0).normal(size=(6, 3))
    wrong = np.zeros((6, 2))
    rep = handle({"op": "embed", "Y": array_to_bytes(Y), "shape": [6, 3], "perplexity": 30.0, "tsne_seed": 1,
                  "landmark_embedding": array_to_bytes(wrong), "embedding_shape": [6, 2]},
                 {"data-path": paths[0]}, SiteState())
    assert rep["error"].startswith("ProtocolError") and "differs" in rep["error"]


def test_flower_app_command_writes_a_valid_app(tmp_path, capsys):
    import argparse
    import json
    import tomllib

    from securefed.errors import ConfigError
    from securefed.cli.flower_app import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["flower-app", str(tmp_path / "app"), "--set", "rounds=3", "--set", "aggregation=plain"])
    assert args.func(args) == 0
    doc = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    assert doc["tool"]["flwr"]["app"]["components"]["serverapp"] == "securefed.flower.server_app:app"
    assert doc["tool"]["flwr"]["app"]["config"]["rounds"] == 3
    assert json.loads(capsys.readouterr().out)["run_config"]["aggregation"] == "plain"
    with pytest.raises(ConfigError):
        args = parser.parse_args(["flower-app", str(tmp_path / "b"), "--set", "nope=1"])
        args.func(args)


# --------------------------------------------------------------------------- differential privacy (issue 7)

def _dp_nodes(tmp_path, budget=5.0, n=3, **extra):
    return {i: {"epsilon-budget": budget, "allow-seeded-noise": "true", "ledger-path": str(tmp_path / f"ledgers{i}"),
                **extra} for i in range(n)}


def _site_ledger(tmp_path, site, run_id):
    from securefed.accounting import PrivacyLedger

    path = tmp_path / f"ledgers{site}" / f"{run_id}.jsonl"
    import json

    head = json.loads(path.read_text().splitlines()[0])
    return PrivacyLedger(str(path), run_id, delta=head["delta"], accountant=head["accountant"])


def test_dp_landmarks_and_accounting_equal_in_process(sites, tmp_path):
    """Seeded noise, local mode, model averaging: the same landmarks, σ, Δ and ε as fed_dl with
    GradientPerturbation(random_state=seed) — the noise streams are the same (seed, site, round, step)."""
    from securefed.accounting import GradientPerturbation

    arrays, paths = sites
    cfg = _cfg(tmp_path, aggregation="plain", epsilon=2.0, clip_norm=2.0, rounds=2, local_steps=2, run_id="dp1")
    res = run_feddl(MemoryExchange(paths, node_config=_dp_nodes(tmp_path)), cfg)
    gp = GradientPerturbation(epsilon=2.0, tau_x=2.0, random_state=3)
    ref = fed_dl(arrays, 6, rounds=2, local_steps=2, privacy=gp, random_state=3)
    np.testing.assert_array_equal(res["landmarks"], ref.landmarks)
    for key in ("epsilon", "noise_multiplier", "sigma_per_site", "sensitivity_per_site", "releases", "tau_y",
                "clipped_per_site", "epsilon_per_site", "epsilon_by_round"):
        assert res["privacy"][key] == ref.privacy[key], key
    assert res["privacy"]["epsilon"] <= 2.0 + 1e-9 and res["privacy"]["releases"] == 4
    # the aggregate ledger on the server and each site's own ledger hold the same releases as in process
    from securefed.accounting import PrivacyLedger

    server = PrivacyLedger(str(tmp_path / "out" / "ledger.jsonl"), "dp1", accountant="exact")
    def coords(ledger):
        return sorted(e["id"].split("/", 1)[1] for e in ledger.events("release"))

    assert coords(server) == coords(gp.ledger)
    for p in range(3):
        mine = _site_ledger(tmp_path, p, "dp1")
        assert {e["site"] for e in mine.events("release")} == {p}
        assert [e["release_digest"] for e in mine.events("release")] == \
            [e["release_digest"] for e in gp.ledger.events("release") if e["site"] == p]
        assert mine.spent(p)[0] == pytest.approx(ref.privacy["epsilon_per_site"][str(p)], rel=1e-12)


def test_dp_distributed_noise_secagg_gradient_settles_with_survivors(sites, tmp_path):
    from securefed.accounting import GradientPerturbation

    arrays, paths = sites
    cfg = _cfg(tmp_path, rule="gradient", epsilon=3.0, clip_norm=2.0, noise="distributed", rounds=1, local_steps=2,
               run_id="dp2")
    res = run_feddl(MemoryExchange(paths, node_config=_dp_nodes(tmp_path)), cfg)
    gp = GradientPerturbation(epsilon=3.0, tau_x=2.0, noise="distributed", random_state=3)
    ref = fed_dl(arrays, 6, rounds=1, local_steps=2, rule="gradient", privacy=gp, random_state=3,
                 aggregator=SecAggAggregator(clip_range=1.0, degree=2, threshold=2, random_state=0))
    assert res["privacy"]["sigma_per_site"] == ref.privacy["sigma_per_site"]
    assert res["privacy"]["epsilon"] == pytest.approx(ref.privacy["epsilon"], rel=1e-9)
    f = min(st["details"]["fixed_point"]["fractional_bits"] for st in res["steps"])
    assert np.max(np.abs(res["landmarks"] - ref.landmarks)) < 1e3 * 2.0 ** -f
    from securefed.accounting import PrivacyLedger

    server = PrivacyLedger(str(tmp_path / "out" / "ledger.jsonl"), "dp2", accountant="exact")
    assert len(server.events("settle")) == 2 and all(e["survivors"] == [0, 1, 2] for e in server.events("settle"))
    # every site survived (= t): the worst case each site booked at release is the actual spending, so a
    # site records no settlement on the server's word (site_settle records only ones that raise its ε)
    assert _site_ledger(tmp_path, 0, "dp2").events("settle") == []
    assert _site_ledger(tmp_path, 0, "dp2").spent()[0] == pytest.approx(res["privacy"]["epsilon"], rel=1e-9)


def test_site_refuses_over_its_budget_and_writes_nothing(sites, tmp_path):
    _, paths = sites
    nodes = _dp_nodes(tmp_path)
    nodes[1]["epsilon-budget"] = 0.5  # site s1 allows less than the run's ε = 2
    res = run_feddl(MemoryExchange(paths, node_config=nodes),
                    _cfg(tmp_path, aggregation="plain", epsilon=2.0, clip_norm=2.0, rounds=2, run_id="dp3"))
    assert res["survivors"] == [0, 2]
    assert res["site_errors"]["s1"].startswith("BudgetExceededError")
    assert not (tmp_path / "ledgers1" / "dp3.jsonl").exists() or \
        _site_ledger(tmp_path, 1, "dp3").events("release") == []
    # every site over budget: the run stops with the refusals
    with pytest.raises(ProtocolAbortedError, match="BudgetExceededError"):
        run_feddl(MemoryExchange(paths, node_config=_dp_nodes(tmp_path, budget=0.5)),
                  _cfg(tmp_path, aggregation="plain", epsilon=2.0, clip_norm=2.0, run_id="dp4", out_dir=str(tmp_path / "o4")))


def test_site_budget_covers_all_its_runs(sites, tmp_path):
    """epsilon-budget is the site's total over the runs in its ledger directory (basic composition)."""
    _, paths = sites
    nodes = _dp_nodes(tmp_path, budget=3.5)
    common = dict(aggregation="plain", clip_norm=2.0, rounds=1, local_steps=2)
    first = run_feddl(MemoryExchange(paths, node_config=nodes), _cfg(tmp_path, epsilon=2.0, run_id="life1", **common))
    assert first["privacy"]["epsilon"] == pytest.approx(2.0, rel=1e-9)
    with pytest.raises(ProtocolAbortedError, match="BudgetExceededError.*earlier run"):  # 1.5 left < 2
        run_feddl(MemoryExchange(paths, node_config=nodes),
                  _cfg(tmp_path, epsilon=2.0, run_id="life2", out_dir=str(tmp_path / "o2"), **common))
    third = run_feddl(MemoryExchange(paths, node_config=nodes),
                      _cfg(tmp_path, epsilon=1.0, run_id="life3", out_dir=str(tmp_path / "o3"), **common))
    assert third["survivors"] == [0, 1, 2]
    led = _site_ledger(tmp_path, 0, "life3")
    assert led.budget_epsilon == pytest.approx(3.5 - first["privacy"]["epsilon_per_site"]["0"], rel=1e-9)


def test_site_checks_sigma_seeded_noise_and_distributed_rules(sites, tmp_path):
    import json

    from securefed.flower.privacy import ServerPrivacy
    from securefed.flower.transport import array_to_bytes

    _, paths = sites
    cfg = _cfg(tmp_path, rule="gradient", epsilon=2.0, clip_norm=2.0, noise="distributed", run_id="dp5")
    sp = ServerPrivacy(cfg, "dp5", [30, 35, 40], [1 / 3] * 3, 0.25)
    plan = json.loads(sp.wire_plan())
    Y = np.zeros((6, 3))
    task = {"op": "secagg-start", "task": "gradient", "Y": array_to_bytes(Y), "shape": [6, 3], "gamma": 0.25, "round": 0,
            "step": 0, "site": 0, "seed": 3}
    node = {"data-path": paths[0], "site-name": "s0", "epsilon-budget": 5.0, "ledger-path": str(tmp_path / "l")}
    rep = handle(dict(task, op="plain", dp=json.dumps(plan)), dict(node, **{"allow-seeded-noise": True}), SiteState())
    assert rep["error"].startswith("ConfigError") and "secure sum" in rep["error"]
    local = dict(plan, noise="local", aggregation="plain")
    rep = handle(dict(task, op="plain", dp=json.dumps(local)), node, SiteState())
    assert rep["error"].startswith("ConfigError") and "seeded" in rep["error"]
    low = dict(plan, noise="local", aggregation="plain", sigma=[v * 0.5 for v in plan["sigma"]])
    rep = handle(dict(task, op="plain", dp=json.dumps(low)), dict(node, **{"allow-seeded-noise": True}), SiteState())
    assert rep["error"].startswith("ProtocolError") and "own calibration" in rep["error"]
    rep = handle(dict(task, op="plain", dp=json.dumps(dict(plan, noise="local", aggregation="plain"))),
                 {"data-path": paths[0], "allow-seeded-noise": True}, SiteState())
    assert "epsilon-budget" in rep["error"]
    # a site that requires DP releases no raw statistic and no raw rows
    strict = {"data-path": paths[0], "require-dp": "true"}
    rep = handle({"op": "plain", "task": "moments", "scale": 1.0, "site": 0, "seed": 0}, strict, SiteState())
    assert rep["error"].startswith("ConfigError") and "require-dp" in rep["error"]
    rep = handle({"op": "rows", "kind": "distance", "Y": array_to_bytes(Y), "shape": [6, 3], "site": 0}, strict, SiteState())
    assert "require-dp" in rep["error"]


def test_ledger_event_is_on_disk_before_the_reply_leaves_the_site(sites, tmp_path):
    import json

    _, paths = sites
    seen = []

    def check(node, fields, reply):
        if "dp_events" not in reply:
            return
        site = node - 1000
        on_disk = {json.loads(line)["id"] for line in (tmp_path / f"ledgers{site}" / "dp6.jsonl").read_text().splitlines()[1:]}
        ids = {json.loads(e)["id"] for e in reply["dp_events"]}
        assert ids and ids <= on_disk
        seen.append(len(ids))

    run_feddl(MemoryExchange(paths, node_config=_dp_nodes(tmp_path), after_reply=check),
              _cfg(tmp_path, aggregation="plain", epsilon=2.0, clip_norm=2.0, rounds=2, local_steps=3, run_id="dp6"))
    assert seen == [3] * 6  # 3 sites × 2 rounds, 3 local-step releases each


# ----------------------------------------------------------------------------------- rows mode (issue 7)

@pytest.mark.parametrize("embedding", ["tsne-rows", "spectral-rows", "umap-rows"])
def test_rows_mode_equals_the_estimator(sites, tmp_path, embedding):
    """Same data and seed: Flower's rows stage gives the estimator's embedding / labels exactly (the server
    runs the estimators' own functions on the rows the sites sent, with the same Generator)."""
    from securefed.estimators import FedSpectralClustering, FedTSNE, FedUMAP

    arrays, paths = sites
    est = {"tsne-rows": FedTSNE(n_iter=300, perplexity=10.0), "spectral-rows": FedSpectralClustering(n_clusters=3),
           "umap-rows": FedUMAP(n_neighbors=10)}[embedding]
    ex = MemoryExchange(paths)
    res = run_feddl(ex, _cfg(tmp_path, aggregation="plain", embedding=embedding, n_iter=300, perplexity=10.0,
                             n_clusters=3, n_neighbors=10))
    est.set_params(n_landmarks=6, rounds=2, local_steps=2, nystrom="rows", random_state=3, keep_sent=True)
    est.fit(arrays)
    np.testing.assert_array_equal(res["landmarks"], est.landmarks_)
    emb = res["embedding"]
    names = ["s0", "s1", "s2"]
    if embedding == "spectral-rows":
        np.testing.assert_array_equal(np.concatenate([emb["labels"][k] for k in names]), est.labels_)
    else:
        np.testing.assert_array_equal(np.vstack([emb["coordinates"][k] for k in names]), est.embedding_)
    assert emb["reconstruction"] == est.reconstruction_ and emb["sent_kind"] == est.sent_kind_
    assert emb["rows_per_site"] == {k: len(X) for k, X in zip(names, arrays)}
    assert any("give every record back" in w for w in res["warnings"]) and est.sent_kind_ in res["released"]
    assert ex.ops.count("rows") == 3


def test_rows_under_dp_need_rows_epsilon_and_are_data_perturbed(sites, tmp_path):
    from securefed.accounting import PrivacyLedger
    from securefed.errors import ConfigError
    from securefed.kernels import sq_dists

    arrays, paths = sites
    with pytest.raises(ConfigError, match="rows-epsilon"):
        run_feddl(MemoryExchange(paths, node_config=_dp_nodes(tmp_path)),
                  _cfg(tmp_path, aggregation="plain", epsilon=1.0, clip_norm=2.0, embedding="tsne-rows", run_id="r0"))
    rows_seen = {}

    def grab(node, fields, reply):
        if fields["op"] == "rows":
            rows_seen[node - 1000] = np.frombuffer(reply["rows"]).reshape(reply["rows_shape"])

    res = run_feddl(MemoryExchange(paths, node_config=_dp_nodes(tmp_path, budget=3.0), after_reply=grab),
                    _cfg(tmp_path, aggregation="plain", epsilon=1.0, clip_norm=2.0, rows_epsilon=1.0, rounds=1,
                         embedding="tsne-rows", n_iter=300, perplexity=10.0, run_id="r1"))
    rp = res["privacy"]["rows"]
    assert rp["epsilon"] == 1.0 and rp["sites"] == 3 and res["privacy"]["epsilon_total"] > res["privacy"]["epsilon"]
    # the rows are not the raw records' rows: they were computed from clipped + noisy records
    Y = res["landmarks"]
    for p, X in enumerate(arrays):
        resid = rows_seen[p] - sq_dists(X, Y)  # ≈ ‖e‖² + 2e·(x − y): mean ≈ m·σ² for noise e ~ N(0, σ²I)
        assert rp["sigma"] > 1 and np.mean(resid) > rp["sigma"]
    server = PrivacyLedger(str(tmp_path / "out" / "ledger.jsonl"), "r1", accountant="exact")
    assert sum(e["mechanism"] == "gaussian-data" for e in server.events("release")) == 3
    for p in range(3):
        assert any(e["mechanism"] == "gaussian-data" for e in _site_ledger(tmp_path, p, "r1").events("release"))


def test_spectral_local_equals_the_estimator(sites, tmp_path):
    from securefed.estimators import FedSpectralClustering

    arrays, paths = sites
    res = run_feddl(MemoryExchange(paths), _cfg(tmp_path, aggregation="plain", embedding="spectral-local", landmarks=8,
                                                n_clusters=3))
    est = FedSpectralClustering(n_clusters=3, n_landmarks=8, rounds=2, local_steps=2, nystrom="local", random_state=3,
                                refine_rounds=0).fit(arrays)
    np.testing.assert_array_equal(np.concatenate([res["embedding"]["labels"][k] for k in ["s0", "s1", "s2"]]), est.labels_)


# ---------------------------------------------------------------------------------------- audit gate

def test_audit_gate_stops_before_anything_per_record_leaves(sites, tmp_path):
    """Landmarks that are the members themselves (a server-side init of the members, a negligible step) must
    fail the default policy; nothing per record may leave a site after that."""
    from securefed.errors import AuditFailedError
    from securefed.flower.site import site_records

    _, paths = sites
    members = [site_records({"audit_holdout": 0.3, "seed": 3}, {"data-path": p, "site-name": f"s{i}"})[1]
               for i, p in enumerate(paths)]
    np.save(tmp_path / "leaky.npy", np.vstack(members))
    ex = MemoryExchange(paths)
    strict = dict(aggregation="plain", embedding="tsne-rows", landmarks=sum(len(M) for M in members), rounds=1,
                  local_steps=1, lr=1e-12, gamma=1.0, init=str(tmp_path / "leaky.npy"), audit_holdout=0.3)
    with pytest.raises(AuditFailedError, match="audit failed"):
        run_feddl(ex, _cfg(tmp_path, **strict))
    assert "rows" not in ex.ops and "embed" not in ex.ops
    import json

    block = json.loads((tmp_path / "out" / "audit.json").read_text())
    assert block["verdict"] == "fail" and block["auc"] > 0.9 and block["failures"]
    # with the override the run goes on and the failed verdict is recorded
    res = run_feddl(MemoryExchange(paths), _cfg(tmp_path, allow_audit_failure=True, n_iter=300, **strict))
    audit = res["audit"]
    assert audit["verdict"] == "fail (overridden)" and audit["failures"] and audit["auc"] > 0.9
    assert audit["mia"]["n_members"] == sum(res["site_sizes"])
    assert audit["mia"]["n_members"] + audit["mia"]["n_nonmembers"] == 30 + 35 + 40
    assert sum(res["embedding"]["rows_per_site"].values()) == 30 + 35 + 40  # hold-out records are embedded too


def test_audit_counts_through_secagg_equal_plain(sites, tmp_path):
    _, paths = sites
    common = dict(gamma=1.0, rounds=1, local_steps=1, landmarks=6, audit_holdout=0.3, embedding="none")
    a = run_feddl(MemoryExchange(paths), _cfg(tmp_path, aggregation="plain", **common))["audit"]
    b = run_feddl(MemoryExchange(paths), _cfg(tmp_path, out_dir=str(tmp_path / "o2"), **common))["audit"]
    assert b["mia"]["aggregation"] == "secagg"
    # landmarks differ within quantisation only; the counts and verdict of both audits are well-formed
    assert a["mia"]["n_members"] == b["mia"]["n_members"] and a["mia"]["n_nonmembers"] == b["mia"]["n_nonmembers"]
    assert abs(a["auc"] - b["auc"]) < 0.05


# ----------------------------------------------------------------------------------- restarted sites

def test_restarted_site_is_readmitted_with_its_ledger(sites, tmp_path):
    import json

    _, paths = sites
    restarted = {}

    class Restarting(MemoryExchange):
        def request(self, payloads, deadline, on_reply=None):
            rounds = [f.get("round") for f in payloads.values()]
            if 1 in rounds and 2 not in self.drop and not restarted:
                self.drop[2] = "plain"          # s2 crashes when round 2 starts
            out = super().request(payloads, deadline, on_reply)
            if 1 in rounds and not restarted:
                restarted["node"] = self.restart(2)   # ... and its SuperNode comes back with a new node id
            return out

    ex = Restarting(paths, node_config=_dp_nodes(tmp_path))
    res = run_feddl(ex, _cfg(tmp_path, aggregation="plain", epsilon=3.0, clip_norm=2.0, rounds=3, local_steps=1,
                             run_id="rs1"))
    assert res["readmitted"] == [{"site": "s2", "at": "before round 3"}]
    assert res["survivors"] == [0, 1, 2] and ex.nodes[2] == restarted["node"]
    state = ex.states[restarted["node"]]
    assert state["identity"] != ex.states[1002]["identity"]  # a new identity key was made and announced at the re-hello
    # its ledger on disk carried the budget: rounds 0 and 2, not round 1 (it was down)
    led = _site_ledger(tmp_path, 2, "rs1")
    assert sorted(e["round"] for e in led.events("release")) == [0, 2]
    server = [json.loads(x) for x in (tmp_path / "out" / "ledger.jsonl").read_text().splitlines()[1:]]
    assert sorted(e["round"] for e in server if e["site"] == 2) == [0, 2]
    assert res["privacy"]["epsilon_per_site"]["2"] < res["privacy"]["epsilon_per_site"]["0"]


def test_restarted_site_with_other_data_is_not_readmitted(sites, tmp_path):
    _, paths = sites

    class Restarting(MemoryExchange):
        def request(self, payloads, deadline, on_reply=None):
            out = super().request(payloads, deadline, on_reply)
            if any(f.get("op") == "plain" for f in payloads.values()) and 2 in self.drop and len(self.site_of) == 3:
                node = self.restart(2)
                self.node_config[2] = {"data-path": paths[0]}  # comes back with another file
                self.site_of[node] = 2
            return out

    ex = Restarting(paths, drop={2: "plain"})
    res = run_feddl(ex, _cfg(tmp_path, aggregation="plain", gamma=1.0, rounds=3))
    assert res["readmitted"] == [] and res["survivors"] == [0, 1]


def test_restarted_site_seen_before_its_old_node_drops_is_readmitted_later(sites, tmp_path):
    """s2's SuperNode restarts (new node) while its old node still answers; the old node then dies. The
    new node must not be locked out as a 'stranger' at the first boundary: it is re-admitted once s2 is
    noticed as dropped (s1, dead from the start, makes every boundary look for fresh nodes)."""
    _, paths = sites
    seen = {"plain": 0}

    class Restarting(MemoryExchange):
        def request(self, payloads, deadline, on_reply=None):
            if any(f.get("op") == "plain" for f in payloads.values()):
                seen["plain"] += 1
                if seen["plain"] == 3:
                    self.dead.add(1002)               # the old s2 node dies in round 3
            out = super().request(payloads, deadline, on_reply)
            if seen["plain"] == 1 and "new" not in seen:
                seen["new"] = self.restart(2)         # the new s2 node appears while the old one still answers
            return out

    ex = Restarting(paths, drop={1: "plain"})
    res = run_feddl(ex, _cfg(tmp_path, aggregation="plain", gamma=1.0, rounds=4, min_sites=2))
    assert [r["site"] for r in res["readmitted"]] == ["s2"]
    assert res["survivors"] == [0, 2] and ex.nodes[2] == seen["new"]


# ------------------------------------------------------------------------------------------- CKKS wiring

def test_ckks_aggregation_with_distributed_noise_matches_secagg(sites, tmp_path):
    """aggregation="ckks" goes through ckks_flow (F2) with the sites' DP releases mirrored and settled."""
    from securefed.accounting import PrivacyLedger

    _, paths = sites
    common = dict(rule="gradient", rounds=1, local_steps=2, epsilon=3.0, clip_norm=2.0, noise="distributed")
    a = run_feddl(MemoryExchange(paths, node_config=_dp_nodes(tmp_path)),
                  _cfg(tmp_path, aggregation="ckks", run_id="ck1", **common))
    b = run_feddl(MemoryExchange(paths, node_config=_dp_nodes(tmp_path / "second")),  # fresh site budgets
                  _cfg(tmp_path, out_dir=str(tmp_path / "o2"), run_id="ck2", **common))
    assert [st["details"]["key_holder"] for st in a["steps"]] == [0, 0]
    # the same seeded noise; the two secure sums differ only by their rounding (CKKS step, SecAgg+ 2^-f)
    np.testing.assert_allclose(a["landmarks"], b["landmarks"], rtol=0, atol=1e-4)
    assert a["privacy"]["epsilon"] == pytest.approx(b["privacy"]["epsilon"], rel=1e-12)
    led = PrivacyLedger(str(tmp_path / "out" / "ledger.jsonl"), "ck1", accountant="exact")
    assert len(led.events("release")) == 6 and len(led.events("settle")) == 2


def test_distributed_noise_with_a_dropout_is_settled_with_the_actual_survivors(sites, tmp_path):
    import json

    _, paths = sites
    ex = MemoryExchange(paths, drop={2: "ckks-start"}, node_config=_dp_nodes(tmp_path))
    res = run_feddl(ex, _cfg(tmp_path, aggregation="ckks", rule="gradient", rounds=1, local_steps=1, epsilon=3.0,
                             clip_norm=2.0, noise="distributed", min_survivors=2, run_id="ck3"))
    assert res["survivors"] == [0, 1]
    events = [json.loads(x) for x in (tmp_path / "out" / "ledger.jsonl").read_text().splitlines()[1:]]
    settle = [e for e in events if e["type"] == "settle"]
    assert len(settle) == 1 and settle[0]["survivors"] == [0, 1]
    # closed form (GradientPerturbation._mu_sum): μ_p = w_p Δ_p / √(Σ_{k∈K} (w_k σ_k)²), K = survivors
    pr = res["privacy"]
    w = np.array(res["site_sizes"], float) / sum(res["site_sizes"])
    sig, dl = np.array(pr["sigma_per_site"]), np.array(pr["sensitivity_per_site"])
    for p in (0, 1):
        rid = next(e["id"] for e in events if e["type"] == "release" and e["site"] == p)
        mu = w[p] * dl[p] / np.sqrt(np.sum((w[:2] * sig[:2]) ** 2))
        assert settle[0]["releases"][rid] == pytest.approx(1.0 / mu, rel=1e-12)
    assert not any(e["type"] == "release" and e["site"] == 2 for e in events)


def test_restarted_site_rejoins_secagg_with_its_new_identity_key(tmp_path):
    """4 sites, SecAgg+ degree 3 / threshold 2: s3 crashes in round 1 (the round completes without it), its
    SuperNode restarts (new node id, new Ed25519 key) and round 2 sums all 4 — its signed SecAgg+ messages
    verify only because the re-hello announced the new key in round 2's spec."""
    rng = np.random.default_rng(7)
    paths = []
    for i in range(4):
        np.save(tmp_path / f"q{i}.npy", rng.normal(size=(25, 3)) * 0.5)
        paths.append(str(tmp_path / f"q{i}.npy"))

    class Restarting(MemoryExchange):
        def request(self, payloads, deadline, on_reply=None):
            out = super().request(payloads, deadline, on_reply)
            if 3 in self.drop and any(f["op"] == "secagg" for f in payloads.values()) and len(self.site_of) == 4:
                self.restart(3)
            return out

    ex = Restarting(paths, drop={3: "secagg-start"})
    res = run_feddl(ex, _cfg(tmp_path, gamma=1.0, init="public", rounds=2, local_steps=1, degree=3, threshold=2,
                             min_sites=4))
    rounds = [st for st in res["steps"] if st["label"].startswith("round")]
    assert rounds[0]["survivors"] == [0, 1, 2] and rounds[1]["survivors"] == [0, 1, 2, 3]
    assert res["readmitted"] == [{"site": "s3", "at": "before round 2"}]
    assert ex.states[ex.nodes[3]]["identity"] != ex.states[1003]["identity"]


@pytest.mark.parametrize("lie", ["size", "gamma", "landmarks"])
def test_site_refuses_a_request_that_disagrees_with_its_dp_plan(sites, tmp_path, lie):
    """A server that announces numbers in the DP plan other than those it uses (100× a site's record
    count, a small γ in the plan and a large one in the request, other landmarks) would shrink the site's
    noise: the site checks and refuses before any release reaches its ledger."""
    import json

    _, paths = sites

    class Lying(MemoryExchange):
        def request(self, payloads, deadline, on_reply=None):
            out = {}
            for cid, f in payloads.items():
                f = dict(f)
                if "dp" in f and cid == 0:
                    plan = json.loads(f["dp"])
                    if lie == "size":
                        plan["sizes"][0] *= 100
                        f["dp"] = json.dumps(plan)
                    elif lie == "gamma":
                        f["gamma"] = float(f["gamma"]) * 10
                    else:
                        from securefed.flower.transport import array_from_bytes, array_to_bytes

                        Y = array_from_bytes(f["Y"], f["shape"])[:-1]
                        f["Y"], f["shape"] = array_to_bytes(Y), list(Y.shape)
                out[cid] = f
            return MemoryExchange.request(self, out, deadline, on_reply)

    res = run_feddl(Lying(paths, node_config=_dp_nodes(tmp_path)),
                    _cfg(tmp_path, aggregation="plain", epsilon=2.0, clip_norm=2.0, rounds=2, run_id="lie"))
    assert res["survivors"] == [1, 2]
    assert res["site_errors"]["s0"].startswith("ProtocolError") and "refusing" in res["site_errors"]["s0"]
    assert _site_ledger(tmp_path, 0, "lie").events("release") == []


def test_distributed_noise_sets_the_secagg_clients_survivor_floor():
    """Under distributed noise a site's SecAgg+ client signs only survivor sets of at least the plan's t
    (the SecAgg+ unit test shows the refusal); without DP or with local noise the floor is 1."""
    import json

    from securefed.flower.site import _dp_min_survivors

    plan = {"noise": "distributed", "min_survivors": None, "sizes": [30, 35, 40]}
    assert _dp_min_survivors({"dp": json.dumps(plan)}, 3) == 3
    assert _dp_min_survivors({"dp": json.dumps(dict(plan, min_survivors=2))}, 3) == 2
    assert _dp_min_survivors({"dp": json.dumps(dict(plan, noise="local"))}, 3) == 1
    assert _dp_min_survivors({}, 3) == 1


def test_secagg_clipping_over_flower_is_counted_and_warned(sites, tmp_path):
    """A value bound far below the data: the sites' SecAgg+ clients clip coordinates into the public range;
    the count reaches the aggregation's stats and a ClippingWarning is raised (never silent)."""
    from securefed.securesum.quantize import ClippingWarning

    _, paths = sites
    with pytest.warns(ClippingWarning, match="over Flower"):
        res = run_feddl(MemoryExchange(paths), _cfg(tmp_path, value_bound=0.01, gamma=1.0, rounds=1, local_steps=1))
    assert sum(st["clipped"] for st in res["steps"]) > 0
