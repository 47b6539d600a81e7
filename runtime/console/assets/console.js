// outbox console: live refresh of the overview, and "select all" on lists.
// Every page works without this script.
(function () {
  "use strict";

  function refreshOverview(el) {
    var url = el.getAttribute("data-refresh-url");
    var ms = parseInt(el.getAttribute("data-refresh-ms"), 10);
    if (!url || !(ms >= 1000)) {
      return;
    }
    var timer = null;
    var busy = false;
    function tick() {
      if (document.hidden || busy) {
        return;
      }
      busy = true;
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" }, cache: "no-store" })
        .then(function (r) {
          if (!r.ok) {
            throw new Error("HTTP " + r.status);
          }
          return r.text();
        })
        .then(function (html) {
          var doc = new DOMParser().parseFromString("<div>" + html + "</div>", "text/html");
          var fresh = doc.body.firstChild;
          el.replaceChildren.apply(el, Array.prototype.slice.call(fresh.childNodes));
          el.setAttribute("data-refreshed-at", new Date().toISOString());
          el.removeAttribute("data-refresh-error");
        })
        .catch(function (e) {
          el.setAttribute("data-refresh-error", String(e && e.message || e));
        })
        .finally(function () {
          busy = false;
        });
    }
    function start() {
      if (timer === null) {
        timer = setInterval(tick, ms);
      }
    }
    function stop() {
      if (timer !== null) {
        clearInterval(timer);
        timer = null;
      }
    }
    document.addEventListener("visibilitychange", function () {
      if (document.hidden) {
        stop();
      } else {
        tick();
        start();
      }
    });
    if (!document.hidden) {
      start();
    }
  }

  function selectAll(box) {
    box.addEventListener("change", function () {
      var table = box.closest("table");
      var boxes = table.querySelectorAll("input[type=checkbox][name=id]");
      for (var i = 0; i < boxes.length; i++) {
        boxes[i].checked = box.checked;
      }
    });
  }

  function init() {
    var ov = document.getElementById("overview");
    if (ov) {
      refreshOverview(ov);
    }
    var all = document.getElementById("select-all");
    if (all) {
      selectAll(all);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
