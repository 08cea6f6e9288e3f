// The agl rollout viewer: a hash-routed page over the management API.
// Routes: #/ (the run's steps), #/rollouts?status=&group_id=&mode=&cursor=,
// #/rollout/ID[?call=N] (calls, N marked, and samples), #/rollout/ID/sample/N. A `key=` in the
// route's query is the admin key: kept in sessionStorage, taken out of the URL.
"use strict";

const main = document.getElementById("main");
const KEY = "agl-admin-key";

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  }[c]));
}

function fmt(x, digits = 3) {
  return x === null || x === undefined ? "-" : Number(x).toFixed(digits);
}

/** The route and its query, with a `key` moved into the session. */
function route() {
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query || "");
  if (params.has("key")) {
    sessionStorage.setItem(KEY, params.get("key"));
    params.delete("key");
    const rest = params.toString();
    history.replaceState(null, "", "#" + (path || "/") + (rest ? "?" + rest : ""));
  }
  return { parts: (path || "/").split("/").filter(Boolean).map(decodeURIComponent), params };
}

class AuthError extends Error {}

async function api(path) {
  const key = sessionStorage.getItem(KEY);
  const headers = key ? { Authorization: "Bearer " + key } : {};
  const resp = await fetch(path, { headers });
  const body = await resp.json().catch(() => ({}));
  if (resp.status === 401 || resp.status === 403) {
    throw new AuthError(body.error?.message || resp.statusText);
  }
  if (!resp.ok) throw new Error(body.error?.message || resp.statusText);
  return body;
}

// --- charts: inline SVG, one polyline (or stacked bars) per series ---

const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"];

function chart(title, xs, series, stacked = false) {
  const W = 360, H = 160, P = 28;
  const values = series.flatMap((s) => s.values).filter((v) => v !== null && v !== undefined);
  if (!xs.length || !values.length) return "";
  const sums = xs.map((_, i) => series.reduce((a, s) => a + (s.values[i] || 0), 0));
  const top = stacked ? Math.max(...sums) : Math.max(...values);
  const low = stacked ? 0 : Math.min(0, ...values);
  const span = top - low || 1;
  const x = (i) => P + (xs.length === 1 ? (W - 2 * P) / 2 : (i * (W - 2 * P)) / (xs.length - 1));
  const y = (v) => H - P - ((v - low) * (H - 2 * P)) / span;
  let marks = "";
  if (stacked) {
    // One band per step, the bar in its middle.
    const band = (W - 2 * P) / xs.length;
    const bw = Math.max(2, band * 0.7);
    xs.forEach((_, i) => {
      let base = 0;
      const left = P + i * band + (band - bw) / 2;
      series.forEach((s, k) => {
        const v = s.values[i] || 0;
        marks += `<rect x="${left}" y="${y(base + v)}" width="${bw}" height="${y(base) - y(base + v)}" fill="${COLORS[k]}"/>`;
        base += v;
      });
    });
  } else {
    series.forEach((s, k) => {
      const pts = s.values.map((v, i) => (v === null || v === undefined ? null : `${x(i)},${y(v)}`)).filter(Boolean);
      marks += `<polyline fill="none" stroke="${COLORS[k]}" stroke-width="2" points="${pts.join(" ")}"/>`;
      marks += pts.map((p) => `<circle r="2.5" fill="${COLORS[k]}" cx="${p.split(",")[0]}" cy="${p.split(",")[1]}"/>`).join("");
    });
  }
  const axes = `<line x1="${P}" y1="${H - P}" x2="${W - P}" y2="${H - P}" stroke="#999"/>` +
    `<text x="${P}" y="${H - 8}" font-size="10">${esc(xs[0])}</text>` +
    `<text x="${W - P}" y="${H - 8}" font-size="10" text-anchor="end">${esc(xs[xs.length - 1])}</text>` +
    `<text x="2" y="${P}" font-size="10">${fmt(top, 2)}</text>` +
    `<text x="2" y="${H - P}" font-size="10">${fmt(low, 2)}</text>`;
  const legend = series.map((s, k) => `<span><i style="background:${COLORS[k]}"></i>${esc(s.name)}</span>`).join("");
  return `<div class="chart"><h3>${esc(title)}</h3><svg width="${W}" height="${H}">${axes}${marks}</svg>` +
    `<div class="legend">${legend}</div></div>`;
}

// --- pages ---

