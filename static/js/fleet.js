/* The fleet pages' hook on their live page (static/js/live.js subscribes to [data-live-topics] and re-fetches every
 * [data-live-region], so what the page shows is what the server renders from the database): the Live feed gets a
 * line per event as it happens, "name · status · reason", as fleet/views.py _fleet_line writes its history. */
(function () {
  "use strict";
  var feed = document.getElementById("fleet-feed");
  if (!feed || !window.LockstepLive) { return; }
  window.LockstepLive.on(function (event) {
    var p = event.payload || {};
    window.LockstepLive.appendToFeed(feed, event, 30, [p.name, p.status || p.state, p.reason].filter(Boolean).join(" · "));
  });
})();
