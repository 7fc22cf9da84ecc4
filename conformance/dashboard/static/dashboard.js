// Conformance dashboard: filters, matrix counts and keyboard navigation. Plain DOM, no dependencies; every
// string from the data is set with textContent, never parsed as HTML.
"use strict";
(function () {
  function typing(event) {
    var target = event.target;
    return target && (target.tagName === "INPUT" || target.tagName === "SELECT" || target.tagName === "TEXTAREA" ||
                      target.isContentEditable);
  }

  // Every page: a link with data-key="x" is followed when x is pressed.
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event) || event.key.length !== 1) return;
    var links = document.querySelectorAll("a[data-key]");
    for (var i = 0; i < links.length; i++) {
      if (links[i].getAttribute("data-key") === event.key) {
        event.preventDefault();
        window.location.href = links[i].href;
        return;
      }
    }
  });

  var holder = document.getElementById("dashboard-data");
  if (holder) index(JSON.parse(holder.textContent));

  function index(data) {
    var form = document.getElementById("filters");
    var fields = {};
    Array.prototype.forEach.call(form.querySelectorAll("[data-field]"), function (el) { fields[el.dataset.field] = el; });
    var rows = Array.prototype.slice.call(document.querySelectorAll("#case-list tbody tr"));
    var shown = document.getElementById("shown");
    var matrix = {};
    Array.prototype.forEach.call(document.querySelectorAll("table.matrix[data-level]"), function (table) {
      Array.prototype.forEach.call(table.querySelectorAll("tbody tr[data-area]"), function (tr) {
        matrix[table.dataset.level + "\u0000" + tr.dataset.area] = {
          table: table, row: tr, cells: Array.prototype.slice.call(tr.querySelectorAll("td.cell"))};
      });
    });
    var footers = {};
    Array.prototype.forEach.call(document.querySelectorAll("tr[data-total]"), function (tr) {
      footers[tr.dataset.total] = Array.prototype.slice.call(tr.querySelectorAll("td.cell"));
    });
    var selected = -1;
    var visible = [];

    function state() {
      return {level: fields.level.value, profile: fields.profile.value, area: fields.area.value,
              verdict: fields.verdict.value, run: fields.run.value, text: fields.text.value.trim().toLowerCase()};
    }

    function matches(item, s) {
      if (s.level && item[1] !== s.level) return false;
      if (s.area && item[2] !== s.area) return false;
      if (s.profile && item[3] !== s.profile) return false;
      var codes = item[4];
      if (s.run !== "") codes = [codes[Number(s.run)]];
      if (s.verdict === "disagree") {
        var present = item[4].filter(function (c) { return c !== "a"; });
        if (present.every(function (c) { return c === present[0]; })) return false;
        if (s.run !== "" && codes[0] === "a") return false;
      } else if (s.verdict) {
        if (codes.indexOf(s.verdict) < 0) return false;
      } else if (s.run !== "" && codes[0] === "a") {
        return false;
      }
      if (s.text && item[0].toLowerCase().indexOf(s.text) < 0 && item[5].indexOf(s.text) < 0) return false;
      return true;
    }

    function render(cell, counts) {
      while (cell.firstChild) cell.removeChild(cell.firstChild);
      data.verdicts.forEach(function (verdict) {
        var count = counts[verdict.code] || 0;
        if (!count) return;
        var span = document.createElement("span");
        span.className = "v v-" + verdict.code;
        span.dataset.verdict = verdict.name;
        span.dataset.count = String(count);
        span.title = count + " " + verdict.name;
        var symbol = document.createElement("span");
        symbol.setAttribute("aria-hidden", "true");
        symbol.textContent = verdict.symbol;
        span.appendChild(symbol);
        span.appendChild(document.createTextNode(" " + count));
        cell.appendChild(span);
        cell.appendChild(document.createTextNode(" "));
      });
    }

    function apply() {
      var s = state();
      var totals = {};
      visible = [];
      data.cases.forEach(function (item, i) {
        var keep = matches(item, s);
        rows[i].hidden = !keep;
        if (!keep) return;
        visible.push(i);
        var key = item[1] + "\u0000" + item[2];
        var counts = totals[key] || (totals[key] = data.runs.map(function () { return {}; }));
        item[4].forEach(function (code, run) {
          if (code !== "a") counts[run][code] = (counts[run][code] || 0) + 1;
        });
      });
      var tables = new Map();
      Object.keys(matrix).forEach(function (key) {
        var entry = matrix[key];
        var counts = totals[key];
        entry.row.hidden = !counts;
        entry.cells.forEach(function (cell, run) { render(cell, counts ? counts[run] : {}); });
        tables.set(entry.table, (tables.get(entry.table) || false) || !!counts);
      });
      tables.forEach(function (any, table) { table.hidden = !any; });
      Object.keys(footers).forEach(function (level) {
        footers[level].forEach(function (cell, run) {
          var sum = {};
          Object.keys(totals).forEach(function (key) {
            if (key.split("\u0000")[0] !== level) return;
            var counts = totals[key][run];
            Object.keys(counts).forEach(function (code) { sum[code] = (sum[code] || 0) + counts[code]; });
          });
          render(cell, sum);
        });
      });
      shown.textContent = visible.length === data.cases.length ? "Showing all " + visible.length + " cases." :
        "Showing " + visible.length + " of " + data.cases.length + " cases.";
      select(visible.indexOf(selected) >= 0 ? selected : -1);
      var params = new URLSearchParams();
      Object.keys(s).forEach(function (name) { if (s[name] !== "") params.set(name, fields[name].value); });
      var hash = params.toString();
      try {
        history.replaceState(null, "", hash ? "#" + hash : window.location.pathname + window.location.search);
      } catch (error) {
        // some file:// contexts refuse replaceState; the filters still apply
      }
    }

    function select(i) {
      if (selected >= 0) rows[selected].classList.remove("selected");
      selected = i;
      if (i < 0) return;
      rows[i].classList.add("selected");
      rows[i].scrollIntoView({block: "nearest"});
    }

    function move(step) {
      if (!visible.length) return;
      var at = visible.indexOf(selected);
      at = at < 0 ? (step > 0 ? 0 : visible.length - 1) : Math.min(Math.max(at + step, 0), visible.length - 1);
      select(visible[at]);
    }

    function restore() {
      var params = new URLSearchParams(window.location.hash.slice(1));
      Object.keys(fields).forEach(function (name) {
        var value = params.get(name);
        if (value === null) value = "";
        var field = fields[name];
        if (field.tagName === "SELECT" && !Array.prototype.some.call(field.options, function (o) { return o.value === value; })) return;
        field.value = value;
      });
    }

    form.addEventListener("input", apply);
    form.addEventListener("change", apply);
    form.addEventListener("submit", function (event) { event.preventDefault(); });
    form.addEventListener("reset", function () { setTimeout(apply, 0); });
    fields.text.addEventListener("keydown", function (event) {
      if (event.key !== "Escape") return;
      event.preventDefault();  // a search field would clear itself: Escape only leaves it
      fields.text.blur();
    });
    document.addEventListener("keydown", function (event) {
      if (event.ctrlKey || event.metaKey || event.altKey || typing(event)) return;
      if (event.key === "/") {
        event.preventDefault();
        fields.text.focus();
      } else if (event.key === "j" || event.key === "k") {
        event.preventDefault();
        move(event.key === "j" ? 1 : -1);
      } else if (event.key === "Enter" && selected >= 0) {
        event.preventDefault();
        window.location.href = rows[selected].querySelector("a").href;
      }
    });
    window.addEventListener("hashchange", function () {
      restore();
      apply();
    });
    visible = data.cases.map(function (_, i) { return i; });
    if (window.location.hash.length > 1) {
      restore();
      apply();
    }
  }
})();
