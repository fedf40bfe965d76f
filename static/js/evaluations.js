/* Run page, "Held-out evaluation" (templates/history/run_sections.html): greedy held-out success
   by step, the team's and each agent's, from the page's JSON (no extra request). Drawn again when
   the live page swaps in newer results (htmx, out of band). Axes: static/js/charts.js. */
(function () {
  "use strict";
  var COLORS = ["#1d2330", "#4b50d6", "#e0692b", "#18794e", "#8e44ad", "#c22f2f"];
  var plot = null;

  function draw() {
    var box = document.getElementById("eval-chart");
    var source = document.getElementById("eval-chart-data");
    var CH = window.troupeCharts;
    if (plot) { plot.destroy(); plot = null; window.troupeEvalChart = null; }
    if (!box || !source || !window.uPlot || !CH) return;
    var chart = JSON.parse(source.textContent);
    if (!chart.steps.length) return;
    var names = Object.keys(chart.series);
    var data = [chart.steps].concat(names.map(function (n) { return chart.series[n]; }));
    var series = [{label: "step"}].concat(names.map(function (n, i) {
      return {label: n, stroke: COLORS[i % COLORS.length], width: n === "team" ? 2.4 : 1.6, spanGaps: true,
              points: {show: true, size: 6}, value: function (u, v) { return v == null ? "—" : v.toFixed(3); }};
    }));
    box.textContent = "";
    plot = new uPlot({
      width: Math.max(280, box.clientWidth || 520), height: 240, series: series,
      scales: {x: {time: false, range: CH.stepRange}, y: {range: [0, 1]}},
      axes: [CH.stepAxis({label: "step"}), CH.valueAxis({label: "held-out success", size: 56})],
    }, data, box);
    window.troupeEvalChart = plot;
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw); else draw();
  document.addEventListener("htmx:oobAfterSwap", function (e) {
    if (e.detail.target && e.detail.target.id === "held-out-results") draw();
  });
  window.addEventListener("resize", function () {
    var box = document.getElementById("eval-chart");
    if (plot && box) plot.setSize({width: Math.max(280, box.clientWidth), height: 240});
  });
})();
