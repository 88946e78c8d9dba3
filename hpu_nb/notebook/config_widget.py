"""TrainerConfigWidget / PrecisionConfigWidget: click a Trainer for HPU together and get the code for it.

The form is made of ipywidgets controls (a kept library; keyboard and screen-reader friendly); the generated code,
the validation messages and the Copy / Insert below buttons are a small anywidget (`static/config_widget.js`, shipped
in the package). All logic lives in `hpu_nb.notebook.trainer_config.TrainerConfig`, which the widget only edits: its
rows are TrainerConfig's fields that declare a control (`form_fields`), the code shown is `cfg.code`, and
`cfg.trainer_kwargs()` builds exactly that Trainer. Clicks are handled by the kernel between cells, as all widget
events are. Displayed, the form is followed by a static snapshot of its code (kept up to
date as the form changes), which is what a saved notebook shows without a kernel. Given a model and a batch
(`model=`, `batch=` or `plan_for(model, batch)`), the form also says whether the run fits the chosen Gaudi, as
`hpu_nb.plan` estimates it (hpu_nb.notebook.plan_verdict plans off the kernel's thread).
"""

from __future__ import annotations

import html
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import ipywidgets as w
import traitlets
from IPython import get_ipython

from hpu_nb.core.issues import Issue
from hpu_nb.notebook.plan_verdict import GENERATION_OPTIONS, LivePlanner
from hpu_nb.notebook.snapshot import SnapshotDisplays, live_bundle, snapshot_bundle
from hpu_nb.notebook.trainer_config import Control, TrainerConfig, config_from, form_fields, op_list_text, parse_op_list
from hpu_nb.runtime import get_backend

STATIC = Path(__file__).parent / "static"


def make_control(spec: Control, value: Any) -> w.Widget:
    """The ipywidgets control of a field, sized by the browser to its longest choice, so no label is cut (ipywidgets'
    fixed widths cut "auto (single for 1 device, parallel for more)" and "with torch.autocast")."""
    if spec.kind == "toggle":
        return w.ToggleButtons(options=list(spec.options), value=value, style={"button_width": "auto"})
    if spec.kind == "dropdown":
        return w.Dropdown(options=list(spec.options), value=value, layout=w.Layout(width="max-content"))
    if spec.kind == "int":
        return w.IntText(value=value, layout=w.Layout(width="90px"))
    if spec.kind == "check":
        return w.Checkbox(value=value, description=spec.text, indent=False)
    text = op_list_text(value) if spec.kind == "oplist" else value
    return w.Text(value=text, placeholder=spec.text, layout=w.Layout(width="300px"))


class CodePanel(anywidget.AnyWidget):
    """The generated code with Copy and Insert below buttons, and the validation messages above it."""

    _esm = STATIC / "config_widget.js"
    _css = STATIC / "config_widget.css"

    code = traitlets.Unicode("").tag(sync=True)
    form_id = traitlets.Unicode("").tag(sync=True)  # the form's widget model: its output's cell is where to insert
    issues = traitlets.List().tag(sync=True)  # [{"level", "field", "message"}]
    backend_label = traitlets.Unicode("").tag(sync=True)


