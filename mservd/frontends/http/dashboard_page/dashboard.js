// The dashboard's script: reads the overview stream (/dashboard/events, one JSON document a
// second), keeps the last minute of it, and draws. Rates and latency quantiles come from the
// differences between consecutive documents (the server sends running totals and histogram
// buckets, so it does no sampling work of its own). Actions post to /dashboard/actions/*,
// which calls the management API's own verbs.
"use strict";

const HISTORY = 60; // seconds kept for the sparklines
const models = new Map(); // "name/version" -> {el, history: [{p50, p99, rps}], ...}
let previous = null;

const $ = (sel, root = document) => root.querySelector(sel);
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;",
  ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const fmt = (x, digits = 1) => (x === null || x === undefined || Number.isNaN(x)) ? "–"
  : Number(x).toLocaleString(undefined, {maximumFractionDigits: digits});
const ms = (seconds) => (seconds === null || seconds === undefined) ? "–" : fmt(seconds * 1e3, 1) + " ms";
const mib = (bytes) => fmt(bytes / 1048576, 0) + " MiB";

// -- arithmetic on histograms -----------------------------------------------------------

function delta(now, before) {
  // bucket counts of what happened between two documents (cumulative → per interval)
  if (!now) return null;
  if (!before || before.count > now.count) return now;
  return {buckets: now.buckets, counts: now.counts.map((c, i) => c - (before.counts[i] || 0)),
          count: now.count - before.count, sum: now.sum - before.sum};
}

function quantile(hist, q) {
  if (!hist || hist.count <= 0) return null;
  const target = q * hist.count;
  for (let i = 0; i < hist.counts.length; i++) {
    if (hist.counts[i] >= target) {
      const lower = i === 0 ? 0 : hist.buckets[i - 1];
      const upper = hist.buckets[i];
      if (upper === null) return lower; // past the last finite bucket
      const below = i === 0 ? 0 : hist.counts[i - 1];
      const inside = hist.counts[i] - below;
      return inside > 0 ? lower + (upper - lower) * (target - below) / inside : upper;
    }
  }
  return null;
}

// -- drawing ----------------------------------------------------------------------------

function sparkline(points, width = 240, height = 48) {
  const values = points.flatMap((p) => [p.p50, p.p99]).filter((v) => v !== null);
  const top = Math.max(1e-6, ...values);
  const x = (i) => (i / (HISTORY - 1)) * width;
  const y = (v) => height - 2 - (v / top) * (height - 12);
  const path = (key) => {
    let d = "";
    points.forEach((p, i) => {
      if (p[key] === null) return;
      d += (d && points[i - 1] && points[i - 1][key] !== null ? "L" : "M") +
           x(i + HISTORY - points.length).toFixed(1) + "," + y(p[key]).toFixed(1);
    });
    return d;
  };
  return `<svg width="${width}" height="${height}" role="img" aria-label="latency">` +
    `<path class="p99" d="${path("p99")}"/><path class="p50" d="${path("p50")}"/>` +
    `<text x="2" y="9">${esc(ms(top))}</text></svg>`;
}

function bars(hist, width = 240, height = 60) {
  if (!hist || hist.count <= 0) return '<span class="muted">no batches yet</span>';
  const counts = hist.counts.map((c, i) => c - (i ? hist.counts[i - 1] : 0));
  const labels = hist.buckets.map((b, i) => b === null ? `>${hist.buckets[i - 1]}` : `≤${b}`);
  const top = Math.max(1, ...counts);
  const w = width / counts.length;
  return `<svg width="${width}" height="${height}" role="img" aria-label="batch sizes">` +
    counts.map((c, i) => {
      const h = (c / top) * (height - 14);
      return `<rect class="bar" x="${(i * w + 1).toFixed(1)}" y="${(height - 12 - h).toFixed(1)}"` +
             ` width="${(w - 2).toFixed(1)}" height="${h.toFixed(1)}"><title>${esc(labels[i])}: ${c}` +
             `</title></rect><text x="${(i * w + 2).toFixed(1)}" y="${height - 2}">${esc(labels[i])}</text>`;
    }).join("") + "</svg>";
}

