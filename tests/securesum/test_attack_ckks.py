"""Issue 13, attack 5 inverted: CKKS decryption hygiene, and who can read what (computed, not asserted).

Before the fix: a spec with step 2^-60 was accepted and the release carried 31.5 bits of raw
decryption error; precision finer than float64 broke the stated bound 19.7×; the rounding flooded the CKKS
error only to a statistical distance of 2^-7.9 per coordinate; a decryptor's 1.95e278 was accepted as the sum;
and every site received the secret key, so the server plus ANY one site read every upload.
"""

import dataclasses
import math
import os

import numpy as np
import pytest

from securefed.errors import ConfigError, OverflowRiskError
from securefed.federation import SiteWorker
from securefed.securesum import crypto
from securefed.securesum.ckks import (
    CKKSClient,
    CKKSRoundSpec,
    check_ckks_params,
    choose_ckks_parameters,
    decode_ckks_spec,
    encode_ckks_spec,
    flood_shift,
    flood_sigma,
    gaussian_noise,
    release_error_bound,
    run_ckks_round,
)
from securefed.securesum.ckks import context as cx
from securefed.securesum.messages import DecryptRequest, SignedInput, decode, encode, peek_header

_KEYS: dict = {}


def identities(n):
    if n not in _KEYS:
        keys = [crypto.ed25519_keypair() for _ in range(n)]
        _KEYS[n] = (tuple(k for k, _ in keys), tuple(p for _, p in keys))
    return _KEYS[n]


def test_a_step_below_the_ckks_error_is_refused_everywhere():
    n, d = 3, 256
    p0 = choose_ckks_parameters(d, 1e-6, float(n), n)
    tiny = dataclasses.replace(p0, step=2.0**-60)
    assert any("below 2^6 x the CKKS error" in r for r in check_ckks_params(tiny, n, float(n)))
    with pytest.raises(ConfigError, match="raw decryption noise"):
        CKKSRoundSpec(b"\x01" * 16, 0, n, 0, tiny, 1.0, identities(n)[1])
    good = CKKSRoundSpec(b"\x01" * 16, 0, n, 0, p0, 1.0, identities(n)[1])
    raw = encode_ckks_spec(good).replace(repr(p0.step).encode(), repr(2.0**-60).encode())
    with pytest.raises(ConfigError, match="key-recovery risk"):
        decode_ckks_spec(raw)
    # a site answers the server's spec with the reason, before computing anything
    w = SiteWorker({"site-name": "s"}, np.random.default_rng(0).normal(size=(10, 2)))
    rep = w.handle(
        {
            "op": "ckks-start",
            "site": 1,
            "spec": raw,
            "task": "stats",
            "want": ["moments"],
            "scale": 1.0,
            "weights": "uniform",
        }
    )
    assert rep["error"].startswith("ConfigError") and "raw decryption noise" in rep["error"]
    assert "ckks_client" not in w.state


def test_precision_beyond_float64_is_refused_with_the_reason():
    n, clip, prec = 3, 1e4, 1e-12
    with pytest.raises(OverflowRiskError, match="cannot be released to .* in float64"):
        choose_ckks_parameters(4096, prec, n * clip, n)
    p = choose_ckks_parameters(4096, 1e-9, n * clip, n)
    fine = dataclasses.replace(p, step=2.0**-40)
    assert any("finer than float64" in r for r in check_ckks_params(fine, n, n * clip))


def test_flood_is_sized_for_lambda_bits_and_covers_the_measured_shift():
    """σ = 8·√R·2^(λ/2)·E with E = e_max + 2 ulp(M) ≥ the measured raw error; per-coordinate TV = E/(2σ)."""
    n, d = 10, 4096
    M = float(n)
    params = choose_ckks_parameters(d, 1e-6, M, n)
    ctx = cx.make_context(params)
    rng = np.random.default_rng(2)
    xs = [rng.uniform(-1, 1, d) for _ in range(n)]
    total = cx.sum_ciphertexts(ctx, [cx.encrypt_vector(ctx, x, params.slots) for x in xs])
    raw = cx.decrypt_vectors(cx.vectors(ctx, total, "sum"), d)
    exact = np.array([math.fsum(col) for col in np.array(xs).T])
    E = flood_shift(params.scale_bits, n, M)
    assert float(np.max(np.abs(raw - exact))) <= E  # the shift the flood hides is bounded as stated
    for R in (1, 2, 3):
        sigma = flood_sigma(params.scale_bits, n, M, 40, R)
        assert sigma == pytest.approx(8 * math.sqrt(R) * 2**20 * E)
        assert math.log2(E / (2 * sigma)) == pytest.approx(-(4 + math.log2(R) / 2 + 20))  # 2^-24.5 at R = 2
    sigma = flood_sigma(params.scale_bits, n, M, 40, 2)
    assert 1e-9 < sigma < params.step / 10  # the flood costs less than the rounding at the default precision
    z = gaussian_noise(200_000, 1.0)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01  # the CSPRNG Gaussian
    bound = release_error_bound(params.step, sigma, d)
    assert bound == pytest.approx(params.step * (1 + 2**-6) + math.sqrt(2 * math.log(2 * d * 2.0**40)) * sigma)


