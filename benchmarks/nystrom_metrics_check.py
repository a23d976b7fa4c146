"""Plausibility of securefed.metrics: centralized openTSNE on a built-in dataset, all metrics + timing.

Compare with the paper's tSNE column (Qiao et al. (arXiv:2412.13495) Table 1, MNIST-70k: CA-10NN 0.966, NPA-1NN 0.418,
NPA-10NN 0.391). Usage: ``OMP_NUM_THREADS=1 python benchmarks/nystrom_metrics_check.py [digits|mnist5k]``
"""

from __future__ import annotations

import argparse
import json
import time

from openTSNE import TSNE

from securefed.data import load_dataset
from securefed.metrics import embedding_metrics


def main(name: str = "digits", seed: int = 0) -> None:
    ds = load_dataset(name)
    t = time.time()
    emb = TSNE(random_state=seed, n_jobs=1).fit(ds.X)
    t_tsne = time.time() - t
    t = time.time()
    m = embedding_metrics(ds.X, emb, ds.y, random_state=seed)
    print(
        json.dumps(
            {
                "dataset": name,
                "n": ds.n_samples,
                "tsne_s": round(t_tsne, 1),
                "metrics_s": round(time.time() - t, 1),
                **{k: round(v, 4) for k, v in m.items()},
            }
        )
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", default="digits", help="built-in data set (digits, mnist5k)")
    main(ap.parse_args().name)
