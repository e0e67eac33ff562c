// Berth's dashboard: the table of workspaces follows the cluster (server-sent events from the
// gateway, which watches the workspaces). Without this script the page still works; it shows
// what was true when it was loaded.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const body = document.querySelector("tbody[data-live]");
  if (!body || !window.EventSource) return;
  const events = new EventSource(body.dataset.live);
  events.onmessage = (event) => {
    // Keep the keyboard's place: the focused button's label, found again in the new rows.
    const focused = document.activeElement && document.activeElement.getAttribute("aria-label");
    body.innerHTML = event.data;
    body.dataset.updated = String(Date.now());
    if (focused) {
      for (const button of body.querySelectorAll("button")) {
        if (button.getAttribute("aria-label") === focused) { button.focus(); break; }
      }
    }
  };
});
