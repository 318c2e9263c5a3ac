/* Lockstep live pages: the one way a page goes live, over one websocket per page, ordered per topic, with
 * catch-up after a reconnect.
 *
 * A page names its topics and the sequence numbers it was rendered at in its markup (one element with
 * data-live-topics="job-17" data-live-after="42", comma-separated for several; data-live-kinds="whatif." to
 * re-fetch only for events of those kinds). On each event the page re-fetches itself and swaps every
 * [data-live-region] (by id) for the fresh render's, so what it shows is what the server renders from the
 * database: snapshot + events == a fresh snapshot, by construction. A burst of events costs one re-fetch.
 * A page with an effect of its own per event (a Plotly chart grown with extendTraces, a figure that follows an
 * event's payload) adds a hook before the page has loaded:
 *
 *   LockstepLive.on((event) => { ... });   // each event, in order, once, before the re-fetch
 *
 * (Underneath: LockstepLive.connect().subscribe(topic, lastSeq, handler), which live pages do not call.)
 *
 * Events are applied in sequence order and duplicates dropped. A topic is caught up from
 * /api/v1/events/?topic=…&after=<last seq applied> when it is (re)subscribed, when an event's seq jumps, and
 * when the server says its head (last seq) is above what the page has: the server sends heads with each
 * subscribe reply and, every few seconds, for a topic whose events did not all reach this socket. Events that
 * arrive during a catch-up wait in a queue; a catch-up that fails is retried (1 s, doubling to 30 s) and the
 * queue kept, so nothing is applied out of order or skipped.
 */
