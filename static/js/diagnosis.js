(function () {
  "use strict";
  var box = document.getElementById("diagnosis");
  if (!box) { return; }
  var summary = document.getElementById("diagnosis-summary");
  var list = document.getElementById("diagnosis-findings");
  document.getElementById("diagnose-button").addEventListener("click", function () {
    summary.textContent = "Diagnosing…";
    fetch(box.dataset.url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.json(); })
      .then(function (d) {
        summary.textContent = d.summary + (d.slowness && d.slowness.detail ? " (" + d.slowness.detail + ")" : "");
        box.dataset.fabric = d.fabric ? "yes" : "no";
        list.textContent = "";
        (d.findings || []).forEach(function (f) {
          var li = document.createElement("li");
          li.textContent = f.name + ": " + f.evidence.join("; ");
          list.appendChild(li);
        });
      })
      .catch(function () { summary.textContent = "The diagnosis could not be loaded."; });
  });
})();
