"""The MemoryMonitor's parts, one job a module (the callback itself is hpu_nb.notebook.memory_monitor):

history.py (the sample layout and the bounded history), packing.py (samples as one binary buffer for the front end),
oom.py (the figures of an out-of-memory error), chart_widget.py (the live chart, an anywidget), summary.py (the text /
HTML summary a saved notebook keeps), svg.py (the static SVG charts' frame), relay.py (forked workers' rank 0 to the
kernel's monitor), planned.py (what MemoryMonitor(plan=...) compares: the plan's peak and FLOPs, the MFU). Nothing is
imported here eagerly. (A forked worker's notebook output is kept in order by the fork launchers:
hpu_nb.core.strategy_parts.worker_output.)
"""