function speedupCurve(cost, advice, width = 240, height = 60) {
  const points = cost.curve;
  const top = Math.max(...points.map((p) => p.speedup), 1);
  const x = (i) => 4 + (i / (points.length - 1)) * (width - 8);
  const y = (s) => height - 12 - (s / top) * (height - 20);
  const d = points.map((p, i) => (i ? "L" : "M") + x(i).toFixed(1) + "," + y(p.speedup).toFixed(1)).join("");
  const marks = points.map((p, i) => `<text x="${(x(i) - 3).toFixed(1)}" y="${height - 2}">${p.batchSize}</text>`).join("");
  let chosen = "";
  if (advice) {
    const i = points.findIndex((p) => p.batchSize >= advice.batchSize);
    if (i >= 0) chosen = `<circle class="mark" cx="${x(i).toFixed(1)}" cy="${y(points[i].speedup).toFixed(1)}" r="3"/>`;
  }
  return `<svg width="${width}" height="${height}" role="img" aria-label="speed-up by batch size">` +
    `<path class="curve" d="${d}"/>${chosen}${marks}<text x="2" y="9">S(B) up to ${fmt(cost.speedupCeiling)}x</text></svg>`;
}

function stat(label, value) {
  return `<div class="stat"><span>${esc(label)}</span><span>${value}</span></div>`;
}

// -- one model version ------------------------------------------------------------------

function modelSection(m) {
  const key = `${m.name}/${m.version}`;
  let entry = models.get(key);
  if (!entry) {
    const el = document.createElement("article");
    el.className = "model";
    el.dataset.model = m.name;
    el.dataset.version = m.version;
    el.innerHTML = `<div class="model-head"><h3>${esc(m.name)} <span class="muted">v${esc(m.version)}</span></h3>` +
      `<span class="state badge"></span><span class="default badge"></span></div>` +
      `<div class="body"></div>` +
      `<div class="actions"><label>workers <input type="number" min="0" class="workers-input"></label>` +
      `<button class="scale">Scale</button><button class="make-default">Make default</button>` +
      `<span class="result"></span></div>`;
    $("#models").appendChild(el);
    $(".workers-input", el).value = m.settings.minWorkers;
    $(".scale", el).addEventListener("click", () => act(el, "scale",
      {model: m.name, version: m.version, min_worker: $(".workers-input", el).value}));
    $(".make-default", el).addEventListener("click", () => act(el, "set-default",
      {model: m.name, version: m.version}));
    entry = {el, history: []};
    models.set(key, entry);
  }
  return entry;
}

