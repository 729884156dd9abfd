/* fairq dashboard: plain JavaScript, no build step.
 * Polls /v1/overview every 1.5 s (the server samples stats into a ring buffer and
 * measures rates); a queue's page also polls /v1/queues/{q}/history for its charts and
 * peeks at its dead-letter queue. Every value goes into the page with textContent. */
"use strict";

const POLL_MS = 1500;
const state = { overview: null, charts: {}, route: null, timer: null, dlqSeen: null };

// -- helpers ---------------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

async function api(path, options = {}) {
  const opts = Object.assign({ credentials: "same-origin" }, options);
  opts.headers = Object.assign({ "X-Fairq-Dashboard": "1" }, options.headers || {});
  if (opts.body !== undefined && typeof opts.body !== "string") {
    opts.body = JSON.stringify(opts.body);
    opts.headers["Content-Type"] = "application/json";
  }
  const r = await fetch(path, opts);
  if (r.status === 401) { location.href = "/login"; throw new Error("not logged in"); }
  const text = await r.text();
  const data = text ? JSON.parse(text) : null;
  if (!r.ok) throw new Error((data && data.detail) || r.statusText);
  return data;
}

const enc = encodeURIComponent;
function age(s) {
  if (!s || s <= 0) return "–";
  if (s < 120) return s.toFixed(1) + "s";
  if (s < 7200) return (s / 60).toFixed(1) + "m";
  return (s / 3600).toFixed(1) + "h";
}
function rate(r) { return r === null || r === undefined ? "–" : (r < 10 ? r.toFixed(2) : r.toFixed(1)) + "/s"; }
function num(n) { return n === null || n === undefined ? "–" : String(n); }
function workers(w) { return w === null || w === undefined ? "–" : (w < 10 ? w.toFixed(2) : w.toFixed(1)); }
function slo(s) {
  if (s.freshness_slo === null) return h("span", { class: "dim" }, "–");
  return s.breaching
    ? h("span", { class: "badge bad" }, `BREACH > ${s.freshness_slo}s`)
    : h("span", { class: "badge ok" }, `ok ≤ ${s.freshness_slo}s`);
}
function depth(s) { return s.visible + s.delayed + s.in_flight; }

// -- routing ---------------------------------------------------------------------------
function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const parts = hash.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "queue" && parts[1]) return { view: "queue", name: parts[1] };
  if (parts[0] === "topics") return { view: "topics" };
  if (parts[0] === "attention") return { view: "attention" };
  if (parts[0] === "rooms") return { view: "rooms" };
  return { view: "queues" };
}

window.addEventListener("hashchange", () => { state.charts = {}; state.dlqSeen = null; render(true); });

// -- views -----------------------------------------------------------------------------
function queuesView(ov) {
  const rows = ov.queues;
  if (!rows.length) {
    return h("div", { class: "empty", id: "empty" },
      h("p", {}, "No queues yet. Send a message and watch it appear here:"),
      h("p", {}, h("code", {}, `fairq send jobs '{"hello": "world"}' --server ${location.origin}`)),
      h("p", {}, "or run ", h("code", {}, "fairq demo"), " against the same database."));
  }
  const head = ["queue", "visible", "in flight", "delayed", "oldest", "DLQ", "send", "ack",
    "workers needed", "freshness"];
  const table = h("table", { id: "queues" },
    h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))),
    h("tbody", {}, rows.map((q) => {
      const s = q.stats;
      return h("tr", { "data-queue": q.name, class: [s.breaching ? "breach" : "", q.is_dlq ? "dlq" : ""].join(" ").trim() },
        h("td", { class: "text" }, h("a", { href: `#/queue/${enc(q.name)}` }, q.name)),
        h("td", { "data-col": "visible" }, s.visible),
        h("td", { "data-col": "in_flight" }, s.in_flight),
        h("td", { "data-col": "delayed" }, s.delayed),
        h("td", { "data-col": "oldest_age", class: s.breaching ? "num-bad" : "" }, age(s.oldest_age)),
        h("td", { "data-col": "dlq" }, q.dead_letter
          ? h("a", { href: `#/queue/${enc(q.dead_letter)}`, class: q.dlq_depth ? "num-bad" : "" }, num(q.dlq_depth))
          : h("span", { class: "dim" }, "–")),
        h("td", { "data-col": "send_rate" }, rate(q.send_rate)),
        h("td", { "data-col": "ack_rate" }, rate(q.ack_rate)),
        h("td", { "data-col": "workers_needed" }, workers(q.workers_needed)),
        h("td", { "data-col": "freshness" }, slo(s)));
    })));
  const breaches = rows.filter((q) => q.stats.breaching).length;
  const note = ov.sampled_queues < ov.total_queues
    ? h("p", { class: "note" }, `Showing the first ${ov.sampled_queues} of ${ov.total_queues} queues.`) : null;
  return h("div", {},
    h("h1", {}, "Queues ", breaches ? h("span", { class: "badge bad", id: "breaches" }, `${breaches} freshness breach${breaches > 1 ? "es" : ""}`) : null),
    note, table);
}

