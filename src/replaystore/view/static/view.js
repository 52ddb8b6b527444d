// replaystore view: screenshot zoom and the click point (plain JavaScript, no dependencies).
(function () {
  "use strict";
  var inner = document.getElementById("zoom-inner");
  var img = document.getElementById("screenshot");
  if (!inner || !img) { return; }
  var level = 1;
  var label = document.getElementById("zoom-level");
  function apply() {
    inner.style.width = (100 * level) + "%";
    if (label) { label.textContent = Math.round(100 * level) + "%"; }
  }
  function placePoint() {
    var point = document.getElementById("click-point");
    var x = parseFloat(inner.dataset.x), y = parseFloat(inner.dataset.y);
    if (!point || isNaN(x) || isNaN(y) || !img.naturalWidth) { return; }
    // The action's coordinates are screenshot pixels (CSS pixels at device scale 1).
    point.style.left = (100 * x / img.naturalWidth) + "%";
    point.style.top = (100 * y / img.naturalHeight) + "%";
    point.hidden = false;
  }
  document.querySelectorAll("[data-zoom]").forEach(function (button) {
    button.addEventListener("click", function () {
      var what = button.getAttribute("data-zoom");
      if (what === "in") { level = Math.min(level * 1.5, 8); }
      else if (what === "out") { level = Math.max(level / 1.5, 1); }
      else { level = 1; }
      apply();
    });
  });
  img.addEventListener("click", function () { level = level > 1 ? 1 : 2; apply(); });
  if (img.complete) { placePoint(); } else { img.addEventListener("load", placePoint); }
  document.addEventListener("keydown", function (event) {
    if (event.target.tagName === "INPUT") { return; }
    var link = null;
    if (event.key === "ArrowRight") { link = document.getElementById("next-step"); }
    if (event.key === "ArrowLeft") { link = document.getElementById("prev-step"); }
    if (link) { window.location.href = link.href; }
  });
})();
