// Opened from disk, the browser refuses the speech rules MathJax's explorer reads as data files,
// and a remembered "explorer on" would then stop every page's formulas from rendering.
if (location.protocol === "file:") {
  try {
    const key = "MathJax-Menu-Settings";
    const settings = JSON.parse(localStorage.getItem(key) || "{}");
    if (settings.explorer) {
      delete settings.explorer;
      localStorage.setItem(key, JSON.stringify(settings));
    }
  } catch (error) {
    // no storage (private mode): nothing remembered, nothing to undo
  }
}

window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex"
  }
};

// MathJax typesets the page it starts on; the theme's document$ also fires then, and clearing
// MathJax's cache after that first typeset would drop the styles of every formula on the page.
let firstDocument = true;
document$.subscribe(() => {
  if (firstDocument) {
    firstDocument = false;
    return;
  }
  MathJax.startup.output.clearCache();
  MathJax.typesetClear();
  MathJax.texReset();
  MathJax.typesetPromise();
});
