"""The Flower deployment's logic without Flower: coordinator + site handlers over an in-memory exchange.

Every site request goes through ``site.handle`` with a fresh state object rebuilt from stored bytes
(as in a fresh ClientApp process), so these tests also prove the SecAgg+ client state survives the
store/load between messages. Results are compared with in-process ``fed_dl``.
"""

import numpy as np
import pytest

from securefed.errors import DecodeError, ProtocolAbortedError, ProtocolTimeoutError
from securefed.landmarks import fed_dl
from securefed.protocols import SecAggAggregator
from securefed.protocols.flower.coordinator import FlowerRunConfig, run_feddl
from securefed.protocols.flower.site import SiteState, handle
from securefed.protocols.flower.transport import decode_spec, encode_spec, payload_size


class MemoryExchange:
    """Same interface as transport.Exchange; delivers to site.handle in process. ``drop={site: op}``
    makes a site silent from the first request with that op on (a crashed SuperNode)."""

    def __init__(self, paths, drop=None):
        self.paths = paths
        self.nodes = {i: 1000 + i for i in range(len(paths))}
        self.states = {1000 + i: {} for i in range(len(paths))}
        self.bytes_to = {i: 0 for i in self.nodes}
        self.bytes_from = {i: 0 for i in self.nodes}
        self.silent, self.messages, self.clock = {}, 0, 0.0
        self.drop, self.dead = dict(drop or {}), set()

    def now(self):
        return self.clock

    def request(self, payloads, deadline, on_reply=None):
        out = {}
        for cid, fields in payloads.items():
            node = self.nodes[cid]
            self.messages += 1
            self.bytes_to[cid] += payload_size(fields)
            if node in self.dead or self.drop.get(node - 1000) == fields["op"]:
                self.dead.add(node)
                self.silent[cid] = "no reply"
                continue
            st = SiteState(dict(self.states[node]))
            rep = handle(dict(fields), {"data-path": self.paths[node - 1000], "site-name": f"s{node - 1000}"}, st)
            self.states[node] = dict(st.data)
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
    base = dict(embedding="none", out_dir=str(tmp_path / "out"), landmarks=6, rounds=2, local_steps=2, gamma=0.0, init="moments",
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
    from securefed.protocols.flower.transport import array_to_bytes

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
    from securefed.protocols.flower.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["flower-app", str(tmp_path / "app"), "--set", "rounds=3", "--set", "aggregation=plain"])
    assert args.func(args) == 0
    doc = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    assert doc["tool"]["flwr"]["app"]["components"]["serverapp"] == "securefed.protocols.flower.server_app:app"
    assert doc["tool"]["flwr"]["app"]["config"]["rounds"] == 3
    assert json.loads(capsys.readouterr().out)["run_config"]["aggregation"] == "plain"
    with pytest.raises(ConfigError):
        args = parser.parse_args(["flower-app", str(tmp_path / "b"), "--set", "nope=1"])
        args.func(args)
