// The Lapidus status page: reads /events (server-sent events: "status", "rates", "tail") and
// draws the table, the chart (a canvas, no library) and the tail.  Everything shown that comes
// from the databases is set as text, never as HTML.
"use strict";

const SPAN = 300;          // seconds of history on the chart
const TAIL_SHOWN = 50;     // events listed at most
const PALETTE = ["#2f5fb3", "#1a7f37", "#b35c00", "#8e24aa", "#c62828", "#00838f", "#6d4c41", "#546e7a"];

const page = {
  status: null,
  series: {},              // backend -> [[unix seconds, events/s], ...]
  backend: new URLSearchParams(location.search).get("tail") || "",
  values: false,
  source: null,
  draws: 0,
  plotted: {},             // backend -> points on the chart as last drawn
  tailCount: 0,
};
window.lapidusStatus = page;   // for the browser tests and the curious

const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function duration(seconds) {
  if (seconds === undefined || seconds === null) return "-";
  const s = Math.floor(seconds);
  if (s < 120) return s + "s";
  if (s < 7200) return Math.floor(s / 60) + "m";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}

function bytes(value) {
  if (value === undefined || value === null) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = value, i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return i === 0 ? v.toFixed(0) + "B" : v.toFixed(1) + units[i];
}

function rate(value) {
  if (!value) return "0";
  return value >= 100 ? value.toFixed(0) : value.toFixed(1);
}

// what lapidusctl status shows in its last column
function errorText(row) {
  for (const [sink, held] of Object.entries(row.undeliverable || {})) {
    return `held: ${sink} refuses ${held.id} (${held.table}): ${held.error}` + (held.fix ? `; fix: ${held.fix}` : "");
  }
  if (row.sink_error) return row.sink_error;
  if (row.state === "WAITING" && row.waiting_for) {
    const waiting = `waiting for ${row.waiting_for} since ${duration(row.waiting_seconds)}`;
    return row.last_error ? `${waiting}: ${row.last_error}` : waiting;
  }
  return row.last_error || "";
}

function walCell(row) {
  const td = el("td", bytes(row.slot_retained_wal_bytes), "num");
  if (row.slot_retained_wal_bytes === undefined || row.slot_retained_wal_bytes === null) return td;
  let level = "ok";
  const limit = row.slot_warn_bytes || 1 << 30;
  if (row.slot_wal_status === "unreserved" || row.slot_wal_status === "lost") level = "bad";
  else if (row.slot_retained_wal_bytes > limit || row.slot_wal_status === "extended") level = "warn";
  td.classList.add("wal", level);
  td.title = `slot ${row.slot || ""}, wal_status ${row.slot_wal_status || "-"}, warns above ${bytes(limit)}`;
  return td;
}

function sinksCell(row) {
  const td = el("td");
  const sinks = Object.entries(row.sinks || {});
  if (!sinks.length) td.textContent = "-";
  for (const [name, state] of sinks) {
    let text = name + " up", cls = "sink up";
    if (state.error) { text = name + " ?"; cls = "sink down"; }
    else if (!state.connected) { text = name + " down" + (state.down_seconds ? " " + duration(state.down_seconds) : ""); cls = "sink down"; }
    td.append(el("span", text, cls));
  }
  return td;
}

function renderStatus(status) {
  page.status = status;
  const rows = status.backends || [];
  const counts = {};
  for (const row of rows) counts[row.state] = (counts[row.state] || 0) + 1;
  $("summary").textContent = `${rows.length} backend${rows.length === 1 ? "" : "s"}: ` +
    Object.entries(counts).map(([s, n]) => `${n} ${s}`).join(", ");
  const body = document.querySelector("#backends tbody");
  body.replaceChildren();
  for (const row of rows) {
    const tr = el("tr");
    tr.dataset.backend = row.name;
    if (row.name === page.backend) tr.classList.add("selected");
    const name = el("td", row.name, "name");
    name.title = "show its last events";
    name.addEventListener("click", () => chooseBackend(row.name));
    const state = el("td");
    state.append(el("span", row.state, "state " + row.state));
    const lag = row.lag_seconds === undefined || row.lag_seconds === null ? "-" : row.lag_seconds.toFixed(1) + "s";
    tr.append(name, state, el("td", duration(row.uptime), "num"), el("td", row.restarts || 0, "num"),
      el("td", row.position || "-"), el("td", lag, "num"), el("td", bytes(row.lag_bytes), "num"),
      el("td", rate(row.events_per_second), "num"), sinksCell(row), walCell(row),
      el("td", errorText(row), "error"));
    body.append(tr);
  }
  fillBackendChoice(rows.map((r) => r.name));
  $("footer").textContent = `${status.config || ""} · supervisor pid ${status.pid} · updated ${new Date(status.time * 1000).toLocaleTimeString()}`;
  drawChart();
}

function fillBackendChoice(names) {
  const select = $("tail-backend");
  const now = Array.from(select.options).map((o) => o.value);
  if (!page.backend && names.length) { chooseBackend(names[0]); return; }
  if (now.join("\n") === names.join("\n")) return;
  select.replaceChildren(...names.map((n) => { const o = el("option", n); o.value = n; return o; }));
  select.value = page.backend;
}

