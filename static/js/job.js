/* The job page's charts: a Plotly timeline (phases, faults, actions, snapshots) and iterations against the
 * restart-from-checkpoint counterfactual, drawn from the database snapshot in #timeline-data and grown live
 * with Plotly.extendTraces from the job's topic (a hook on static/js/live.js's live page). */
(function () {
  "use strict";
  var dataEl = document.getElementById("timeline-data");
  var live = document.getElementById("job-live");
  if (!dataEl || !live || !window.Plotly) { return; }
  var data = JSON.parse(dataEl.textContent);
  var spi = data.seconds_per_iteration || 1;
  var seenFaults = {}, seenActions = {};
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
  function onEvent(event) {
    var p = event.payload || {};
    if (event.kind.indexOf("fault.") === 0 && !seenFaults[p.fault]) {
      seenFaults[p.fault] = true;
      Plotly.extendTraces("job-timeline", { x: [[p.detected_at]], y: [["faults"]], text: [[p.summary]] }, [3]);
    } else if (event.kind.indexOf("action.") === 0 && p.job === Number(live.dataset.job) && !seenActions[p.action + ":" + p.state]) {
      seenActions[p.action + ":" + p.state] = true;
      var at = p.ended_at || p.started_at || p.planned_at;
      Plotly.extendTraces("job-timeline", { x: [[at]], y: [["actions"]], text: [[p.kind + " " + p.state]] }, [4]);
      if (p.state === "succeeded" && !p.dry_run) {
        Plotly.extendTraces("job-timeline", { x: [segment(p.detected_at, p.ended_at)], y: [["recovering", "recovering", null]] }, [1]);
        if (p.kind === "nic_failover") {
          Plotly.extendTraces("job-timeline", { x: [[p.ended_at, new Date().toISOString(), null]], y: [["degraded", "degraded", null]] }, [2]);
        }
        counterGap += (p.gpu_hours_saved || 0) * 3600 / Math.max(1, p.gpus || 1) / spi;
        if (p.job_state) { onEvent({ kind: "job.state", created: p.at, payload: { state: p.job_state, iteration: p.iteration, at: p.at } }); }
      }
    } else if (event.kind.indexOf("snapshot.") === 0 && p.ended_at) {
      Plotly.extendTraces("job-timeline", { x: [segment(p.started_at, p.ended_at)], y: [["snapshots", "snapshots", null]],
                                             text: [["snapshot at iteration " + p.iteration, "", null]] }, [5]);
    } else if (event.kind === "job.progress" || event.kind === "job.state") {
      if (p.state) { state = p.state; }
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
  // The page is live on #job-live's topic (static/js/live.js): its state, GPU-hours saved, Incidents and
  // Recovery actions are live regions the page re-fetches; the charts grow here, from each event.
  window.LockstepLive.on(onTopicEvent);

  // A simulated job advances by the clock: extend the running line and the iteration curve every few seconds.
  setInterval(function () {
    if (state !== "Running") { return; }
    var now = new Date();
    var iteration = lastIteration + Math.floor((now - lastAt) / 1000 / spi);
    Plotly.extendTraces("job-timeline", { x: [[lastAt.toISOString(), now.toISOString(), null]], y: [["running", "running", null]] }, [0]);
    addPoint(now.toISOString(), iteration);
  }, 5000);
})();
