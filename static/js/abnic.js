/* ab-nic: both jobs' iterations on one chart, grown live. Between events the running job's line is extended
 * from its own speed (seconds per iteration); an event for either job re-reads that job's timeline once. */
(function () {
  "use strict";
  var el = document.getElementById("abnic-data");
  if (!el || !window.Plotly) { return; }
  var data = JSON.parse(el.textContent);
  var labels = Object.keys(data);
  var chart = document.getElementById("abnic-chart");
  var COLORS = { protected: "#1a7f37", unprotected: "#b42318" };
  function traceOf(label) {
    var t = data[label].timeline;
    return { x: t.iterations.t.slice(), y: t.iterations.actual.slice(), mode: "lines", name: label + " (" + data[label].cluster + ")",
             line: { color: COLORS[label] || "#0b5cad", width: 3 } };
  }
  Plotly.newPlot(chart, labels.map(traceOf), { margin: { t: 10, r: 10 }, xaxis: { type: "date" },
    yaxis: { title: "iteration" }, legend: { orientation: "h" } }, { displayModeBar: false, responsive: true });
  function show(label) {
    var t = data[label].timeline, job = data[label].job;
    document.querySelector(".abnic-state[data-job='" + job + "']").textContent = t.state;
    document.querySelector(".abnic-saved[data-job='" + job + "']").textContent = Number(t.gpu_hours_saved).toFixed(2);
    var last = t.actions.length ? t.actions[t.actions.length - 1] : null;
    if (last) { document.querySelector(".abnic-action[data-job='" + job + "']").textContent = last.kind + " " + last.state; }
  }
  function reload(label) {
    fetch("/api/v1/jobs/" + data[label].job + "/timeline/" + (data[label].range ? "?range=" + encodeURIComponent(data[label].range) : ""),
          { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (t) {
        data[label].timeline = t; show(label);
        Plotly.react(chart, labels.map(traceOf), chart.layout);
      });
  }
  labels.forEach(show);
  // The page is live on both jobs' topics (#abnic-live, static/js/live.js): an event re-reads its job's timeline.
  window.LockstepLive.on(function (event) {
    labels.forEach(function (label) { if (data[label].topic === event.topic) { reload(label); } });
  });
  setInterval(function () {   // animation only: extend running jobs along their own speed
    var now = new Date();
    labels.forEach(function (label, index) {
      var t = data[label].timeline;
      if (t.state !== "Running" || !t.iterations.t.length) { return; }
      var lastT = new Date(t.iterations.t[t.iterations.t.length - 1]);
      var lastI = t.iterations.actual[t.iterations.actual.length - 1];
      var next = lastI + Math.floor((now - lastT) / 1000 / (t.seconds_per_iteration || 1));
      Plotly.extendTraces(chart, { x: [[now.toISOString()]], y: [[next]] }, [index]);
    });
  }, 2000);
})();
