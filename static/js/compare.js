/* Compare page (templates/history/compare.html): one metric's curves for every compared run, on the
   same axes, whole-team or per agent. Data: GET <data-url>&metric=<key> (webapp.history.selectors.compare_series,
   downsampled on the server). Each run keeps its colour; its agents are dashed variants of it. */
(function () {
  "use strict";
  var COLORS = ["#4b50d6", "#e0692b", "#18794e", "#c22f2f", "#8e44ad", "#1d6fd1", "#9a6200", "#2f8f9d"];
  var DASHES = [null, [6, 4], [2, 3], [10, 3, 2, 3], [1, 5]];
  var card = document.getElementById("compare-chart-card");
  var CH = window.troupeCharts;
  if (!card || !window.uPlot || !CH) return;
  var box = document.getElementById("compare-chart");

  function say(where, cls, text) {  // a message as text, never as markup (it may echo a metric name or a server error)
    var p = document.createElement("p");
    p.className = cls;
    p.textContent = text;
    where.replaceChildren(p);
  }
  var metricSel = document.getElementById("compare-metric");
  var viewSel = document.getElementById("compare-view");
  var note = document.getElementById("compare-note");
  var plot = null;
  var last = null;

  document.querySelectorAll(".swatch[data-series]").forEach(function (el) {
    el.style.background = COLORS[+el.dataset.series % COLORS.length];
  });

  function load() {
    var url = card.dataset.url + "&metric=" + encodeURIComponent(metricSel.value);
    box.setAttribute("aria-busy", "true");
    fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { return r.json(); })
      .then(function (data) { last = data; draw(); })
      .catch(function (e) { say(box, "errors", "Could not load the curves: " + e); })
      .finally(function () { box.removeAttribute("aria-busy"); });
  }

  function draw() {
    if (!last) return;
    if (last.error) { say(box, "errors", last.error); return; }
    var perAgent = viewSel.value === "agents";
    var tables = [], series = [{label: "step"}];
    last.runs.forEach(function (run, i) {
      var color = COLORS[i % COLORS.length];
      if (!perAgent) {
        if (run.run[0].length) { tables.push(run.run); series.push({label: "#" + run.id + " " + run.name, stroke: color, width: 1.8, spanGaps: true}); }
        return;
      }
      Object.keys(run.agents).forEach(function (name, j) {
        var s = run.agents[name];
        if (!s[0].length) return;
        tables.push(s);
        series.push({label: "#" + run.id + " " + name, stroke: color, width: 1.6, dash: DASHES[j % DASHES.length] || undefined, spanGaps: true});
      });
    });
    if (plot) { plot.destroy(); plot = null; }
    box.innerHTML = "";
    if (!tables.length) {
      say(box, "empty", "No run recorded " + (perAgent ? "a per-agent " : "") + last.metric + ".");
      note.textContent = "";
      return;
    }
    note.textContent = last.metric + (perAgent ? " · per agent (dashes: agents, colours: runs)" : " · whole team") + (last.downsampled ? " · downsampled" : "");
    var data = uPlot.join(tables);
    var width = Math.max(320, box.clientWidth || 900);
    plot = new uPlot({
      width: width, height: 320, series: series,
      scales: {x: {time: false, range: CH.stepRange}},
      axes: [CH.stepAxis({label: "step"}), CH.valueAxis({label: last.metric, size: 60})],
      cursor: {drag: {x: true, y: false}},
      legend: {live: true},
    }, data, box);
    box.dataset.series = String(series.length - 1);
    drawLegendLines(plot, series);
  }

  function drawLegendLines(u, series) {
    // uPlot's legend marks each series with a plain square of its colour, so one run's agents
    // (same colour, different dashes) looked alike: draw each marker as a short line in its dash.
    var NS = "http://www.w3.org/2000/svg";
    var rows = u.root.querySelectorAll(".u-legend .u-series");
    series.forEach(function (s, i) {
      var marker = i && rows[i] && rows[i].querySelector(".u-marker");
      if (!marker) return;
      var svg = document.createElementNS(NS, "svg");
      svg.setAttribute("width", "28");
      svg.setAttribute("height", "8");
      svg.setAttribute("aria-hidden", "true");
      var line = document.createElementNS(NS, "line");
      [["x1", 1], ["y1", 4], ["x2", 27], ["y2", 4], ["stroke", s.stroke], ["stroke-width", 2]].forEach(function (a) { line.setAttribute(a[0], a[1]); });
      if (s.dash) line.setAttribute("stroke-dasharray", s.dash.join(" "));
      svg.appendChild(line);
      marker.replaceChildren(svg);
      marker.classList.add("line-marker");
      marker.dataset.dash = s.dash ? s.dash.join(",") : "solid";
    });
  }

  metricSel.addEventListener("change", load);
  viewSel.addEventListener("change", draw);
  window.addEventListener("resize", function () { if (plot) plot.setSize({width: Math.max(320, box.clientWidth), height: 320}); });
  window.troupeCompare = {reload: load, plot: function () { return plot; }, data: function () { return last; }};
  load();
})();
