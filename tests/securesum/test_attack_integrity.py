"""Issue 13, attacks 3 and 4 inverted: integrity everywhere, and one bad client costs only itself.

* A byte-level + structured fuzz corpus of real messages through the state machines (one message of a round
  rewritten on the wire, either direction; a client that raises is dropped, as a deployment drops a site that
  returns an error). Before the fix: 2000 SecAgg+ rounds gave 134 silently wrong sums and 43 wrong sums
  returned although something had been rejected; CKKS 2 + 3. Now: **0 wrong sums of either kind** — every
  round is correct over its survivors or aborted with nothing released (the fuzz never changes a client's own
  input, the one thing no protocol without range proofs can check).
* The named attack cases (a forwarded share dropped, a masked input replaced or relabelled, a revealed
  share replaced, a dealer masking with another seed, a dealer whose shares do not match its commitment, a
  revealer lying about a share) each give the exact sum over the others or an abort naming the culprit.
* A signed low-order X25519 key or signed garbage share ciphertexts from one client: the round completes
  without that client (before: every honest neighbour aborted).

Every SecAgg+ case runs under both schedules (the ``schedule`` fixture of conftest.py): input at construction, and
input late-bound after the share stage.
"""

import collections
import dataclasses
import os

import numpy as np
import pytest

from securefed.securesum import crypto
from securefed.securesum.graph import choose_parameters
from securefed.securesum.messages import (
    AdvertiseKeys,
    EncryptedShares,
    ForwardedShares,
    MaskedInput,
    UnmaskResponse,
    decode,
    encode,
    peek_header,
)
from securefed.securesum.quantize import dequantize, plan_fixed_point
from securefed.securesum.runner import run_secagg_round
from securefed.securesum.secagg import DEFAULT_TIMEOUTS, RoundSpec, advert_payload, share_item_payload, unmask_payload
from securefed.securesum.secagg_client import SecAggClient

_KEYS: dict = {}
FB = 4


def identities(n):
    if n not in _KEYS:
        keys = [crypto.ed25519_keypair() for _ in range(n)]
        _KEYS[n] = (tuple(k for k, _ in keys), tuple(p for _, p in keys))
    return _KEYS[n]


def make_round(n, d=6, seed=0):
    gp = choose_parameters(n)
    sid = os.urandom(16)
    fp = plan_fixed_point(1000.0, np.ones(n), modulus_bits=32, fractional_bits=FB)
    spec = RoundSpec(
        sid, 0, n, gp.degree, gp.threshold, sid, d, fp, identities(n)[1], tuple(DEFAULT_TIMEOUTS.items()), gp.quorum
    )
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-500 * 2**FB, 500 * 2**FB, d) / 2**FB for _ in range(n)]
    return spec, xs, rng


def outcome(spec, xs, out) -> str:
    """correct / aborted / wrong_silent / wrong_flagged (the classification of a fuzzed round)."""
    if out.error is not None or out.result is None:
        return "aborted"
    got = dequantize(out.result, spec.fixed_point)
    if np.array_equal(got, np.sum([xs[u] for u in out.survivors], axis=0)):
        return "correct"
    return "wrong_flagged" if (out.rejected or out.client_errors) else "wrong_silent"


def secagg(spec, xs, rng, intercept=None, clients=None):
    return run_secagg_round(
        spec, identities(spec.n_clients)[0], xs, np.ones(spec.n_clients), rng, intercept=intercept, clients=clients
    )


# ------------------------------------------------------------------------------------------- mutators


def mutate_bytes(data: bytes, rng) -> tuple[str, bytes]:
    """A byte-level mutation of a whole encoded message (header included)."""
    from securefed.securesum.messages import HEADER

    b = bytearray(data)
    op = str(rng.choice(["bitflip", "byte", "bitflip_body", "truncate", "extend", "zero_run"]))
    if op == "bitflip":
        i = int(rng.integers(len(b)))
        b[i] ^= 1 << int(rng.integers(8))
    elif op == "bitflip_body":
        i = int(rng.integers(HEADER.size, len(b)))
        b[i] ^= 1 << int(rng.integers(8))
    elif op == "byte":
        b[int(rng.integers(len(b)))] = int(rng.integers(256))
    elif op == "truncate":
        b = b[: int(rng.integers(len(b)))]
    elif op == "extend":
        b += os.urandom(int(rng.integers(1, 8)))
    else:
        i = int(rng.integers(len(b)))
        j = min(len(b), i + int(rng.integers(1, 16)))
        b[i:j] = bytes(j - i)
    return op, bytes(b)


