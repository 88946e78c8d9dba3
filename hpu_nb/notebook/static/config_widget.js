// TrainerConfigWidget's code panel (anywidget ESM shipped in hpu_nb: no CDN). Shows the validation messages, the
// generated code with light syntax colouring, and a Copy button that works without a kernel round trip.

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
  bar.append(label, copy);
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
    el.setAttribute("data-errors", String(list.filter((i) => i.level === "error").length));
  };
  copy.addEventListener("click", async () => {
    const ok = await copyText(model.get("code"));
    copy.textContent = ok ? "Copied ✓" : "Copy failed";
    el.setAttribute("data-copied", ok ? "yes" : "no");
    setTimeout(() => { copy.textContent = "Copy"; }, 1500);
  });
  model.on("change:code change:issues", draw);
  draw();
  return () => model.off("change:code change:issues", draw);
}

export default { render };
