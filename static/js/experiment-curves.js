/* Experiment page (templates/experiments/detail.html): one metric against the step for every arm,
   the mean over its seeds as a line and its 95% t-interval as a band (uPlot bands). Data: GET
   <data-url>?metric=<name> (webapp.experiments.selectors.experiment_curves). Live: each time the
   results table is refreshed by its htmx poll (every 3 s while trials or ablations are active),
   the curves are fetched again; once nothing is active the table stops polling and so do they. */
(function () {
  "use strict";
  var COLORS = ["#4b50d6", "#e0692b", "#18794e", "#c22f2f", "#8e44ad", "#1d6fd1", "#9a6200", "#2f8f9d"];
  var card = document.getElementById("curves-card");
  var CH = window.troupeCharts;
  if (!card || !window.uPlot || !CH) return;
  var box = document.getElementById("experiment-curves");
  var metricSel = document.getElementById("curves-metric");
  var note = document.getElementById("curves-note");
  var plot = null;
  var last = null;

  function say(cls, text) {  // text, never markup: it may echo a metric name or a server error
    var p = document.createElement("p");
    p.className = cls;
    p.textContent = text;
    box.replaceChildren(p);
  }

  function fade(hex) {  // the arm's colour, translucent, for its band
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + ",0.15)";
  }

  function load() {
    if (!metricSel || !metricSel.value) return;
    box.setAttribute("aria-busy", "true");
    fetch(card.dataset.url + "?metric=" + encodeURIComponent(metricSel.value), {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { return r.json(); })
      .then(function (data) { last = data; draw(); })
      .catch(function (e) { say("errors", "Could not load the curves: " + e); })
      .finally(function () { box.removeAttribute("aria-busy"); });
  }

  function draw() {
    if (!last) return;
    if (last.error) { say("errors", last.error); return; }
    var tables = [], series = [{label: "step"}], bands = [];
    last.arms.forEach(function (arm, i) {
      if (!arm.steps.length) return;
      var color = COLORS[i % COLORS.length], at = series.length;
      tables.push([arm.steps, arm.mean], [arm.steps, arm.high], [arm.steps, arm.low]);
      series.push({label: arm.label + " (" + arm.runs + " seed" + (arm.runs === 1 ? "" : "s") + ")", stroke: color, width: 1.8, spanGaps: true},
                  {label: arm.label + " high", stroke: color, width: 0, spanGaps: true, show: true},
                  {label: arm.label + " low", stroke: color, width: 0, spanGaps: true, show: true});
      bands.push({series: [at + 1, at + 2], fill: fade(color)});
    });
    if (plot) { plot.destroy(); plot = null; }
    box.innerHTML = "";
    if (!tables.length) {
      say("empty", "No trial has recorded " + last.metric + " yet.");
      note.textContent = "";
      return;
    }
    note.textContent = last.metric + " · mean over seeds, 95% band";
    plot = new uPlot({
      width: Math.max(320, box.clientWidth || 900), height: 320, series: series, bands: bands,
      scales: {x: {time: false, range: CH.stepRange}, y: {range: last.range ? function () { return last.range; } : CH.padRange(0.05)}},
      axes: [CH.stepAxis({label: "step"}), CH.valueAxis({label: last.metric, size: 60})],
      cursor: {drag: {x: true, y: false}},
      legend: {live: true},
    }, uPlot.join(tables), box);
    box.dataset.arms = String(bands.length);
    plot.root.querySelectorAll(".u-legend .u-series").forEach(function (row, i) {  // the band edges are not arms
      if (i && (i - 1) % 3) row.style.display = "none";
    });
  }

  metricSel.addEventListener("change", load);
  document.body.addEventListener("htmx:load", function (e) {  // the polled table, swapped in anew
    if (e.target && e.target.id === "experiment-results") load();
  });
  window.addEventListener("resize", function () { if (plot) plot.setSize({width: Math.max(320, box.clientWidth), height: 320}); });
  window.troupeExperimentCurves = {reload: load, plot: function () { return plot; }, data: function () { return last; }};
  load();
})();