(function () {
  "use strict";

  // The one date format of every page (templatetags/figures.py `when` writes the same, in UTC): here in the
  // reader's time zone.
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function formatTime(value) {
    var d = value instanceof Date ? value : new Date(value);
    if (isNaN(d)) { return ""; }
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function localTimes(root) {
    (root || document).querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (!isNaN(d)) { el.textContent = formatTime(d); el.title = el.getAttribute("datetime"); }
    });
  }

  // Numbers as the templates write them (`number` filter): thousands separators, fixed decimals.
  function formatNumber(value, digits) {
    digits = digits || 0;
    var n = Number(value) || 0;
    if (Math.abs(n) < Math.pow(10, -digits) / 2) { n = 0; }
    return n.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
  }

  // A figure on the page that events change: its value is kept in data-value (the text carries separators).
  function figureValue(el) {
    if (!el) { return 0; }
    if (el.dataset.value !== undefined) { return Number(el.dataset.value) || 0; }
    return Number(el.textContent.replace(/[^0-9.\-]/g, "")) || 0;
  }
  function setFigure(el, value, digits) {
    if (!el) { return; }
    el.dataset.value = String(value);
    el.textContent = formatNumber(value, digits === undefined ? Number(el.dataset.digits || 0) : digits);
  }
  function bumpFigure(el, by, digits) {
    if (!el) { return; }
    setFigure(el, Math.round((figureValue(el) + by) * 10000) / 10000, digits);
  }

  function Live(url) {
    this.url = url;
    // topic -> {last: seq applied, known: highest seq known to exist, handlers, catchingUp, queue, retry…}
    this.topics = {};
    this.socket = null;
    this.backoff = 500;
    this.stateEl = document.getElementById("live-state");
    this.open();
  }

  Live.prototype.setState = function (text) {
    // The badge is hidden on pages that subscribe to nothing; a live page shows it from its first connect.
    if (this.stateEl) { this.stateEl.hidden = false; this.stateEl.textContent = text; this.stateEl.dataset.state = text; }
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
        self.heads(data.heads || {});
        data.topics.forEach(function (name) { self.catchUp(name, true); });
      } else if (data.type === "heads") {
        self.heads(data.heads || {});
        Object.keys(data.heads || {}).forEach(function (name) {
          var entry = self.topics[name];
          if (entry && entry.known > entry.last) { self.catchUp(name); }
        });
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
      var last = Number(lastSeq) || 0;
      entry = this.topics[name] = { last: last, known: last, handlers: [], catchingUp: false, queue: [],
                                    again: false, retryDelay: 1000, retryTimer: null };
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
    entry.handlers.forEach(function (handler) {
      // A page's handler that throws must not stop the others, or the events queued behind this one.
      try { handler(event); } catch (error) { setTimeout(function () { throw error; }); }
    });
  };

  // What the server says exists: a topic's head, from a subscribe reply or a heads message.
  Live.prototype.heads = function (heads) {
    var self = this;
    Object.keys(heads).forEach(function (name) {
      var entry = self.topics[name];
      var head = Number(heads[name]) || 0;
      if (entry && head > entry.known) { entry.known = head; }
    });
  };

  Live.prototype.receive = function (event) {
    var entry = this.topics[event.topic];
    if (!entry) { return; }
    if (event.seq > entry.known) { entry.known = event.seq; }
    if (entry.catchingUp) { entry.queue.push(event); return; }
    if (event.seq > entry.last + 1) { entry.queue.push(event); this.catchUp(event.topic); return; }
    this.apply(event.topic, event);
  };

  // Fetch what a topic missed, then apply the queued events that follow on without a gap. `now` (after a
  // (re)subscribe) retries a failed catch-up at once, or runs one more after the one in flight.
  Live.prototype.catchUp = function (name, now) {
    var self = this;
    var entry = this.topics[name];
    if (!entry) { return; }
    if (entry.retryTimer !== null) {
      if (!now) { return; }                       // waiting to retry: the retry fetches this too
      clearTimeout(entry.retryTimer);
      entry.retryTimer = null;
    } else if (entry.catchingUp) {
      if (now) { entry.again = true; }
      return;
    }
    entry.catchingUp = true;
    entry.again = false;
    // Everything up to `target` was committed before this fetch starts, so the fetch returns all of it
    // that still exists (pruned events never come back: the page moves past them).
    var target = entry.known;
    function page(url) {
      return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (r) { if (!r.ok) { throw new Error("catch-up " + r.status); } return r.json(); })
        .then(function (body) {
          body.results.forEach(function (event) { self.apply(name, event); });
          if (body.next) { return page(body.next); }
        });
    }
    page("/api/v1/events/?page_size=500&topic=" + encodeURIComponent(name) + "&after=" + entry.last)
      .then(function () {
        entry.retryDelay = 1000;
        if (entry.last < target) { entry.last = target; }
        entry.catchingUp = false;
        self.drain(name);
      }, function () {
        // Keep the queue and stay in catch-up (new events queue too) until a retry fills the gap.
        var delay = entry.retryDelay;
        entry.retryDelay = Math.min(delay * 2, 30000);
        entry.retryTimer = setTimeout(function () {
          entry.retryTimer = null;
          entry.catchingUp = false;
          self.catchUp(name);
        }, delay);
      });
  };

  // Apply queued events in order while they follow on; a gap left (an event not yet fetched) means another
  // catch-up, as does a head above what was applied or a (re)subscribe during the fetch.
  Live.prototype.drain = function (name) {
    var entry = this.topics[name];
    var queued = entry.queue.sort(function (a, b) { return a.seq - b.seq; });
    entry.queue = [];
    for (var i = 0; i < queued.length; i++) {
      if (queued[i].seq > entry.last + 1) { entry.queue = queued.slice(i); break; }
      this.apply(name, queued[i]);
    }
    if (entry.queue.length || entry.known > entry.last || entry.again) { this.catchUp(name); }
  };

  // One line of a live feed, newest first: "<time> <code> text". Every page's feed goes through here.
  function prependToFeed(feed, at, code, text, limit) {
    var empty = feed.querySelector(".empty");
    if (empty) { empty.remove(); }
    var item = document.createElement("li");
    var when = document.createElement("time");
    when.setAttribute("datetime", at);
    when.textContent = formatTime(at);
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

  // The page's live regions, re-rendered by the server: one fetch at a time, and one more if events came while
  // it was in flight (so the last swap is never older than the last event).
  var hooks = [];
  var refreshTimer = null, refreshing = false, refreshAgain = false;
  function refreshRegions() {
    refreshTimer = null;
    if (refreshing) { refreshAgain = true; return; }
    refreshing = true;
    refreshAgain = false;
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) { if (!response.ok) { throw new Error(response.status); } return response.text(); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live-region]").forEach(function (region) {
          var next = fresh.getElementById(region.id);
          if (next) { region.innerHTML = next.innerHTML; }
        });
        localTimes(document);
      })
      .catch(function () { /* the next event tries again */ })
      .then(function () {
        refreshing = false;
        if (refreshAgain) { scheduleRefresh(); }
      });
  }
  function scheduleRefresh() {
    if (!refreshTimer) { refreshTimer = setTimeout(refreshRegions, 400); }
  }

  function startPage() {
    var root = document.querySelector("[data-live-topics]");
    if (!root || !root.dataset.liveTopics) { return; }
    var topics = root.dataset.liveTopics.split(",");
    var after = (root.dataset.liveAfter || "").split(",");
    var kinds = root.dataset.liveKinds ? root.dataset.liveKinds.split(",") : null;
    var hasRegions = document.querySelector("[data-live-region]") !== null;
    var live = window.LockstepLive.connect();
    function onEvent(event) {
      hooks.forEach(function (hook) {
        try { hook(event); } catch (error) { setTimeout(function () { throw error; }); }
      });
      var wanted = !kinds || kinds.some(function (prefix) { return (event.kind || "").indexOf(prefix) === 0; });
      if (hasRegions && wanted) { scheduleRefresh(); }
    }
    topics.forEach(function (topic, i) {
      if (topic) { live.subscribe(topic, after[i] || 0, onEvent); }
    });
  }

  window.LockstepLive = {
    appendToFeed: appendToFeed,
    prependToFeed: prependToFeed,
    connect: function () {
      if (window.LockstepLive.current) { return window.LockstepLive.current; }   // one socket per page
      var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
      var live = new Live(scheme + window.location.host + "/ws/events/");
      window.LockstepLive.current = live;
      return live;
    },
    on: function (hook) { hooks.push(hook); },
    localTimes: localTimes,
    formatTime: formatTime,
    formatNumber: formatNumber,
    figureValue: figureValue,
    setFigure: setFigure,
    bumpFigure: bumpFigure,
  };

  document.addEventListener("DOMContentLoaded", function () { localTimes(document); startPage(); });
})();
