// The fleet page, made live: local times, copy buttons, and server-sent events
// that swap in the rows that changed (rendered by the server, escaped there).
"use strict";
(function () {
  function localTimes(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) return;
      // Always with the zone's name; a job's own times in its schedule's zone.
      var opts = {
        year: "numeric", month: "short", day: "2-digit",
        hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short"
      };
      if (el.dataset.tz) opts.timeZone = el.dataset.tz;
      try { el.textContent = d.toLocaleString(undefined, opts); } catch (e) { return; }
      el.title = "UTC " + el.getAttribute("datetime");
    });
  }
  function copyButtons(root) {
    if (!navigator.clipboard) return;
    root.querySelectorAll("code.copy").forEach(function (el) {
      if (el.nextSibling && el.nextSibling.className === "copy-btn") return;
      var b = document.createElement("button");
      b.type = "button"; b.className = "copy-btn"; b.textContent = "copy";
      b.setAttribute("aria-label", "copy " + el.textContent);
      b.addEventListener("click", function () {
        navigator.clipboard.writeText(el.textContent).then(function () {
          b.textContent = "copied";
          setTimeout(function () { b.textContent = "copy"; }, 1500);
        }, function () {});
      });
      el.after(b);
    });
  }
  function decorate(root) { localTimes(root); copyButtons(root); }
  decorate(document);

  var live = document.getElementById("live");
  if (!window.EventSource || !live) return;
  var jobTitle = document.getElementById("job-title");
  var pending = new Set(), fleet = false, all = false, timer = null;

  function get(url) {
    return fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); });
  }
  function refresh() {
    timer = null;
    if (jobTitle) {
      var name = jobTitle.getAttribute("data-job");
      if (!all && !pending.has(name)) { pending.clear(); fleet = false; return; }
      var focus = document.activeElement;
      if (focus && focus.tagName === "INPUT") { timer = setTimeout(refresh, 1000); return; }
      pending.clear(); all = false; fleet = false;
      get("/fragment/job/" + encodeURIComponent(name) + location.search).then(function (html) {
        var main = document.getElementById("main");
        main.innerHTML = html; decorate(main);
      }).catch(function () {});
      return;
    }
    if (all) { all = false; pending.clear(); location.reload(); return; }
    if (pending.size) {
      var names = Array.from(pending); pending.clear();
      get("/fragment/jobs?names=" + encodeURIComponent(names.join(","))).then(function (html) {
        var t = document.createElement("tbody"); t.innerHTML = html;
        Array.from(t.children).forEach(function (row) {
          var old = document.getElementById(row.id);
          if (old) { old.replaceWith(row); decorate(row); }
        });
      }).catch(function () {});
    }
    if (fleet) {
      fleet = false;
      get("/fragment/fleet").then(function (html) {
        var old = document.getElementById("fleet");
        if (!old) return;
        var d = document.createElement("div"); d.innerHTML = html;
        var sec = d.firstElementChild; old.replaceWith(sec); decorate(sec);
      }).catch(function () {});
    }
  }
  var es = new EventSource("/api/v1/events");
  es.addEventListener("hello", function () { live.textContent = "live"; live.className = "live on"; });
  es.addEventListener("change", function (ev) {
    var data = JSON.parse(ev.data);
    if (data.all) all = true;
    (data.jobs || []).forEach(function (j) { pending.add(j); });
    if (data.fleet) fleet = true;
    if (!timer) timer = setTimeout(refresh, 100);
  });
  es.onerror = function () { live.textContent = "reconnecting"; live.className = "live"; };
})();
