/* The provider's fleet dashboard: figures, charts and GPU-health heat maps drawn from the server's snapshot
 * (#dashboard-data), then kept current from the fleet topic: counters change, charts grow with
 * Plotly.extendTraces, heat map cells follow node state changes. Nothing polls. */
(function () {
  "use strict";
  var dataEl = document.getElementById("dashboard-data");
  var liveEl = document.getElementById("dashboard-live");
  if (!dataEl || !liveEl || !window.Plotly) { return; }
  var data = JSON.parse(dataEl.textContent);
  var CONFIG = { displayModeBar: false, responsive: true };
  // z: -1 failed node (red), 0 all GPUs healthy (green), 1..8 GPUs not healthy (amber to brown); zmin -1, zmax 8
  var COLORS = [[0, "#b42318"], [0.05, "#b42318"], [0.05, "#2da44e"], [0.16, "#2da44e"], [0.16, "#e3b341"], [1, "#7d4e00"]];
  var now = new Date();
  function daysAgo(days) { return new Date(now.getTime() - days * 86400000).toISOString(); }

  function bump(id, by) {
    var el = document.getElementById(id);
    if (el) { el.textContent = (Math.round((Number(el.textContent) + by) * 100) / 100).toString(); }
  }

  // charts
  var faultsChart = document.getElementById("chart-faults");
  Plotly.newPlot(faultsChart, [{ type: "bar", x: data.charts.faults.map(function (p) { return p.t; }),
    y: data.charts.faults.map(function (p) { return p.v; }), marker: { color: "#b42318" }, name: "faults" }],
    { margin: { t: 8, r: 8, b: 40, l: 40 }, xaxis: { type: "date", range: [daysAgo(7), now.toISOString()] },
      yaxis: { title: "faults", rangemode: "tozero" } }, CONFIG);
  var savedChart = document.getElementById("chart-saved");
  // a step line from zero at the start of the window, so even one completed recovery draws a line
  Plotly.newPlot(savedChart, [{ x: [daysAgo(30)].concat(data.charts.saved.map(function (p) { return p.t; })),
    y: [0].concat(data.charts.saved.map(function (p) { return p.v; })), mode: "lines+markers",
    line: { color: "#1a7f37", width: 3, shape: "hv" }, name: "saved" }],
    { margin: { t: 8, r: 8, b: 40, l: 50 }, xaxis: { type: "date", range: [daysAgo(30), now.toISOString()] },
      yaxis: { title: "GPU-hours", rangemode: "tozero" } }, CONFIG);
  var savedTotal = data.charts.saved.length ? data.charts.saved[data.charts.saved.length - 1].v : 0;

  // heat maps: 8 nodes to a row
  var cells = {};   // hostname -> {cluster, row, col}
  data.clusters.forEach(function (cluster) {
    var el = document.getElementById("heatmap-" + cluster.id);
    var h = cluster.heatmap, z = [], text = [];
    h.hosts.forEach(function (host, i) {
      var row = Math.floor(i / 8), col = i % 8;
      if (!z[row]) { z[row] = []; text[row] = []; }
      z[row][col] = h.unhealthy[i];
      text[row][col] = host + " (" + h.racks[i] + "): " + h.states[i] + ", " + Math.max(0, h.unhealthy[i]) + " GPU(s) not healthy";
      cells[host] = { cluster: cluster.id, row: row, col: col };
    });
    el._z = z;
    Plotly.newPlot(el, [{ type: "heatmap", z: z, text: text, hoverinfo: "text", zmin: -1, zmax: 8, colorscale: COLORS,
      showscale: false, xgap: 2, ygap: 2 }],
      { margin: { t: 4, r: 4, b: 4, l: 4 }, height: Math.max(60, 14 * z.length + 10),
        xaxis: { visible: false }, yaxis: { visible: false, autorange: "reversed" } }, CONFIG);
  });

  function nodeChanged(payload) {
    var cell = cells[payload.hostname];
    if (!cell) { return; }
    var el = document.getElementById("heatmap-" + cell.cluster);
    var value = payload.state === "failed" ? -1 : Math.max(0, el._z[cell.row][cell.col]);
    if (payload.state !== "failed" && el._z[cell.row][cell.col] === -1) { value = 0; }
    el._z[cell.row][cell.col] = value;
    Plotly.restyle(el, { z: [el._z] }, [0]);
  }

  var feed = document.getElementById("event-feed");
  var live = window.LockstepLive.connect();
  live.subscribe(liveEl.dataset.topic, liveEl.dataset.after, function (event) {
    window.LockstepLive.appendToFeed(feed, event);
    var p = event.payload || {};
    if (event.kind === "fault.reported") {
      bump("fig-faults", 1); bump("fig-faults-open", 1);
      var hour = new Date(event.created); hour.setMinutes(0, 0, 0);
      Plotly.extendTraces(faultsChart, { x: [[hour.toISOString()]], y: [[1]] }, [0]);
    } else if (event.kind === "fault.handled") {
      bump("fig-faults-open", -1);
    } else if (event.kind === "actions.completed") {
      // one list per cluster and batch: the recoveries that just finished
      var saved = (p.actions || []).reduce(function (sum, a) { return sum + (a.dry_run ? 0 : (a.gpu_hours_saved || 0)); }, 0);
      if (saved) {
        bump("fig-saved-today", saved); bump("fig-saved-30d", saved);
        savedTotal += saved;
        Plotly.extendTraces(savedChart, { x: [[event.created]], y: [[savedTotal]] }, [0]);
      }
    } else if (event.kind.indexOf("node.") === 0 && p.hostname) {
      nodeChanged(p);
    }
  });
})();