function queueView(ov, name) {
  const q = ov.queues.find((x) => x.name === name);
  if (!q) return h("div", { class: "empty" }, `Queue ${name} is not there (yet).`);
  const s = q.stats;
  const card = (label, value, bad, col) =>
    h("div", { class: "card" + (bad ? " bad" : ""), "data-card": col }, h("div", { class: "label" }, label), h("div", { class: "value" }, value));
  const littles = q.workers_needed === null
    ? h("div", { class: "littles" }, "Workers needed: not measurable yet — it needs handlings that ended within the last ",
      `${ov.window} s (mean handling time = in flight ÷ handlings ended per second).`)
    : h("div", { class: "littles", id: "littles" },
      h("b", {}, `${workers(q.workers_needed)} workers`),
      ` must be busy on average: arrival rate ${rate(q.send_rate)} × attempts a message takes × mean handling time `,
      `${q.handling_time.toFixed(2)} s (in flight ÷ acks, nacks and dead letters per second), by Little's law.`);
  const dlqName = q.is_dlq ? q.name : q.dead_letter;
  return h("div", {},
    h("h1", {}, h("a", { href: "#/" }, "Queues"), " / ", name, " ", s.breaching ? h("span", { class: "badge bad" }, "freshness SLO breached") : null),
    h("div", { class: "cards" },
      card("visible", s.visible, false, "visible"),
      card("in flight", s.in_flight, false, "in_flight"),
      card("delayed", s.delayed, false, "delayed"),
      card("oldest age" + (s.freshness_slo !== null ? ` (SLO ${s.freshness_slo}s)` : ""), age(s.oldest_age), s.breaching, "oldest_age"),
      card("DLQ depth", num(q.dlq_depth), q.dlq_depth > 0, "dlq"),
      card("send rate", rate(q.send_rate), false, "send_rate"),
      card("ack rate", rate(q.ack_rate), false, "ack_rate"),
      card("sent / acked", `${s.sent} / ${s.acked}`, false, "counters"),
      card("dead-lettered", s.dead_lettered, false, "dead_lettered")),
    littles,
    h("div", { class: "charts" },
      h("div", { class: "chart" }, h("h3", {}, "Depth, last 15 minutes"), h("div", { id: "chart-depth" })),
      h("div", { class: "chart" }, h("h3", {}, "Rates (messages/s)"), h("div", { id: "chart-rates" }))),
    dlqName ? h("section", { class: "panel", id: "dlq" },
      h("h2", {}, q.is_dlq ? "Dead letters in this queue" : `Dead-letter queue ${dlqName}`),
      h("div", { class: "toolbar" },
        h("button", { class: "action", id: "redrive", "data-dlq": dlqName, onclick: () => redrive(dlqName) },
          q.is_dlq ? "Redrive all to their source queues" : `Redrive all to ${name}`),
        h("span", { id: "redrive-result", class: "note" })),
      h("div", { id: "dlq-messages" }, h("p", { class: "note" }, "loading…"))) : null);
}

