/* The fault overview's hook on its live page (static/js/live.js): the figures and the feed are live regions the
   page re-fetches, so they end as the server renders them; this hook shows each event at once and grows the
   GPU-hours saved chart with Plotly.extendTraces. The page renders an incident a row with its reports folded
   under it; a new report of an incident already in the feed (its payload names the incident) is folded under
   that row, which moves to the top; any other event is a new line at the top, until the re-fetch lands. */
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
  // Faults the page already shows: an event sent between reading the topic's sequence and the snapshot is not
  // shown twice.
  Array.prototype.forEach.call(feed.querySelectorAll("[data-fault]"), function (el) { seen["f" + el.dataset.fault] = true; });
  // The running total as steps from zero (an axis from zero, not from the first total); an empty series is an
  // empty state until the first recovery.
  var chartEl = document.getElementById("saved-chart");
  var drawn = false;
  function draw(series) {
    chartEl.hidden = false;
    var empty = document.getElementById("saved-chart-empty");
    if (empty) { empty.hidden = true; }
    var xs = series.map(function (r) { return r.t; }), ys = series.map(function (r) { return r.cumulative; });
    if (xs.length) { xs.unshift(xs[0]); ys.unshift(0); }
    Plotly.newPlot("saved-chart", [{ x: xs, y: ys, mode: "lines+markers", name: "GPU-hours saved",
      line: { shape: "hv", color: "#2ea043" } }],
    { margin: { l: 70, r: 20, t: 10, b: 40 }, height: 260, xaxis: { type: "date" },
      yaxis: { title: "GPU-hours saved", rangemode: "tozero", tickformat: "," } },
    { displaylogo: false, responsive: true });
    drawn = true;
  }
  if (stats.series.length) { draw(stats.series); }

  // Only the first page of the feed is the newest: later pages keep what they were rendered with.
  var firstPage = !feed.dataset.page || feed.dataset.page === "1";
  function add(p, kind, className) {
    if (!firstPage) { return; }
    var code = kind === "fault" ? faultCode(p) : p.kind;
    var li = window.LockstepLive.prependToFeed(feed, p.detected_at, code,
                                               (p.summary || "") + (p.state_reason ? " — " + p.state_reason : ""), 100);
    if (className) { li.className = className; }
    // A line links to its incident's page (or to the job a recovery is for), as the rendered rows do.
    var href = p.incident ? "/incidents/" + Number(p.incident) + "/" : (p.job ? "/jobs/" + Number(p.job) + "/" : "");
    var codeEl = li.querySelector("code");
    if (href && codeEl) {
      var link = document.createElement("a");
      link.href = href;
      li.replaceChild(link, codeEl);
      link.appendChild(codeEl);
    }
  }
  function faultCode(p) { return p.kind + (p.xid !== null && p.xid !== undefined ? " " + p.xid : ""); }
  function incidentRow(p) {
    return p.incident ? feed.querySelector('li[data-incident="' + Number(p.incident) + '"]') : null;
  }
  function fold(row, p) {
    // A new report of an incident the feed shows: under its row, which is now the newest activity.
    var list = row.querySelector(".incident-faults");
    var item = document.createElement("li");
    var when = document.createElement("time");
    var code = document.createElement("code");
    var state = document.createElement("span");
    item.dataset.fault = p.fault;
    when.setAttribute("datetime", p.detected_at);
    when.textContent = window.LockstepLive.formatTime(p.detected_at);
    code.textContent = faultCode(p);
    state.className = "state";
    state.textContent = p.state || "new";
    item.appendChild(when);
    item.appendChild(document.createTextNode(" "));
    item.appendChild(code);
    item.appendChild(document.createTextNode(" " + (p.device || "") + " from " + (p.sources || []).join(", ") + " — "));
    item.appendChild(state);
    list.appendChild(item);
    var count = row.querySelector(".report-count");
    if (count) { count.textContent = Number(count.textContent) + 1; }
    var sources = row.querySelector(".report-sources");
    if (sources) {
      var known = sources.textContent.split(", ").filter(function (s) { return s && s !== "—"; });
      (p.sources || []).forEach(function (s) { if (known.indexOf(s) < 0) { known.push(s); } });
      sources.textContent = known.sort().join(", ");
    }
    if (firstPage) { feed.insertBefore(row, feed.firstChild); }
  }
  function onEvent(event) {
    var p = event.payload || {};
    if (event.kind === "fault.reported" && !seen["f" + p.fault]) {
      seen["f" + p.fault] = true;
      var row = incidentRow(p);
      if (row && row.querySelector(".incident-faults")) { fold(row, p); } else { add(p, "fault"); }
      window.LockstepLive.bumpFigure(faultsEl, 1, 0);
    } else if (event.kind === "actions.decided" || event.kind === "action.started" || event.kind === "action.planned") {
      // A decision lists its actions (actions.decided on fleet, cluster and tenant topics).
      (p.actions || [p]).forEach(function (a) {
        if (!a.fault_summary || seen["p" + a.action]) { return; }
        seen["p" + a.action] = true;
        add({ detected_at: a.detected_at, kind: a.kind, summary: a.fault_summary + " → " + a.summary, job: a.job },
            "action", "decided");
      });
    } else if (event.kind === "fault.handled") {
      var folded = feed.querySelector('.incident-faults li[data-fault="' + Number(p.fault) + '"] .state');
      if (folded) { folded.textContent = p.state; } else { add(p, "fault", "handled"); }
    } else if (event.kind === "action.succeeded" || event.kind === "actions.completed") {
      (p.actions || [p]).forEach(function (a) {
        if (!a.job || a.dry_run || seen["a" + a.action]) { return; }
        seen["a" + a.action] = true;
        cumulative += a.gpu_hours_saved || 0;
        window.LockstepLive.setFigure(savedEl, cumulative, 2);
        window.LockstepLive.bumpFigure(actionsEl, 1, 0);
        if (drawn) { Plotly.extendTraces("saved-chart", { x: [[a.ended_at]], y: [[cumulative]] }, [0]); }
        else { draw([{ t: a.ended_at, cumulative: cumulative }]); }
      });
    }
  }
  window.LockstepLive.on(onEvent);   // the page is live on #fault-feed's topic (static/js/live.js)
})();
