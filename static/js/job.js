/* The job page: a Plotly timeline (phases, faults, actions, snapshots) and iterations against the
 * restart-from-checkpoint counterfactual, drawn from the database snapshot in #timeline-data and grown live
 * with Plotly.extendTraces from the job's topic. */
(function () {
  "use strict";
  var dataEl = document.getElementById("timeline-data");
  var live = document.getElementById("job-live");
  if (!dataEl || !live || !window.Plotly) { return; }
  var data = JSON.parse(dataEl.textContent);
  var savedEl = document.getElementById("gpu-hours-saved");
  var stateEl = document.getElementById("job-state");
  var spi = data.seconds_per_iteration || 1;
  var seenFaults = {}, seenActions = {}, savedSecondsPerGpu = 0;
  var lastIteration = data.iterations.actual.length ? data.iterations.actual[data.iterations.actual.length - 1] : 0;
  var lastAt = data.iterations.t.length ? new Date(data.iterations.t[data.iterations.t.length - 1]) : new Date();
  var state = data.state;
  var ROWS = { running: "running", recovering: "recovering", degraded: "degraded" };

  function segment(start, end) { return [start, end || data.now, null]; }
  function phaseTrace(kind, color) {
    var xs = [], ys = [];
    data.phases.forEach(function (p) {
      if (p.kind === kind) { xs = xs.concat(segment(p.start, p.end)); ys = ys.concat([ROWS[kind], ROWS[kind], null]); }
    });
    return { x: xs, y: ys, mode: "lines", name: kind, line: { width: 14, color: color }, hoverinfo: "x+name" };
  }
  var faultTrace = { x: [], y: [], text: [], mode: "markers", name: "faults", marker: { symbol: "x", size: 11, color: "#c0392b" } };
  var actionTrace = { x: [], y: [], text: [], mode: "markers", name: "actions", marker: { symbol: "diamond", size: 10, color: "#1f6feb" } };
  var snapTrace = { x: [], y: [], text: [], mode: "lines+markers", name: "snapshots", line: { width: 8, color: "#8e44ad" } };
  data.faults.forEach(function (f) { seenFaults[f.fault] = true; faultTrace.x.push(f.detected_at); faultTrace.y.push("faults"); faultTrace.text.push(f.summary); });
  data.actions.forEach(function (a) {
    seenActions[a.action + ":" + a.state] = true;
    actionTrace.x.push(a.ended_at || a.started_at || a.planned_at); actionTrace.y.push("actions");
    actionTrace.text.push(a.kind + " " + a.state + " (" + a.gpu_hours_saved + " GPU-h saved)");
    if (a.state === "succeeded" && !a.dry_run && a.ended_at) { savedSecondsPerGpu += 0; }
  });
  data.snapshots.forEach(function (s) {
    snapTrace.x = snapTrace.x.concat(segment(s.start, s.end)); snapTrace.y = snapTrace.y.concat(["snapshots", "snapshots", null]);
    snapTrace.text = snapTrace.text.concat(["snapshot at iteration " + s.iteration, (s.seconds || 0).toFixed(1) + " s", null]);
  });
  var traces = [phaseTrace("running", "#2ea043"), phaseTrace("recovering", "#d29922"), phaseTrace("degraded", "#db6d28"),
                faultTrace, actionTrace, snapTrace];
  var layout = { margin: { l: 90, r: 20, t: 10, b: 40 }, height: 260, showlegend: false,
                 yaxis: { type: "category", categoryarray: ["snapshots", "actions", "faults", "degraded", "recovering", "running"] },
                 xaxis: { type: "date" } };
  Plotly.newPlot("job-timeline", traces, layout, { displaylogo: false, responsive: true });

  var counterGap = 0;
  var n = data.iterations.actual.length;
  if (n) { counterGap = data.iterations.actual[n - 1] - data.iterations.counterfactual[n - 1]; }
  Plotly.newPlot("job-iterations", [
    { x: data.iterations.t, y: data.iterations.actual, mode: "lines", name: "actual", line: { color: "#2ea043", shape: "hv" } },
    { x: data.iterations.t, y: data.iterations.counterfactual, mode: "lines", name: "restart from checkpoint", line: { dash: "dot", color: "#c0392b", shape: "hv" } }
  ], { margin: { l: 70, r: 20, t: 10, b: 40 }, height: 280, xaxis: { type: "date" },
       yaxis: { title: "iteration", rangemode: "tozero", tickformat: ",d" } },
  { displaylogo: false, responsive: true });

  function addPoint(at, iteration) {
    lastAt = new Date(at); lastIteration = iteration;
    Plotly.extendTraces("job-iterations", { x: [[at], [at]], y: [[iteration], [Math.max(0, iteration - counterGap)]] }, [0, 1]);
  }
  function setSaved(delta) { window.LockstepLive.bumpFigure(savedEl, delta, 2); }

  // The Recovery actions table: a row per action, newest planned first, its cells as the template writes them.
  var actionBody = document.querySelector("#action-table tbody");
  var ACTION_ORDER = { planned: 0, running: 1, started: 1, succeeded: 2, failed: 2, cancelled: 2, superseded: 2 };
  function fmt(value, digits) { return window.LockstepLive.formatNumber(value, digits); }
  function cell(row, className, text) {
    var td = document.createElement("td");
    if (className) { td.className = className; }
    if (text !== undefined) { td.textContent = text; }
    row.appendChild(td);
    return td;
  }
  function upsertAction(p) {
    if (!actionBody || !p.action) { return; }
    var row = actionBody.querySelector('tr[data-action="' + Number(p.action) + '"]');
    if (row && ACTION_ORDER[row.dataset.state] > ACTION_ORDER[p.state]) { return; }   // an older event, applied late
    var empty = actionBody.querySelector("tr.empty-row");
    if (empty) { empty.remove(); }
    var fresh = document.createElement("tr");
    fresh.dataset.action = p.action;
    fresh.dataset.state = p.state;
    var when = document.createElement("time");
    when.setAttribute("datetime", p.planned_at);
    when.textContent = window.LockstepLive.formatTime(p.planned_at);
    cell(fresh).appendChild(when);
    cell(fresh, "", p.kind + (p.dry_run ? " (dry run)" : ""));
    cell(fresh, "state", p.state);
    cell(fresh, "pause", fmt(p.pause_seconds || 0, 1));
    var lost = cell(fresh, "work-lost");
    if (p.restore_iteration !== null && p.restore_iteration !== undefined && p.state === "succeeded") {
      if (typeof p.work_lost_seconds === "number") { lost.appendChild(document.createTextNode(fmt(p.work_lost_seconds, 1) + " s ")); }
      lost.appendChild(document.createTextNode("from iteration "));
      var it = document.createElement("span");
      it.className = "restore-iteration";
      it.textContent = fmt(p.restore_iteration, 0);
      lost.appendChild(it);
    } else { lost.textContent = "–"; }
    cell(fresh, "overhead", p.snapshot_overhead_seconds ? fmt(p.snapshot_overhead_seconds, 1) : "–");
    cell(fresh, "saved", fmt(p.gpu_hours_saved || 0, 2));
    cell(fresh, "muted", (p.reason || "").length > 160 ? p.reason.slice(0, 159) + "…" : (p.reason || ""));
    if (row) { actionBody.replaceChild(fresh, row); return; }
    // newest planned first
    var rows = actionBody.querySelectorAll("tr[data-action]");
    for (var i = 0; i < rows.length; i++) {
      var t = rows[i].querySelector("time");
      if (t && t.getAttribute("datetime") < p.planned_at) { actionBody.insertBefore(fresh, rows[i]); return; }
    }
    actionBody.appendChild(fresh);
  }

  // The Incidents table: a new incident gets a row, a new report of one counts under it, and each recovery
  // attempt is listed (and its state kept) under the incident of its fault.
  var incidentBody = document.querySelector("#incident-table tbody");
  var incidentOfFault = {}, faultPayloads = {};
  data.faults.forEach(function (f) { if (f.incident) { incidentOfFault[f.fault] = f.incident; faultPayloads[f.fault] = f; } });
  function incidentRow(id) { return id && incidentBody ? incidentBody.querySelector('tr[data-incident="' + Number(id) + '"]') : null; }
  function addIncident(p) {
    if (!incidentBody || !p.incident) { return; }
    var row = incidentRow(p.incident);
    if (row) {
      if (!row.querySelector('li[data-fault="' + Number(p.fault) + '"]')) {
        var count = row.querySelector(".report-count");
        if (count) { count.textContent = Number(count.textContent) + 1; }
        var item = document.createElement("li");
        item.dataset.fault = p.fault;
        item.textContent = window.LockstepLive.formatTime(p.detected_at) + " " + p.summary + " — " + p.state;
        var list = row.querySelector(".incident-faults");
        if (list) { list.appendChild(item); }
      }
      return;
    }
    var empty = incidentBody.querySelector("tr.empty-row");
    if (empty) { empty.remove(); }
    row = document.createElement("tr");
    row.dataset.incident = p.incident;
    var when = document.createElement("time");
    when.setAttribute("datetime", p.detected_at);
    when.textContent = window.LockstepLive.formatTime(p.detected_at);
    cell(row).appendChild(when);
    var code = document.createElement("code");
    code.textContent = p.kind + (p.xid !== null && p.xid !== undefined ? " " + p.xid : "");
    var what = cell(row);
    what.appendChild(code);
    if (p.device) { what.appendChild(document.createTextNode(" " + p.device)); }
    cell(row, "", p.hostname || "");
    cell(row, "state", "open");
    var reports = cell(row);
    reports.innerHTML = '<details class="reports"><summary>reports: <span class="report-count">1</span> from ' +
      '<span class="report-sources"></span></summary><ul class="incident-faults"></ul></details>';
    reports.querySelector(".report-sources").textContent = (p.sources || []).join(", ") || "—";
    var first = document.createElement("li");
    first.dataset.fault = p.fault;
    first.textContent = window.LockstepLive.formatTime(p.detected_at) + " " + p.summary + " — " + p.state;
    reports.querySelector(".incident-faults").appendChild(first);
    var attempts = document.createElement("ol");
    attempts.className = "attempts";
    cell(row).appendChild(attempts);
    incidentBody.insertBefore(row, incidentBody.firstChild);
  }
  function addAttempt(p) {
    var row = incidentRow(incidentOfFault[p.fault]);
    // An incident is listed once the job made a recovery attempt for it (as the page renders it).
    if (!row && faultPayloads[p.fault]) { addIncident(faultPayloads[p.fault]); row = incidentRow(incidentOfFault[p.fault]); }
    if (!row) { return; }
    var list = row.querySelector("ol.attempts");
    if (!list) { return; }
    var none = list.querySelector("li.muted");
    if (none) { none.remove(); }
    var item = list.querySelector('li[data-action="' + Number(p.action) + '"]');
    if (!item) {
      item = document.createElement("li");
      item.dataset.action = p.action;
      item.appendChild(document.createTextNode(p.kind + (p.dry_run ? " (dry run)" : "") + " "));
      var state = document.createElement("span");
      state.className = "state";
      item.appendChild(state);
      list.appendChild(item);
    }
    item.querySelector(".state").textContent = p.state;
  }

  function onEvent(event) {
    var p = event.payload || {};
    if (event.kind === "fault.reported" && p.incident) {
      incidentOfFault[p.fault] = p.incident;
      faultPayloads[p.fault] = p;
      if (incidentRow(p.incident)) { addIncident(p); }   // another report of an incident listed
    }
    if (event.kind.indexOf("fault.") === 0 && !seenFaults[p.fault]) {
      seenFaults[p.fault] = true;
      Plotly.extendTraces("job-timeline", { x: [[p.detected_at]], y: [["faults"]], text: [[p.summary]] }, [3]);
    } else if (event.kind.indexOf("action.") === 0 && p.job === Number(live.dataset.job) && !seenActions[p.action + ":" + p.state]) {
      seenActions[p.action + ":" + p.state] = true;
      upsertAction(p);
      addAttempt(p);
      var at = p.ended_at || p.started_at || p.planned_at;
      Plotly.extendTraces("job-timeline", { x: [[at]], y: [["actions"]], text: [[p.kind + " " + p.state]] }, [4]);
      if (p.state === "succeeded" && !p.dry_run) {
        Plotly.extendTraces("job-timeline", { x: [segment(p.detected_at, p.ended_at)], y: [["recovering", "recovering", null]] }, [1]);
        if (p.kind === "nic_failover") {
          Plotly.extendTraces("job-timeline", { x: [[p.ended_at, new Date().toISOString(), null]], y: [["degraded", "degraded", null]] }, [2]);
        }
        setSaved(p.gpu_hours_saved || 0);
        counterGap += (p.gpu_hours_saved || 0) * 3600 / Math.max(1, p.gpus || 1) / spi;
        if (p.job_state) { onEvent({ kind: "job.state", created: p.at, payload: { state: p.job_state, iteration: p.iteration, at: p.at } }); }
      }
    } else if (event.kind.indexOf("snapshot.") === 0 && p.ended_at) {
      Plotly.extendTraces("job-timeline", { x: [segment(p.started_at, p.ended_at)], y: [["snapshots", "snapshots", null]],
                                             text: [["snapshot at iteration " + p.iteration, "", null]] }, [5]);
    } else if (event.kind === "job.progress" || event.kind === "job.state") {
      if (stateEl && p.state) { stateEl.textContent = p.state; state = p.state; }
      if (typeof p.iteration === "number") { addPoint(p.at || event.created, p.iteration); }
      if (p.state === "Running") {
        Plotly.extendTraces("job-timeline", { x: [[p.at || event.created, p.at || event.created, null]], y: [["running", "running", null]] }, [0]);
      }
    }
  }
  function onTopicEvent(event) {
    // Decisions and completions arrive as lists of a tenant's actions: take this job's, as single events.
    if (event.payload && event.payload.actions) {
      event.payload.actions.forEach(function (a) {
        if (a.job === Number(live.dataset.job)) { onEvent({ kind: a.event || "action." + a.state, created: event.created, payload: a }); }
      });
      return;
    }
    onEvent(event);
  }
  window.LockstepLive.connect().subscribe(live.dataset.topic, live.dataset.after, onTopicEvent);

  // A simulated job advances by the clock: extend the running line and the iteration curve every few seconds.
  setInterval(function () {
    if (state !== "Running") { return; }
    var now = new Date();
    var iteration = lastIteration + Math.floor((now - lastAt) / 1000 / spi);
    Plotly.extendTraces("job-timeline", { x: [[lastAt.toISOString(), now.toISOString(), null]], y: [["running", "running", null]] }, [0]);
    addPoint(now.toISOString(), iteration);
  }, 5000);
})();