async function runPage() {
  const { steps } = await api("/v1/steps");
  if (!steps.length) {
    return `<h2>Run</h2><p class="muted">No step records: this gateway serves no run's metrics.jsonl (yet).</p>` +
      `<p><a href="#/rollouts">Rollouts</a></p>`;
  }
  const xs = steps.map((s) => s.step);
  const kinds = [...new Set(steps.flatMap((s) => Object.keys(s.breaks || {})))].sort();
  const charts = [
    chart("reward per step", xs, [
      { name: "reward", values: steps.map((s) => s.reward_mean) },
      { name: "val reward", values: steps.map((s) => s.val_reward) },
    ]),
    // A harness that never reported a tool use gets no tool chart.
    steps.some((s) => s.tool_use > 0 || s.val_tool_use > 0) ? chart("tool use (share of rollouts)", xs, [
      { name: "train", values: steps.map((s) => (s.step ? s.tool_use : null)) },
      { name: "val", values: steps.map((s) => s.val_tool_use) },
    ]) : "",
    chart("per rollout", xs, [
      { name: "model calls", values: steps.map((s) => (s.step ? s.calls_per_rollout : null)) },
      { name: "samples", values: steps.map((s) => (s.rollouts ? s.samples / s.rollouts : null)) },
    ]),
    chart("breaks per kind", xs, kinds.map((k) => ({ name: k, values: steps.map((s) => (s.breaks || {})[k] || 0) })), true),
    chart("gradient norm, entropy", xs, [
      { name: "grad norm", values: steps.map((s) => s.grad_norm) },
      { name: "entropy", values: steps.map((s) => s.entropy) },
    ]),
    chart("trainer vs engine", xs, [
      { name: "KL(engine || trainer)", values: steps.map((s) => s.engine_kl) },
      { name: "mean |logprob gap|", values: steps.map((s) => s.mismatch_mean) },
      { name: "tokens outside bounds", values: steps.map((s) => s.outside_token_fraction) },
      { name: "corrected share", values: steps.map((s) => s.corrected_fraction) },
    ]),
    chart("step time (s)", xs, ["wait_s", "train_s", "drain_s"].map((k) => ({
      name: k.replace("_s", ""), values: steps.map((s) => s[k]),
    })), true),
  ].join("");
  const rows = steps.map((s) => `<tr data-step="${s.step}"><td class="num">${s.step}</td><td class="num">${s.weight_version}</td>` +
    `<td class="num">${fmt(s.reward_mean)}</td><td class="num">${fmt(s.val_reward)}</td>` +
    `<td class="num">${fmt(s.tool_use, 2)}</td><td class="num">${fmt(s.calls_per_rollout, 2)}</td>` +
    `<td class="num">${s.rollouts}</td><td class="num">${s.samples}</td><td class="num">${s.tokens}</td>` +
    `<td>${esc(Object.entries(s.breaks || {}).map(([k, n]) => `${k} ${n}`).join(", "))}</td>` +
    `<td class="num">${fmt(s.wait_s, 1)} / ${fmt(s.train_s, 1)} / ${fmt(s.drain_s, 1)}</td></tr>`).join("");
  return `<h2>Run: ${steps.length} step records</h2><div class="charts">${charts}</div>` +
    `<table><tr><th class="num">step</th><th class="num">weights</th><th class="num">reward</th><th class="num">val reward</th>` +
    `<th class="num">tool use</th><th class="num">calls / rollout</th><th class="num">rollouts</th><th class="num">samples</th><th class="num">trained tokens</th><th>breaks</th>` +
    `<th class="num">wait / train / drain s</th></tr>${rows}</table>` +
    `<p><a id="to-rollouts" href="#/rollouts">Rollouts of this run</a></p>`;
}

async function rolloutsPage(params) {
  const q = new URLSearchParams();
  for (const k of ["status", "group_id", "mode", "cursor"]) if (params.get(k)) q.set(k, params.get(k));
  q.set("limit", "50");
  const page = await api("/v1/rollouts?" + q);
  const field = (k, label) => `<label>${label} <input name="${k}" value="${esc(params.get(k) || "")}" size="10"></label>`;
  const rows = page.rollouts.map((r) => `<tr><td><a class="rollout" href="#/rollout/${encodeURIComponent(r.id)}">${esc(r.id)}</a></td>` +
    `<td>${esc(r.group_id)}</td><td>${esc(r.mode)}</td><td>${esc(r.status)}${r.failure ? " (" + esc(r.failure) + ")" : ""}</td>` +
    `<td class="num">${r.attempt}</td><td>${esc(r.reason || "")}</td></tr>`).join("");
  const next = new URLSearchParams(params);
  if (page.next_cursor) next.set("cursor", page.next_cursor);
  return `<h2>Rollouts</h2><form class="filters" id="filters">${field("status", "status")}${field("group_id", "group")}` +
    `${field("mode", "mode")}<button>Filter</button></form>` +
    `<table><tr><th>id</th><th>group</th><th>mode</th><th>status</th><th class="num">attempt</th><th>reason</th></tr>${rows}</table>` +
    (page.next_cursor ? `<p><a href="#/rollouts?${next}">Next page</a></p>` : "");
}

