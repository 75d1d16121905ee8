// pgfleet console: the only script, served from /ui/static (the CSP allows no other).
// Pages with data-refresh="N" on <body> reload themselves every N seconds, unless
// paused, the tab is hidden, or a form field has the focus.
(function () {
  "use strict";
  var every = Number(document.body.getAttribute("data-refresh") || 0);
  var key = "pgfleet-console-paused";
  var paused = window.sessionStorage.getItem(key) === "1";
  var toggle = document.getElementById("refresh-toggle");

  function label() {
    if (toggle) {
      toggle.textContent = paused ? "Resume auto-refresh" : "Pause auto-refresh (every " + every + "s)";
    }
  }

  if (toggle && every > 0) {
    toggle.hidden = false;
    label();
    toggle.addEventListener("click", function () {
      paused = !paused;
      window.sessionStorage.setItem(key, paused ? "1" : "0");
      label();
    });
  }

  if (every > 0) {
    window.setInterval(function () {
      var active = document.activeElement;
      if (paused || document.hidden) { return; }
      if (active && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) { return; }
      window.location.reload();
    }, every * 1000);
  }
})();