async function redrive(dlq) {
  const button = document.getElementById("redrive");
  const out = document.getElementById("redrive-result");
  button.disabled = true;
  try {
    const r = await api(`/v1/queues/${enc(dlq)}/redrive`, { method: "POST", body: {} });
    out.textContent = `moved ${r.moved} message${r.moved === 1 ? "" : "s"}`;
    state.dlqSeen = null;
    await tick();
  } catch (e) {
    out.textContent = `redrive failed: ${e.message}`;
  } finally {
    button.disabled = false;
  }
}

async function refreshDlq(dlq, depthNow) {
  const box = document.getElementById("dlq-messages");
  if (!box || state.dlqSeen === depthNow) return;
  state.dlqSeen = depthNow;
  let msgs;
  try { msgs = (await api(`/v1/queues/${enc(dlq)}/messages?limit=50`)).messages; }
  catch (e) { box.replaceChildren(h("p", { class: "error" }, e.message)); return; }
  if (!msgs.length) { box.replaceChildren(h("p", { class: "note", id: "dlq-empty" }, "No dead letters.")); return; }
  const now = Date.now() / 1000;
  box.replaceChildren(h("table", { id: "dlq-table" },
    h("thead", {}, h("tr", {}, ["id", "reason", "from", "attempts", "age", "body"].map((c) => h("th", { class: "text" }, c)))),
    h("tbody", {}, msgs.map((m) => h("tr", { "data-message": m.id },
      h("td", { class: "text" }, m.id),
      h("td", { class: "text" }, m.attributes["fairq.reason"] || "–", m.attributes["fairq.detail"] ? h("div", { class: "dim" }, m.attributes["fairq.detail"]) : null),
      h("td", { class: "text" }, m.attributes["fairq.source"] || "–"),
      h("td", { class: "text" }, m.attributes["fairq.attempts"] || "–"),
      h("td", { class: "text" }, age(now - m.enqueued_at)),
      h("td", { class: "body" }, m.encoding === "base64" ? `(binary, ${Math.floor(m.body.length * 3 / 4)} bytes)` : m.body.slice(0, 300)))))));
}

function topicsView(ov) {
  if (!ov.topics.length) return h("div", { class: "empty" }, "No topics yet.");
  const byName = Object.fromEntries(ov.queues.map((q) => [q.name, q]));
  return h("div", {}, h("h1", {}, "Topics"), ov.topics.map((t) => h("section", { class: "panel", "data-topic": t.name },
    h("h2", {}, t.name),
    h("p", { class: "note" }, `published ${t.stats.published} · copies ${t.stats.copies} · unmatched ${t.stats.unmatched} · ${t.stats.subscriptions} subscription(s)`),
    t.subscriptions.length ? h("table", {},
      h("thead", {}, h("tr", {}, ["subscription", "routing", "filter", "push", "visible", "in flight", "oldest", "DLQ"].map((c) => h("th", {}, c)))),
      h("tbody", {}, t.subscriptions.map((s) => {
        const q = byName[s.queue];
        return h("tr", { "data-subscription": s.name },
          h("td", { class: "text" }, h("a", { href: `#/queue/${enc(s.queue)}` }, s.name)),
          h("td", { class: "text" }, s.routing || "#"),
          h("td", { class: "body" }, s.filter ? JSON.stringify(s.filter) : "–"),
          h("td", { class: "text" }, s.push || "pull"),
          h("td", {}, q ? q.stats.visible : "–"),
          h("td", {}, q ? q.stats.in_flight : "–"),
          h("td", {}, q ? age(q.stats.oldest_age) : "–"),
          h("td", {}, q ? num(q.dlq_depth) : "–"));
      }))) : h("p", { class: "note" }, "No subscriptions."))));
}

