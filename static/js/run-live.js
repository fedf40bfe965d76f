/* Troupe live run page: status, progress and ETA, uPlot charts, the rollout viewer and the log
 * tail, fed by one WebSocket at /ws/runs/<id>/.
 *
 * The server (webapp/runs/streaming.py) sends JSON messages with a `t` key: status, metrics (columnar
 * series, a backlog or one live step), evals, rollouts (rendered HTML), log, checkpoint, pong.
 * On connect it sends the backlog from the database, then live deltas.
 *
 * Reconnect and gap fill: on any close the page reconnects by itself (0.5 s doubling to 15 s,
 * jittered; at once when the browser comes back online or the tab becomes visible) and states what
 * it already has: ?step=<last metrics step>&log=<last log line id>. The server answers with the
 * database rows after those, then live deltas. Series are merged by step (a duplicate step
 * replaces, never doubles), so no step goes missing across a drop. Every 25 s the page pings; the
 * server re-joins the run's group and sends anything the database has that the page lacks, and
 * no answer within 10 s means a half-open connection: reconnect.
 *
 * Episodes never travel over the socket: it announces the newest episode's id, and the page
 * fetches what it lacks (after=<id>, with the viewer's filter) as rendered HTML over HTTP, the
 * same fragment the filter and "load older" use (htmx).
 */
