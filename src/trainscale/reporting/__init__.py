"""What every report shares: Markdown/HTML with plots, atomic JSON, the consoles, honest statistics.

Below the lab, the planner and the parameter server; imports nothing else of trainscale's.
"""

from .files import atomic_write_bytes, write_json
from .render import Block, figure, legend_below, render_html, render_markdown, save, write_reports
from .stats import Interval, mean_interval, median, median_interdecile, rel_range

__all__ = ["atomic_write_bytes", "write_json", "Block", "figure", "legend_below", "render_html", "render_markdown",
           "save", "write_reports", "Interval", "mean_interval", "median", "rel_range", "median_interdecile"]