def mutate_fields(data: bytes, rng, n: int) -> tuple[str, list]:
    """A structured mutation that keeps the message well-formed: drop / duplicate / reorder entries, another
    sender, a flipped vector word, a dropped survivor, a changed share value, a dropped or repeated message."""
    msg = decode(data)
    flds = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    tuples = [k for k, v in flds.items() if isinstance(v, tuple) and v and k not in ("survivors", "peers")]
    ops = ["drop_message", "duplicate_message"] + (
        ["drop_entry", "duplicate_entry", "reverse_entries"] if tuples else []
    )
    ops += [
        o
        for o, k in (
            ("swap_sender", "sender"),
            ("perturb_word", "data"),
            ("drop_survivor", "survivors"),
            ("drop_peer", "peers"),
        )
        if k in flds and flds[k] not in ((), b"")
    ]
    if flds.get("self_shares") or flds.get("key_shares"):
        ops.append("perturb_share")
    op = str(rng.choice(ops))
    if op == "drop_message":
        return op, []
    if op == "duplicate_message":
        return op, [data, data]
    if op in ("drop_entry", "duplicate_entry", "reverse_entries"):
        k = str(rng.choice(tuples))
        items = list(flds[k])
        i = int(rng.integers(len(items)))
        if op == "drop_entry":
            items.pop(i)
        elif op == "duplicate_entry":
            items.insert(i, items[i])
        else:
            items.reverse()
        return f"{op}:{k}", [encode(dataclasses.replace(msg, **{k: tuple(items)}))]
    if op == "swap_sender":
        return op, [encode(dataclasses.replace(msg, sender=int((msg.sender + 1 + rng.integers(n - 1)) % n)))]
    if op == "perturb_word":
        b = bytearray(msg.data)
        b[int(rng.integers(len(b)))] ^= 1 << int(rng.integers(8))
        return op, [encode(dataclasses.replace(msg, data=bytes(b)))]
    if op in ("drop_survivor", "drop_peer"):
        k = "survivors" if op == "drop_survivor" else "peers"
        s = list(flds[k])
        s.pop(int(rng.integers(len(s))))
        return op, [encode(dataclasses.replace(msg, **{k: tuple(s)}))]
    k = "self_shares" if msg.self_shares and (not msg.key_shares or rng.random() < 0.5) else "key_shares"
    items = list(getattr(msg, k))
    i = int(rng.integers(len(items)))
    items[i] = dataclasses.replace(items[i], value=(items[i].value + 1) % (1 << 256))
    return f"{op}:{k}", [encode(dataclasses.replace(msg, **{k: tuple(items)}))]


def one_mutation(target: int, rng, n: int, tag: dict):
    counter = [0]

    def intercept(direction, who, data):
        i = counter[0]
        counter[0] += 1
        if i != target:
            return [data]
        structured = rng.random() < 0.5
        op, datas = mutate_fields(data, rng, n) if structured else (lambda o, d: (o, [d]))(*mutate_bytes(data, rng))
        tag.update(key=f"{direction}:{peek_header(data)[0].__name__}:{op}")
        return datas

    return intercept


def fuzz_secagg(cases: int, seed: int = 20250113):
    rng = np.random.default_rng(seed)
    counts, by_key = collections.Counter(), collections.defaultdict(collections.Counter)
    for case in range(cases):
        spec, xs, r = make_round(5, seed=case)
        tag: dict = {}
        out = secagg(spec, xs, r, one_mutation(int(rng.integers(45)), rng, 5, tag))
        kind = outcome(spec, xs, out)
        counts[kind] += 1
        by_key[tag.get("key")][kind] += 1
    return counts, by_key


@pytest.mark.usefixtures("schedule")
def test_fuzz_corpus_secagg_gives_no_wrong_sum():
    counts, by_key = fuzz_secagg(300)
    assert counts["wrong_silent"] == counts["wrong_flagged"] == 0, {
        k: dict(v) for k, v in by_key.items() if v["wrong_silent"] or v["wrong_flagged"]
    }
    assert counts["correct"] > 200  # most mutations cost one client at most


@pytest.mark.slow
@pytest.mark.usefixtures("schedule")
def test_fuzz_corpus_secagg_2000_rounds():
    counts, by_key = fuzz_secagg(2000, seed=7)
    assert counts["wrong_silent"] == counts["wrong_flagged"] == 0, {
        k: dict(v) for k, v in by_key.items() if v["wrong_silent"] or v["wrong_flagged"]
    }


