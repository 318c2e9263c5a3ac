/* A tenant's home: job rows and figures follow the tenant's topic live (job state, GPU-hours saved). */
(function () {
  "use strict";
  var liveEl = document.getElementById("dashboard-live");
  if (!liveEl || !liveEl.dataset.topic) { return; }
  var feed = document.getElementById("event-feed");
  var live = window.LockstepLive.connect();
  live.subscribe(liveEl.dataset.topic, liveEl.dataset.after, function (event) {
    window.LockstepLive.appendToFeed(feed, event);
    var p = event.payload || {};
    var jobId = p.job || (event.kind.indexOf("job.") === 0 ? p.id : null);
    var row = jobId ? document.querySelector("#tenant-jobs tr[data-job='" + jobId + "']") : null;
    if (row && p.state && event.kind.indexOf("job.") === 0) { row.querySelector(".state").textContent = p.state; }
    if (event.kind === "action.succeeded" && !p.dry_run && p.gpu_hours_saved) {
      var total = document.getElementById("fig-saved");
      total.textContent = (Number(total.textContent) + p.gpu_hours_saved).toFixed(2);
      if (row) {
        var cell = row.querySelector(".saved");
        cell.textContent = (Number(cell.textContent) + p.gpu_hours_saved).toFixed(2);
      }
    }
  });
})();
