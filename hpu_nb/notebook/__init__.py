"""The notebook layer: IPython extension, magics and widgets. The only layer that imports IPython / ipywidgets.

Nothing is imported here eagerly, so `import hpu_nb.notebook` stays cheap: extension.py (%load_ext hpu_nb), info.py
(%hpu_info), memory_monitor.py (the MemoryMonitor callback; its chart, history and summary in memory/),
trainer_config/ (TrainerConfig, the plan of a Trainer), config_widget.py (its form), trace_viewer.py (%hpu_trace),
deepspeed_ops.py (DeepSpeed's compile-once ops).
"""