def test_a_decryptor_releasing_an_impossible_sum_is_blamed_and_the_fallback_decrypts():
    class Liar(CKKSClient):
        def _on_decrypt(self, msg):
            m = decode(super()._on_decrypt(msg)[0])
            bogus = np.full(self.spec.params.length, 1.95e278).astype("<f8").tobytes()
            sig = crypto.sign(
                self._identity,
                cx.decrypted_payload(
                    self.spec.session_id, self.spec.round_index, self.id, self.spec.digest, m.step, bogus
                ),
            )
            return [encode(dataclasses.replace(m, data=bogus, signature=sig))]

    n, d = 3, 16
    params = choose_ckks_parameters(d, 1e-6, float(n), n)
    priv, pub = identities(n)
    xs = [np.random.default_rng(i).uniform(-1, 1, d) for i in range(n)]
    for fallbacks, completes in (((1,), True), ((), False)):
        spec = CKKSRoundSpec(os.urandom(16), 0, n, 0, params, 1.0, pub, max_abs_sum=float(n), fallbacks=fallbacks)
        clients = [(Liar if i == 0 else CKKSClient)(spec, i, priv[i], xs[i]) for i in range(n)]
        out = run_ckks_round(
            params,
            priv,
            pub,
            xs,
            np.ones(n),
            1.0,
            session_id=spec.session_id,
            max_abs_sum=float(n),
            fallbacks=fallbacks,
            clients=clients,
        )
        assert out.blame == (0,) and any("lies outside |sum|" in r for r in out.rejected), out.rejected
        if completes:
            assert out.error is None and out.decryptor == 1
            assert np.max(np.abs(out.total - np.sum(xs, axis=0))) < 3 * params.step
        else:
            assert out.total is None and "no client holding the CKKS key" in str(out.error)


def test_who_can_read_an_upload_with_the_server():
    """The statement in docs/threat-model-secure-sum.md, measured: with every upload the server holds, the key
    holder and the fallback decrypt each site's individual update (float64 precision); any other site holds a
    public context that decrypts nothing, and so does the server."""
    n, d = 4, 64
    params = choose_ckks_parameters(d, 1e-6, float(n), n)
    priv, pub = identities(n)
    xs = [np.random.default_rng(10 + i).uniform(-1, 1, d) for i in range(n)]
    spec = CKKSRoundSpec(os.urandom(16), 0, n, 0, params, 1.0, pub, max_abs_sum=float(n))
    clients = [CKKSClient(spec, i, priv[i], xs[i]) for i in range(n)]
    uploads, held = {}, {}

    def watch(direction, who, data):
        cls = peek_header(data)[0]
        if direction == "up" and cls is SignedInput:
            uploads[who] = decode(data).chunks
        if direction == "down" and cls is DecryptRequest and not held:  # every client still holds its context
            held.update({i: c._ctx for i, c in enumerate(clients)})
        return [data]

    out = run_ckks_round(
        params,
        priv,
        pub,
        xs,
        np.ones(n),
        1.0,
        session_id=spec.session_id,
        max_abs_sum=float(n),
        clients=clients,
        intercept=watch,
    )
    assert out.error is None and spec.decryptors == (0, 1)
    reads = {}
    for site, ctx in held.items():
        errs = []
        for victim in range(n):
            try:
                got = cx.decrypt_vectors(cx.vectors(ctx, uploads[victim], "upload"), d)
                errs.append(float(np.max(np.abs(got - xs[victim]))))
            except ValueError:
                errs.append(None)
        reads[site] = errs
    assert all(e is not None and e < 1e-12 for s in (0, 1) for e in reads[s])  # key holder, fallback: everything
    assert all(e is None for s in (2, 3) for e in reads[s])  # the other sites: nothing
    assert all(not c.is_private() for s, c in held.items() if s >= 2)


# ------------------------------------------------------------------ the flood is really added (issue 22)


def _flood_sigma_closed_form(scale_bits: int, n: int, M: float, bits: int, R: int) -> float:
    """σ = 8·√R·2^(λ/2)·E with E = 2^(14 + ⌈½ log2 n⌉ − s) + 2·ulp(M) (Li, Micciancio, Schultz & Sorrell 2022),
    written out here from the module docstring rather than taken from the code."""
    e_max = 2.0 ** (14 + math.ceil(0.5 * math.log2(n)) - scale_bits)
    return 8.0 * math.sqrt(R) * 2.0 ** (bits / 2) * (e_max + 2.0 * float(np.spacing(M)))


