"""One look for every plot in the book, readable without colour vision and in a 690 px column.

Colours are Okabe and Ito's eight, chosen to stay apart under the common colour-vision
deficiencies (Okabe & Ito, *Color Universal Design*, 2008). Colour is never the only cue: the
property cycle pairs each colour with its own line style, and :func:`series` adds a marker, so two
series differ in at least two ways and a plot still reads in greyscale.

``use()`` sets matplotlib's defaults for a chapter: ``C0`` ... ``C7`` and the default cycle
become the palette (with line styles), and text is sized so that a figure 10 inches wide, shrunk
into the book's column, still shows legends and tick labels at about 10 px.
"""
from __future__ import annotations

from cycler import cycler

# Okabe-Ito, in the order the book uses them; yellow, hard to see on white, comes last.
OKABE_ITO = {
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "bluish green": "#009E73",
    "reddish purple": "#CC79A7",
    "orange": "#E69F00",
    "sky blue": "#56B4E9",
    "black": "#000000",
    "yellow": "#F0E442",
}
PALETTE = list(OKABE_ITO.values())
# reference lines (chance level, sqrt(D), ...): grey, thin, and dotted or dashed at the call
GREY = "0.45"
# one line style per palette entry: solid, dashed, dash-dot, dotted, then longer patterns
LINESTYLES = ["-", "--", "-.", ":", (0, (8, 2)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (5, 2, 1, 2))]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
# legends of figures 10 inches wide (two panels, 2x2 grids): the page shrinks them to its column
# (690 px of 1000, about 0.7), so their text is set larger to stay near 11 px there
WIDE_LEGEND = 12

RC = {
    "axes.prop_cycle": cycler(color=PALETTE) + cycler(linestyle=LINESTYLES),
    "font.size": 11,
    "axes.titlesize": 11,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "legend.framealpha": 0.9,
    "lines.linewidth": 1.7,
    "lines.markersize": 5,
    "figure.dpi": 100,
}


def use() -> None:
    """Set matplotlib's defaults to the book's style (call once per chapter, after importing pyplot)."""
    import matplotlib as mpl

    mpl.rcParams.update(RC)


def series(i: int, marker: bool = True, every: int | float | None = None) -> dict:
    """Keyword arguments for ``ax.plot`` that tell series ``i`` apart by colour, line style and marker.

    ``every`` is matplotlib's ``markevery``: for a line of many points, a marker every ``every``
    points (an int) or at that fraction of the axes' diagonal (a float), so the markers stay few.
    """
    style = {"color": PALETTE[i % len(PALETTE)], "linestyle": LINESTYLES[i % len(LINESTYLES)]}
    if marker:
        style["marker"] = MARKERS[i % len(MARKERS)]
        if every is not None:
            style["markevery"] = every
    return style