function drawModel(m, before, seconds) {
  const entry = modelSection(m);
  const el = entry.el;
  const latency = delta(m.latency, before && before.latency);
  const answered = Object.values(m.answers).reduce((a, b) => a + b, 0);
  const answeredBefore = before ? Object.values(before.answers).reduce((a, b) => a + b, 0) : answered;
  const rps = seconds > 0 ? Math.max(0, answered - answeredBefore) / seconds : 0;
  entry.history.push({p50: quantile(latency, 0.5), p99: quantile(latency, 0.99), rps});
  const failed = (answers) => Object.entries(answers).filter(([code]) => Number(code) >= 500)
    .reduce((sum, [, n]) => sum + n, 0);
  entry.errorRate = answered > answeredBefore && before
    ? (failed(m.answers) - failed(before.answers)) / (answered - answeredBefore) : null;
  if (entry.history.length > HISTORY) entry.history.shift();
  const minute = entry.history.filter((p) => p.p99 !== null);
  const state = $(".state", el);
  state.textContent = m.state;
  state.className = "state badge " + ({READY: "ok", LOADING: "warn", FAILED: "bad"}[m.state] || "");
  $(".default", el).textContent = m.isDefault ? "default" : "";
  $(".make-default", el).hidden = m.isDefault;

  const errors = Object.entries(m.answers).filter(([code]) => Number(code) >= 400)
    .map(([code, n]) => `${esc(code)}: ${fmt(n, 0)}`).join(", ") || "none";
  const workers = m.workers.map((w) => `<tr><td>${esc(w.id)}</td><td>${esc(w.pid ?? "–")}</td>` +
    `<td>${esc(w.status)}</td><td>${mib(w.memoryBytes)}</td><td>${esc(w.device)}${w.deviceMemoryBytes == null ? "" : " · " + mib(w.deviceMemoryBytes)}</td></tr>`).join("");
  let html = `<div class="grid">` +
    `<div class="panel"><h3>Traffic</h3>` +
    stat("requests/s", fmt(rps, 1)) +
    stat("queue", `${fmt(m.queue.pending, 0)} / ${fmt(m.queue.capacity, 0)}`) +
    stat("oldest wait", ms(m.queue.oldestWaitSeconds)) +
    stat("running", fmt(m.running, 0)) +
    stat("errors", errors) +
    stat("worker restarts", fmt(m.restarts, 0)) + `</div>` +
    `<div class="panel"><h3>Latency, last minute</h3>${sparkline(entry.history)}` +
    `<div class="legend"><span class="a">p50</span> ${ms(entry.history.at(-1).p50)} · ` +
    `<span class="w">p99</span> ${ms(entry.history.at(-1).p99)} · ` +
    `worst p99 ${ms(minute.length ? Math.max(...minute.map((p) => p.p99)) : null)}</div></div>` +
    `<div class="panel"><h3>Batch sizes</h3>${bars(m.batchSize)}</div>` +
    `<div class="panel"><h3>Batching advisor</h3>`;
  if (m.batchCost) {
    const c = m.batchCost;
    html += stat("fixed cost c", fmt(c.fixedMs, 3) + " ms") + stat("per request m", fmt(c.perItemMs, 3) + " ms") +
      stat("fit r²", fmt(c.r2, 3)) + speedupCurve(c, m.advice) +
      (m.advice ? stat("advised", `batch ${m.advice.batchSize}, delay ${fmt(m.advice.maxBatchDelay, 2)} ms`) +
                  `<div class="muted legend">${esc(m.advice.why)}</div>` : "");
  } else {
    html += '<span class="muted">no fit yet: it needs batches of two sizes or more</span>';
  }
  html += `</div>`;
  if (m.generative) {
    const tokens = delta(m.interToken, before && before.interToken);
    const first = delta(m.firstToken, before && before.firstToken);
    const made = (tokens ? tokens.count : 0) + (first ? first.count : 0);
    html += `<div class="panel"><h3>Generation</h3>` + stat("running sequences", fmt(m.running, 0)) +
      stat("tokens/s", fmt(seconds > 0 ? made / seconds : 0, 1)) +
      stat("first token p50 / p99", `${ms(quantile(first, 0.5))} / ${ms(quantile(first, 0.99))}`) +
      stat("between tokens p50 / p99", `${ms(quantile(tokens, 0.5))} / ${ms(quantile(tokens, 0.99))}`) + `</div>`;
  }
  html += `<div class="panel wide"><h3>Workers</h3><table class="workers"><thead><tr><th>id</th><th>pid</th>` +
    `<th>status</th><th>memory</th><th>device</th></tr></thead><tbody>${workers}</tbody></table></div></div>`;
  if (m.loadError) html += `<p class="result bad">${esc(m.loadError)}</p>`;
  $(".body", el).innerHTML = html;
}

// -- the whole page ---------------------------------------------------------------------

function draw(doc) {
  const seconds = previous ? doc.time - previous.time : 0;
  const before = new Map((previous ? previous.models : []).map((m) => [`${m.name}/${m.version}`, m]));
  $("#daemon").textContent = `version ${doc.version} · up ${fmt(doc.uptimeSeconds / 60, 1)} min`;
  const refused = Object.entries(doc.refused).map(([k, n]) => `${esc(k)}: ${fmt(n, 0)}`).join(", ") || "none";
  const frontends = Object.entries(doc.frontends)
    .map(([k, f]) => `${esc(k)} (${fmt(f.restarts, 0)} restarts)`).join(", ");
  const cards = [["models", doc.models.length], ["workers", doc.models.reduce((a, m) => a + m.workers.length, 0)],
    ["answers 2XX", fmt(doc.answers["2XX"], 0)], ["4XX", fmt(doc.answers["4XX"], 0)],
    ["5XX", fmt(doc.answers["5XX"], 0)]];
  $("#summary").innerHTML = cards.map(([k, v]) => `<div class="card"><div class="muted">${esc(k)}</div>` +
    `<div class="value">${v}</div></div>`).join("") +
    `<div class="card"><div class="muted">refused</div><div>${refused}</div></div>` +
    `<div class="card"><div class="muted">frontends</div><div>${frontends}</div></div>`;
  const seen = new Set();
  for (const m of doc.models) {
    seen.add(`${m.name}/${m.version}`);
    drawModel(m, before.get(`${m.name}/${m.version}`), seconds);
  }
  for (const [key, entry] of models) {
    if (!seen.has(key)) { entry.el.remove(); models.delete(key); }
  }
  drawTraffic(doc.models);
  $("#events tbody").innerHTML = doc.events.slice().reverse().map((e) =>
    `<tr><td>${esc(new Date(e.time * 1000).toLocaleTimeString())}</td><td>${esc(e.kind)}</td>` +
    `<td>${esc(e.model || "")}</td><td>${esc(e.rid || "")}</td><td>${esc(e.message)}</td></tr>`).join("");
  previous = doc;
}

