/* The provider's fleet dashboard: figures, charts and GPU-health heat maps drawn from the server's snapshot
 * (#dashboard-data), then kept current from the fleet topic: counters change, charts grow with
 * Plotly.extendTraces, heat map cells follow node state changes. Nothing polls. */
(function () {
  "use strict";
  var dataEl = document.getElementById("dashboard-data");
  var liveEl = document.getElementById("dashboard-live");
  if (!dataEl || !liveEl || !window.Plotly) { return; }
  var L = window.LockstepLive;
  var data = JSON.parse(dataEl.textContent);
  var CONFIG = { displayModeBar: false, responsive: true };
  // z: -2 out of service (grey), -1 failed node (red), 0 all GPUs healthy (green), 1..8 GPUs not healthy (amber
  // to brown); zmin -2, zmax 8
  var OUT = -2, FAILED = -1;
  var COLORS = [[0, "#6e7781"], [0.05, "#6e7781"], [0.05, "#b42318"], [0.15, "#b42318"], [0.15, "#2da44e"],
                [0.25, "#2da44e"], [0.25, "#e3b341"], [1, "#7d4e00"]];
  var OUT_STATES = { cordoned: true, draining: true };
  // The charts' window (the page's time range: ?range=, templates/_time_range.html) and the bucket faults are
  // counted per; live points extend it to now.
  var range = data.charts.range || { since: new Date(Date.now() - 7 * 86400000).toISOString(), bucket: "hour" };
  function bucketOf(at) {
    var t = new Date(at);
    if (range.bucket === "day") { t.setUTCHours(0, 0, 0, 0); }
    else if (range.bucket === "hour") { t.setUTCMinutes(0, 0, 0); }
    else { t.setUTCSeconds(0, 0); }
    return t.toISOString();
  }
  function bump(id, by) { L.bumpFigure(document.getElementById(id), by); }

  // charts: an empty one is an empty state until its first point arrives
  var faultsChart = document.getElementById("chart-faults");
  var savedChart = document.getElementById("chart-saved");
  var faultsDrawn = false, savedDrawn = false;
  function show(chart) {
    chart.hidden = false;
    var empty = document.getElementById(chart.id + "-empty");
    if (empty) { empty.hidden = true; }
  }
  function drawFaults(points) {
    show(faultsChart);
    // Whole faults only: a step of at least 1 (left to Plotly, a bucket of one fault gets ticks 0.2 apart,
    // which ",d" prints as 0, 0, 0, 1, 1, 1).
    var most = Math.max.apply(null, [1].concat(points.map(function (p) { return p.v; })));
    Plotly.newPlot(faultsChart, [{ type: "bar", x: points.map(function (p) { return p.t; }),
      y: points.map(function (p) { return p.v; }), marker: { color: "#b42318" }, name: "faults" }],
      { margin: { t: 8, r: 8, b: 40, l: 40 }, xaxis: { type: "date", range: [range.since, new Date().toISOString()] },
        yaxis: { title: "faults", rangemode: "nonnegative", tickformat: ",d", tick0: 0, dtick: Math.max(1, Math.ceil(most / 5)) } }, CONFIG);
    faultsDrawn = true;
  }
  // GPU-hours saved and lost, cumulated: two step lines from zero at the start of the window, so even one
  // completed recovery draws them (the series share their buckets: jobs.selectors.recovery_dashboard)
  function steps(points, name, color, dash) {
    return { x: [range.since].concat(points.map(function (p) { return p.t; })),
      y: [0].concat(points.map(function (p) { return p.v; })), mode: "lines+markers",
      line: { color: color, width: 3, shape: "hv", dash: dash }, name: name };
  }
  function drawSaved(saved, lost) {
    show(savedChart);
    Plotly.newPlot(savedChart, [steps(saved, "saved", "#1a7f37", "solid"), steps(lost, "lost", "#b42318", "dot")],
      { margin: { t: 8, r: 8, b: 40, l: 60 }, xaxis: { type: "date", range: [range.since, new Date().toISOString()] },
        yaxis: { title: "GPU-hours", rangemode: "tozero", tickformat: "," },
        legend: { orientation: "h", y: 1.12 } }, CONFIG);
    savedDrawn = true;
  }
  function last(points) { return points.length ? points[points.length - 1].v : 0; }
  var lostPoints = data.charts.lost || [];
  if (data.charts.faults.length) { drawFaults(data.charts.faults); }
  if (data.charts.saved.length) { drawSaved(data.charts.saved, lostPoints); }
  var savedTotal = last(data.charts.saved), lostTotal = last(lostPoints);

  // heat maps: 8 nodes to a row, cells keyed by node id (hostnames may repeat across clusters)
  var cells = {};   // node id -> {cluster, row, col, state, unhealthy, gpus}
  function value(cell) {
    if (cell.state === "failed") { return FAILED; }
    if (OUT_STATES[cell.state]) { return OUT; }
    return Math.max(0, cell.unhealthy);
  }
  function label(cell) {
    return cell.host + " (" + cell.rack + "): " + cell.state + ", " + Math.max(0, cell.unhealthy) + " GPU(s) not healthy";
  }
  data.clusters.forEach(function (cluster) {
    var el = document.getElementById("heatmap-" + cluster.id);
    var h = cluster.heatmap, z = [], text = [];
    h.hosts.forEach(function (host, i) {
      var row = Math.floor(i / 8), col = i % 8;
      if (!z[row]) { z[row] = []; text[row] = []; }
      var cell = { cluster: cluster.id, row: row, col: col, host: host, rack: h.racks[i], state: h.states[i],
                   unhealthy: h.unhealthy[i], gpus: h.gpus[i] };
      cells[h.ids[i]] = cell;
      z[row][col] = value(cell);
      text[row][col] = label(cell);
    });
    el._z = z; el._text = text;
    el.dataset.cells = JSON.stringify(z);
    Plotly.newPlot(el, [{ type: "heatmap", z: z, text: text, hoverinfo: "text", zmin: OUT, zmax: 8, colorscale: COLORS,
      showscale: false, xgap: 2, ygap: 2 }],
      { margin: { t: 4, r: 4, b: 4, l: 4 }, height: Math.max(60, 14 * z.length + 10),
        xaxis: { visible: false }, yaxis: { visible: false, autorange: "reversed" } }, CONFIG);
  });

  function healthyOf(cell) { return cell.state === "failed" ? 0 : Math.max(0, cell.gpus - Math.max(0, cell.unhealthy)); }
  function nodeChanged(payload) {
    var cell = cells[payload.node];
    if (!cell || !payload.state || payload.state === cell.state) { return; }
    var before = { out: cell.state === "failed" || !!OUT_STATES[cell.state], healthy: healthyOf(cell) };
    cell.state = payload.state;
    if (payload.state !== "failed" && cell.unhealthy < 0) { cell.unhealthy = 0; }
    var after = { out: cell.state === "failed" || !!OUT_STATES[cell.state], healthy: healthyOf(cell) };
    if (before.out !== after.out) { bump("fig-nodes-out", after.out ? 1 : -1); }
    if (before.healthy !== after.healthy) { bump("fig-gpus-healthy", after.healthy - before.healthy); }
    var el = document.getElementById("heatmap-" + cell.cluster);
    el._z[cell.row][cell.col] = value(cell);
    el._text[cell.row][cell.col] = label(cell);
    el.dataset.cells = JSON.stringify(el._z);
    Plotly.restyle(el, { z: [el._z], text: [el._text] }, [0]);
    summarize(cell.cluster);
  }
  // The heat map's text alternative (#heatmap-summary-<cluster>), as home/views.py heatmap_summary writes it.
  function summarize(clusterId) {
    var el = document.getElementById("heatmap-summary-" + clusterId);
    if (!el) { return; }
    var total = 0, groups = { sick: [], out: [], failed: [] };
    Object.keys(cells).forEach(function (id) {
      var c = cells[id];
      if (c.cluster !== clusterId) { return; }
      total += 1;
      if (c.state === "failed") { groups.failed.push(c.host); }
      else if (OUT_STATES[c.state]) { groups.out.push(c.host); }
      else if (c.unhealthy > 0) { groups.sick.push(c.host + " (" + c.unhealthy + " GPU" + (c.unhealthy === 1 ? "" : "s") + ")"); }
    });
    var healthy = total - groups.sick.length - groups.out.length - groups.failed.length;
    var parts = [healthy + " of " + total + " nodes have all GPUs healthy"];
    [["sick", "not all GPUs healthy"], ["out", "out of service"], ["failed", "failed"]].forEach(function (g) {
      var hosts = groups[g[0]];
      if (!hosts.length) { return; }
      parts.push(hosts.length + " " + g[1] + ": " + hosts.slice(0, 12).join(", ") + (hosts.length > 12 ? " and " + (hosts.length - 12) + " more" : ""));
    });
    el.textContent = parts.join("; ") + ".";
  }

  var feed = document.getElementById("event-feed");
  // The page is live on #dashboard-live's topic (static/js/live.js).
  L.on(function (event) {
    L.appendToFeed(feed, event);
    var p = event.payload || {};
    if (event.kind === "fault.reported") {
      bump("fig-faults", 1); bump("fig-faults-open", 1);
      var bucket = bucketOf(event.created);
      if (faultsDrawn) { Plotly.extendTraces(faultsChart, { x: [[bucket]], y: [[1]] }, [0]); }
      else { drawFaults([{ t: bucket, v: 1 }]); }
    } else if (event.kind === "fault.handled") {
      bump("fig-faults-open", -1);
    } else if (event.kind === "actions.completed") {
      // one list per cluster and batch: the recoveries that just finished
      var booked = (p.actions || []).filter(function (a) { return !a.dry_run; });
      var saved = booked.reduce(function (sum, a) { return sum + (a.gpu_hours_saved || 0); }, 0);
      var lost = booked.reduce(function (sum, a) { return sum + (a.gpu_hours_lost || 0); }, 0);
      if (saved || lost) {
        bump("fig-saved-today", saved); bump("fig-saved-30d", saved);
        bump("fig-lost-today", lost); bump("fig-lost-30d", lost);
        savedTotal += saved; lostTotal += lost;
        if (savedDrawn) {
          Plotly.extendTraces(savedChart, { x: [[event.created], [event.created]], y: [[savedTotal], [lostTotal]] }, [0, 1]);
        } else { drawSaved([{ t: event.created, v: savedTotal }], [{ t: event.created, v: lostTotal }]); }
      }
    } else if (event.kind.indexOf("node.") === 0 && p.node) {
      nodeChanged(p);
    }
  });
})();
