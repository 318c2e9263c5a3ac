/* Lockstep live events: one websocket per page, ordered per topic, with catch-up after a reconnect.
 *
 *   const live = LockstepLive.connect();
 *   live.subscribe("job-17", lastSeqRenderedByServer, (event) => { ... });
 *
 * Events are applied in sequence order and duplicates dropped. After a reconnect the client fetches
 * /api/v1/events/?topic=…&after=<last seq seen> before applying new events, so nothing is missed.
 */
(function () {
  "use strict";

  function localTimes(root) {
    (root || document).querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (!isNaN(d)) { el.textContent = d.toLocaleString(); el.title = el.getAttribute("datetime"); }
    });
  }

  function Live(url) {
    this.url = url;
    this.topics = {};       // topic -> {last: seq, handlers: [], catchingUp: bool, queue: []}
    this.socket = null;
    this.backoff = 500;
    this.stateEl = document.getElementById("live-state");
    this.open();
  }

  Live.prototype.setState = function (text) {
    if (this.stateEl) { this.stateEl.textContent = text; this.stateEl.dataset.state = text; }
    document.body.dataset.live = text;
  };

  Live.prototype.open = function () {
    var self = this;
    this.setState("connecting");
    var socket = new WebSocket(this.url);
    this.socket = socket;
    socket.onopen = function () {
      self.backoff = 500;
      self.setState("live");
      var names = Object.keys(self.topics);
      if (names.length) { socket.send(JSON.stringify({ subscribe: names })); }
    };
    socket.onmessage = function (message) {
      var data = JSON.parse(message.data);
      if (data.type === "subscribed") {
        data.topics.forEach(function (name) { self.catchUp(name); });
      } else if (data.type === "event") {
        self.receive(data);
      }
    };
    socket.onclose = function () {
      self.setState("reconnecting");
      setTimeout(function () { self.open(); }, self.backoff);
      self.backoff = Math.min(self.backoff * 2, 10000);
    };
  };

  Live.prototype.subscribe = function (name, lastSeq, handler) {
    var entry = this.topics[name];
    if (!entry) {
      entry = this.topics[name] = { last: Number(lastSeq) || 0, handlers: [], catchingUp: false, queue: [] };
      if (this.socket && this.socket.readyState === WebSocket.OPEN) {
        this.socket.send(JSON.stringify({ subscribe: [name] }));
      }
    }
    entry.handlers.push(handler);
  };

  Live.prototype.apply = function (name, event) {
    var entry = this.topics[name];
    if (!entry || event.seq <= entry.last) { return; }   // a duplicate, or already caught up
    entry.last = event.seq;
    entry.handlers.forEach(function (handler) { handler(event); });
  };

  Live.prototype.receive = function (event) {
    var entry = this.topics[event.topic];
    if (!entry) { return; }
    if (entry.catchingUp) { entry.queue.push(event); return; }
    if (event.seq > entry.last + 1) { entry.queue.push(event); this.catchUp(event.topic); return; }
    this.apply(event.topic, event);
  };

  Live.prototype.catchUp = function (name) {
    var self = this;
    var entry = this.topics[name];
    if (!entry || entry.catchingUp) { return; }
    entry.catchingUp = true;
    function page(url) {
      return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { if (!r.ok) { throw new Error("catch-up " + r.status); } return r.json(); })
        .then(function (body) {
          body.results.forEach(function (event) { self.apply(name, event); });
          if (body.next) { return page(body.next); }
        });
    }
    page("/api/v1/events/?page_size=500&topic=" + encodeURIComponent(name) + "&after=" + entry.last)
      .catch(function () { /* the next reconnect tries again */ })
      .then(function () {
        entry.catchingUp = false;
        var queued = entry.queue.sort(function (a, b) { return a.seq - b.seq; });
        entry.queue = [];
        queued.forEach(function (event) { self.apply(name, event); });
      });
  };

  // One line of a live feed, newest first: "<time> <code> text". Every page's feed goes through here.
  function prependToFeed(feed, at, code, text, limit) {
    var empty = feed.querySelector(".empty");
    if (empty) { empty.remove(); }
    var item = document.createElement("li");
    var when = document.createElement("time");
    when.setAttribute("datetime", at);
    when.textContent = new Date(at).toLocaleTimeString();
    var kind = document.createElement("code");
    kind.textContent = code;
    item.appendChild(when);
    item.appendChild(document.createTextNode(" "));
    item.appendChild(kind);
    item.appendChild(document.createTextNode(" " + (text || "")));
    feed.insertBefore(item, feed.firstChild);
    while (feed.children.length > (limit || 50)) { feed.removeChild(feed.lastChild); }
    return item;
  }

  function appendToFeed(feed, event, limit, text) {
    var p = event.payload || {};
    var line = text !== undefined ? text : (p.summary || p.name || p.hostname || p.reason || "");
    prependToFeed(feed, event.created, event.kind, line, limit).dataset.seq = event.seq;
  }

  window.LockstepLive = {
    appendToFeed: appendToFeed,
    prependToFeed: prependToFeed,
    connect: function () {
      var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
      var live = new Live(scheme + window.location.host + "/ws/events/");
      window.LockstepLive.current = live;
      return live;
    },
    localTimes: localTimes,
  };

  document.addEventListener("DOMContentLoaded", function () { localTimes(document); });
})();
