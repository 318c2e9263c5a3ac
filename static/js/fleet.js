/* Fleet pages go live: the page subscribes to its topics (data-live-topics, rendered at data-live-after) and, on
 * each event, re-fetches itself and swaps every [data-live-region] in place — so what the page shows is always
 * what the server renders from the database (snapshot + events == a fresh snapshot). */
(function () {
  "use strict";
  var root = document.querySelector("[data-live-topics]");
  if (!root || !root.dataset.liveTopics || !window.LockstepLive) { return; }
  var topics = root.dataset.liveTopics.split(",");
  var after = (root.dataset.liveAfter || "").split(",");
  var feed = document.getElementById("fleet-feed");
  var pending = null;

  function refresh() {
    pending = null;
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) { if (!response.ok) { throw new Error(response.status); } return response.text(); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live-region]").forEach(function (region) {
          var next = fresh.getElementById(region.id);
          if (next) { region.innerHTML = next.innerHTML; }
        });
        window.LockstepLive.localTimes(document);
      })
      .catch(function () { /* the next event tries again */ });
  }

  function note(event) {
    if (!feed) { return; }
    var p = event.payload || {};
    window.LockstepLive.appendToFeed(feed, event, 30, [p.name, p.status || p.state, p.reason].filter(Boolean).join(" · "));
  }


  var live = window.LockstepLive.connect();
  topics.forEach(function (topic, i) {
    live.subscribe(topic, after[i] || 0, function (event) {
      note(event);
      if (!pending) { pending = setTimeout(refresh, 400); }  // a burst of events costs one re-fetch
    });
  });
})();
