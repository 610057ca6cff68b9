// Live updates for a task's page: follows /ui/tasks/<id>/live (server-sent events).
// Without this script every page still works; reload to see changes.
"use strict";
(function () {
  const logs = document.getElementById("logs");
  if (!logs || !logs.dataset.live) return;
  const status = document.getElementById("status");
  const node = document.getElementById("node");
  const state = document.getElementById("live-state");
  const box = document.getElementById("timeline-box");
  const source = new EventSource(logs.dataset.live);
  source.addEventListener("status", (e) => {
    const d = JSON.parse(e.data);
    status.textContent = d.status;
    status.className = "status s-" + d.status;
    if (node && d.node_id) node.textContent = d.node_id;
  });
  source.addEventListener("log", (e) => {
    logs.textContent += JSON.parse(e.data).line + "\n";
  });
  source.addEventListener("timeline", () => {
    fetch(box.dataset.src, { credentials: "same-origin" })
      .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
      .then((html) => {
        const doc = new DOMParser().parseFromString(html, "text/html");
        const list = doc.getElementById("timeline");
        if (list) box.replaceChildren(list);
      })
      .catch(() => {});
  });
  source.addEventListener("end", (e) => {
    const d = JSON.parse(e.data);
    state.textContent = d.error ? "Stopped following: " + d.error : "The task is over.";
    source.close();
  });
})();
