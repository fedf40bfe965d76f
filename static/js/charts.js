/* Troupe's chart helpers, shared by the run page's live charts (run-live.js), its held-out chart
 * (evaluations.js) and compare (compare.js), so every chart reads the same way:
 *
 * - step axes tick whole steps only (1, 2, 5, 10... apart: never "1.5") and span the steps there
 *   are (a 3-step run's axis runs 0..3, not 0..100);
 * - value ticks carry as many decimals as the ticks need to be told apart and read exactly
 *   (0.25 and 0.75 print as 0.25 and 0.75, not 0.3 and 0.8), with exponents for tiny or huge numbers.
 */
(function () {
  "use strict";

  var STEP_INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 20000, 25000, 50000, 100000,
    200000, 250000, 500000, 1000000];

  function decimalsOf(v) {
    // The fewest decimals (at most 8) that write v exactly, up to float noise (0.30000000000000004 -> 1).
    var tolerance = 1e-9 * Math.max(1, Math.abs(v));
    for (var d = 0; d < 8; d++) {
      if (Math.abs(+v.toFixed(d) - v) <= tolerance) return d;
    }
    return 8;
  }

  function fmtTicks(vals) {
    var nums = vals.filter(function (v) { return v != null && isFinite(v); });
    if (!nums.length) return vals.map(function () { return ""; });
    var big = Math.max.apply(null, nums.map(Math.abs));
    if (big >= 1e6 || (big > 0 && big < 1e-3)) {
      var digits = 1;
      nums.forEach(function (v) { if (v) digits = Math.max(digits, decimalsOf(v / Math.pow(10, Math.floor(Math.log10(Math.abs(v))))) + 1); });
      digits = Math.min(6, digits);
      return vals.map(function (v) { return v == null ? "" : v === 0 ? "0" : v.toExponential(digits - 1); });
    }
    var decimals = Math.max.apply(null, nums.map(decimalsOf));
    return vals.map(function (v) { return v == null ? "" : v.toFixed(decimals); });
  }

  function fmtValue(v) {
    var a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(3);
    return +v.toPrecision(4) + "";
  }

  function stepRange(u, min, max) {
    // The steps there are (or the zoom asked for); one step alone gets a step either side (never
    // below 0). For a single step uPlot passes its own guess (0..100), so that one is read from the data.
    var xs = u.data && u.data[0];
    if (xs && xs.length && xs[0] === xs[xs.length - 1]) { min = max = xs[0]; }
    if (min == null || max == null) return [0, 1];
    if (min === max) return [Math.max(0, min - 1), max + 1];
    return [min, max];
  }

  function padRange(frac) {
    // uPlot's auto range, except that a flat series (one point, or all zeros) gets a small band
    // around its value instead of 0..100.
    return function (u, min, max) {
      if (min == null || max == null) return [0, 1];
      if (min === max) { var d = Math.abs(min) * 0.1 || 1; return [min - d, max + d]; }
      if (!frac) return [min, max];
      var pad = (max - min) * frac;
      return [min - pad, max + pad];
    };
  }

  function axisSize(u, values, axisIdx, cycleNum) {
    // Wide enough for the widest tick label as the canvas draws it in the axis' font, plus the
    // ticks and the gap (uPlot calls this again once the labels are known). A guess from the
    // number of characters cut "1.00" to ".00" where the font's digits are wider than guessed.
    if (cycleNum > 1 || !values) return u.axes[axisIdx]._size || 40;
    var axis = u.axes[axisIdx], ctx = u.ctx, ratio = (window.uPlot && uPlot.pxRatio) || 1, widest = 0;
    if (ctx && axis.font && axis.font[0]) {
      ctx.save();
      ctx.font = axis.font[0];
      values.forEach(function (v) { if (v) widest = Math.max(widest, ctx.measureText(String(v)).width / ratio); });
      ctx.restore();
    } else {
      widest = values.reduce(function (n, v) { return Math.max(n, v ? String(v).length : 0); }, 0) * 8;
    }
    var ticks = (axis.ticks && axis.ticks.show !== false && axis.ticks.size) || 10;
    return Math.max(36, Math.ceil(widest) + ticks + (axis.gap || 5) + 6);
  }

  function stepAxis(extra) {
    var axis = { space: 60, incrs: STEP_INCRS, values: function (u, vals) { return vals.map(function (v) { return String(Math.round(v)); }); } };
    Object.keys(extra || {}).forEach(function (k) { axis[k] = extra[k]; });
    return axis;
  }

  function valueAxis(extra) {
    var axis = { space: 28, values: function (u, vals) { return fmtTicks(vals); }, size: axisSize };
    Object.keys(extra || {}).forEach(function (k) { axis[k] = extra[k]; });
    return axis;
  }

  window.troupeCharts = {
    STEP_INCRS: STEP_INCRS, fmtTicks: fmtTicks, fmtValue: fmtValue, stepRange: stepRange, padRange: padRange,
    axisSize: axisSize, stepAxis: stepAxis, valueAxis: valueAxis,
  };
})();
