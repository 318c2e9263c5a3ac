/* The fault overview: a live fault feed and GPU-hours saved over time (grown with Plotly.extendTraces). */
(function () {
  "use strict";
  var feed = document.getElementById("fault-feed");
  var statsEl = document.getElementById("stats-data");
  if (!feed || !statsEl || !window.Plotly) { return; }
  var stats = JSON.parse(statsEl.textContent);
  var savedEl = document.getElementById("gpu-hours-saved");
  var faultsEl = document.getElementById("total-faults");
  var actionsEl = document.getElementById("total-actions");
  var cumulative = stats.totals.gpu_hours_saved || 0;
  var seen = {};
  Plotly.newPlot("saved-chart", [{
    x: stats.series.map(function (r) { return r.t; }), y: stats.series.map(function (r) { return r.cumulative; }),
    mode: "lines+markers", name: "GPU-hours saved", line: { shape: "hv", color: "#2ea043" }
  }], { margin: { l: 60, r: 20, t: 10, b: 40 }, height: 260, xaxis: { type: "date" }, yaxis: { title: "GPU-hours saved" } },
  { displaylogo: false, responsive: true });

  function add(p, kind, className) {
    var code = kind === "fault" ? (p.kind + (p.xid !== null && p.xid !== undefined ? " " + p.xid : "")) : p.kind;
    var li = window.LockstepLive.prependToFeed(feed, p.detected_at, code,
                                               (p.summary || "") + (p.state_reason ? " — " + p.state_reason : ""), 100);
    if (className) { li.className = className; }
  }
  function onEvent(event) {
    var p = event.payload || {};
    if (event.kind === "fault.reported" && !seen["f" + p.fault]) {
      seen["f" + p.fault] = true;
      add(p, "fault");
      if (faultsEl) { faultsEl.textContent = Number(faultsEl.textContent) + 1; }
    } else if (event.kind === "actions.decided" || event.kind === "action.started" || event.kind === "action.planned") {
      // A decision lists its actions (actions.decided on fleet, cluster and tenant topics).
      (p.actions || [p]).forEach(function (a) {
        if (!a.fault_summary || seen["p" + a.action]) { return; }
        seen["p" + a.action] = true;
        add({ detected_at: a.detected_at, kind: a.kind, summary: a.fault_summary + " → " + a.summary }, "action", "decided");
      });
    } else if (event.kind === "fault.handled") {
      add(p, "fault", "handled");
    } else if (event.kind === "action.succeeded" || event.kind === "actions.completed") {
      (p.actions || [p]).forEach(function (a) {
        if (!a.job || a.dry_run || seen["a" + a.action]) { return; }
        seen["a" + a.action] = true;
        cumulative += a.gpu_hours_saved || 0;
        if (savedEl) { savedEl.textContent = cumulative.toFixed(2); }
        if (actionsEl) { actionsEl.textContent = Number(actionsEl.textContent) + 1; }
        Plotly.extendTraces("saved-chart", { x: [[a.ended_at]], y: [[cumulative]] }, [0]);
      });
    }
  }
  window.LockstepLive.connect().subscribe(feed.dataset.topic, feed.dataset.after, onEvent);
})();
