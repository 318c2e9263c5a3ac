/* The time-range picker (templates/_time_range.html): the range last chosen on a page is remembered in
 * localStorage under the page's path, and a later visit without ?range= asks for it. */
(function () {
  "use strict";
  var picker = document.querySelector("[data-time-range]");
  if (!picker || picker.dataset.ready) { return; }
  picker.dataset.ready = "1";
  var key = "lockstep.range:" + window.location.pathname;
  var params = new URLSearchParams(window.location.search);
  function remember(value) { try { window.localStorage.setItem(key, value); } catch (e) { /* storage off */ } }
  var offered = Array.prototype.map.call(picker.querySelectorAll("a[data-range]"), function (a) { return a.dataset.range; });
  if (params.has("range")) {
    if (offered.indexOf(params.get("range")) >= 0) { remember(params.get("range")); }
  } else {
    var saved = null;
    try { saved = window.localStorage.getItem(key); } catch (e) { saved = null; }
    if (saved && saved !== picker.dataset.timeRange && offered.indexOf(saved) >= 0) {
      params.set("range", saved);
      window.location.replace(window.location.pathname + "?" + params.toString() + window.location.hash);
      return;
    }
  }
  picker.addEventListener("click", function (event) {
    var link = event.target.closest("a[data-range]");
    if (link) { remember(link.dataset.range); }
  });
})();
