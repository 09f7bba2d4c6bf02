/* The "Go live" button of every chapter page (added by book/_ext/atlas_book.py).
 *
 * `make serve` (python -m attention_atlas serve) serves the book and a Jupyter server on
 * 127.0.0.1 and prints an address whose fragment names the server and its token
 * (#atlas-jupyter=...&atlas-token=...). This script keeps them in localStorage (never sent over
 * HTTP) and, on a click, loads the book's own copy of thebe (_static/vendor/thebe/), turns the
 * page's code cells into runnable cells on that server's kernel and runs them in order, so the
 * chapter's widgets appear in the page. Nothing is fetched from another host: thebe's hard-coded
 * fetch of require.js is answered with the book's copy, its MathJax 2 with a small adapter to
 * the page's MathJax 3 (atlas-mathjax2-shim.js), and the widget styles come from thebe.css.
 */
(function () {
  "use strict";
  var KEY = "atlas-live";
  var here = document.currentScript ? document.currentScript.src : "";
  var STATIC = here.slice(0, here.lastIndexOf("/") + 1); // .../_static/

  function serverConfig() {
    var hash = new URLSearchParams(window.location.hash.slice(1));
    if (hash.get("atlas-jupyter")) {
      var cfg = { url: hash.get("atlas-jupyter"), token: hash.get("atlas-token") || "" };
      window.localStorage.setItem(KEY, JSON.stringify(cfg));
      window.history.replaceState(null, "", window.location.pathname + window.location.search);
    }
    try {
      return JSON.parse(window.localStorage.getItem(KEY) || "null");
    } catch (e) {
      return null;
    }
  }

  function chapterStem() {
    var name = window.location.pathname.split("/").pop() || "";
    return name.replace(/\.html$/, "");
  }

  // thebe fetches require.js from a CDN by a literal URL: answer with the book's copy
  function redirectRequireJs() {
    var fetch0 = window.fetch.bind(window);
    window.fetch = function (input, init) {
      var url = typeof input === "string" ? input : (input && input.url) || "";
      if (/\/require\.js\/[0-9.]+\/require(\.min)?\.js$/.test(url)) {
        return fetch0(STATIC + "vendor/require.js", init);
      }
      return fetch0(input, init);
    };
  }

  function load(tag, attrs) {
    return new Promise(function (resolve, reject) {
      var el = document.createElement(tag);
      Object.keys(attrs).forEach(function (k) { el.setAttribute(k, attrs[k]); });
      el.onload = resolve;
      el.onerror = function () { reject(new Error("could not load " + (attrs.src || attrs.href))); };
      document.head.appendChild(el);
    });
  }

  // the page's plotly.js draws the live figures (a page built without outputs has none yet);
  // a UMD bundle: hide any AMD loader so that it sets the global Plotly
  async function ensurePlotly() {
    if (window.Plotly) return;
    var define = window.define;
    window.define = undefined;
    try {
      await load("script", { src: STATIC + "vendor/plotly.min.js" });
    } finally {
      window.define = define;
    }
  }

  // thebe has no Markdown parser (Markdown outputs, such as viz.markdown's prose with numbers,
  // would show as source): a small one for what chapters print (paragraphs, emphasis, code,
  // links, {cite}`key` as [key]); the renderer takes $math$ out before and typesets it after
  // (atlas-mathjax2-shim.js)
  function escapeHtml(text) {
    return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function renderMarkdown(source) {
    var kept = [];
    var keep = function (html) { kept.push(html); return "\u0000" + (kept.length - 1) + "\u0000"; };
    var text = source
      .replace(/\{cite[pt]?\}`([^`]+)`/g, "[$1]")
      .replace(/`([^`]+)`/g, function (m, code) { return keep("<code>" + escapeHtml(code) + "</code>"); });
    var html = escapeHtml(text)
      .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
      .replace(/\*([^*\s][^*]*)\*/g, "<em>$1</em>")
      .replace(/\[([^\]]+)\]\((https?:[^)\s]+)\)/g, '<a href="$2">$1</a>');
    html = html.split(/\n\s*\n/).map(function (p) { return "<p>" + p + "</p>"; }).join("\n");
    return html.replace(/\u0000(\d+)\u0000/g, function (m, i) { return kept[+i]; });
  }

  // one source element and one output placeholder per code cell, in order (myst-nb's markup)
  function markCells() {
    var cells = document.querySelectorAll("div.cell");
    cells.forEach(function (cell) {
      var pre = cell.querySelector(".cell_input pre");
      if (!pre) return;
      pre.setAttribute("data-executable", "true");
      var out = cell.querySelector(".cell_output");
      if (!out) {
        out = document.createElement("div");
        out.className = "cell_output";
        cell.appendChild(out);
      }
      out.setAttribute("data-output", "true");
    });
    return cells.length;
  }

  function say(bar, text) {
    bar.querySelector(".atlas-live-status").textContent = text;
  }

  async function goLive(bar, cfg) {
    var button = bar.querySelector("button");
    button.disabled = true;
    document.body.classList.add("atlas-live");
    try {
      say(bar, "loading thebe…");
      redirectRequireJs();
      await load("link", { rel: "stylesheet", href: STATIC + "vendor/thebe/thebe.css" });
      await load("script", { src: STATIC + "vendor/thebe/index.js" });
      await ensurePlotly();
      var n = markCells();
      say(bar, "starting a kernel on " + cfg.url + "…");
      var live = await window.thebe.bootstrap({
        useBinder: false,
        useJupyterLite: false,
        requestKernel: true,
        mountActivateWidget: false,
        mountStatusWidget: false,
        mountRestartButton: false,
        mountRestartAllButton: false,
        predefinedOutput: true,
        selector: "[data-executable]",
        outputSelector: "[data-output]",
        serverSettings: { baseUrl: cfg.url, token: cfg.token, appendToken: true },
        kernelOptions: { name: "python3", kernelName: "python3", path: "notebooks/" + chapterStem() + ".ipynb" },
        mathjaxUrl: STATIC + "atlas-mathjax2-shim.js",
        mathjaxConfig: "TeX-AMS_CHTML-full,Safe",
        codeMirrorConfig: { mode: "python", theme: "default" },
      });
      if (live.notebook && live.notebook.rendermime) {
        live.notebook.rendermime.markdownParser = {
          render: function (source) { return Promise.resolve(renderMarkdown(source)); },
        };
      }
      say(bar, "running the " + n + " cells of this page on the local kernel…");
      await live.notebook.executeAll(true);
      var failed = document.querySelectorAll('.cell_output [data-mime-type="application/vnd.jupyter.error"]');
      bar.setAttribute("data-state", failed.length ? "error" : "live");
      say(bar, failed.length ? "a cell failed: see its output below"
                             : "live: the controls below run on your local kernel");
    } catch (err) {
      bar.setAttribute("data-state", "error");
      say(bar, "could not go live: " + err);
      button.disabled = false;
      throw err;
    }
  }

  function addBar() {
    var title = document.querySelector("article.bd-article h1") || document.querySelector("article h1");
    if (!title) return;
    var cfg = serverConfig();
    var bar = document.createElement("div");
    bar.className = "atlas-live-bar";
    bar.setAttribute("data-state", "static");
    var button = document.createElement("button");
    button.type = "button";
    button.className = "atlas-go-live";
    button.textContent = "Go live";
    button.title = "Run this page's cells on your local Jupyter server (make serve)";
    var status = document.createElement("span");
    status.className = "atlas-live-status";
    bar.appendChild(button);
    bar.appendChild(status);
    if (cfg) {
      var lab = document.createElement("a");
      lab.className = "atlas-open-lab";
      lab.href = cfg.url.replace(/\/?$/, "/") + "lab/tree/notebooks/" + chapterStem() + ".py?token=" +
        encodeURIComponent(cfg.token);
      lab.textContent = "open in JupyterLab";
      bar.appendChild(lab);
      status.textContent = "a local Jupyter server: " + cfg.url;
    } else {
      status.textContent = "to run this page, start `make serve` and open the address it prints";
    }
    button.onclick = function () {
      if (!cfg) {
        say(bar, "no local server known: run `make serve` and open the address it prints");
        return;
      }
      goLive(bar, cfg).catch(function (err) { console.warn("atlas-live:", err); });
    };
    title.insertAdjacentElement("afterend", bar);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", addBar);
  } else {
    addBar();
  }
})();
