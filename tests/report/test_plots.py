"""embedding.png: class names in a legend, sites by marker (or a by-site panel), metrics and privacy in the titles."""

import numpy as np
import pytest

from securefed.report.plots import Panel, draw_panels, metrics_line, plot_run, privacy_line, standard_panels


def _legend_texts(fig):
    return {t.get_text() for leg in fig.legends for t in leg.get_texts()}


@pytest.fixture
def blobs():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 40)
    E = rng.normal(size=(120, 2)) + 6 * y[:, None]
    return E, y


def test_privacy_and_metrics_lines():
    assert (
        privacy_line({"aggregation": "secagg", "dp": True, "nystrom": "local"}, {"epsilon": 1.0, "delta": 1e-5})
        == "no rows (each site places its own records) · SecAgg+ · ε=1 (δ=1e-05)"
    )
    rows = privacy_line({"aggregation": "plain", "dp": False, "nystrom": "rows"})
    assert (
        rows.startswith("rows mode — records reconstructible") and "plain" in rows and "no differential privacy" in rows
    )
    assert "kernel rows" in privacy_line({"aggregation": "ckks", "nystrom": "rows", "method": "spectral"})
    assert "VOID" in privacy_line({"dp": True, "nystrom": "local"}, {"epsilon": 1, "noise_source": "seeded-testing"})
    assert (
        metrics_line("tsne", {"ca_10nn": 0.9261, "trustworthiness": 0.99, "nmi": 0.5})
        == "CA-10NN 0.926 · trustworthiness 0.990"
    )
    assert metrics_line("spectral", {"nmi": 0.7, "ari": None}) == "NMI 0.700"
    assert metrics_line("tsne", {"ca_10nn": None}) is None


def test_standard_panels_legend_markers_titles(blobs, tmp_path):
    E, y = blobs
    panels = standard_panels(
        "tsne",
        E,
        y=y,
        site_sizes=[50, 40, 30],
        centralized=E * 2,
        mode={"aggregation": "secagg", "dp": False, "nystrom": "local"},
        fed_metrics={"ca_10nn": 0.95, "trustworthiness": 0.97},
        cen_metrics={"ca_10nn": 0.96, "trustworthiness": 0.98},
        partition="iid",
    )
    assert [p.title for p in panels] == ["Fed-tSNE (iid partition, 3 sites)", "centralized t-SNE on pooled data"]
    assert panels[0].metrics == "CA-10NN 0.950 · trustworthiness 0.970" and "SecAgg+" in panels[0].privacy
    assert "exists only in this simulation" in panels[1].privacy
    fig = draw_panels(panels, class_names=["benign", "malignant", "other"], site_names=["north", "south", "east"])
    texts = _legend_texts(fig)
    assert {"benign", "malignant", "other", "north", "south", "east"} <= texts
    assert len(fig.axes) == 2 and "CA-10NN 0.950" in fig.axes[0].get_title(loc="left")
    markers = {c.get_paths()[0].vertices.shape for c in fig.axes[0].collections}
    assert len(fig.axes[0].collections) == 3 and len(markers) > 1  # one marker shape per site
    out = plot_run(tmp_path / "embedding.png", panels, class_names=["benign", "malignant", "other"])
    assert (tmp_path / "embedding.png").stat().st_size > 10_000 and out.endswith("embedding.png")


def test_many_sites_get_a_by_site_panel_many_classes_a_colour_bar(blobs):
    E, y = blobs
    sites = np.repeat(np.arange(12), 10)
    fig = draw_panels([Panel("fed", E, y, "class", sites, None, "p")])
    assert len([a for a in fig.axes if a.get_title(loc="left")]) == 2
    assert "coloured by site (12 sites)" in fig.axes[1].get_title(loc="left")
    many = np.arange(120) % 30  # 30 classes: a colour bar instead of a 30-entry legend
    fig = draw_panels([Panel("fed", E, many)])
    assert len(fig.axes) == 2 and not fig.legends


def test_old_tuple_panels_still_draw(blobs, tmp_path):
    E, y = blobs
    plot_run(tmp_path / "e.png", [("one", E, y), ("two", E, None)])
    assert (tmp_path / "e.png").exists()


def test_spectral_pca_views(blobs):
    E, y = blobs
    X = np.hstack([E, np.random.default_rng(1).normal(size=(120, 3))])
    panels = standard_panels(
        "spectral",
        y[::-1].copy(),
        y=y,
        X=X,
        centralized=y,
        site_sizes=[60, 60],
        mode={"aggregation": "ckks", "nystrom": "local"},
        fed_metrics={"nmi": 0.5, "ari": 0.4},
    )
    assert [p.colour_kind for p in panels] == ["cluster", "cluster", "class"]
    assert panels[0].metrics == "NMI 0.500 · ARI 0.400" and "labels its own records" in panels[0].privacy
    assert "PCA view" in panels[2].title and panels[0].coords.shape == (120, 2)