function attentionView(ov) {
  if (!ov.attention.length) return h("div", { class: "empty" }, "No attention domains yet.");
  return h("div", {}, h("h1", {}, "Attention domains"), ov.attention.map((d) => {
    const s = d.stats;
    const discarded = Object.entries(s.discarded).map(([k, v]) => `${k} ${v}`).join(", ") || "0";
    const counter = (label, value, col) => h("div", { class: "card", "data-card": col }, h("div", { class: "label" }, label), h("div", { class: "value" }, value));
    return h("section", { class: "panel", "data-domain": d.name },
      h("h2", {}, d.name, " ", h("span", { class: "dim" }, s.queue)),
      h("div", { class: "cards" },
        counter("keys", s.keys, "keys"), counter("signals pending", s.signals_pending, "signals"),
        counter("slices running", s.slices, "slices"), counter("processed", s.processed, "processed"),
        counter("republished", s.republished, "republished"), counter("blocked", s.blocked, "blocked"),
        counter("rate limited", s.rate_limited, "rate_limited"), counter("parked", s.parked, "parked"),
        counter("reconciled", s.reconciled, "reconciled"), counter("discarded", discarded, "discarded"),
        counter("mean clear time", age(s.clear_time_avg), "clear_time")),
      tenantsTable(d.tenants || []),
      d.keys.length ? h("table", {},
        h("thead", {}, h("tr", {}, ["busiest keys", "tenant", "plan", "state", "backlog", "in flight", "oldest", "slices", "signals", "processed"].map((c) => h("th", {}, c)))),
        h("tbody", {}, d.keys.map((k) => h("tr", { "data-key": k.key },
          h("td", { class: "text" }, k.key), h("td", { class: "text" }, k.tenant), h("td", { class: "text" }, k.plan),
          h("td", { class: "text" }, k.state === "active" ? k.state : h("span", { class: "badge warn" }, k.state)),
          h("td", {}, k.backlog), h("td", {}, k.in_flight), h("td", {}, age(k.oldest_age)),
          h("td", {}, k.active), h("td", {}, k.pending), h("td", {}, k.processed))))) : h("p", { class: "note" }, "No keys yet."));
  }));
}

// tenants over the last minute: the share of the domain's worker time each one used
function tenantsTable(tenants) {
  if (!tenants.length) return h("span", {});
  const pct = (x) => (100 * x).toFixed(1) + " %";
  return h("table", { "data-table": "tenants" },
    h("thead", {}, h("tr", {}, ["tenants (last minute)", "worker time", "share", "slices", "messages", "backlog", "keys with backlog", ""].map((c) => h("th", {}, c)))),
    h("tbody", {}, tenants.map((t) => h("tr", { "data-tenant": t.tenant },
      h("td", { class: "text" }, t.tenant),
      h("td", {}, age(t.busy)),
      h("td", {}, h("span", { class: "share" }, h("span", { class: "share-bar", style: `width:${Math.round(80 * t.share)}px` }), pct(t.share))),
      h("td", {}, t.slices), h("td", {}, t.messages), h("td", {}, t.backlog), h("td", {}, t.keys),
      h("td", { class: "text" }, t.at_cap ? h("span", { class: "badge warn", title: "every backlogged key runs max_concurrency slices: the others get what it cannot use" }, "at cap") : "")))));
}

function roomsView(ov) {
  if (!ov.rooms.length) return h("div", { class: "empty" }, "No waiting rooms yet.");
  const rate = (r) => (r < 10 ? r.toFixed(2) : r.toFixed(1)) + "/s";
  const head = ["room", "phase", "in line", "pre-queue", "joined", "admitted", "active", "used",
    "expired", "admit rate", "measured", "told sold out"];
  return h("div", {}, h("h1", {}, "Waiting rooms"),
    h("table", { id: "rooms" },
      h("thead", {}, h("tr", {}, head.map((c) => h("th", {}, c)))),
      h("tbody", {}, ov.rooms.map((r) => h("tr", { "data-room": r.name },
        h("td", { class: "text" }, h("a", { href: `/rooms/${enc(r.name)}` }, r.name)),
        h("td", { class: "text" }, r.phase === "open" ? h("span", { class: "badge ok" }, "open")
          : r.phase === "sold_out" ? h("span", { class: "badge bad" }, "sold out")
            : h("span", { class: "badge warn" }, r.phase)),
        h("td", { "data-col": "waiting" }, r.waiting), h("td", {}, r.pre_queue), h("td", {}, r.joined),
        h("td", {}, r.admitted), h("td", {}, r.active), h("td", {}, r.used), h("td", {}, r.expired),
        h("td", {}, rate(r.admit_rate)), h("td", {}, rate(r.measured_rate)), h("td", {}, r.told_sold_out))))),
    h("p", { class: "note" }, "A room's name links to the fans' page."));
}

