"""``embedding.png``: the map as a reader needs it — class names in a legend, the site of each record by marker
shape (or a second panel coloured by site when there are many sites), and the quality figures and the privacy
mode in every panel's title. The centralized panel says that it was computed on pooled records: a data-dependent
release that exists only in this simulation.

:func:`plot_run` draws a list of :class:`Panel`; :func:`standard_panels` builds the usual ones of a run
(federated, centralized, and for spectral clustering the PCA views), :func:`privacy_line` and
:func:`metrics_line` give the title lines.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence, cast

import numpy as np

__all__ = [
    "Panel",
    "plot_run",
    "plot_density",
    "standard_panels",
    "privacy_line",
    "metrics_line",
    "draw_panels",
    "MAX_LEGEND_CLASSES",
    "MAX_MARKER_SITES",
    "palette",
]

MAX_LEGEND_CLASSES = 20  # more classes: a colour bar instead of a legend
MAX_MARKER_SITES = 8  # more sites: a second panel coloured by site instead of marker shapes
#: Kelly's colours of maximum contrast (without white and black): the clusters' palette — never the classes'
#: (tab10 / tab20), so a cluster's colour never looks like a class's colour on one figure
KELLY = (
    "#F3C300",
    "#875692",
    "#F38400",
    "#A1CAF1",
    "#BE0032",
    "#C2B280",
    "#848482",
    "#008856",
    "#E68FAC",
    "#0067A5",
    "#F99379",
    "#604E97",
    "#F6A600",
    "#B3446C",
    "#DCD300",
    "#882D17",
    "#8DB600",
    "#654522",
    "#E25822",
    "#2B3D26",
)
TITLE_WIDTH = 58  # characters per title line of a panel (longer lines wrap instead of running into the next)
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_AGG = {"plain": "plain sums", "secagg": "SecAgg+", "ckks": "CKKS"}
_METHOD = {"tsne": "Fed-tSNE", "umap": "Fed-UMAP", "spectral": "Fed-SpeClust"}
_CENTRAL = {"tsne": "t-SNE", "umap": "UMAP", "spectral": "spectral clustering"}


@dataclass
class Panel:
    """One scatter of the figure.

    title : first title line (e.g. ``"Fed-tSNE (label partition, 10 sites)"``)
    coords : (n, 2) array
    colour : (n,) class or cluster codes, or None (one colour, or the sites' colours when ``sites`` is given)
    colour_kind : ``"class"`` (legend from ``class_names``), ``"cluster"`` (``cluster k``) or ``"site"``
    sites : (n,) site index of each record, or None — shown by marker shape (≤ 8 sites)
    metrics : a title line of quality figures (:func:`metrics_line`), or None
    privacy : a title line on the privacy mode (:func:`privacy_line`) or the pooled-data note, or None
    """

    title: str
    coords: np.ndarray
    colour: np.ndarray | None = None
    colour_kind: str = "class"
    sites: np.ndarray | None = None
    metrics: str | None = None
    privacy: str | None = None


def _fmt_eps(x) -> str:
    return f"{float(x):.3g}"


def privacy_line(mode: dict | None, privacy: dict | None = None) -> str:
    """``"no rows · SecAgg+ · ε=1 (δ=1e-05)"``, ``"rows mode — records reconstructible · plain sums"`` …

    ``mode``: the run's mode (``config.json`` / ``metrics.json`` ``mode``: aggregation, dp, nystrom, method,
    rows_privacy); ``privacy``: the ``metrics.json`` privacy block (ε, δ) or None.
    """
    mode = mode or {}
    nys = str(mode.get("nystrom") or "").lower()
    spectral = "spectral" in str(mode.get("method") or "")
    if nys == "local":
        first = f"no rows (each site {'labels' if spectral else 'places'} its own records)"
    elif nys in ("rows", "paper", "kernel_rows", "perturbed_rows"):
        if mode.get("rows_privacy") or nys == "perturbed_rows":
            first = "rows of noised records (data perturbation)"
        else:
            first = f"{'kernel ' if spectral or nys == 'kernel_rows' else ''}rows mode — records reconstructible"
    else:
        first = "what left the sites: see the report"
    parts = [
        first,
        _AGG.get(str(mode.get("aggregation") or "").lower(), str(mode.get("aggregation") or "aggregation ?")),
    ]
    eps = (privacy or {}).get("epsilon")
    if mode.get("dp") or eps is not None:
        if eps is not None:
            delta = (privacy or {}).get("delta")
            void = (privacy or {}).get("epsilon_void") or "seeded" in str(
                (privacy or {}).get("noise_source", "")
            ).lower()
            parts.append(
                f"ε={_fmt_eps(eps)}"
                + (f" (δ={delta:.0e})" if isinstance(delta, (int, float)) else "")
                + (" VOID: seeded test noise" if void else "")
            )
        else:
            parts.append("differential privacy")
    else:
        parts.append("no differential privacy")
    return " · ".join(parts)


def metrics_line(method: str, metrics: dict | None) -> str | None:
    """``"CA-10NN 0.926 · trustworthiness 0.991"`` (maps) or ``"NMI 0.72 · ARI 0.61"`` (clusterings); None if none."""
    m = metrics or {}
    keys = (
        (("nmi", "NMI"), ("ari", "ARI"))
        if method == "spectral"
        else (("ca_10nn", "CA-10NN"), ("trustworthiness", "trustworthiness"), ("nmi", "NMI"))
    )
    parts = [f"{label} {m[k]:.3f}" for k, label in keys if isinstance(m.get(k), (int, float)) and math.isfinite(m[k])]
    if method != "spectral" and len(parts) == 3:
        parts = parts[:2]
    return " · ".join(parts) or None


def _site_index(site_sizes: Sequence[int] | None, n: int) -> np.ndarray | None:
    if not site_sizes or sum(int(s) for s in site_sizes) != n:
        return None
    return np.repeat(np.arange(len(site_sizes)), [int(s) for s in site_sizes])


def _where(partition: str | None, n_sites: int | None) -> str:
    """Where the records come from, for the federated panel's title: the partition (``"label partition"``, or
    ``partition`` as given when it names no split) and the number of sites, as far as they are known."""
    split = partition in ("iid", "label") or str(partition).startswith("dirichlet")  # a data set split into sites
    return ", ".join(
        p
        for p in (
            f"{partition} partition" if split else (str(partition) if partition else None),
            f"{n_sites} sites" if n_sites else None,
        )
        if p
    )


def standard_panels(
    method: str,
    federated,
    *,
    y=None,
    site_sizes=None,
    centralized=None,
    X=None,
    mode: dict | None = None,
    privacy: dict | None = None,
    fed_metrics: dict | None = None,
    cen_metrics: dict | None = None,
    partition: str | None = None,
) -> list[Panel]:
    """The panels of a run's ``embedding.png``.

    method : "tsne" | "umap" | "spectral" (or a related system's name: drawn like a map)
    federated : (n, 2) coordinates of all sites stacked in site order, or (n,) cluster labels (spectral)
    y : (n,) true class codes or None; site_sizes : records per site (site order), for the marker shapes
    centralized : the centralized method on the pooled records (coordinates or labels), or None
    X : (n, m) records — spectral only, for the PCA view
    mode / privacy : for :func:`privacy_line`; fed_metrics / cen_metrics : for :func:`metrics_line`
    """
    federated = np.asarray(federated)
    n = len(federated)
    sites = _site_index(site_sizes, n)
    where = _where(partition, len(site_sizes) if site_sizes else None)
    name = _METHOD.get(method, method)
    fed_privacy = privacy_line(dict(mode or {}, method=method), privacy)
    pooled = "pooled records — no privacy; exists only in this simulation"
    if method == "spectral":
        from sklearn.decomposition import PCA

        P2 = PCA(2, random_state=0).fit_transform(np.asarray(X, dtype=np.float64))
        panels = [
            Panel(
                f"{name} clusters (PCA view{', ' + where if where else ''})",
                P2,
                federated,
                "cluster",
                sites,
                metrics_line(method, fed_metrics),
                fed_privacy,
            )
        ]
        if centralized is not None:
            panels.append(
                Panel(
                    "centralized spectral clusters on pooled data (PCA view)",
                    P2,
                    np.asarray(centralized),
                    "cluster",
                    None,
                    metrics_line(method, cen_metrics),
                    pooled,
                )
            )
        if y is not None:
            panels.append(
                Panel(
                    "true labels (PCA view)",
                    P2,
                    np.asarray(y),
                    "class",
                    None,
                    None,
                    "PCA of the pooled records — exists only in this simulation",
                )
            )
        return panels
    panels = [
        Panel(
            f"{name}{' (' + where + ')' if where else ''}",
            federated,
            None if y is None else np.asarray(y),
            "class",
            sites,
            metrics_line(method, fed_metrics),
            fed_privacy,
        )
    ]
    if centralized is not None:
        panels.append(
            Panel(
                f"centralized {_CENTRAL.get(method, method)} on pooled data",
                np.asarray(centralized),
                None if y is None else np.asarray(y),
                "class",
                None,
                metrics_line(method, cen_metrics),
                pooled,
            )
        )
    return panels


def palette(kind: str, n: int) -> list:
    """``n`` RGBA colours for ``kind`` ∈ {"class", "cluster", "site"}: classes tab10 / tab20, clusters Kelly's colours
    of maximum contrast, sites Dark2 (≤ 8) or ``n`` hues spread evenly round the colour wheel at two lightnesses —
    three different palettes, so one colour never means two things on one figure, and no two sites look alike."""
    import matplotlib.colors as mcolors
    from matplotlib import colormaps

    if kind == "cluster":
        return [mcolors.to_rgba(KELLY[i % len(KELLY)]) for i in range(n)]
    if kind == "site":
        if n <= 8:
            return [colormaps["Dark2"](i) for i in range(n)]
        rgb = [mcolors.hsv_to_rgb((i / n, 0.85, 0.55 if i % 2 else 0.9)) for i in range(n)]
        return [(float(r), float(g), float(b), 1.0) for r, g, b in rgb]
    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _wrap(text: str) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, TITLE_WIDTH, break_on_hyphens=False)) if len(text) > TITLE_WIDTH else text


def _colours(codes: np.ndarray, kind: str, class_names, plt):
    """RGBA per record, legend handles (or a ScalarMappable for a colour bar) for ``codes``."""
    from matplotlib.lines import Line2D

    uniq = np.unique(codes)
    if len(uniq) <= MAX_LEGEND_CLASSES:
        lut = dict(zip(uniq.tolist(), palette(kind, len(uniq))))
        rgba = np.array([lut[c] for c in codes.tolist()])

        def label(u):
            if kind == "cluster":
                return f"cluster {u}"
            if kind == "site":
                return (
                    str(class_names[int(u)])
                    if class_names is not None and 0 <= int(u) < len(class_names)
                    else f"site {u}"
                )
            if class_names is not None and isinstance(u, (int, np.integer)) and 0 <= int(u) < len(class_names):
                return str(class_names[int(u)])
            return str(u)

        handles = [Line2D([], [], ls="", marker="o", ms=7, color=lut[u], label=label(u)) for u in uniq.tolist()]
        return rgba, handles, None
    import matplotlib as mpl

    norm = mpl.colors.Normalize(vmin=float(np.min(codes)), vmax=float(np.max(codes)))
    sm = mpl.cm.ScalarMappable(norm=norm, cmap=plt.get_cmap("viridis"))
    return sm.to_rgba(codes.astype(float)), None, sm


def draw_panels(panels: Sequence[Panel], *, class_names=None, site_names=None, panel_size: float = 5.6):
    """The matplotlib figure of :func:`plot_run` (caller closes it)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    panels = list(panels)
    # many sites: a panel coloured by site after the first one that has sites, instead of marker shapes
    for i, p in enumerate(panels):
        if p.sites is not None and len(np.unique(p.sites)) > MAX_MARKER_SITES and p.colour is not None:
            panels.insert(
                i + 1,
                Panel(
                    f"the same map, coloured by site ({len(np.unique(p.sites))} sites)",
                    p.coords,
                    p.sites,
                    "site",
                    None,
                    None,
                    p.privacy,
                ),
            )
            break
    fig, axes = plt.subplots(1, len(panels), figsize=(panel_size * len(panels), panel_size + 0.9), squeeze=False)
    legends: list = []
    for ax, p in zip(axes[0], panels):
        E = np.asarray(p.coords, dtype=np.float64)
        n = len(E)
        size = float(np.clip(9000.0 / max(n, 1), 4.0, 28.0))
        names = site_names if p.colour_kind == "site" else class_names
        if p.colour is not None:
            rgba, handles, sm = _colours(np.asarray(p.colour), p.colour_kind, names, plt)
        elif p.sites is not None:
            rgba, handles, sm = None, None, None
        else:
            rgba, handles, sm = np.tile(np.array(plt.get_cmap("tab10")(0)), (n, 1)), None, None
        few_sites = p.sites is not None and len(np.unique(p.sites)) <= MAX_MARKER_SITES
        if few_sites:
            site_colours = palette("site", int(np.max(p.sites)) + 1)
            for s in np.unique(p.sites):
                m = p.sites == s
                col = rgba[m] if rgba is not None else [site_colours[int(s)]]
                ax.scatter(E[m, 0], E[m, 1], c=col, marker=_MARKERS[int(s) % len(_MARKERS)], s=size, linewidths=0)
        else:
            ax.scatter(E[:, 0], E[:, 1], c=rgba, s=size, linewidths=0)
        if sm is not None:
            fig.colorbar(
                sm,
                ax=ax,
                fraction=0.046,
                pad=0.02,
                label={"class": "class", "cluster": "cluster", "site": "site"}[p.colour_kind],
            )
        if handles:
            key = (p.colour_kind, tuple(h.get_label() for h in handles))
            if key not in [k for k, _ in legends]:
                title = {"class": "class", "cluster": "cluster", "site": "site"}[p.colour_kind]
                legends.append((key, (handles, title)))
        if few_sites:
            sh = [
                Line2D(
                    [],
                    [],
                    ls="",
                    marker=_MARKERS[int(s) % len(_MARKERS)],
                    ms=7,
                    color="0.35",
                    label=str(site_names[int(s)])
                    if site_names is not None and int(s) < len(site_names)
                    else f"site {int(s)}",
                )
                for s in np.unique(p.sites)
            ]
            key = ("marker", tuple(h.get_label() for h in sh))
            if key not in [k for k, _ in legends]:
                legends.append((key, (sh, "site (marker)")))
        lines = [_wrap(x) for x in [p.title] + [x for x in (p.metrics, p.privacy) if x]]
        ax.set_title("\n".join(lines), fontsize=10, loc="left")
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout(w_pad=2.5)
    y = 0.98
    for _, (handles, title) in legends:
        leg = fig.legend(
            handles=handles,
            title=title,
            loc="upper left",
            bbox_to_anchor=(1.0, y),
            fontsize=8,
            title_fontsize=9,
            frameon=False,
            ncol=1 if len(handles) <= 12 else 2,
        )
        fig.add_artist(leg)
        y -= 0.05 + 0.032 * math.ceil(len(handles) / (1 if len(handles) <= 12 else 2))
    return fig


def plot_run(
    path,
    panels: Sequence[Panel | tuple],
    *,
    class_names: Sequence[str] | None = None,
    site_names: Sequence[str] | None = None,
    dpi: int = 110,
) -> str:
    """Draw ``panels`` side by side into ``path`` (PNG); returns the path.

    panels : :class:`Panel` objects (:func:`standard_panels` builds a run's), or ``(title, coords, colour)`` tuples
    class_names : ``class_names[c]`` names class code ``c`` in the legend (``Dataset.target_names``)
    site_names : names of the sites, in site order (the marker legend / the by-site panel)
    """
    import matplotlib.pyplot as plt

    panels = [
        p if isinstance(p, Panel) else Panel(p[0], p[1], None if p[2] is None else np.asarray(p[2])) for p in panels
    ]
    fig = draw_panels(cast(list[Panel], panels), class_names=class_names, site_names=site_names)
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_density(path, density: dict, landmark_embedding=None, *, epsilon=None, dpi: int = 110) -> str:
    """``density.png``: the DP density of every record on the landmark map (the billboard's third release; noisy
    counts shown clipped at 0), the landmarks' positions on top; the title names σ per cell and the ε covering it."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    C = np.maximum(np.asarray(density["counts"], dtype=np.float64), 0.0)
    lo, hi = np.asarray(density["lo"]), np.asarray(density["hi"])
    fig, ax = plt.subplots(figsize=(6.2, 5.6))
    im = ax.imshow(C.T, origin="lower", extent=(lo[0], hi[0], lo[1], hi[1]), cmap="viridis", aspect="auto")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02, label="records per cell (noisy, clipped at 0)")
    if landmark_embedding is not None:
        E = np.asarray(landmark_embedding)
        ax.scatter(E[:, 0], E[:, 1], s=6, c="white", edgecolors="black", linewidths=0.3, label="landmarks")
        ax.legend(loc="upper right", fontsize=8, frameon=True)
    eps = f"ε = {_fmt_eps(epsilon)}" if epsilon is not None else "ε"
    ax.set_title(
        f"Every record on the shared map: a DP density ({eps} covers it)\n{density['grid']} × "
        f"{density['grid']} cells, noise σ = {density['sigma_per_cell']:.3g} per cell; no coordinate left "
        "its site",
        fontsize=10,
        loc="left",
    )
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    path = os.fspath(path)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
