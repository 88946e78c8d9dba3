"""Run in the fresh venv: `%load_ext hpu_nb` and `%hpu_info --text` in an IPython shell; prints what it displayed."""

from __future__ import annotations

import json

from IPython.core.interactiveshell import InteractiveShell

shown: list[dict] = []
ip = InteractiveShell.instance()
ip.display_pub.publish = lambda data, metadata=None, **kw: shown.append(data)
ip.run_line_magic("load_ext", "hpu_nb")
ip.run_line_magic("hpu_info", "--text")
print(json.dumps([item.get("text/plain", "") for item in shown]))