// -- versions that share a model's traffic: each one's p99 and 5xx rate side by side -------

function drawTraffic(list) {
  const byModel = new Map();
  for (const m of list.filter((m) => m.traffic)) {
    if (!byModel.has(m.name)) byModel.set(m.name, []);
    byModel.get(m.name).push(m);
  }
  $("#traffic").hidden = byModel.size === 0;
  $("#traffic-body").innerHTML = [...byModel].map(([name, versions]) =>
    `<h3>${esc(name)}</h3><table class="workers"><thead><tr><th>version</th><th>share</th>` +
    `<th>shadow</th><th>state</th><th>requests/s</th><th>p99</th><th>5xx rate</th></tr></thead><tbody>` +
    versions.map((m) => {
      const entry = models.get(`${m.name}/${m.version}`);
      const last = entry.history.at(-1) || {};
      const t = m.traffic;
      return `<tr><td>${esc(m.version)}</td><td>${fmt(t.share, 1)} %</td>` +
        `<td>${t.shadowPercent == null ? "–" : fmt(t.shadowPercent, 0) + " %"}</td>` +
        `<td>${esc(t.state)}</td><td>${fmt(last.rps, 1)}</td><td>${ms(last.p99)}</td>` +
        `<td>${entry.errorRate == null ? "–" : fmt(entry.errorRate * 100, 1) + " %"}</td></tr>`;
    }).join("") + `</tbody></table>`).join("");
}

$("#traffic-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const form = event.target;
  const weights = Object.fromEntries(form.weights.value.trim().split(/\s+/)
    .map((pair) => pair.split("=")).map(([version, weight]) => [version, Number(weight)]));
  act(form, "traffic", {model: form.model.value, traffic: {weights, sticky: form.sticky.checked}});
});

async function act(el, verb, body) {
  const result = $(".result", el);
  result.className = "result";
  result.textContent = "…";
  try {
    const answer = await fetch(`/dashboard/actions/${verb}`, {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-Mservd-Dashboard": "1"},
      body: JSON.stringify(body)});
    const doc = await answer.json().catch(() => ({}));
    result.className = "result " + (answer.ok ? "ok" : "bad");
    result.textContent = answer.ok ? (doc.status || "done") : `${answer.status}: ${doc.message || answer.statusText}`;
  } catch (err) {
    result.className = "result bad";
    result.textContent = String(err);
  }
}

function connect() {
  const live = $("#live");
  const events = new EventSource("/dashboard/events");
  events.onopen = () => { live.textContent = "live"; live.className = "badge ok"; };
  events.onmessage = (message) => draw(JSON.parse(message.data));
  events.onerror = async () => {
    live.textContent = "reconnecting"; live.className = "badge warn";
    const check = await fetch("/dashboard/overview", {credentials: "same-origin"}).catch(() => null);
    if (check && check.status === 401) { events.close(); location.reload(); }
  };
}

$("#logout").addEventListener("click", async () => {
  // ends the session on the server (every page opened with it stops), then shows the key form
  await fetch("/dashboard/logout", {method: "POST", credentials: "same-origin",
                                    headers: {"X-Mservd-Dashboard": "1"}}).catch(() => null);
  location.reload();
});

connect();
