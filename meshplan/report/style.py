"""One look for every report figure: sizes, colours, fonts, and a Figure factory.

Figures are built with :class:`matplotlib.figure.Figure` and the Agg canvas, never through
``pyplot``: no global figure registry to leak into, no GUI backend, nothing to ``close``, and a
notebook still displays the returned Figure. The rc settings are applied with
``matplotlib.rc_context`` for the duration of one figure only, so importing this module changes
nothing for the caller.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

GIB = 2**30

# Okabe–Ito palette (Okabe & Ito 2008, "Color Universal Design"): distinguishable for the
# common colour-vision deficiencies, so stacked segments stay readable for everyone.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
           "#000000", "#999999")

# Fixed colour per quantity: the same part has the same colour in every figure.
MEMORY_COLORS = {"weights": "#0072B2", "grads": "#56B4E9", "optimizer": "#009E73",
                 "activations": "#E69F00", "other": "#999999"}
TIME_COLORS = {"compute": "#0072B2", "TP comm": "#E69F00", "PP comm": "#CC79A7",
               "PP p2p interference": "#882255", "bubble": "#D9D9D9",
               "DP exposed": "#D55E00", "ZeRO-3 gathers": "#F0E442", "optimizer": "#009E73",
               "waiting for the CPU": "#666666"}
PASS_COLORS = {"F": "#0072B2", "B": "#E69F00", "W": "#009E73"}
ACCENT = "#D55E00"
REFERENCE = "#555555"

RC = {
    "font.size": 9.5,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 9.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": "#E5E5E5",
    "grid.linewidth": 0.8,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
    "figure.dpi": 100,
    "savefig.dpi": 110,
    "figure.facecolor": "white",
    "axes.facecolor": "white",
}

FULL_WIDTH_IN = 10.0   # every figure is this wide, so the HTML column scales them alike


@contextmanager
def figure(height_in: float, *, width_in: float = FULL_WIDTH_IN) -> Iterator:
    """Yield a new Agg-backed Figure drawn under the report's rc settings."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(width_in, height_in), layout="constrained")
        FigureCanvasAgg(fig)
        yield fig


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes (what the HTML embeds and the Markdown links)."""
    import io

    import matplotlib
    buf = io.BytesIO()
    with matplotlib.rc_context(RC):
        fig.savefig(buf, format="png")
    return buf.getvalue()


def si(value: float, unit: str = "", digits: int = 3) -> str:
    """``value`` with an SI prefix, e.g. ``si(1.23e6, "tokens/s") == "1.23 M tokens/s"``."""
    if value != value:  # NaN
        return "–"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:#.{digits}g}".rstrip(".") + f" {prefix}{unit}".rstrip()
    return f"{value:#.{digits}g}".rstrip(".") + f" {unit}".rstrip()


def seconds(value: float) -> str:
    """A time with a unit and three significant digits: ``"7.71 s"``, ``"378 ms"``,
    ``"823 µs"``; exactly zero stays ``"0"``."""
    if value != value:
        return "–"
    if value == 0:
        return "0"
    if abs(value) >= 1:
        return f"{_sig3(value)} s" if abs(value) < 100 else f"{value:,.0f} s"
    if abs(value) >= 1e-3:
        return f"{_sig3(value * 1e3)} ms"
    return f"{_sig3(value * 1e6)} µs"


def _sig3(value: float) -> str:
    """Three significant digits, trailing zeros kept (7.80, not 7.8: columns read alike)."""
    return f"{value:#.3g}".rstrip(".")


def duration(seconds: float) -> str:
    """A human duration: ``"3.2 days"``, ``"5.1 h"``, ``"42 min"``."""
    if seconds != seconds:
        return "–"
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.1f} s"


def dollars(amount: float) -> str:
    if amount != amount:
        return "–"
    if amount >= 1e6:
        return f"${amount / 1e6:.2f}M"
    if amount >= 1e3:
        return f"${amount / 1e3:.1f}k"
    return f"${amount:.2f}"
