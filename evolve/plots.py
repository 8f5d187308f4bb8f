"""matplotlib, set up once: headless backend, deterministic PNG bytes, atomic writes."""

from __future__ import annotations

from io import BytesIO


def pyplot():
    """matplotlib.pyplot on the Agg backend; RuntimeError if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("pictures need matplotlib (pip install matplotlib)") from None
    return plt


def save_png(fig, path) -> None:
    """Write a figure as PNG (no timestamp metadata, so same figure, same bytes) and close it."""
    from evolve.atomic import atomic_write_bytes
    plt = pyplot()
    buf = BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
