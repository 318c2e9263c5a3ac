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
    function rowOf(jobId) { return jobId ? document.querySelector("#tenant-jobs tr[data-job='" + jobId + "']") : null; }
    if (event.kind.indexOf("job.") === 0) {
      var row = rowOf(p.job);
      if (row && p.state) { row.querySelector(".state").textContent = p.state; }
    } else if (event.kind === "actions.completed" || event.kind === "actions.decided") {
      // lists of this tenant's recoveries: each carries its job, and when completed the job's new state
      (p.actions || []).forEach(function (a) {
        var row = rowOf(a.job);
        if (row && a.job_state) { row.querySelector(".state").textContent = a.job_state; }
        if (event.kind === "actions.completed" && !a.dry_run && a.gpu_hours_saved) {
          window.LockstepLive.bumpFigure(document.getElementById("fig-saved"), a.gpu_hours_saved, 2);
          if (row) { window.LockstepLive.bumpFigure(row.querySelector(".saved"), a.gpu_hours_saved, 2); }
        }
      });
    }
  });
})();
