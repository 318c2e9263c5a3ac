/* The node page's telemetry (templates/fleet/node_detail.html): per-GPU series (memory included) and per-NIC
 * series (throughput, errors, drops, link changes) over the page's range, or the latest memory and NIC counters
 * where the raw samples are not kept that far back, and the node's faults, Xids, link changes and recovery actions on the same
 * time axis (a line on every chart, and a strip naming them). Data from #node-charts-data (json_script, built
 * by jobs.views.node_detail from telemetry.selectors); nothing is fetched. */
(function () {
  "use strict";
  var dataEl = document.getElementById("node-charts-data");
  if (!dataEl || !window.Plotly) { return; }
  var data = JSON.parse(dataEl.textContent);
  var CONFIG = { displayModeBar: false, responsive: true };
  var MARKERS = {
    fault: { name: "Faults", color: "#b42318", symbol: "diamond" },
    xid: { name: "Xids", color: "#8250df", symbol: "x" },
    link: { name: "Link changes", color: "#bc4c00", symbol: "triangle-down" },
    action: { name: "Recovery actions", color: "#1a7f37", symbol: "circle" }
  };
  var ORDER = ["action", "link", "xid", "fault"];
  var xrange = [data.range.since, data.range.until];
  var gpus = data.gpus;
  var x = gpus.x.map(function (ms) { return new Date(ms); });

  // a dashed line at each marker, coloured by its kind, on every time chart
  var shapes = data.markers.map(function (m) {
    return { type: "line", xref: "x", yref: "paper", x0: m.at, x1: m.at, y0: 0, y1: 1,
      line: { color: MARKERS[m.kind].color, width: 1.5, dash: "dash" } };
  });
  function layout(title, extra) {
    var base = { margin: { t: 8, r: 8, b: 40, l: 56 }, xaxis: { type: "date", range: xrange },
      yaxis: { title: title, rangemode: "tozero" }, shapes: shapes, showlegend: true,
      legend: { orientation: "h", y: -0.2 } };
    return Object.assign(base, extra || {});
  }
  function lines(values, suffix, along) {
    return Object.keys(values).sort(function (a, b) { return a.localeCompare(b, undefined, { numeric: true }); })
      .map(function (name) {
        return { type: "scatter", mode: "lines", x: along || x, y: values[name], name: name + (suffix || ""),
          connectgaps: false, hovertemplate: "%{y}<extra>" + name + (suffix || "") + "</extra>" };
      });
  }
  // each line of ``values`` through ``f`` (null stays null)
  function mapped(values, f) {
    var out = {};
    Object.keys(values).forEach(function (name) {
      out[name] = values[name].map(function (v) { return v === null || v === undefined ? null : f(v); });
    });
    return out;
  }
  // a byte counter per bucket (times in ms) as Gbit/s since the previous point; none across a reset
  function throughput(values, times) {
    var out = {};
    Object.keys(values).forEach(function (name) {
      var last = -1;
      out[name] = values[name].map(function (v, i) {
        if (v === null || v === undefined) { return null; }
        var rate = null;
        if (last >= 0 && v >= values[name][last]) {
          rate = Math.round((v - values[name][last]) * 8 / 1e9 / ((times[i] - times[last]) / 1000) * 1000) / 1000;
        }
        last = i;
        return rate;
      });
    });
    return out;
  }
  var GIB = 1073741824;
  var gib = function (v) { return Math.round(v / GIB * 10) / 10; };

  // the strip: one row per kind of marker, each a point with its name and device
  var strip = document.getElementById("chart-events");
  var rows = ORDER.map(function (kind) {
    var own = data.markers.filter(function (m) { return m.kind === kind; });
    return { type: "scatter", mode: "markers", name: MARKERS[kind].name, x: own.map(function (m) { return m.at; }),
      y: own.map(function () { return MARKERS[kind].name; }),
      text: own.map(function (m) { return m.label + (m.device ? " on " + m.device : "") + " (" + m.state + ")"; }),
      hovertemplate: "%{text}<extra></extra>",
      marker: { color: MARKERS[kind].color, symbol: MARKERS[kind].symbol, size: 12 } };
  });
  Plotly.newPlot(strip, rows, { margin: { t: 8, r: 8, b: 32, l: 120 }, height: 180, showlegend: false,
    xaxis: { type: "date", range: xrange },
    yaxis: { type: "category", categoryorder: "array", categoryarray: ORDER.map(function (k) { return MARKERS[k].name; }) },
    shapes: shapes }, CONFIG);
  strip.dataset.markers = String(data.markers.length);

  var TITLES = { temperature: "°C", power: "W", utilization: "%", ecc: "errors" };
  if (gpus.has_data) {
    Array.prototype.forEach.call(document.querySelectorAll("#gpu-charts [data-metric]"), function (chart) {
      var metric = chart.dataset.metric;
      var traces = metric === "ecc"
        ? lines(gpus.values.sbe, " corrected").concat(lines(gpus.values.dbe, " uncorrected"))
        : lines(gpus.values[metric]);
      var extra = metric === "utilization" ? { yaxis: { title: "%", range: [0, 100] } } : null;
      if (!traces.length) {
        extra = { annotations: [{ text: "Not kept over this range", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }] };
      }
      Plotly.newPlot(chart, traces, layout(TITLES[metric], extra), CONFIG);
      chart.dataset.series = String(traces.length);
    });
  }

  var memory = document.getElementById("chart-memory");
  var mibToGib = function (v) { return Math.round(v / 1024 * 10) / 10; };  // the series are in MiB
  var memoryLines = gpus.per_gpu ? lines(mapped(gpus.values.memory || {}, mibToGib)) : [];
  var memoryKept = memoryLines.some(function (t) { return t.y.some(function (v) { return v !== null; }); });
  if (memory && memoryKept) {
    var total = Math.max.apply(null, data.memory.map(function (m) { return m.total ? gib(m.total) : 0; }));
    Plotly.newPlot(memory, memoryLines, layout("GiB", total ? { yaxis: { title: "GiB", range: [0, total] } } : null), CONFIG);
    memory.dataset.series = String(memoryLines.length);
  } else if (memory && data.memory.length) {
    var names = data.memory.map(function (m) { return m.gpu; });
    var used = data.memory.map(function (m) { return m.used === null || m.used === undefined ? null : gib(m.used); });
    var free = data.memory.map(function (m) { return m.total ? gib(m.total - m.used) : null; });
    Plotly.newPlot(memory, [
      { type: "bar", x: names, y: used, name: "in use", marker: { color: "#0969da" } },
      { type: "bar", x: names, y: free, name: "free", marker: { color: "#d0d7de" } }
    ], { barmode: "stack", margin: { t: 8, r: 8, b: 40, l: 56 }, yaxis: { title: "GiB" },
      legend: { orientation: "h", y: -0.2 } }, CONFIG);
  }

  // NIC series: per group, a line per NIC (and direction), on the GPU charts' time axis and markers
  var nicCharts = document.getElementById("nic-charts");
  if (nicCharts && nicCharts.dataset.mode === "series") {
    var nic = data.nic_series;
    var nx = nic.x.map(function (ms) { return new Date(ms); });
    var COUNTERS = { errors: "errors", drops: "drops", "link changes": "link_changes" };
    Array.prototype.forEach.call(nicCharts.querySelectorAll("[data-group]"), function (chart) {
      var group = chart.dataset.group;
      var traces = group === "bytes"
        ? lines(throughput(nic.values.rx_bytes, nic.x), " received", nx)
          .concat(lines(throughput(nic.values.tx_bytes, nic.x), " sent", nx))
        : lines(nic.values[COUNTERS[group]], "", nx);
      var shown = traces.filter(function (t) { return t.y.some(function (v) { return v !== null; }); });
      var extra = shown.length ? null : { annotations: [{ text: "No " + group + " counters reported",
        showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }] };
      Plotly.newPlot(chart, shown, layout(group === "bytes" ? "Gbit/s" : group, extra), CONFIG);
      chart.dataset.series = String(shown.length);
    });
    return;
  }

  // NIC counters at their latest reading (no samples over this range): per group, a bar per counter and NIC
  Array.prototype.forEach.call(document.querySelectorAll("#nic-charts [data-group]"), function (chart) {
    var group = chart.dataset.group;
    var counters = {};
    data.nics.forEach(function (nic) {
      Object.keys(nic.counters[group] || {}).forEach(function (name) { counters[name] = true; });
    });
    var traces = Object.keys(counters).sort().map(function (name) {
      return { type: "bar", name: name, x: data.nics.map(function (nic) { return nic.nic + " (" + nic.link_state + ")"; }),
        y: data.nics.map(function (nic) { var v = (nic.counters[group] || {})[name]; return v === undefined ? null : v; }) };
    });
    Plotly.newPlot(chart, traces, { barmode: "group", margin: { t: 8, r: 8, b: 60, l: 64 },
      yaxis: { title: group, rangemode: "tozero" }, legend: { orientation: "h", y: -0.3 },
      annotations: traces.length ? [] : [{ text: "No " + group + " counters reported", showarrow: false,
        xref: "paper", yref: "paper", x: 0.5, y: 0.5 }] }, CONFIG);
  });
})();
