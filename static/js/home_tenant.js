/* A tenant's home: job rows and figures follow the tenant's topic live (job state, GPU-hours saved and lost). */
(function () {
  "use strict";
  var liveEl = document.getElementById("dashboard-live");
  if (!liveEl || !liveEl.dataset.topic) { return; }
  var feed = document.getElementById("event-feed");
  // The page is live on #dashboard-live's topic (static/js/live.js).
  window.LockstepLive.on(function (event) {
    window.LockstepLive.appendToFeed(feed, event);
    var p = event.payload || {};
    function rowOf(jobId) { return jobId ? document.querySelector("#tenant-jobs tr[data-job='" + jobId + "']") : null; }
    // The "Jobs running" and "recovering" figures move with each job's change of state: one out of the state it
    // left, one into the state it entered (a new job has no row yet and left no state).
    function count(state, by) {
      var id = state === "Running" ? "fig-running" : state === "Recovering" ? "fig-recovering" : null;
      if (id) { window.LockstepLive.bumpFigure(document.getElementById(id), by, 0); }
    }
    function setState(jobId, state, isNew) {
      if (!state) { return; }
      var row = rowOf(jobId), cell = row ? row.querySelector(".state") : null;
      var old = cell ? cell.textContent.trim() : null;
      if (old === state || (!cell && !isNew)) { return; }
      if (old) { count(old, -1); }
      count(state, 1);
      if (cell) { cell.textContent = state; }
    }
    if (event.kind.indexOf("job.") === 0) {
      setState(p.job, p.state, event.kind === "job.submitted");
    } else if (event.kind === "actions.completed" || event.kind === "actions.decided") {
      // lists of this tenant's recoveries: each carries its job, and when completed the job's new state
      (p.actions || []).forEach(function (a) {
        var row = rowOf(a.job);
        setState(a.job, a.job_state, false);
        if (event.kind === "actions.completed" && !a.dry_run && a.gpu_hours_saved) {
          window.LockstepLive.bumpFigure(document.getElementById("fig-saved"), a.gpu_hours_saved, 2);
          if (row) { window.LockstepLive.bumpFigure(row.querySelector(".saved"), a.gpu_hours_saved, 2); }
        }
        if (event.kind === "actions.completed" && !a.dry_run && a.gpu_hours_lost) {
          window.LockstepLive.bumpFigure(document.getElementById("fig-lost"), a.gpu_hours_lost, 2);
          if (row) { window.LockstepLive.bumpFigure(row.querySelector(".lost"), a.gpu_hours_lost, 2); }
        }
      });
    }
  });
})();
