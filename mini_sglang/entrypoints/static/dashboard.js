// mini-sglang dashboard: polls /dashboard/data once a second and draws the charts on
// <canvas> by hand (no library, nothing fetched from elsewhere). With --api-key the page
// asks for the key once and keeps it in localStorage ("mini_sglang_api_key").
"use strict";

const HISTORY = 300; // points per chart (about five minutes)
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];
const KEY_STORE = "mini_sglang_api_key";
const history = { t: [], tput: [], running: [], queued: [], used: [], evictable: [], free: [],
  hit: [], ttft50: [], ttft90: [], ttft99: [], itl50: [], itl90: [], itl99: [] };

function $(id) { return document.getElementById(id); }
function fmt(x, digits) { return x == null ? "–" : Number(x).toFixed(digits); }
function ms(x) { return x == null ? null : x * 1000; }
function pct(a, b) { return b ? (100 * a) / b : 0; }
function compact(n) { return n >= 1e6 ? (n / 1e6).toFixed(1) + "M" : n >= 1e4 ? (n / 1e3).toFixed(0) + "k" : String(n); }

function push(name, value) {
  const arr = history[name];
  arr.push(value);
  if (arr.length > HISTORY) arr.shift();
}

function drawChart(canvas, series, opts) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== w * dpr || canvas.height !== h * dpr) {
    canvas.width = w * dpr; canvas.height = h * dpr;
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const left = 48, right = 8, top = 6, bottom = 18;
  let max = opts.max || 0;
  for (const s of series) for (const v of s.data) if (v != null && v > max) max = v;
  if (!opts.max) max = max > 0 ? max * 1.1 : 1;
  const x = (i, n) => left + ((w - left - right) * i) / Math.max(HISTORY - 1, 1) + (w - left - right) * (HISTORY - n) / Math.max(HISTORY - 1, 1);
  const y = (v) => top + (h - top - bottom) * (1 - v / max);
  ctx.strokeStyle = "#e5e5e5"; ctx.fillStyle = "#777"; ctx.lineWidth = 1;
  ctx.font = "11px system-ui, sans-serif"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
  for (let k = 0; k <= 4; k++) {
    const v = (max * k) / 4, yy = y(v);
    ctx.beginPath(); ctx.moveTo(left, yy); ctx.lineTo(w - right, yy); ctx.stroke();
    ctx.fillText(v >= 100 ? v.toFixed(0) : v.toFixed(v >= 10 ? 1 : 2), left - 4, yy);
  }
  ctx.textAlign = "left"; ctx.textBaseline = "bottom";
  ctx.fillText("-" + Math.round(HISTORY) + " s", left, h);
  ctx.textAlign = "right"; ctx.fillText("now", w - right, h);
  series.forEach((s, si) => {
    const n = s.data.length;
    ctx.strokeStyle = s.color || COLORS[si % COLORS.length]; ctx.lineWidth = 1.5;
    ctx.beginPath();
    let pen = false;
    s.data.forEach((v, i) => {
      if (v == null) { pen = false; return; }
      const xx = x(i, n), yy = y(Math.min(v, max));
      if (pen) ctx.lineTo(xx, yy); else ctx.moveTo(xx, yy);
      pen = true;
    });
    ctx.stroke();
  });
  ctx.textAlign = "left"; ctx.textBaseline = "top";
  let lx = left + 6;
  series.forEach((s, si) => {
    if (!s.label) return;
    ctx.fillStyle = s.color || COLORS[si % COLORS.length];
    ctx.fillText(s.label, lx, top + 2);
    lx += ctx.measureText(s.label).width + 12;
  });
}

function drawAll() {
  drawChart($("c-tput"), [{ data: history.tput, label: "tok/s" }], {});
  drawChart($("c-reqs"), [{ data: history.running, label: "running" }, { data: history.queued, label: "queued" }], {});
  drawChart($("c-kv"), [{ data: history.used, label: "used" }, { data: history.evictable, label: "evictable" },
    { data: history.free, label: "free" }], { max: 100 });
  drawChart($("c-hit"), [{ data: history.hit, label: "hit %" }], { max: 100 });
  drawChart($("c-ttft"), [{ data: history.ttft50, label: "p50" }, { data: history.ttft90, label: "p90" },
    { data: history.ttft99, label: "p99" }], {});
  drawChart($("c-itl"), [{ data: history.itl50, label: "p50" }, { data: history.itl90, label: "p90" },
    { data: history.itl99, label: "p99" }], {});
}

function cell(row, text) { const td = document.createElement("td"); td.textContent = text; row.appendChild(td); }

