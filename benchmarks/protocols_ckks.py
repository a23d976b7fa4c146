"""CKKS secure sum (securefed, full protocol) vs TenSEAL's raw encrypt + add + decrypt, same parameters.

    OMP_NUM_THREADS=1 python3 benchmarks/protocols_ckks.py --clients 10 --length 1000000

securefed: one :func:`securefed.securesum.ckks.run_ckks_round` (signed key advertisement, key
generation, AES-GCM key handoff, clip + encrypt per client, strict codec, homomorphic sum on the public
context, decrypt + randomised rounding). Raw: the same TenSEAL parameters, N clients' ``ckks_vector``
encryptions + serialisation, deserialisation on a public context, ``add_``, decryption.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import tenseal as ts

from securefed.securesum import ckks, crypto


def raw_tenseal(params, xs) -> float:
    t0 = time.perf_counter()
    ctx = ckks._make_context(params)
    pub = ts.context_from(ckks._public_bytes(ctx))
    uploads = [ckks.encrypt_vector(ctx, x, params.slots) for x in xs]
    total = ckks.sum_ciphertexts(pub, uploads)
    out = np.concatenate([np.asarray(ts.ckks_vector_from(ctx, c).decrypt()) for c in total])
    secs = time.perf_counter() - t0
    assert np.max(np.abs(out[: xs[0].size] - np.sum(xs, axis=0))) < 1e-3
    return secs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--length", type=int, default=1_000_000)
    ap.add_argument("--precision", type=float, default=1e-6)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    xs = [rng.uniform(-1, 1, args.length) for _ in range(args.clients)]
    params = ckks.choose_ckks_parameters(args.length, args.precision, float(args.clients), args.clients)
    keys = [crypto.ed25519_keypair() for _ in range(args.clients)]
    t0 = time.perf_counter()
    out = ckks.run_ckks_round(params, [k for k, _ in keys], [p for _, p in keys], xs, np.ones(args.clients), 1.0)
    ours = time.perf_counter() - t0
    assert out.error is None, out.error
    err = float(np.max(np.abs(out.total - np.sum(xs, axis=0))))
    raw = raw_tenseal(params, xs)
    # the stated bound now includes the decryption flood (M = Σ weights × clip, R = key holder + 1 fallback)
    sigma = ckks.flood_sigma(params.scale_bits, args.clients, float(args.clients), ckks.FLOOD_BITS, 2)
    up = int(np.mean([out.bytes_up[i] for i in range(1, args.clients)]))
    # timings: {stage: {"clients": s, "server": s}} (RoundOutcome), server_sum included in "input"'s server time
    print(
        json.dumps(
            {
                "clients": args.clients,
                "length": args.length,
                "params": params.as_dict(),
                "securefed_seconds": round(ours, 3),
                "raw_tenseal_seconds": round(raw, 3),
                "ratio": round(ours / raw, 3),
                "max_abs_error": err,
                "stated_precision": params.step,
                "release_error_bound": ckks.release_error_bound(params.step, sigma, args.length),
                "bytes_up_per_client": up,
                "timings": {k: {w: round(s, 3) for w, s in v.items()} for k, v in out.timings.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
