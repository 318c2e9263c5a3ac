/* The job list: each row's state follows the live events of the reader's fleet or tenant topic. */
(function () {
  "use strict";
  var table = document.getElementById("job-table");
  if (!table || !table.dataset.topic) { return; }
  function apply(event, p) {
    if (!p.job) { return; }
    var row = table.querySelector('tr[data-job="' + p.job + '"]');
    if (!row) { return; }
    if (event.kind.indexOf("job.") === 0 && p.state) {
      var cell = row.querySelector(".state"); cell.textContent = p.state; cell.dataset.state = p.state;
    }
    if ((event.kind === "action.succeeded" || event.kind === "actions.completed") && !p.dry_run) {
      var saved = row.querySelector(".saved");
      window.LockstepLive.bumpFigure(saved, p.gpu_hours_saved || 0, 2);
      if (p.job_state) { var state = row.querySelector(".state"); state.textContent = p.job_state; state.dataset.state = p.job_state; }
    }
  }
  window.LockstepLive.connect().subscribe(table.dataset.topic, table.dataset.after, function (event) {
    var p = event.payload || {};
    // Decisions and completions on shared topics arrive as lists of actions.
    (p.actions || [p]).forEach(function (one) { apply(event, one); });
  });
})();
