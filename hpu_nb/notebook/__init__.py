"""The notebook layer: IPython extension, magics and widgets. The only layer that imports IPython / ipywidgets.

Nothing is imported here eagerly, so `import hpu_nb.notebook` stays cheap; see extension.py, info.py,
memory_monitor.py and config_widget.py.
"""