def fuzz_ckks(cases: int, verify: str, seed: int):
    from securefed.securesum.ckks import choose_ckks_parameters, run_ckks_round

    n, d = 3, 16
    params = choose_ckks_parameters(d, 1e-6, float(n), n)
    priv, pub = identities(n)
    rng = np.random.default_rng(seed)
    counts, by_key = collections.Counter(), collections.defaultdict(collections.Counter)
    for _ in range(cases):
        xs = [rng.uniform(-1, 1, d) for _ in range(n)]
        tag: dict = {}
        out = run_ckks_round(
            params,
            priv,
            pub,
            xs,
            np.ones(n),
            1.0,
            verify=verify,
            intercept=one_mutation(int(rng.integers(20)), rng, n, tag),
        )
        if out.error is not None:
            kind = "aborted"
        else:
            err = float(np.max(np.abs(out.total - np.sum([xs[u] for u in out.survivors], axis=0))))
            ok = err <= 3 * params.step  # flood + rounding: far below any mutation's effect
            kind = "correct" if ok else ("wrong_flagged" if (out.rejected or out.client_errors) else "wrong_silent")
        counts[kind] += 1
        by_key[tag.get("key")][kind] += 1
    return counts, by_key


def _wrong(by_key):
    return {k: dict(v) for k, v in by_key.items() if v["wrong_silent"] or v["wrong_flagged"]}


def test_fuzz_corpus_ckks_gives_no_wrong_sum():
    counts, by_key = fuzz_ckks(16, "recompute", 77)
    assert counts["wrong_silent"] == counts["wrong_flagged"] == 0, _wrong(by_key)


@pytest.mark.slow
@pytest.mark.parametrize("verify", ["recompute", "signatures"])
def test_fuzz_corpus_ckks_150_rounds(verify):
    counts, by_key = fuzz_ckks(150, verify, 78)
    if verify == "recompute":
        assert counts["wrong_silent"] == counts["wrong_flagged"] == 0, _wrong(by_key)
    else:  # documented: this mode trusts the server's sum; a wrong sum can come only from the sum it sends
        assert all(k.startswith("down:DecryptRequest") for k in _wrong(by_key)), _wrong(by_key)


# -------------------------------------------------------------------------------------- named cases


def _only(cls, direction, who, fn):
    done = set()  # the sessions it fired in: once per round (the same intercept serves both schedules)

    def intercept(d, w, data):
        head = peek_header(data)
        if head[1] in done or d != direction or head[0] is not cls or w != who:
            return [data]
        done.add(head[1])
        return fn(decode(data))

    return intercept


def _forwarded_without_dealer_1(m):
    return [encode(dataclasses.replace(m, items=tuple(it for it in m.items if it.peer != 1)))]


class _OtherSeed(SecAggClient):
    """Deals shares of the committed seed b, then masks with another one (its own value becomes garbage)."""

    def _on_keys(self, msg):
        out = super()._on_keys(msg)
        self._b = os.urandom(32)
        return out


class _InconsistentDealer(SecAggClient):
    """Deals (and masks with) a seed other than the one it committed to: its signed share hashes convict it."""

    def _on_keys(self, msg):
        self._b = os.urandom(32)
        return super()._on_keys(msg)


class _LyingRevealer(SecAggClient):
    """Reveals a wrong self-mask share of one peer (and signs its lie)."""

    def _on_unmask(self, msg):
        m = decode(super()._on_unmask(msg)[0])
        s = list(m.self_shares)
        s[0] = dataclasses.replace(s[0], value=(s[0].value + 1) % (1 << 256))
        sig = crypto.sign(
            self._identity,
            unmask_payload(self.spec.session_id, self.spec.round_index, self.spec.digest, self.id, s, m.key_shares),
        )
        return [encode(dataclasses.replace(m, self_shares=tuple(s), signature=sig))]


def _factory(cls, who, n, d=6):
    def make(spec, xs, rng):
        return [(cls if i == who else SecAggClient)(spec, i, identities(n)[0][i], xs[i], 1.0, rng) for i in range(n)]

    return make


NAMED = {  # name → (intercept, client factory, vector length, expected: ("correct", dropped) | ("aborted", culprit))
    "forwarded_shares_entry_dropped": (
        _only(ForwardedShares, "down", 0, _forwarded_without_dealer_1),
        None,
        6,
        ("correct", 1),
    ),
    "masked_input_replaced": (
        _only(MaskedInput, "up", 2, lambda m: [encode(dataclasses.replace(m, data=os.urandom(len(m.data))))]),
        None,
        6,
        ("correct", 2),
    ),
    "masked_input_sender_swapped": (
        _only(MaskedInput, "up", 2, lambda m: [encode(dataclasses.replace(m, sender=3))]),
        None,
        6,
        ("correct", 2),
    ),
    "unmask_response_self_share_replaced": (
        _only(
            UnmaskResponse,
            "up",
            0,
            lambda m: [
                encode(
                    dataclasses.replace(
                        m, self_shares=(dataclasses.replace(m.self_shares[0], value=7),) + m.self_shares[1:]
                    )
                )
            ],
        ),
        None,
        6,
        ("correct", None),
    ),
    "dealer_masks_with_another_seed": (None, _factory(_OtherSeed, 4, 5), 64, ("aborted", None)),
    "dealer_shares_off_its_commitment": (None, _factory(_InconsistentDealer, 4, 5), 6, ("aborted", 4)),
    "revealer_lies_about_a_share": (None, _factory(_LyingRevealer, 0, 5), 6, ("correct", None)),
}