class TrainerConfigWidget(w.VBox):
    """A form for `L.Trainer(...)` on HPU that validates as you click and writes the code.

    `TrainerConfigWidget(precision="bf16-mixed", devices=2)` presets fields (names as in TrainerConfig).
    Use it with `L.Trainer(**cfg.trainer_kwargs())`, `cfg.code`, the Insert below button, or `cfg.insert_cell()`.
    With `model=` and `batch=` (or `plan_for(model, batch)`) every change re-plans the run with `hpu_nb.plan` and
    shows the estimated per-card peak against the chosen Gaudi's HBM (`generation=`: "gaudi", "gaudi2", "gaudi3").
    """

    PRECISION_ONLY = False  # PrecisionConfigWidget: the precision rows only

    def __init__(self, config: TrainerConfig | None = None, *, model: Any = None, batch: Any = None,
                 generation: str = "gaudi2", **fields: Any) -> None:
        if config is not None and fields:
            raise TypeError("Pass either a TrainerConfig or field values, not both.")
        if generation not in dict(GENERATION_OPTIONS).values():
            raise ValueError(f"generation must be one of {', '.join(k for _, k in GENERATION_OPTIONS)}, "
                             f"got {generation!r}.")
        self._config = config if config is not None else config_from(fields.items())
        self._planner: LivePlanner | None = None
        self.plan_verdict = ""  # the plan's one-line verdict (empty without a model)
        self.plan_state = ""  # "", "planning", "done", "error"
        self.generation_control = w.ToggleButtons(options=GENERATION_OPTIONS, value=generation,
                                                  style={"button_width": "auto"})
        self.plan_line = w.HTML("")
        self._plan_box = w.VBox([w.HBox([w.Label("plan for", layout=w.Layout(width="110px")),
                                         self.generation_control]), self.plan_line])
        self._plan_box.add_class("hpu-cfg-plan")
        self._updating = False
        self._displays = SnapshotDisplays()
        self.specs = form_fields(type(self._config), precision_only=self.PRECISION_ONLY)
        self.controls = {name: make_control(spec, getattr(self._config, name)) for name, spec in self.specs.items()}
        # inline flex sizing (ipywidgets' box rules would otherwise keep the panel at its content's width, and a long
        # code line would push it past the output's edge): beside the form when there is room, else below it
        self.panel = CodePanel(layout=w.Layout(flex="1 1 380px", min_width="380px", max_width="760px",
                                               overflow="hidden"))
        backend = get_backend()
        self.panel.backend_label = backend.describe()
        title = w.HTML(f"<b>{html.escape(self._title())}</b> — {html.escape(self.panel.backend_label)}")
        form = w.VBox([self._row(name) for name in self.specs], layout=w.Layout(min_width="560px"))
        body = w.HBox([form, self.panel], layout=w.Layout(align_items="flex-start", flex_flow="row wrap",
                                                          width="100%"))
        super().__init__([title, body])
        self.panel.form_id = self.model_id or ""
        self.add_class("hpu-cfg")
        for _name, control in self.controls.items():
            control.observe(self._on_change, names="value")
        self.generation_control.observe(lambda _change: self._request_plan(), names="value")
        if model is not None or batch is not None:
            self.plan_for(model, batch)
        self._refresh()

    # -- form -----------------------------------------------------------------------------------------------
    def _title(self) -> str:
        return "Trainer configuration"

    def _row(self, name: str) -> w.Widget:
        label = w.Label(self.specs[name].label, layout=w.Layout(width="110px"))
        row = w.HBox([label, self.controls[name]])
        row.add_class(f"hpu-cfg-row-{name}")
        return row

    # -- state ----------------------------------------------------------------------------------------------
    def _value_of(self, name: str) -> Any:
        value = self.controls[name].value
        return parse_op_list(value) if self.specs[name].kind == "oplist" else value

    def _on_change(self, change: dict) -> None:
        if self._updating:
            return
        values = {name: self._value_of(name) for name in self.controls}
        self._config = self._config.replace(**values)
        self._refresh()

    def _refresh(self) -> None:
        """Show the code and the issues; enable only the controls that matter for the current choices."""
        c = self._config
        issues = c.issues()
        bad = {i.field for i in issues if i.level == "error"}
        oplist_bad = any(self.specs[name].kind == "oplist" for name in bad & set(self.specs))  # one check of both
        for name, control in self.controls.items():
            control.disabled = not c.relevant(name)
            if name in bad or (self.specs[name].kind == "oplist" and oplist_bad):
                control.add_class("hpu-cfg-invalid")
            else:
                control.remove_class("hpu-cfg-invalid")
        with self.panel.hold_sync():
            self.panel.code = c.code
            self.panel.issues = [{"level": i.level, "field": i.field, "message": i.message} for i in issues]
        if self._displays.snapshots:
            self._displays.refresh(self._snapshot())
        self._request_plan()

    # -- the live plan --------------------------------------------------------------------------------------
    def plan_for(self, model: Any, batch: Any) -> TrainerConfigWidget:
        """Say, as the form changes, whether training `model` on `batch` (one per-card batch, a DataLoader or a
        LightningDataModule) fits the chosen Gaudi: `hpu_nb.plan` of a copy of the model, an estimate. Returns self."""
        self._planner = LivePlanner(model, batch, self._show_plan)
        shell = get_ipython()
        if shell is not None:  # plans run between cells only (plan_verdict: the trace's hooks are process-wide)
            planner = weakref.ref(self._planner)
            for event, method in (("pre_run_cell", "pause"), ("post_run_cell", "resume")):
                shell.events.register(event, _weak_call(planner, method))
        if self._plan_box not in self.children:
            self.children = (*self.children, self._plan_box)
        self._request_plan()
        return self

    def _request_plan(self) -> None:
        if self._planner is None:
            return
        config, generation = self._config, self.generation_control.value
        self._planner.request(lambda: {**config.trainer_kwargs(), "generation": generation})

    def _show_plan(self, text: str, state: str) -> None:
        self.plan_verdict, self.plan_state = text, state
        color = {"error": "#b00020", "planning": "#666"}.get(state, "inherit")
        self.plan_line.value = f'<span style="color:{color}">{html.escape(text)}</span>'
        if self._displays.snapshots:
            self._displays.refresh(self._snapshot())

    @property
    def plan(self) -> Any:
        """The latest finished plan of the form's state (an hpu_nb.plan.Plan), or None."""
        return None if self._planner is None else self._planner.plan

    def wait_for_plan(self, timeout: float | None = None) -> str:
        """Wait until the form's latest state is planned; the verdict line (for scripts: the form never waits)."""
        if self._planner is None:
            raise RuntimeError("this widget has no model to plan: pass model= and batch=, or call plan_for().")
        if not self._planner.wait(timeout):
            raise TimeoutError(f"planning did not finish within {timeout} s.")
        return self.plan_verdict

    def set(self, **fields: Any) -> TrainerConfigWidget:
        """Change fields from code (the form follows); returns self."""
        config = config_from({**{n: getattr(self._config, n) for n in self._config.field_names()}, **fields}.items(),
                             type(self._config))
        self._config = config
        self._updating = True
        try:
            for name, control in self.controls.items():
                value = getattr(config, name)
                control.value = op_list_text(value) if self.specs[name].kind == "oplist" else value
        finally:
            self._updating = False
        self._refresh()
        return self

    # -- what users call ------------------------------------------------------------------------------------
    @property
    def config(self) -> TrainerConfig:
        return self._config

    @property
    def code(self) -> str:
        """The Python that builds this Trainer (fp8: it converts your `model` first)."""
        return self._config.code

    @property
    def issues(self) -> list[Issue]:
        return self._config.issues()

    def trainer_kwargs(self, model: Any = None) -> dict[str, Any]:
        """`L.Trainer(**cfg.trainer_kwargs())`; raises InvalidConfigError listing the errors, if any."""
        return self._config.trainer_kwargs(model)

    def build(self, model: Any = None) -> tuple[dict[str, Any], Any]:
        """(Trainer kwargs, the model to train): fp8 converts the model."""
        return self._config.build(model)

    def insert_cell(self) -> None:
        """Put the code into a new cell below the running one (IPython's set_next_input payload, which JupyterLab,
        Notebook 7 and classic Notebook honour); the form's Insert below button does it without running a cell."""
        shell = get_ipython()
        if shell is None:
            raise RuntimeError("insert_cell() needs IPython or Jupyter; outside them, use cfg.code.")
        self._config.check()  # code with errors would raise in its cell (the Insert below button is disabled too)
        shell.set_next_input(self.code, replace=False)

    # -- headless / text ------------------------------------------------------------------------------------
    def _text(self) -> str:
        issues = self._config.issues()
        head = [f"{self._title()} ({self.panel.backend_label})"]
        head += [f"  {i}" for i in issues]
        if self.plan_verdict:
            head.append(self.plan_verdict)
        return "\n".join(head + ["", self.code])

    def _html(self) -> str:
        issues = "".join(
            f'<li style="color:{"#b00020" if i.level == "error" else "#8a6d00"}">{html.escape(str(i))}</li>'
            for i in self._config.issues()
        )
        verdict = f"<p>{html.escape(self.plan_verdict)}</p>" if self.plan_verdict else ""
        return (f"<div><b>{html.escape(self._title())}</b> ({html.escape(self.panel.backend_label)})"
                f"{'<ul>' + issues + '</ul>' if issues else ''}{verdict}<pre>{html.escape(self.code)}</pre></div>")

    def _snapshot(self) -> dict[str, str]:
        return snapshot_bundle(self._title(), self._html(), self._text())

    def _ipython_display_(self) -> None:
        """The live form, then its snapshot (the code and the issues), which follows every change of the form."""
        self._displays.show(live_bundle(self, f"{self._title()} (live form; its code follows)"), self._snapshot())

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data["text/plain"] = self._text()
        data["text/html"] = self._html()
        return bundle

    def __repr__(self) -> str:
        return self._text()


def _weak_call(ref: weakref.ref[LivePlanner], method: str) -> Callable[[Any], None]:
    """An IPython event callback calling `method` of the planner while it lives (the callback does not keep it)."""
    def call(*args: Any) -> None:
        planner = ref()
        if planner is not None:
            getattr(planner, method)(*args)
    return call


class PrecisionConfigWidget(TrainerConfigWidget):
    """The precision part of the form only: precision, autocast style, op lists, fp8 data directory."""

    PRECISION_ONLY = True

    def _title(self) -> str:
        return "Precision configuration"
