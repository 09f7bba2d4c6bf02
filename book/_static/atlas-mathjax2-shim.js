/* The MathJax 2 API that thebe's output renderer calls (MathJax.Hub.Config, Queue, ...),
 * served by the page's own MathJax 3, so live outputs typeset their math with the book's copy
 * (thebe would otherwise load MathJax 2.7.5 from a CDN). Loaded by thebe as its mathjaxUrl. */
(function () {
  "use strict";
  var mj = window.MathJax || (window.MathJax = {});
  if (mj.Hub) return;
  // rendered Markdown keeps $...$ and $$...$$, which the page's MathJax 3 does not read:
  // rewrite them as \(...\) and \[...\] and mark the node for MathJax ("math" class)
  function dollarsToMathJax3(node) {
    if (!node || !node.classList || !node.classList.contains("jp-RenderedMarkdown")) return;
    var walker = document.createTreeWalker(node, NodeFilter.SHOW_TEXT);
    var texts = [];
    for (var t = walker.nextNode(); t; t = walker.nextNode()) {
      if (!t.parentElement.closest("code, pre")) texts.push(t);
    }
    texts.forEach(function (t) {
      t.textContent = t.textContent
        .replace(/\$\$([\s\S]+?)\$\$/g, "\\[$1\\]")
        .replace(/\$([^$\n]+?)\$/g, "\\($1\\)");
    });
    node.classList.add("math");
  }
  function typeset(node) {
    dollarsToMathJax3(node);
    if (mj.typesetPromise) {
      return mj.typesetPromise(node ? [node] : undefined).catch(function (e) {
        console.warn("MathJax:", e);
      });
    }
    return Promise.resolve();
  }
  mj.Ajax = mj.Ajax || {};
  mj.InputJax = mj.InputJax || { TeX: { resetEquationNumbers: function () {} } };
  mj.Hub = {
    config: {},
    Config: function () {},
    Configured: function () {},
    Register: { StartupHook: function (name, fn) { if (typeof fn === "function") fn(); } },
    Queue: function () {
      var chain = Promise.resolve();
      Array.prototype.forEach.call(arguments, function (job) {
        chain = chain.then(function () {
          if (typeof job === "function") return job();
          if (Array.isArray(job) && job[0] === "Typeset") return typeset(job[2]);
          return undefined; // "Require" and the rest: MathJax 3 has them loaded already
        }).catch(function (e) { console.warn("MathJax 2 adapter:", e); });
      });
      return chain;
    },
  };
})();