def test_the_decryptor_adds_a_flood_of_the_announced_size():
    """A decryption is ``round_step(decode(m + e) + η)``, η ~ N(0, σ²) per slot. At the default precision the
    rounding step (≈ 1e-6) hides a σ of ≈ 1e-8, so the flood is measured with a step the parameter check still
    accepts (2^-40, above 64 × the CKKS error) where σ is ~10⁴ steps: the released sum then deviates from the
    exact one by η alone, and over 4096 coordinates its sample deviation is σ within a few per cent — a decryptor
    that adds no flood (or a smaller one) releases deviations ~1e-12 and fails. Two decryptions of the same sum
    (two rounds over the same inputs) differ by √2·σ."""
    n, d, M = 3, 4096, 3.0
    p0 = choose_ckks_parameters(d, 1e-6, M, n)
    params = dataclasses.replace(p0, step=2.0**-40)
    assert check_ckks_params(params, n, M) == []  # a step every party accepts
    sigma = _flood_sigma_closed_form(params.scale_bits, n, M, 40, 2)
    assert sigma > 1e4 * params.step
    priv, pub = identities(n)
    rng = np.random.default_rng(5)
    xs = [rng.uniform(-1, 1, d) for _ in range(n)]
    exact = np.array([math.fsum(col) for col in np.array(xs).T])
    releases = []
    for _ in range(2):
        spec = CKKSRoundSpec(os.urandom(16), 0, n, 0, params, 1.0, pub, max_abs_sum=M)
        assert spec.flood_sigma == pytest.approx(sigma, rel=1e-12)  # the σ the round announces
        out = run_ckks_round(params, priv, pub, xs, np.ones(n), 1.0, session_id=spec.session_id, max_abs_sum=M)
        assert out.error is None
        dev = out.total - exact
        assert abs(float(np.mean(dev))) < 6 * sigma / math.sqrt(d)
        assert 0.9 * sigma < float(np.std(dev)) < 1.1 * sigma, (float(np.std(dev)), sigma)
        # Gaussian, not a shift: |η| < σ/100 for 0.8 % of the slots (without a flood, every slot would be)
        assert float(np.mean(np.abs(dev) < sigma / 100)) < 0.03
        releases.append(out.total)
    diff = releases[1] - releases[0]
    assert 0.9 * math.sqrt(2) * sigma < float(np.std(diff)) < 1.1 * math.sqrt(2) * sigma


def test_a_decrypted_sum_at_another_step_is_refused_and_the_fallback_decrypts():
    """The server accepts a DecryptedSum only at the spec's rounding step: a key holder that releases its
    decryption at a finer grid (raw decryption noise, the key-recovery risk the step guards against) — signed, in
    range — is refused; the fallback decrypts at the stated step instead."""

    class FineStep(CKKSClient):
        def _on_decrypt(self, msg):
            m = decode(super()._on_decrypt(msg)[0])
            fine = self.spec.params.step / 1024
            vals = np.frombuffer(m.data, dtype="<f8") + 5 * fine  # off the stated grid, well inside the range
            data = vals.astype("<f8").tobytes()
            sig = crypto.sign(
                self._identity,
                cx.decrypted_payload(
                    self.spec.session_id, self.spec.round_index, self.id, self.spec.digest, fine, data
                ),
            )
            return [encode(dataclasses.replace(m, step=fine, data=data, signature=sig))]

    n, d = 3, 16
    params = choose_ckks_parameters(d, 1e-6, float(n), n)
    priv, pub = identities(n)
    xs = [np.random.default_rng(20 + i).uniform(-1, 1, d) for i in range(n)]
    spec = CKKSRoundSpec(os.urandom(16), 0, n, 0, params, 1.0, pub, max_abs_sum=float(n), fallbacks=(1,))
    clients = [(FineStep if i == 0 else CKKSClient)(spec, i, priv[i], xs[i]) for i in range(n)]
    out = run_ckks_round(
        params,
        priv,
        pub,
        xs,
        np.ones(n),
        1.0,
        session_id=spec.session_id,
        max_abs_sum=float(n),
        fallbacks=(1,),
        clients=clients,
    )
    assert any("wrong step" in r for r in out.rejected), out.rejected
    assert out.error is None and out.decryptor == 1
    grid = out.total / params.step
    assert np.array_equal(grid, np.round(grid))  # released at the stated step
    assert np.max(np.abs(out.total - np.sum(xs, axis=0))) < spec.release_bound