// -- charts ----------------------------------------------------------------------------
function chart(id, series, data) {
  const el = document.getElementById(id);
  if (!el || typeof uPlot === "undefined") return;
  let c = state.charts[id];
  if (!c || !el.contains(c.root)) {
    el.replaceChildren();
    c = new uPlot({
      width: Math.max(300, el.clientWidth - 4), height: 230,
      series: [{}].concat(series.map(([label, stroke]) => ({ label, stroke, width: 2 }))),
      axes: [{}, { size: 50 }],
      scales: { x: { time: true } },
    }, data, el);
    state.charts[id] = c;
  } else {
    c.setData(data);
  }
}

async function refreshCharts(name) {
  let hst;
  try { hst = await api(`/v1/queues/${enc(name)}/history`); } catch (e) { return; }
  chart("chart-depth", [["visible", "#2f6fde"], ["in flight", "#e08a1e"], ["delayed", "#8a8fa0"], ["DLQ", "#c9302c"]],
    [hst.t, hst.visible, hst.in_flight, hst.delayed, hst.dlq_depth]);
  chart("chart-rates", [["send/s", "#2f855a"], ["ack/s", "#6b46c1"]], [hst.t, hst.send_rate, hst.ack_rate]);
}

// -- the loop --------------------------------------------------------------------------
function render(force) {
  const ov = state.overview;
  if (!ov) return;
  const r = route();
  document.querySelectorAll("[data-nav]").forEach((a) =>
    a.classList.toggle("active", a.dataset.nav === (r.view === "queue" ? "queues" : r.view)));
  const view = document.getElementById("view");
  const keep = {};
  for (const id of ["dlq-messages", "chart-depth", "chart-rates", "redrive-result"]) {
    const el = document.getElementById(id);
    if (el && !force) keep[id] = el;
  }
  let content;
  if (r.view === "queue") content = queueView(ov, r.name);
  else if (r.view === "topics") content = topicsView(ov);
  else if (r.view === "attention") content = attentionView(ov);
  else if (r.view === "rooms") content = roomsView(ov);
  else content = queuesView(ov);
  // keep the charts, the DLQ table and the last redrive result across refreshes
  for (const [id, el] of Object.entries(keep)) {
    const fresh = content.querySelector(`#${id}`);
    if (fresh) fresh.replaceWith(el);
  }
  view.replaceChildren(content);
}

async function tick() {
  try {
    const ov = await api("/v1/overview");
    state.overview = ov;
    document.getElementById("backend").textContent = ov.backend;
    document.getElementById("window").textContent = ov.window;
    document.getElementById("logout").hidden = !ov.auth;
    const live = document.getElementById("live");
    live.textContent = "live · " + new Date(ov.time * 1000).toLocaleTimeString();
    live.classList.remove("stale");
    render(false);
    const r = route();
    if (r.view === "queue") {
      const q = ov.queues.find((x) => x.name === r.name);
      if (q) {
        await refreshCharts(r.name);
        const dlq = q.is_dlq ? q.name : q.dead_letter;
        if (dlq) await refreshDlq(dlq, q.is_dlq ? depth(q.stats) : q.dlq_depth);
      }
    }
  } catch (e) {
    const live = document.getElementById("live");
    live.textContent = "offline: " + e.message;
    live.classList.add("stale");
  }
}

async function loop() {
  await tick();
  state.timer = setTimeout(loop, POLL_MS);
}
loop();
