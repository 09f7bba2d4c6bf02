/* The MathJax 2 API that thebe's output renderer calls (MathJax.Hub.Config, Queue, ...),
 * served by the page's own MathJax 3, so live outputs typeset their math with the book's copy
 * (thebe would otherwise load MathJax 2.7.5 from a CDN). Loaded by thebe as its mathjaxUrl. */
(function () {
  "use strict";
  var mj = window.MathJax || (window.MathJax = {});
  if (mj.Hub) return;
  function typeset(node) {
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
