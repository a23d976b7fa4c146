"""CKKS round (the sans-I/O machines) in both decryptor-check modes vs raw TenSEAL: wall and CPU seconds.

    OMP_NUM_THREADS=1 python3 benchmarks/protocols_ckks_verify.py --clients 10 --length 1000000 --repeats 2

Each repeat runs raw TenSEAL (same parameters: N clients' encrypt + serialise, deserialise + add on a
public context, decrypt) and one :func:`securefed.securesum.ckks.run_ckks_round` per ``verify`` mode,
in alternating order, and reports wall time and this process's CPU time (``time.process_time``; on
a shared machine CPU time is the steadier figure). ``decryptor_download_bytes`` is what the decryptor
receives: in ``recompute`` mode every survivor's upload plus the sum, in ``signatures`` mode only the
sum and the signed digests.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import tenseal as ts

from securefed.securesum import ckks, crypto


def raw_tenseal(params, xs) -> dict:
    w0, c0 = time.perf_counter(), time.process_time()
    ctx = ckks._make_context(params)
    pub = ts.context_from(ckks._public_bytes(ctx))
    uploads = [ckks.encrypt_vector(ctx, x, params.slots) for x in xs]
    total = ckks.sum_ciphertexts(pub, uploads)
    out = np.concatenate([np.asarray(ts.ckks_vector_from(ctx, c).decrypt()) for c in total])
    res: dict = {"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0}
    assert np.max(np.abs(out[: xs[0].size] - np.sum(xs, axis=0))) < 1e-3
    return res


def securefed_round(params, keys, xs, verify: str) -> dict:
    w0, c0 = time.perf_counter(), time.process_time()
    out = ckks.run_ckks_round(
        params, [k for k, _ in keys], [p for _, p in keys], xs, np.ones(len(xs)), 1.0, verify=verify
    )
    res: dict = {"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0}
    assert out.error is None, out.error
    res["max_abs_error"] = float(np.max(np.abs(out.total - np.sum(xs, axis=0))))
    res["decryptor_download_bytes"] = int(out.bytes_down[out.decryptor])
    res["timings"] = {k: {w: round(s, 3) for w, s in v.items()} for k, v in out.timings.items()}
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--length", type=int, default=1_000_000)
    ap.add_argument("--precision", type=float, default=1e-6)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    xs = [rng.uniform(-1, 1, args.length) for _ in range(args.clients)]
    params = ckks.choose_ckks_parameters(args.length, args.precision, float(args.clients), args.clients)
    keys = [crypto.ed25519_keypair() for _ in range(args.clients)]
    for r in range(args.repeats):
        order = ["raw", "recompute", "signatures"] if r % 2 == 0 else ["signatures", "recompute", "raw"]
        row = {}
        for what in order:
            row[what] = raw_tenseal(params, xs) if what == "raw" else securefed_round(params, keys, xs, what)
        line = {
            "repeat": r,
            "clients": args.clients,
            "length": args.length,
            "step": params.step,
            "n_ciphertexts": params.n_ciphertexts,
        }
        for mode in ("recompute", "signatures"):
            line[mode] = {
                k: (round(v, 3) if isinstance(v, float) and k in ("wall", "cpu") else v) for k, v in row[mode].items()
            }
            line[f"ratio_wall_{mode}"] = round(row[mode]["wall"] / row["raw"]["wall"], 3)
            line[f"ratio_cpu_{mode}"] = round(row[mode]["cpu"] / row["raw"]["cpu"], 3)
        line["raw"] = {k: round(v, 3) for k, v in row["raw"].items()}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
