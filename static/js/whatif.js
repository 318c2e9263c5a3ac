(function () {
  "use strict";
  var box = document.getElementById("whatif");
  if (!box) { return; }
  var run = Number(box.dataset.run);
  var bar = document.getElementById("whatif-progress");
  var state = document.getElementById("whatif-state");
  var percent = document.getElementById("whatif-percent");
  if (box.dataset.state === "done" || box.dataset.state === "failed") { return; }
  var live = window.LockstepLive.connect();
  live.subscribe("fleet", box.dataset.after || 0, function (event) {
    if (!event.kind.startsWith("whatif.") || event.payload.run !== run) { return; }
    bar.value = event.payload.progress;
    if (percent) { percent.textContent = Math.round(event.payload.progress * 100) + " %"; }
    state.textContent = event.payload.state;
    if (event.payload.state === "done" || event.payload.state === "failed") {
      window.location.reload();   // the report is rendered from the database
    }
  });
})();