(function () {
  "use strict";

  var root = document.getElementById("run-live");
  if (!root || !window.WebSocket) return;
  var CH = window.troupeCharts;

  var TERMINAL = { succeeded: 1, failed: 1, cancelled: 1 };
  var MAX_EPISODES = 60;   // newest episodes kept in the DOM (more only when the user loads older ones)
  var MAX_LOG = 500;       // log lines kept in the DOM
  var PING_MS = 25000, PONG_WAIT_MS = 10000;
  var BACKOFF_MIN = 500, BACKOFF_MAX = 15000;
  var SUMMARY_EVERY_MS = 15000;  // the summary card's latest-metrics table, while steps arrive
  var PALETTE = ["#4b50d6", "#e07b00", "#18a058", "#d03050", "#8a5cf6", "#0ea5b7", "#b45309", "#db2777"];
  var RUN_COLOR = "#1d2330";

  // The charts to draw, in order: the server's one list (webapp/runs/series.py CHARTS), which also
  // decides which series the socket streams. Each: {id, title, run: [keys], agent: key,
  // runPrefix, evals, range: [min, max], labels: {key: legend name}}.
  var chartsEl = document.getElementById("run-charts");
  var CHARTS = chartsEl ? JSON.parse(chartsEl.textContent) : [];

  var state = {
    status: root.dataset.status,
    total: +root.dataset.total || 0,
    step: +root.dataset.step || 0,
    started: root.dataset.started ? +root.dataset.started : null,
    eta: root.dataset.eta ? +root.dataset.eta : null,   // when the engine expects the run to end (epoch s)
    phase: null,             // the last {phase, detail, progress} the engine reported
    placedHeard: false,      // a `placed` event (the Ray nodes granted) reached this page
    lastStep: null,          // the page holds every step up to here (what it asks for after on reconnect)
    seenStep: null,          // the newest step it has any number of (a backlog still coming in may lead lastStep)
    lastLog: null,
    run: {}, agents: {}, agentOrder: [],
    hidden: {},              // agent -> true when toggled off
    evals: {},               // "step|temperature" -> row
    times: [],               // [[step, epoch seconds]], recent
    loaded: false,           // the first backlog arrived
    ws: null, timer: null, backoff: BACKOFF_MIN, reconnects: 0, lastMessageAt: 0, pingTimer: null, pongTimer: null,
    conn: "connecting", retryAt: 0,
    zoom: null,              // {min, max} of the x scale when zoomed, shared by all charts
    episodeCap: MAX_EPISODES,
    timings: [],             // [step, Date.now()] when a live step reached the DOM (bench/streaming.py)
    firstChartAt: null,
    marks: {},               // performance.now() of this page's milestones (bench/streaming.py reads them)
  };
  var charts = {};           // chart id -> {u, sig, spec, el}
  var summaryTimer = null, summaryAt = 0;

  // == series store ===========================================================================

  function merge(store, key, xs, ys) {
    var s = store[key] || (store[key] = { x: [], y: [] });
    var n = s.x.length;
    if (!xs.length) return;
    if (!n || xs[0] > s.x[n - 1]) {            // the usual case: new steps after the last one
      for (var i = 0; i < xs.length; i++) { s.x.push(xs[i]); s.y.push(ys[i]); }
      return;
    }
    var m = new Map();                          // overlap (a reconnect's backlog): dedupe by step
    for (var j = 0; j < n; j++) m.set(s.x[j], s.y[j]);
    for (var k = 0; k < xs.length; k++) m.set(xs[k], ys[k]);
    s.x = Array.from(m.keys()).sort(function (a, b) { return a - b; });
    s.y = s.x.map(function (x) { return m.get(x); });
  }

  function noteAgent(name) {
    if (state.agentOrder.indexOf(name) < 0) {
      state.agentOrder.push(name);
      renderAgentToggles();
    }
  }

  function agentColor(name) {
    var i = state.agentOrder.indexOf(name);
    return PALETTE[(i < 0 ? 0 : i) % PALETTE.length];
  }

  // == charts ===================================================================================

  function seriesFor(spec) {
    var out = [];
    if (spec.evals) {
      var temps = {}, agents = {};
      Object.keys(state.evals).forEach(function (k) {
        var r = state.evals[k];
        temps[r.temperature] = 1;
        Object.keys(r.agents || {}).forEach(function (a) { agents[a] = 1; });
      });
      var tlist = Object.keys(temps).map(Number).sort(function (a, b) { return a - b; });
      tlist.forEach(function (t, i) {
        out.push({ label: tlist.length > 1 ? "team T=" + t : "team", color: RUN_COLOR, dash: i ? [5, 4] : null, evalT: t });
      });
      var t0 = tlist.length ? tlist[0] : 0;
      state.agentOrder.concat(Object.keys(agents).filter(function (a) { return state.agentOrder.indexOf(a) < 0; }))
        .forEach(function (a) { if (agents[a]) out.push({ label: a, agent: a, color: agentColor(a), evalT: t0, evalAgent: a }); });
      return out;
    }
    if (spec.runPrefix) {
      // one line per key under the prefix, named after its last part (reward/fn/format_ok: format_ok)
      Object.keys(state.run).filter(function (k) { return k.indexOf(spec.runPrefix) === 0; }).sort().forEach(function (key, i) {
        out.push({ label: key.slice(spec.runPrefix.length), color: PALETTE[i % PALETTE.length], store: state.run[key] });
      });
      return out;
    }
    (spec.run || []).forEach(function (key, i) {
      if (!state.run[key]) return;
      var label = (spec.labels && spec.labels[key]) || (spec.agent ? "all agents" : key);
      out.push({ label: label, color: i ? PALETTE[(i + 3) % PALETTE.length] : RUN_COLOR, width: spec.agent ? 2.2 : 1.6, store: state.run[key] });
    });
    if (spec.agent) {
      state.agentOrder.forEach(function (a) {
        var s = state.agents[a] && state.agents[a][spec.agent];
        if (s) out.push({ label: a, agent: a, color: agentColor(a), store: s });
      });
    }
    return out;
  }

  function evalData(series) {
    var steps = {};
    Object.keys(state.evals).forEach(function (k) { steps[state.evals[k].step] = 1; });
    var xs = Object.keys(steps).map(Number).sort(function (a, b) { return a - b; });
    var data = [xs];
    series.forEach(function (s) {
      data.push(xs.map(function (x) {
        var r = state.evals[x + "|" + s.evalT];
        if (!r) return null;
        if (s.evalAgent) return r.agents[s.evalAgent] ? r.agents[s.evalAgent].success : null;
        return r.team;
      }));
    });
    return data;
  }

  function alignedData(series) {
    // One x array for the chart: the union of its series' steps (they differ only when the
    // server downsampled each series on its own); a series without a point at a step gets null.
    var first = series[0].store.x, same = true;
    for (var i = 1; i < series.length && same; i++) {
      var x = series[i].store.x;
      same = x.length === first.length && x[0] === first[0] && x[x.length - 1] === first[first.length - 1];
    }
    if (same) return [first.slice()].concat(series.map(function (s) { return s.store.y.slice(); }));
    var all = new Set();
    series.forEach(function (s) { s.store.x.forEach(function (v) { all.add(v); }); });
    var xs = Array.from(all).sort(function (a, b) { return a - b; });
    return [xs].concat(series.map(function (s) {
      var m = new Map();
      s.store.x.forEach(function (v, j) { m.set(v, s.store.y[j]); });
      return xs.map(function (v) { return m.has(v) ? m.get(v) : null; });
    }));
  }

  function chartBox(spec) {
    var el = document.getElementById("chart-" + spec.id);
    if (!el) {
      el = document.createElement("figure");
      el.id = "chart-" + spec.id;
      el.className = "chart";
      el.innerHTML = "<figcaption></figcaption><div class=\"plot\"></div>";
      el.firstChild.textContent = spec.title;
      var grid = document.getElementById("charts");
      var after = null;   // keep CHARTS order
      for (var i = CHARTS.indexOf(spec) + 1; i < CHARTS.length && !after; i++) after = document.getElementById("chart-" + CHARTS[i].id);
      grid.insertBefore(el, after);
    }
    return el;
  }

  function chartWidth(el) {
    return Math.max(240, Math.floor(el.querySelector(".plot").clientWidth || el.clientWidth || 480));
  }

  function buildChart(spec, series, data) {
    var el = chartBox(spec);
    var old = charts[spec.id];
    if (old) old.u.destroy();
    var plot = el.querySelector(".plot");
    plot.textContent = "";
    var opts = {
      width: chartWidth(el),
      height: 190,
      cursor: {
        sync: { key: "run-" + root.dataset.run, setSeries: false },
        drag: { x: true, y: false, setScale: false },
      },
      scales: {
        x: { time: false, range: CH.stepRange },
        y: spec.range ? { range: [spec.range[0] - 0.03, spec.range[1] + 0.03] } : { range: CH.padRange(0.1) },
      },
      axes: [CH.stepAxis({ size: 30 }), CH.valueAxis()],
      legend: { live: true },
      series: [{ label: "step", value: function (u, v) { return v == null ? "–" : "step " + v; } }].concat(series.map(function (s) {
        return {
          label: s.label, stroke: s.color, width: s.width || 1.6, dash: s.dash || undefined, spanGaps: true,
          show: !(s.agent && state.hidden[s.agent]),
          value: function (u, v) { return v == null ? "–" : CH.fmtValue(v); },
        };
      })),
      hooks: {
        setCursor: [function (u) { if (u.cursor.idx == null) showLatest(u); }],
        setSelect: [function (u) {
          if (u.select.width < 4) return;
          var min = u.posToVal(u.select.left, "x"), max = u.posToVal(u.select.left + u.select.width, "x");
          u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
          zoomAll({ min: min, max: max });
        }],
      },
    };
    var u = new uPlot(opts, data, plot);
    u.over.addEventListener("dblclick", function () { zoomAll(null); });
    charts[spec.id] = { u: u, sig: sigOf(series), spec: spec, el: el, series: series };
    if (state.zoom) u.setScale("x", state.zoom);
    if (state.firstChartAt === null && data[0].length) {
      state.firstChartAt = performance.now();
      if (performance.mark) performance.mark("troupe:first-chart");
      root.dataset.firstChart = String(Math.round(state.firstChartAt));
    }
  }

  function showLatest(u) {
    // With the cursor off the chart, the legend shows each series' latest value.
    var n = u.data[0].length;
    if (n) u.setLegend({ idx: n - 1 }, false);
  }

  function sigOf(series) { return series.map(function (s) { return s.label + "/" + (s.evalT == null ? "" : s.evalT); }).join("|"); }

  function renderChart(spec, appendStep) {
    var series = seriesFor(spec);
    var box = document.getElementById("chart-" + spec.id);
    if (!series.length) { if (box) box.hidden = true; return; }
    var c = charts[spec.id];
    if (box) box.hidden = false;
    if (spec.evals) {
      var ed = evalData(series);
      if (!c || c.sig !== sigOf(series)) buildChart(spec, series, ed); else c.u.setData(ed, !state.zoom);
      if (charts[spec.id].u.cursor.idx == null) showLatest(charts[spec.id].u);
      return;
    }
    if (!c || c.sig !== sigOf(series)) { buildChart(spec, series, alignedData(series)); showLatest(charts[spec.id].u); return; }
    var u = c.u, data = u.data;
    var lastX = data[0].length ? data[0][data[0].length - 1] : -Infinity;
    if (appendStep != null && appendStep > lastX) {
      // Fast path for a live step: push one column instead of rebuilding the chart's arrays.
      var col = series.map(function (s) {
        var n = s.store.x.length;
        return n && s.store.x[n - 1] === appendStep ? s.store.y[n - 1] : null;
      });
      data[0].push(appendStep);
      col.forEach(function (v, i) { data[i + 1].push(v); });
      u.setData(data, !state.zoom);
    } else {
      u.setData(alignedData(series), !state.zoom);
    }
    if (u.cursor.idx == null) showLatest(u);
  }

  function renderCharts(appendStep) {
    CHARTS.forEach(function (spec) { if (!spec.evals) renderChart(spec, appendStep); });
    var empty = document.getElementById("charts-empty");
    if (empty) empty.hidden = Object.keys(charts).length > 0;
    renderMissing();
  }

  function renderMissing() {
    // Charts the run has no numbers for (KL without a reference policy, evaluation switched off...).
    var note = document.getElementById("charts-missing");
    if (!note || state.seenStep === null) return;
    var missing = CHARTS.filter(function (spec) { return !charts[spec.id]; }).map(function (spec) { return spec.title; });
    var when = TERMINAL[state.status] ? "" : " (so far)";  // a finished run records nothing more
    note.textContent = missing.length ? "Not recorded in this run" + when + ": " + missing.join(", ") + "." : "";
  }

  function zoomAll(range) {
    state.zoom = range;
    Object.keys(charts).forEach(function (id) {
      var u = charts[id].u;
      if (range) u.setScale("x", range); else u.setData(u.data, true);
    });
    var reset = document.getElementById("reset-zoom");
    if (reset) reset.hidden = !range;
  }

  function setAgentShown(name, shown) {
    if (shown) delete state.hidden[name]; else state.hidden[name] = true;
    Object.keys(charts).forEach(function (id) {
      var c = charts[id];
      c.series.forEach(function (s, i) { if (s.agent === name) c.u.setSeries(i + 1, { show: shown }); });
    });
    renderAgentToggles();
  }

  function renderAgentToggles() {
    var box = document.getElementById("agent-toggles");
    if (!box) return;
    box.textContent = "";
    state.agentOrder.forEach(function (name) {
      var b = document.createElement("button");
      b.type = "button";
      b.className = "agent-toggle" + (state.hidden[name] ? " off" : "");
      b.setAttribute("aria-pressed", state.hidden[name] ? "false" : "true");
      b.dataset.agent = name;
      b.innerHTML = "<i></i>";
      b.firstChild.style.background = agentColor(name);
      b.appendChild(document.createTextNode(name));
      b.addEventListener("click", function () { setAgentShown(name, !!state.hidden[name]); });
      box.appendChild(b);
    });
  }

  function resizeCharts() {
    Object.keys(charts).forEach(function (id) {
      var c = charts[id];
      c.u.setSize({ width: chartWidth(c.el), height: 190 });
    });
  }

  // == messages ==================================================================================

  function onStatus(m) {
    // Any change from the status the page was rendered with (or last showed) means the parts
    // outside the live card are stale too: the head's buttons, held-out results, artifacts.
    var changed = m.status !== state.status;
    state.status = m.status;
    state.total = m.total || state.total;
    state.step = Math.max(state.step, m.step || 0);
    state.started = m.started;
    root.dataset.status = m.status;
    var badge = document.getElementById("run-status");
    if (badge) {
      badge.innerHTML = "<span class=\"badge\"></span>";
      badge.firstChild.className = "badge status-" + m.status;
      badge.firstChild.textContent = m.label + (m.cancel_requested && m.status === "running" ? " · stopping" : "");
    }
    onPhase(m);
    dropStaleFlash(m.status);
    // The log box's "Waiting for a worker" sentence belongs to a queued run: once it runs, it says where.
    var empty = document.getElementById("log-empty");
    if (empty && m.status !== "queued") {
      empty.removeAttribute("hx-get");  // (its poll, if one is due, answers the same)
      empty.textContent = m.status === "running" ? "Starting on " + (m.worker || "a worker") + ": nothing logged yet." : "Nothing logged yet.";
    }
    if (TERMINAL[m.status]) {
      if (state.conn === "live") setConn("done");
      renderMissing();
      // The page head's Stop button belongs to an active run; the refresh brings Resume, Archive...
      var stop = document.querySelector(".head-actions form[action$='/cancel/']");
      if (stop) stop.remove();
    }
    if (changed) refreshSummary(true, TERMINAL[m.status] ? ["actions", "held-out", "artifacts", "eval-panel"] : ["actions"]);
  }

  function onPhase(m) {
    // What the engine is doing now: "Loading ...", "Evaluating at step 0: 25/100 held-out tasks", ...
    var was = state.phase ? state.phase.phase : null;
    state.phase = { phase: m.phase || "", detail: m.detail || "", progress: m.progress };
    // A run on several hosts starts its ranks once Ray granted its nodes: a page rendered before
    // that (or whose socket opened after the placed event) reads the summary's Hosts line again.
    // One refresh per grant: a page that heard the `placed` event already asked for it.
    if (m.phase === "starting" && was !== "starting" && !state.placedHeard) refreshSummary(true);
    if (m.eta !== undefined) state.eta = m.eta;
    renderPhase();
    renderProgress();
  }

  function renderPhase() {
    var box = document.getElementById("run-phase");
    var p = state.phase;
    if (box) {
      box.hidden = state.status !== "running";
      if (p) {
        box.querySelector(".phase-detail").textContent = p.detail || "Starting…";
        box.dataset.phase = p.phase;
        var bar = box.querySelector("progress");
        if (p.progress == null) bar.removeAttribute("value"); else bar.value = Math.round(100 * p.progress);
      }
    }
    // Before the first held-out results, their card says what the evaluation is doing.
    var note = document.getElementById("held-out-note");
    if (note && note.dataset.empty && p) {
      note.textContent = p.phase === "evaluating" ? p.detail : (state.status === "running" ? "none recorded yet" : note.textContent);
    }
  }

  function dropStaleFlash(status) {
    // "Queued run #3." or "Asked the run to stop..." are true only while the run is in that state.
    document.querySelectorAll(".flash li").forEach(function (li) {
      var m = /(?:^| )while-(\w+)/.exec(li.className);
      if (m && m[1] !== status) li.remove();
    });
    var flash = document.querySelector(".flash");
    if (flash && !flash.children.length) flash.remove();
  }

  function onMetrics(m) {
    if (m.last == null) return;
    var before = state.seenStep;
    var live = state.loaded && !m.downsampled && m.times && m.times[0].length === 1 && (before === null || m.last > before);
    Object.keys(m.run).forEach(function (k) { merge(state.run, k, m.run[k][0], m.run[k][1]); });
    Object.keys(m.agents).forEach(function (a) {
      noteAgent(a);
      var store = state.agents[a] || (state.agents[a] = {});
      Object.keys(m.agents[a]).forEach(function (k) { merge(store, k, m.agents[a][k][0], m.agents[a][k][1]); });
    });
    if (m.times && m.times[0].length) {
      var byStep = new Map(state.times);   // (step -> wall time), for the ETA; one entry per step
      for (var i = 0; i < m.times[0].length; i++) if (m.times[1][i] != null) byStep.set(m.times[0][i], m.times[1][i]);
      state.times = Array.from(byStep).sort(function (a, b) { return a[0] - b[0]; }).slice(-50);
    }
    state.seenStep = before === null ? m.last : Math.max(before, m.last);
    // Only a group's final message moves the reconnect cursor: a backlog comes as several
    // messages (run-wide series, then per agent), and a socket that drops between them must
    // ask for the same steps again, not for what follows the run-wide part.
    if (m.final !== false) state.lastStep = state.lastStep === null ? m.last : Math.max(state.lastStep, m.last);
    state.step = Math.max(state.step, m.last);
    if (m.total) state.total = m.total;
    root.dataset.lastStep = String(state.seenStep);
    // A backlog comes in several messages: draw the first one at once (the first charts appear
    // early), then only once more when the backlog is complete, not once per message.
    if (state.loaded || !state.drawnOnce) {
      renderCharts(live ? m.last : null);
      state.drawnOnce = true;
    } else {
      state.redraw = true;
    }
    renderProgress();
    var note = document.getElementById("charts-note");
    if (note) note.textContent = m.downsampled ? "long series downsampled to ≤2,000 points each (min/max per bucket)" : "";
    if (state.loaded) {
      // When each new step reached the page (a live delta, or a catch-up from the database).
      var now = Date.now(), xs = (m.run["reward/total"] || [[]])[0];
      xs.forEach(function (x) { if (before === null || x > before) state.timings.push([x, now]); });
      if (state.timings.length > 5000) state.timings.splice(0, 1000);
    }
    if (live) {
      if (Date.now() - summaryAt > SUMMARY_EVERY_MS) refreshSummary(false);
    }
  }

  function onEvals(m) {
    m.rows.forEach(function (r) {
      state.evals[r.step + "|" + r.temperature] = r;
      Object.keys(r.agents || {}).forEach(noteAgent);
    });
    var spec = CHARTS.filter(function (s) { return s.evals; })[0];
    if (Object.keys(state.evals).length) renderChart(spec, null);
    renderMissing();
    if (state.loaded && m.rows.length) refreshSummary(false, ["held-out"]);
  }

  function filterQuery() {
    var f = document.getElementById("rollout-filter");
    if (!f) return "";
    var q = [];
    ["agent", "success", "step"].forEach(function (name) {
      var v = f.elements[name] && f.elements[name].value.trim();
      if (v) q.push(name + "=" + encodeURIComponent(v));
    });
    return q.join("&");
  }

  function reloadEpisodes() {
    var f = document.getElementById("rollout-filter");
    if (f && window.htmx) htmx.trigger(f, "submit");
  }

  function episodesBox() { return document.getElementById("episodes"); }

  function ensureLoadMore(box) {
    if (box.querySelector(".load-more")) return;
    var b = document.createElement("button");
    b.type = "button";
    b.className = "load-more";
    b.setAttribute("hx-get", root.dataset.rolloutsUrl);
    b.setAttribute("hx-include", "#rollout-filter");
    b.setAttribute("hx-target", "this");
    b.setAttribute("hx-swap", "outerHTML");
    b.textContent = "Load older episodes";
    box.appendChild(b);
    if (window.htmx) htmx.process(b);
  }

  // "Load older episodes" asks for the episodes before the oldest one shown. Added to its request
  // here rather than with hx-vals="js:...": that is eval, which the Content-Security-Policy refuses.
  document.addEventListener("htmx:configRequest", function (e) {
    if (e.detail.elt.classList.contains("load-more")) e.detail.parameters.before = window.runLive.oldestEpisodeId();
  });

  // Episodes: the socket only announces the newest episode's id; the page fetches what it lacks
  // (newer than what it asked for last time, with its filter) as rendered HTML over plain HTTP.
  var episodes = { asked: null, wanted: null, busy: false };

  function onRollouts(m) {
    if (m.last_id != null) episodes.wanted = Math.max(episodes.wanted || 0, m.last_id);
    if (episodes.asked === null || (episodes.wanted !== null && episodes.wanted > episodes.asked)) fetchEpisodes();
  }

  function fetchEpisodes() {
    if (episodes.busy) return;
    var first = episodes.asked === null;
    var target = episodes.wanted;
    var filter = filterQuery(), q = filter;
    if (!first) q = "after=" + episodes.asked + (q ? "&" + q : "");
    episodes.busy = true;
    fetch(root.dataset.rolloutsUrl + (q ? "?" + q : ""), { credentials: "same-origin", headers: { "HX-Request": "true" } })
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.text(); })
      .then(function (html) {
        if (filter !== filterQuery()) return;  // the viewer changed the filter meanwhile: htmx reloads the list
        showEpisodes(html, first);
        episodes.asked = Math.max(episodes.asked || 0, target || 0, newestIn(html));
      })
      .catch(function () { /* the next announcement (or reconnect) asks again */ })
      .then(function () {
        episodes.busy = false;
        if (episodes.wanted !== null && (episodes.asked === null || episodes.wanted > episodes.asked)) setTimeout(fetchEpisodes, 200);
      });
  }

  function newestIn(html) {
    var m = /id="ep-(\d+)"/.exec(html);
    return m ? +m[1] : 0;
  }

  function showEpisodes(html, replace) {
    var box = episodesBox();
    if (!box) return;
    var tpl = document.createElement("template");
    tpl.innerHTML = html;
    // A first load, or more new episodes than one page (a gap): the list starts over.
    if (replace || tpl.content.querySelector(".load-more")) {
      state.episodeCap = MAX_EPISODES;
      box.innerHTML = html;
      if (window.htmx) htmx.process(box);
      return;
    }
    var arts = tpl.content.querySelectorAll("article.episode");   // newest first
    var added = 0;
    for (var i = arts.length - 1; i >= 0; i--) {
      var a = arts[i];
      if (document.getElementById(a.id)) continue;
      a.classList.add("fresh");
      box.insertBefore(a, box.firstChild);
      added++;
    }
    if (!added) return;
    var empty = box.querySelector(".episodes-empty");
    if (empty) empty.remove();
    var all = box.querySelectorAll("article.episode");
    if (all.length > state.episodeCap) {
      for (var j = state.episodeCap; j < all.length; j++) all[j].remove();
      ensureLoadMore(box);
    }
  }

  function fmtTime(epoch) {
    var d = new Date(epoch * 1000);
    return d.toISOString().slice(11, 19);
  }

  function onLog(m) {
    var pre = document.getElementById("log-tail");
    if (!pre) return;
    var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
    if (m.reset) pre.textContent = "";
    var empty = document.getElementById("log-empty");
    if (empty && m.lines.length) empty.remove();
    m.lines.forEach(function (l) {
      if (!m.reset && state.lastLog !== null && l.id <= state.lastLog) return;
      var span = document.createElement("span");
      span.className = "lvl-" + l.level;
      span.dataset.id = l.id;
      span.textContent = fmtTime(l.time) + " " + (l.level.toUpperCase() + "       ").slice(0, 7) + " " + l.message + "\n";
      pre.appendChild(span);
      state.lastLog = state.lastLog === null ? l.id : Math.max(state.lastLog, l.id);
    });
    while (pre.childNodes.length > MAX_LOG) pre.removeChild(pre.firstChild);
    if (atBottom || m.reset) pre.scrollTop = pre.scrollHeight;
  }

  function handle(m) {
    switch (m.t) {
      case "status": onStatus(m); break;
      case "metrics": onMetrics(m); break;
      case "evals": onEvals(m); break;
      case "rollouts": onRollouts(m); break;
      case "log": onLog(m); if (!state.loaded) markLoaded(); break;
      case "phase": onPhase(m); break;
      case "checkpoint": refreshSummary(false, ["actions", "artifacts"]); break;
      case "placed": state.placedHeard = true; refreshSummary(true); break;  // the Ray nodes granted: the summary's Hosts line
      case "plan": refreshSummary(true); break;  // how the run executes, resolved at its start: the summary's Execution line
      case "pong": break;
    }
  }

  function markLoaded() {
    // The backlog ends with the log message; from here on a message is a live delta.
    state.loaded = true;
    if (state.redraw) { state.redraw = false; renderCharts(null); }
    if (!state.marks.loaded) state.marks.loaded = performance.now();
    root.dataset.loaded = "1";
  }

  // == status, progress, ETA =======================================================================

  function fmtDuration(s) {
    s = Math.max(0, Math.round(s));
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    if (h) return h + "h " + m + "m";
    if (m) return m + "m " + (sec < 10 ? "0" : "") + sec + "s";
    return sec + "s";
  }

  function etaSeconds() {
    // The engine's estimate (its own step, evaluation and checkpoint times), counting down.
    if (state.status !== "running" || state.eta == null) return null;
    return Math.max(0, state.eta - Date.now() / 1000);
  }

  function renderProgress() {
    var box = document.getElementById("run-progress");
    if (box) {
      var pct = state.total ? Math.min(100, Math.floor(100 * state.step / state.total)) : 0;
      var bar = box.querySelector(".bar"), label = box.querySelector("span"), outer = box.querySelector(".progress");
      if (bar) bar.value = pct;
      if (label) label.textContent = state.step + "/" + state.total;
      if (outer) outer.title = "step " + state.step + " of " + state.total;
    }
    var eta = document.getElementById("run-eta");
    if (eta) {
      // Known once a step has been timed; before that (loading, the step-0 evaluation) it says when it
      // will be. Outside training steps it names the phase the estimate is counting down through.
      var s = etaSeconds(), phase = state.phase && state.phase.phase;
      var label = phase && phase !== "training" ? " · " + phase : "";
      if (state.status !== "running") eta.textContent = "";
      else if (state.eta == null) eta.textContent = "ETA after the first step" + label;
      else eta.textContent = s < 1 ? "" : "ETA " + fmtDuration(s) + label;
    }
  }

  function setConn(name, detail) {
    // A finished run's socket stays open (a later evaluation still streams in), but nothing is live.
    if (name === "live" && TERMINAL[state.status]) name = "done";
    state.conn = name;
    root.dataset.conn = name;
    root.dataset.reconnects = String(state.reconnects);
    renderConn(detail);
  }

  function renderConn() {
    var el = document.getElementById("live-conn");
    if (!el) return;
    el.dataset.state = state.conn;
    var text = { connecting: "connecting…", live: "live", done: "", offline: "offline",
                 ended: "signed out · reload the page" }[state.conn];
    if (state.conn === "reconnecting") {
      var wait = Math.max(0, Math.ceil((state.retryAt - Date.now()) / 1000));
      text = wait ? "connection lost · retrying in " + wait + "s" : "reconnecting…";
    }
    el.textContent = text == null ? state.conn : text;
    el.hidden = !text;
  }

  var pendingParts = {};

  function refreshSummary(soon, parts) {
    // The summary card, and the parts named (page head actions, held-out results, artifacts,
    // the evaluate form) swapped out-of-band from the same response: at most one every 2 s.
    (parts || []).forEach(function (p) { pendingParts[p] = 1; });
    if (!window.htmx) return;
    var wait = Math.max(0, 2000 - (Date.now() - summaryAt));
    if (summaryTimer && !soon) return;
    clearTimeout(summaryTimer);
    summaryTimer = setTimeout(function () {
      summaryTimer = null;
      summaryAt = Date.now();
      var names = Object.keys(pendingParts);
      pendingParts = {};
      htmx.ajax("GET", root.dataset.summaryUrl + (names.length ? "?parts=" + names.join(",") : ""), { target: "#run-summary", swap: "outerHTML" });
    }, soon ? Math.min(wait, 250) : wait);
  }

  document.body.addEventListener("htmx:afterSettle", function () {
    // A summary refresh brings the server's badge and progress back: re-apply ETA and connection.
    // A filter or "load older" swap sets how many episodes the list may hold before trimming.
    renderProgress();
    renderConn();
    renderPhase();
    var box = episodesBox();
    if (box) state.episodeCap = Math.max(MAX_EPISODES, box.querySelectorAll("article.episode").length);
  });

  // == the socket ====================================================================================

  function socketUrl() {
    var q = [];
    if (state.lastStep !== null) q.push("step=" + state.lastStep);
    if (state.lastLog !== null) q.push("log=" + state.lastLog);
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    return scheme + location.host + root.dataset.ws + (q.length ? "?" + q.join("&") : "");
  }

  function connect() {
    clearTimeout(state.timer);
    state.timer = null;
    if (state.ws) return;
    // The page's inline script opened the first socket while the scripts were still loading
    // (templates/runs/detail.html); adopt it and replay what it has buffered.
    var early = window.troupeEarlySocket;
    window.troupeEarlySocket = null;
    if (early && (early.closed || early.ws.readyState > 1)) early = null;
    if (!state.marks.connect) state.marks.connect = early ? early.at : performance.now();
    var ws = early ? early.ws : new WebSocket(socketUrl());
    state.ws = ws;
    setConn("connecting");
    ws.onopen = function () {
      if (!state.marks.open) state.marks.open = performance.now();
      state.lastMessageAt = Date.now();
      setConn("live");
      clearInterval(state.pingTimer);
      state.pingTimer = setInterval(ping, PING_MS);
    };
    ws.onmessage = function (e) {
      if (!state.marks.firstMessage) state.marks.firstMessage = performance.now();
      state.lastMessageAt = Date.now();
      clearTimeout(state.pongTimer);
      state.backoff = BACKOFF_MIN;
      var m;
      try { m = JSON.parse(e.data); } catch (err) { return; }
      handle(m);
    };
    ws.onclose = function (e) {
      if (state.ws !== ws) return;
      state.ws = null;
      clearInterval(state.pingTimer);
      clearTimeout(state.pongTimer);
      if (e && e.code === 4401) { setConn("ended"); return; }  // logged out or no longer allowed: reload to sign in
      if (TERMINAL[state.status] && state.loaded) { setConn("done"); return; }
      scheduleReconnect();
    };
    if (early) {
      if (ws.readyState === 1) ws.onopen();
      early.messages.forEach(function (e) { ws.onmessage(e); });
    }
  }

  function ping() {
    var ws = state.ws;
    if (!ws || ws.readyState !== 1) return;
    try { ws.send("{\"t\":\"ping\"}"); } catch (err) { return; }
    clearTimeout(state.pongTimer);
    state.pongTimer = setTimeout(function () {
      if (state.ws === ws && Date.now() - state.lastMessageAt >= PONG_WAIT_MS) ws.close();  // half-open: start over
    }, PONG_WAIT_MS);
  }

  function scheduleReconnect() {
    var delay = Math.round(Math.min(state.backoff, BACKOFF_MAX) * (0.75 + Math.random() * 0.5));
    state.backoff = Math.min(state.backoff * 2, BACKOFF_MAX);
    state.reconnects++;
    state.retryAt = Date.now() + delay;
    setConn(navigator.onLine === false ? "offline" : "reconnecting");
    state.timer = setTimeout(connect, delay);
  }

  function reconnectNow() {
    if (state.ws || !state.timer) return;
    connect();
  }

  window.addEventListener("online", reconnectNow);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) reconnectNow(); });
  window.addEventListener("resize", function () { clearTimeout(resizeCharts.t); resizeCharts.t = setTimeout(resizeCharts, 150); });
  setInterval(function () {
    if (state.conn === "reconnecting") renderConn();
    if (state.status === "running") renderProgress();  // the ETA counts down between steps
  }, 1000);

  var resetZoom = document.getElementById("reset-zoom");
  if (resetZoom) resetZoom.addEventListener("click", function () { zoomAll(null); });
  var clear = document.getElementById("filter-clear");
  if (clear) clear.addEventListener("click", function () {
    var f = document.getElementById("rollout-filter");
    f.reset();
    reloadEpisodes();
  });

  window.runLive = {
    state: state,
    oldestEpisodeId: function () {
      var all = episodesBox().querySelectorAll("article.episode");
      return all.length ? all[all.length - 1].dataset.id : "";
    },
    steps: function (key, agent) {
      var store = agent ? state.agents[agent] || {} : state.run;
      return (store[key || "reward/total"] || { x: [] }).x.slice();
    },
    charts: charts,
  };

  connect();
})();