async function rolloutPage(id) {
  const r = await api(`/v1/rollouts/${encodeURIComponent(id)}?calls=true`);
  const calls = (r.calls || []).map((c) => {
    const tags = Object.entries(c.tags || {}).map(([k, v]) => `${k.replace(/^x-agl-/, "")}=${v}`).join(" ");
    return `<tr id="call-${c.index}"><td class="num">${c.index}</td><td>${esc(c.api)}</td><td class="num">${c.finished_at_ms - c.started_at_ms} ms</td>` +
      `<td class="num">${c.weight_version}</td><td>${esc(c.finish_reason || "")}</td>` +
      `<td>${c.continues === undefined || c.continues === null ? "" : `<a href="#/rollout/${encodeURIComponent(id)}?call=${c.continues}">&larr; ${c.continues}</a>`}</td>` +
      `<td>${c.choice ? `${c.choice.index} of ${c.choice.count}` : ""}</td><td>${esc(tags)}</td>` +
      `<td class="num">${c.prompt_ids.length} + ${c.response_ids.length}</td></tr>`;
  }).join("");
  let samples;
  try {
    const s = await api(`/v1/rollouts/${encodeURIComponent(id)}/samples`);
    const rows = s.samples.map((v) => `<tr><td><a class="sample" href="#/rollout/${encodeURIComponent(id)}/sample/${v.index}">sample ${v.index}</a></td>` +
      `<td>${esc(v.source_calls.join(", "))}</td><td class="num">${v.trained_tokens}</td><td class="num">${v.masked_tokens}</td>` +
      `<td>${v.break_before ? esc(v.break_before.kind) : ""}</td></tr>`).join("");
    samples = `<h3>Samples (adapter ${esc(s.adapter)})</h3>` +
      `<p>reward <strong id="reward">${fmt(s.reward)}</strong> from ${esc(s.reward_source)}${s.reward_error ? ` <span class="error">${esc(s.reward_error)}</span>` : ""};` +
      ` <span id="rollout-trained" data-trained-tokens="${s.trained_tokens}">${s.trained_tokens} trained tokens</span></p>` +
      `<table><tr><th></th><th>calls</th><th class="num">trained</th><th class="num">masked</th><th>break before</th></tr>${rows}</table>`;
  } catch (e) {
    if (e instanceof AuthError) throw e;
    samples = `<p class="muted">Samples: ${esc(e.message)}</p>`;
  }
  return `<h2>Rollout ${esc(r.id)}</h2><p>group ${esc(r.group_id)}, ${esc(r.mode)}, ${esc(r.status)}, attempt ${r.attempt}` +
    `${r.reason ? ": " + esc(r.reason) : ""}</p>${samples}<h3>Calls</h3>` +
    `<table><tr><th class="num">#</th><th>api</th><th class="num">latency</th><th class="num">weights</th><th>finish</th>` +
    `<th>continues</th><th>choice</th><th>tags</th><th class="num">prompt + response</th></tr>${calls}</table>`;
}

async function samplePage(id, n) {
  const s = await api(`/v1/rollouts/${encodeURIComponent(id)}/samples`);
  const v = s.samples[Number(n)];
  if (!v) throw new Error(`rollout ${id} has no sample ${n}`);
  const b = v.break_before;
  const brk = b ? `<div class="break">Break before: <strong>${esc(b.kind)}</strong> at call ${b.call_index}: ${esc(b.detail)}</div>` : "";
  const text = `<span class="prompt">${esc(v.prompt_text)}</span>` +
    v.segments.map((g) => `<span class="${g.trained ? "trained" : "masked"}" data-tokens="${g.tokens}">${esc(g.text)}</span>`).join("");
  return `<h2><a href="#/rollout/${encodeURIComponent(id)}">Rollout ${esc(id)}</a>: sample ${v.index}</h2>` +
    `<p>calls ${esc(v.source_calls.join(", "))}, weights ${v.weight_version}${v.agent ? ", agent " + esc(v.agent) : ""};` +
    ` reward ${fmt(s.reward)} (${esc(s.reward_source)})</p>` +
    `<p><span id="sample-trained" data-trained-tokens="${v.trained_tokens}">${v.trained_tokens} trained</span>,` +
    ` ${v.masked_tokens} masked, ${v.prompt_tokens} prompt tokens. <span class="trained">trained</span> <span class="masked">masked context</span> <span class="prompt">prompt</span></p>` +
    `${brk}<pre class="tokens">${text}</pre>`;
}

async function render() {
  const { parts, params } = route();
  try {
    let html;
    if (parts[0] === "rollouts") html = await rolloutsPage(params);
    else if (parts[0] === "rollout" && parts[2] === "sample") html = await samplePage(parts[1], parts[3]);
    else if (parts[0] === "rollout") html = await rolloutPage(parts[1]);
    else html = await runPage();
    main.innerHTML = html;
    document.getElementById("login").hidden = true;
    // A continuation link: the call it points at, marked.
    const call = params.get("call") && document.getElementById("call-" + params.get("call"));
    if (call) {
      call.classList.add("focus");
      call.scrollIntoView();
    }
  } catch (e) {
    const login = e instanceof AuthError;
    document.getElementById("login").hidden = !login;
    main.innerHTML = `<p class="error" id="failure">${esc(login ? "Admin key needed: " : "")}${esc(e.message)}</p>`;
  }
  main.dataset.ready = "1";
}

document.getElementById("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(KEY, document.getElementById("key").value);
  render();
});
main.addEventListener("submit", (ev) => {
  if (ev.target.id !== "filters") return;
  ev.preventDefault();
  const q = new URLSearchParams();
  for (const [k, v] of new FormData(ev.target)) if (v) q.set(k, v);
  location.hash = "#/rollouts?" + q;
});
window.addEventListener("hashchange", render);
render();