function addRates(points) {
  const cutoff = Date.now() / 1000 - SPAN;
  for (const [name, list] of Object.entries(points)) {
    const series = page.series[name] || (page.series[name] = []);
    for (const p of list) {
      if (!series.length || p[0] > series[series.length - 1][0]) series.push(p);
    }
    while (series.length && series[0][0] < cutoff) series.shift();
  }
  drawChart();
}

function drawChart() {
  const canvas = $("rates");
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight;
  if (canvas.width !== width * ratio) { canvas.width = width * ratio; canvas.height = height * ratio; }
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  const names = (page.status ? page.status.backends.map((r) => r.name) : Object.keys(page.series));
  const now = page.status ? page.status.time : Date.now() / 1000;
  let top = 1;
  for (const name of names) for (const p of page.series[name] || []) top = Math.max(top, p[1]);
  top = niceCeiling(top * 1.1);
  const left = 56, right = 8, up = 8, down = 22;
  const w = width - left - right, h = height - up - down;
  g.font = "11px system-ui, sans-serif";
  g.strokeStyle = "#d9dee5"; g.fillStyle = "#667085"; g.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = up + h - (h * i) / 4;
    g.beginPath(); g.moveTo(left, y); g.lineTo(left + w, y); g.stroke();
    g.textAlign = "right"; g.textBaseline = "middle";
    g.fillText(rate((top * i) / 4), left - 6, y);
  }
  g.textAlign = "center"; g.textBaseline = "top";
  for (let m = 0; m <= SPAN / 60; m++) {
    const x = left + w - (w * m * 60) / SPAN;
    g.fillText(m === 0 ? "now" : `-${m}m`, x, up + h + 6);
  }
  const legend = $("legend");
  legend.replaceChildren();
  names.forEach((name, i) => {
    const colour = PALETTE[i % PALETTE.length];
    const series = page.series[name] || [];
    g.strokeStyle = colour; g.fillStyle = colour; g.lineWidth = 2; g.beginPath();
    const shown = series.filter((p) => now - p[0] <= SPAN);
    shown.forEach((p, j) => {
      const x = left + w - (w * (now - p[0])) / SPAN, y = up + h - (h * p[1]) / top;
      if (j === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
    if (shown.length === 1) {     // a line needs two points: mark the first one
      const p = shown[0];
      g.fillRect(left + w - (w * (now - p[0])) / SPAN - 2, up + h - (h * p[1]) / top - 2, 4, 4);
    }
    page.plotted[name] = shown.length;
    const item = el("li", `${name} ${rate(latestRate(name))}/s`);
    item.style.setProperty("--swatch", colour);
    legend.append(item);
  });
  page.draws++;
}

function niceCeiling(value) {
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

function latestRate(name) {
  const series = page.series[name] || [];
  return series.length ? series[series.length - 1][1] : 0;
}
page.latestRate = latestRate;

function addTail(message) {
  if (message.backend !== page.backend) return;
  const list = $("tail");
  for (const event of message.events) {
    const item = el("li");
    item.dataset.id = event.id || "";
    item.append(el("span", event.type, "kind " + event.type),
      el("span", [event.schema, event.table].filter(Boolean).join("."), "meta"),
      el("span", event.ts || "", "meta"));
    const shown = {};
    for (const field of ["pk", "item", "before", "update", "unchanged", "prefix", "content", "too_large_to_show"]) {
      if (event[field] !== undefined && event[field] !== null) shown[field] = event[field];
    }
    item.append(el("span", JSON.stringify(shown), "data"));
    item.title = `${event.id || ""} at ${event.position || ""}`;
    list.prepend(item);
    page.tailCount++;
  }
  while (list.children.length > TAIL_SHOWN) list.lastChild.remove();
}

function chooseBackend(name) {
  if (name === page.backend) return;
  page.backend = name;
  $("tail-backend").value = name;
  $("tail").replaceChildren();
  connect();
}

function connect() {
  if (page.source) page.source.close();
  const params = new URLSearchParams();
  if (page.backend) params.set("tail", page.backend);
  if (page.values) params.set("values", "1");
  const source = new EventSource("/events?" + params.toString());
  page.source = source;
  source.addEventListener("open", () => { $("link").textContent = "live"; $("link").className = "link up"; });
  source.addEventListener("error", () => { $("link").textContent = "reconnecting"; $("link").className = "link down"; });
  source.addEventListener("status", (e) => renderStatus(JSON.parse(e.data)));
  source.addEventListener("rates", (e) => addRates(JSON.parse(e.data)));
  source.addEventListener("tail", (e) => addTail(JSON.parse(e.data)));
}

$("tail-backend").addEventListener("change", (e) => chooseBackend(e.target.value));
$("show-values").addEventListener("change", (e) => {
  page.values = e.target.checked;
  $("tail-note").textContent = page.values ? "Values are shown as the sinks receive them."
    : "Values are masked: the page shows which columns changed, not what they hold.";
  $("tail").replaceChildren();
  connect();
});
window.addEventListener("resize", drawChart);
connect();