function renderTables(d) {
  const body = $("inflight").querySelector("tbody");
  body.replaceChildren();
  for (const r of d.inflight.rows) {
    const tr = document.createElement("tr");
    cell(tr, r.rid); cell(tr, r.prompt_tokens == null ? "–" : r.prompt_tokens);
    cell(tr, r.output_tokens); cell(tr, fmt(r.age_s, 1)); cell(tr, r.stream ? "yes" : "no");
    body.appendChild(tr);
  }
  const n = d.inflight.count;
  $("inflight-count").textContent = n > d.inflight.rows.length ? `(${n}, oldest ${d.inflight.rows.length} shown)` : `(${n})`;
  const s = d.server;
  const rows = [["model", s.model_path], ["served model name", s.served_model_name], ["card", s.device_name],
    ["version", s.version], ["status", s.status], ["tp / dp", `${s.tp_size} / ${s.dp_size}`],
    ["context length", s.context_len], ["KV capacity (tokens)", s.max_total_num_tokens],
    ["weight version", s.weight_version], ["--enable-metrics", s.enable_metrics],
    ["uptime (s)", fmt(d.uptime_s, 0)]];
  for (const [k, v] of Object.entries(s.flags)) rows.push(["--" + k.replace(/_/g, "-"), JSON.stringify(v)]);
  const sb = $("server").querySelector("tbody");
  sb.replaceChildren();
  for (const [k, v] of rows) { const tr = document.createElement("tr"); cell(tr, k); cell(tr, v == null ? "–" : v); sb.appendChild(tr); }
}

function update(d) {
  const sch = d.scheduler, tok = d.tokenizer, kv = sch.kv;
  push("tput", tok.gen_throughput);
  push("running", sch.num_running_reqs); push("queued", sch.num_queue_reqs);
  push("used", pct(kv.used, kv.capacity)); push("evictable", pct(kv.evictable, kv.capacity)); push("free", pct(kv.free, kv.capacity));
  push("hit", tok.cache_hit_rate_window == null ? null : 100 * tok.cache_hit_rate_window);
  push("ttft50", ms(tok.ttft_s.p50)); push("ttft90", ms(tok.ttft_s.p90)); push("ttft99", ms(tok.ttft_s.p99));
  push("itl50", ms(tok.itl_s.p50)); push("itl90", ms(tok.itl_s.p90)); push("itl99", ms(tok.itl_s.p99));
  $("t-tput").textContent = fmt(tok.gen_throughput, 1) + " tok/s";
  $("t-reqs").textContent = `${sch.num_running_reqs} / ${sch.num_queue_reqs}`;
  $("t-kv").textContent = `${compact(kv.used)} / ${compact(kv.evictable)} / ${compact(kv.free)}`;
  $("t-kv").title = `${kv.used} / ${kv.evictable} / ${kv.free} of ${kv.capacity} tokens`;
  $("t-hit").textContent = tok.cache_hit_rate_window == null ? "–" : fmt(100 * tok.cache_hit_rate_window, 1) + " %";
  $("t-ttft").textContent = `${fmt(ms(tok.ttft_s.p50), 0)} / ${fmt(ms(tok.ttft_s.p99), 0)} ms`;
  $("t-itl").textContent = `${fmt(ms(tok.itl_s.p50), 1)} / ${fmt(ms(tok.itl_s.p99), 1)} ms`;
  $("model").textContent = `${d.server.served_model_name} on ${d.server.device_name || "?"}`;
  $("window").textContent = tok.window_s;
  renderTables(d);
  drawAll();
}

function setStatus(text, cls) { const s = $("status"); s.textContent = text; s.className = "pill " + (cls || ""); }

let waitingForKey = false;

async function poll() {
  if (waitingForKey) return;
  const key = localStorage.getItem(KEY_STORE);
  const headers = key ? { Authorization: "Bearer " + key } : {};
  try {
    const res = await fetch("/dashboard/data", { headers, cache: "no-store" });
    if (res.status === 401) {
      waitingForKey = true;
      $("keyform").hidden = false;
      setStatus(key ? "wrong API key" : "API key needed", "err");
      return;
    }
    if (!res.ok) { setStatus("HTTP " + res.status, "err"); return; }
    update(await res.json());
    setStatus("live", "ok");
  } catch (e) {
    setStatus("unreachable", "err");
  }
}

$("keyform").addEventListener("submit", (ev) => {
  ev.preventDefault();
  localStorage.setItem(KEY_STORE, $("keyinput").value);
  $("keyform").hidden = true;
  waitingForKey = false;
  poll();
});
window.addEventListener("resize", drawAll);
poll();
setInterval(poll, 1000);
