"""CKKS (TenSEAL): sum within the stated precision, server context cannot decrypt, key handoff faults."""

import numpy as np
import pytest
import tenseal as ts

from securefed.errors import ConfigError, OverflowRiskError
from securefed.securesum import CKKSAggregator, simulate
from securefed.securesum import ckks


def test_ckks_sum_within_stated_precision_and_weights():
    rng = np.random.default_rng(0)
    ups = [rng.uniform(-1, 1, 5000) for _ in range(4)]
    w = [1.0, 2.0, 0.5, 3.0]
    agg = CKKSAggregator(clip_range=1.0, precision=1e-6, random_state=0)
    res = agg.aggregate(ups, w)
    exact = sum(wi * u for wi, u in zip(w, ups))
    step = res.details["precision"]
    assert step <= 1e-6 and np.max(np.abs(res.total - exact)) < res.details["error_bound"]
    assert res.details["error_bound"] < 2 * step  # the flood (σ ≈ 1e-8 here) costs less than the rounding
    assert res.protocol == "ckks" and res.survivors == (0, 1, 2, 3) and res.weight_sum == pytest.approx(6.5)
    # the release lies on the stated grid (randomised rounding), so raw decryption noise is not released
    assert np.allclose(res.total / step, np.round(res.total / step), atol=1e-6)
    p = res.details["params"]
    assert sum(p["coeff_mod_bit_sizes"]) <= ckks.MAX_COEFF_BITS[p["poly_modulus_degree"]]
    assert p["n_ciphertexts"] == int(np.ceil(5000 / p["slots"]))


def test_server_context_is_public_and_cannot_decrypt():
    params = ckks.choose_ckks_parameters(100, 1e-6, 200.0, 3)
    ctx = ckks._make_context(params)
    server = ckks.load_public_context(ckks._public_bytes(ctx))
    assert server.is_private() is False
    ct = ckks.encrypt_vector(ctx, np.arange(100.0), params.slots)
    total = ckks.sum_ciphertexts(server, [ct, ct])
    with pytest.raises(ValueError, match="secret"):
        ts.ckks_vector_from(server, total[0]).decrypt()
    # handing the server a private context is refused
    from securefed.errors import AuthenticationError

    with pytest.raises(AuthenticationError):
        ckks.load_public_context(ckks._secret_bytes(ctx))
    out = ckks.decrypt_sum(ckks.ts.context_from(ckks._secret_bytes(ctx)), total, 100, params.step)
    # grid values: rounding (< step) plus CKKS error (≤ step/64) can land one step off, never more
    assert np.max(np.abs(out - 2 * np.arange(100.0))) < ckks.release_error_bound(params.step)


def test_randomized_rounding_unbiased_and_bounded():
    x = np.full(100_000, 0.3)
    r = ckks.randomized_round(x, 1.0)
    assert set(np.unique(r)) <= {0.0, 1.0} and abs(r.mean() - 0.3) < 0.01


def test_parameters_grow_with_precision_and_refuse_impossible():
    small = ckks.choose_ckks_parameters(10, 1e-3, 10.0, 2)
    big = ckks.choose_ckks_parameters(10, 1e-12, 1e3, 100)
    assert small.poly_modulus_degree <= big.poly_modulus_degree and big.scale_bits >= small.scale_bits
    assert sum(big.coeff_mod_bit_sizes[:-1]) > sum(small.coeff_mod_bit_sizes[:-1])
    with pytest.raises(OverflowRiskError):
        ckks.choose_ckks_parameters(10, 1e-200, 1e300, 10)
    # finer than float64 carries at the largest sum (clip 1e4 × 3 sites, 1e-12): refused with the reason
    with pytest.raises(OverflowRiskError, match="float64"):
        ckks.choose_ckks_parameters(10, 1e-12, 3e4, 3)
    with pytest.raises(ConfigError):
        CKKSAggregator()


def test_key_holder_dropout_another_client_decrypts_and_total_loss_aborts():
    r = simulate("ckks", clients=4, length=300, dropout={0: "decrypt"}, seed=1)
    # r["error_bound"] is already release_error_bound(step): compare against it directly
    # the key holder uploaded its input, then vanished before decrypting: another key-holding client decrypts
    assert not r["aborted"] and r["max_abs_error"] < r["error_bound"] and r["survivors"] == [0, 1, 2, 3]
    r2 = simulate("ckks", clients=4, length=30, dropout={0: "advertise"}, seed=1)
    assert r2["aborted"] and r2["error_type"] == "ProtocolAbortedError"


@pytest.mark.parametrize(
    "kind,err",
    [
        ("ciphertext", "AuthenticationError"),
        ("signature", None),
        ("replay", "UnexpectedMessageError"),
        ("reorder", "UnexpectedMessageError"),
        ("wrong_round", "DecodeError"),
        ("truncate", "DecodeError"),
    ],
)
def test_ckks_faults_are_refused_by_the_client_that_gets_them(kind, err):
    r = simulate("ckks", clients=3, length=20, tamper=kind, seed=0)
    assert not r["aborted"] and r["max_abs_error"] < r["error_bound"]
    if err is None:
        assert r["client_errors"] == {}
    else:
        assert list(r["client_errors"]) == ["1"] and r["client_errors"]["1"].startswith(err)
