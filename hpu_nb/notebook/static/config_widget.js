// TrainerConfigWidget's code panel (anywidget ESM shipped in hpu_nb: no CDN). Shows the validation messages, the
// generated code with light syntax colouring, a Copy button that works without a kernel round trip, and an Insert below
// button that puts the code into a new cell under the form's cell.

const KEYWORDS = new Set(["import", "from", "as", "def", "class", "with", "return", "True", "False", "None"]);

function highlight(code, pre) {
  // tokens: comments, strings, names, everything else; built with DOM nodes and text, never parsed as markup
  const re = /(#[^\n]*)|("(?:[^"\\\n]|\\.)*")|([A-Za-z_][A-Za-z0-9_]*)|([^#"A-Za-z_]+)/g;
  let m;
  while ((m = re.exec(code)) !== null) {
    const [text, comment, str, name] = m;
    let cls = null;
    if (comment) cls = "hpu-cfg-tok-comment";
    else if (str) cls = "hpu-cfg-tok-string";
    else if (name && KEYWORDS.has(name)) cls = "hpu-cfg-tok-keyword";
    else if (name && /^(HPU|L$|MemoryMonitor)/.test(name)) cls = "hpu-cfg-tok-class";
    if (cls) {
      const span = document.createElement("span");
      span.className = cls;
      span.textContent = text;
      pre.appendChild(span);
    } else {
      pre.appendChild(document.createTextNode(text));
    }
  }
}

async function copyText(text) {
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return true;
    }
  } catch (err) {
    // fall through to the textarea fallback (clipboard permission refused, insecure origin, ...)
  }
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed";
  area.style.opacity = "0";
  document.body.appendChild(area);
  area.select();
  let ok = false;
  try {
    ok = document.execCommand("copy");
  } catch (err) {
    ok = false;
  }
  document.body.removeChild(area);
  return ok;
}

function outputsOf(cell) {
  if (typeof cell.getOutputs === "function") return cell.getOutputs() || [];
  return cell.outputs || [];
}

function insertBelow(model, el, code) {
  // JupyterLab and Notebook 7: the widget manager's document context holds the notebook model. The form's cell is the
  // one whose output shows the form's widget (by model id), else the cell whose DOM node holds this panel.
  const context = model.widget_manager && model.widget_manager.context;
  const shared = context && context.model && context.model.sharedModel;
  if (shared && shared.cells && typeof shared.insertCell === "function") {
    const formId = model.get("form_id");
    let index = shared.cells.findIndex((cell) => outputsOf(cell).some((out) => {
      const view = out && out.data && out.data["application/vnd.jupyter.widget-view+json"];
      return Boolean(view && formId && view.model_id === formId);
    }));
    if (index < 0) {
      const node = el.closest(".jp-Cell");
      const all = node && node.parentElement ? [...node.parentElement.querySelectorAll(":scope > .jp-Cell")] : [];
      index = node ? all.indexOf(node) : -1;
    }
    if (index >= 0) {
      shared.insertCell(index + 1, { cell_type: "code", source: code });
      return "inserted";
    }
  }
  // classic Notebook (nbclassic, Notebook 6): its global notebook object
  const classic = window.Jupyter && window.Jupyter.notebook;
  if (classic && typeof classic.get_cells === "function") {
    const index = classic.get_cells().findIndex((cell) => cell.element && cell.element[0].contains(el));
    if (index >= 0) {
      classic.insert_cell_below("code", index).set_text(code);
      return "inserted";
    }
  }
  return null;  // Voila, VS Code, a static page: no notebook to write into
}

function render({ model, el }) {
  el.classList.add("hpu-cfg-panel");
  const issues = document.createElement("ul");
  issues.className = "hpu-cfg-issues";
  const bar = document.createElement("div");
  bar.className = "hpu-cfg-bar";
  const label = document.createElement("span");
  label.className = "hpu-cfg-bar-label";
  label.textContent = "Generated code";
  const copy = document.createElement("button");
  copy.className = "hpu-cfg-copy";
  copy.textContent = "Copy";
  copy.title = "Copy the code to the clipboard";
  const insert = document.createElement("button");
  insert.className = "hpu-cfg-insert";
  insert.textContent = "Insert below";
  insert.title = "Put the code into a new cell below this one";
  const buttons = document.createElement("span");
  buttons.className = "hpu-cfg-buttons";
  buttons.append(insert, copy);
  bar.append(label, buttons);
  const pre = document.createElement("pre");
  pre.className = "hpu-cfg-code";
  el.append(issues, bar, pre);

  const draw = () => {
    const code = model.get("code");
    pre.textContent = "";
    highlight(code, pre);
    pre.setAttribute("data-code-length", String(code.length));
    issues.textContent = "";
    const list = model.get("issues") || [];
    for (const issue of list) {
      const li = document.createElement("li");
      li.className = `hpu-cfg-issue hpu-cfg-${issue.level}`;
      li.setAttribute("data-field", issue.field);
      li.textContent = `${issue.level === "error" ? "✖" : "⚠"} ${issue.field}: ${issue.message}`;
      issues.appendChild(li);
    }
    issues.style.display = list.length ? "" : "none";
    const errors = list.filter((i) => i.level === "error").length;
    el.setAttribute("data-errors", String(errors));
    // code with errors would raise where it is run: it can still be read and copied, not inserted as a cell to run
    insert.disabled = errors > 0;
    insert.title = errors > 0 ? "Fix the errors above first: this code would raise"
      : "Put the code into a new cell below this one";
  };
  copy.addEventListener("click", async () => {
    const ok = await copyText(model.get("code"));
    copy.textContent = ok ? "Copied ✓" : "Copy failed";
    el.setAttribute("data-copied", ok ? "yes" : "no");
    setTimeout(() => { copy.textContent = "Copy"; }, 1500);
  });
  insert.addEventListener("click", async () => {
    const code = model.get("code");
    let how = null;
    try {
      how = insertBelow(model, el, code);
    } catch (err) {
      how = null;
    }
    if (!how) {  // no notebook here: the clipboard, and a word on where to paste it
      how = (await copyText(code)) ? "copied" : "failed";
    }
    insert.textContent = { inserted: "Inserted ✓", copied: "Copied: paste it in a cell", failed: "Use cfg.code" }[how];
    el.setAttribute("data-inserted", how);
    setTimeout(() => { insert.textContent = "Insert below"; }, 2500);
  });
  model.on("change:code change:issues", draw);
  draw();
  return () => model.off("change:code change:issues", draw);
}

export default { render };
