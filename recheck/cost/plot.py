"""A PNG of memory over the step for both modes (matplotlib is an optional extra)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from recheck.cost.results import Comparison

__all__ = ["PlotError", "plot_comparison"]

_MIB = 2**20


class PlotError(RuntimeError):
    """The plot cannot be written (matplotlib missing, or the path is not writable)."""


def plot_comparison(cmp: Comparison, path: str) -> str:
    """Write observed and retained memory over the step, both modes, to ``path`` (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError(
            "the memory plot needs matplotlib, which is not installed: pip install matplotlib "
            "(or install recheck with its plot extra)"
        ) from None
    figure, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for name, result in cmp.modes.items():
        samples = result.timeline
        if not samples:
            continue
        span = max(len(samples) - 1, 1)
        x = [i / span for i in range(len(samples))]
        (line,) = axes[0].plot(x, [o / _MIB for o, _ in samples], label=name)
        axes[1].plot(x, [s / _MIB for _, s in samples], label=name, color=line.get_color())
        if result.end_of_forward_index is not None:
            for ax in axes:
                ax.axvline(result.end_of_forward_index / span, linestyle=":", linewidth=0.8, color=line.get_color())
    axes[0].set_ylabel("observed (MiB)")
    axes[0].set_title("memory over the step (dotted: end of forward)")
    axes[1].set_ylabel("retained saved state (MiB)")
    axes[1].set_xlabel("fraction of the step's operators")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    figure.tight_layout()
    target = Path(path)
    try:
        figure.savefig(target, format="png")
    except OSError as exc:
        raise PlotError(f"cannot write the plot to {path}: {exc.strerror or exc}") from None
    finally:
        plt.close(figure)
    return str(target)
