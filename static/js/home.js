(function () {
  "use strict";
  var feed = document.getElementById("event-feed");
  if (!feed || !feed.dataset.topics) { return; }
  var live = window.LockstepLive.connect();
  feed.dataset.topics.split(",").forEach(function (name) {
    live.subscribe(name, feed.dataset.after || 0, function (event) {
      var empty = feed.querySelector(".empty");
      if (empty) { empty.remove(); }
      var item = document.createElement("li");
      var when = document.createElement("time");
      when.setAttribute("datetime", event.created);
      when.textContent = new Date(event.created).toLocaleTimeString();
      var kind = document.createElement("code");
      kind.textContent = event.kind;
      item.appendChild(when);
      item.appendChild(document.createTextNode(" "));
      item.appendChild(kind);
      item.appendChild(document.createTextNode(" " + (event.payload.name || event.payload.summary || "")));
      item.dataset.seq = event.seq;
      feed.insertBefore(item, feed.firstChild);
      while (feed.children.length > 50) { feed.removeChild(feed.lastChild); }
    });
  });
})();