@pytest.mark.usefixtures("schedule")
@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_integrity_case(name):
    intercept, factory, d, (want, who) = NAMED[name]
    spec, xs, rng = make_round(5, d=d, seed=7)
    out = secagg(spec, xs, rng, intercept, None if factory is None else factory(spec, xs, rng))
    kind = outcome(spec, xs, out)
    assert kind == want, (name, kind, out.error, out.rejected)
    if want == "correct" and who is not None:
        assert who not in out.survivors and len(out.survivors) == 4
    if want == "aborted":
        assert "sum withheld" in str(out.error) and out.result is None
        if who is not None:
            assert out.blame == (who,) and f"client {who}" in str(out.error)
    if name == "revealer_lies_about_a_share":
        assert any("does not match the hash its dealer signed" in r for r in out.rejected)


# ------------------------------------------------------------------------------ one bad client (attack 4)

_LOW_ORDER = bytes(32)  # u = 0: X25519 refuses it (all-zero shared secret)


class _LowOrderKey(SecAggClient):
    def start(self, now=0.0):
        m = decode(super().start(now)[0])
        spec = self.spec
        sig = crypto.sign(
            self._identity,
            advert_payload(spec.session_id, spec.round_index, self.id, spec.digest, _LOW_ORDER, m.s_pk, m.commit),
        )
        self._c_pk = _LOW_ORDER
        return [encode(dataclasses.replace(m, c_pk=_LOW_ORDER, signature=sig))]


class _GarbageShares(SecAggClient):
    def _on_keys(self, msg):
        m = decode(super()._on_keys(msg)[0])
        spec, items = self.spec, []
        for it in m.items:
            ct = os.urandom(len(it.ciphertext))
            sig = crypto.sign(
                self._identity,
                share_item_payload(
                    spec.session_id, spec.round_index, spec.digest, self.id, it.peer, ct, it.h_b, it.h_s
                ),
            )
            items.append(dataclasses.replace(it, ciphertext=ct, signature=sig))
        return [encode(EncryptedShares(m.session_id, m.round_index, self.id, tuple(items)))]


@pytest.mark.usefixtures("schedule")
@pytest.mark.parametrize("bad", [_LowOrderKey, _GarbageShares])
@pytest.mark.parametrize("n", [5, 10])
def test_one_bad_client_is_dropped_and_the_round_completes(bad, n):
    spec, xs, rng = make_round(n, seed=n)
    out = secagg(spec, xs, rng, clients=_factory(bad, 0, n)(spec, xs, rng))
    assert out.error is None and outcome(spec, xs, out) == "correct"
    assert out.survivors == tuple(range(1, n)) and out.client_errors == {}  # no honest client aborted
    if bad is _LowOrderKey:
        assert any("X25519 public key is invalid" in r for r in out.rejected)
    else:
        assert out.dropped_at["masked"] == (0,)  # left out by every neighbour, so dropped after masking


def test_ckks_low_order_key_of_one_client_costs_only_that_client():
    from securefed.securesum.ckks import CKKSClient, choose_ckks_parameters, run_ckks_round

    class LowOrder(CKKSClient):
        def start(self, now=0.0):
            m = decode(super().start(now)[0])
            spec = self.spec
            sig = crypto.sign(
                self._identity,
                advert_payload(spec.session_id, spec.round_index, self.id, spec.digest, _LOW_ORDER, m.s_pk, m.commit),
            )
            return [encode(AdvertiseKeys(m.session_id, m.round_index, self.id, _LOW_ORDER, m.s_pk, m.commit, sig))]

    n, d = 5, 8
    params = choose_ckks_parameters(d, 1e-6, float(n), n)
    priv, pub = identities(n)
    xs = [np.random.default_rng(i).uniform(-1, 1, d) for i in range(n)]
    from securefed.securesum.ckks.params import CKKSRoundSpec

    def clients_for(spec):
        return [(LowOrder if i == 1 else CKKSClient)(spec, i, priv[i], xs[i]) for i in range(n)]

    spec_probe = CKKSRoundSpec(os.urandom(16), 0, n, 0, params, 1.0, pub, max_abs_sum=float(n))
    out = run_ckks_round(
        params,
        priv,
        pub,
        xs,
        np.ones(n),
        1.0,
        session_id=spec_probe.session_id,
        max_abs_sum=float(n),
        clients=clients_for(spec_probe),
    )
    assert out.error is None and out.survivors == (0, 2, 3, 4)  # client 1 (even the fallback) is simply left out
    assert np.max(np.abs(out.total - np.sum([xs[u] for u in out.survivors], axis=0))) < 3 * params.step
