"""Look at ``report.html`` as a person would: render it in headless Chromium, keep a screenshot next to it and
return the rendered page's DOM (so a test can assert what a reader sees)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

__all__ = ["find_chromium", "render_report"]

_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def find_chromium() -> str | None:
    """The Chromium binary (``chromium``, ``chromium-browser``, ``google-chrome``) or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def render_report(
    html_path,
    png_path=None,
    *,
    width: int = 1280,
    height: int = 2400,
    timeout: float = 90.0,
    chromium: str | None = None,
) -> tuple[str, str]:
    """Render ``html_path``; write a ``width × height`` screenshot (default: ``report.png`` beside it).

    Returns ``(png_path, dom)``. Raises ``FileNotFoundError`` when no Chromium is installed and
    ``RuntimeError`` (with Chromium's stderr tail) when it fails.
    """
    exe = chromium or find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH (Debian: apt-get install -y chromium)")
    html_path = os.path.abspath(os.fspath(html_path))
    png_path = os.path.abspath(
        os.fspath(png_path) if png_path is not None else os.path.join(os.path.dirname(html_path), "report.png")
    )
    url = "file://" + html_path
    with tempfile.TemporaryDirectory(prefix="securefed-chromium-") as profile:
        base = [exe, *_FLAGS, f"--user-data-dir={profile}"]
        dom = subprocess.run(base + ["--dump-dom", url], capture_output=True, timeout=timeout)
        if dom.returncode != 0 or not dom.stdout:
            raise RuntimeError(
                f"chromium --dump-dom failed ({dom.returncode}): {dom.stderr.decode(errors='replace')[-1500:]}"
            )
        shot = subprocess.run(
            base + [f"--screenshot={png_path}", f"--window-size={width},{height}", url],
            capture_output=True,
            timeout=timeout,
        )
        if not os.path.exists(png_path):
            raise RuntimeError(
                f"chromium --screenshot wrote nothing ({shot.returncode}): "
                f"{shot.stderr.decode(errors='replace')[-1500:]}"
            )
    return png_path, dom.stdout.decode("utf-8", errors="replace")
