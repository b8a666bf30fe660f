// flower's run view: runs, a run's timeline, a step's conversation; live over SSE.
// Plain DOM, no framework, no network beyond this server.
"use strict";

const BOOT = window.FLOWER;
let LANG = localStorage.getItem("flower.lang") || BOOT.lang;
const PAGE_SIZE = 50;
const state = { view: null, filterState: "", filterWs: "", page: 0, zoom: 1, collapsed: {}, selected: null };

function T(key, fields) {
  const pair = BOOT.texts[key];
  let text = pair ? pair[LANG === "zh" ? 0 : 1] : key;
  for (const [k, v] of Object.entries(fields || {})) text = text.split("{" + k + "}").join(String(v));
  return text;
}

function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "style") node.style.cssText = v; // CSSOM: the page's CSP allows no style attribute
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) if (kid !== null && kid !== undefined) node.append(kid);
  return node;
}

function put(node, ...kids) {
  node.replaceChildren(...kids.flat().filter((k) => k !== null && k !== undefined && k !== false));
}

async function getJSON(url) {
  const res = await fetch(url, { credentials: "same-origin" });
  if (res.status === 403) return { __token: true };
  if (!res.ok) throw new Error(res.status + " " + url);
  return res.json();
}

function fmtTime(t) {
  const d = new Date(t * 1000);
  const p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}
function fmtClock(t) { return fmtTime(t).slice(11); }
function fmtDur(s) {
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}
function fmtUsd(x) { return "$" + Number(x || 0).toFixed(4); }

async function copy(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch (e) {
    const area = el("textarea", {}, text);
    document.body.append(area); area.select(); document.execCommand("copy"); area.remove();
  }
  button.textContent = T("ui.copied");
  setTimeout(() => (button.textContent = T("ui.copy")), 1500);
}

// ---- runs -----------------------------------------------------------------------------

function renderRuns(data) {
  const main = document.getElementById("main");
  document.getElementById("where").textContent = T("ui.where", { where: data.where });
  const runs = data.runs;
  const states = [...new Set(runs.map((r) => r.state))].sort();
  const spaces = [...new Set(runs.map((r) => r.workspace))].sort();
  const shown = runs.filter((r) => (!state.filterState || r.state === state.filterState) &&
    (!state.filterWs || r.workspace === state.filterWs));
  const pages = Math.max(1, Math.ceil(shown.length / PAGE_SIZE));
  state.page = Math.min(state.page, pages - 1);
  const slice = shown.slice(state.page * PAGE_SIZE, (state.page + 1) * PAGE_SIZE);
  const select = (label, value, options, set) => el("label", {}, label + " ",
    el("select", { onchange: (e) => { set(e.target.value); state.page = 0; renderRuns(data); } },
      el("option", { value: "", text: T("ui.filter.all") }),
      options.map((o) => el("option", { value: o, text: o, selected: o === value }))));
  const rows = slice.map((r) => {
    const resume = r.resume ? el("div", { class: "resume" },
      r.resume_export ? el("div", {}, T("ui.resume.export") + " ", el("code", { text: r.resume_export }),
        " ", el("button", { type: "button", onclick: (e) => copy(r.resume_export, e.target), text: T("ui.copy") })) : null,
      T("ui.resume") + " ", el("code", { class: "resume-cmd", text: r.resume }), " ",
      el("button", { type: "button", class: "copy", onclick: (e) => copy(r.resume, e.target), text: T("ui.copy") })) : null;
    return el("tr", { class: "run", "data-run": r.run },
      el("td", {}, el("a", { href: "#/run/" + encodeURIComponent(r.run), text: r.run }), resume),
      el("td", { text: r.flow }),
      el("td", {}, el("span", { class: "state " + r.state, text: r.state })),
      el("td", { class: "muted", text: r.workspace }),
      el("td", { text: fmtTime(r.started_at) }),
      el("td", { class: "num", text: fmtDur(r.elapsed_s) }),
      el("td", { class: "num", text: `${r.steps_done}/${r.steps_total}` }),
      el("td", { class: "num", text: fmtUsd(r.cost_usd) }),
      el("td", { class: "num", text: `${r.reused} / ${r.executed}` }),
      el("td", { class: "num", text: fmtUsd(r.saved_usd) }));
  });
  put(main, 
    el("h1", { text: T("ui.runs") }),
    el("div", { class: "filters" },
      select(T("ui.filter.state"), state.filterState, states, (v) => (state.filterState = v)),
      select(T("ui.filter.workspace"), state.filterWs, spaces, (v) => (state.filterWs = v))),
    runs.length === 0 ? el("p", { class: "muted", text: T("ui.none") }) :
      el("table", { id: "runs" },
        el("thead", {}, el("tr", {},
          ["ui.col.run", "ui.col.flow", "ui.col.state", "ui.col.workspace", "ui.col.started"].map((k) => el("th", { text: T(k) })),
          ["ui.col.elapsed", "ui.col.steps", "ui.col.cost", "ui.col.reuse", "ui.col.saved"].map((k) => el("th", { class: "num", text: T(k) })))),
        el("tbody", {}, rows)),
    pages > 1 ? el("div", { class: "pager" },
      el("button", { type: "button", disabled: state.page === 0, onclick: () => { state.page--; renderRuns(data); }, text: T("ui.prev") }),
      el("span", { text: T("ui.page", { page: state.page + 1, pages }) }),
      el("button", { type: "button", disabled: state.page >= pages - 1, onclick: () => { state.page++; renderRuns(data); }, text: T("ui.next") })) : null);
}

// ---- a run's timeline -------------------------------------------------------------------

const OUTCOMES = ["ok", "failed", "retried", "killed-by-signal", "killed", "killed-woken", "taken-over", "reused", "running"];

function renderTimeline(tl) {
  const main = document.getElementById("main");
  const span = Math.max(1, tl.t1 - tl.t0);
  const width = Math.round(Math.max(600, (window.innerWidth - 300)) * state.zoom);
  const x = (t) => ((t - tl.t0) / span) * width;
  const byLabel = {};
  for (const a of tl.attempts) (byLabel[a.label] = byLabel[a.label] || []).push(a);
  const bar = (a) => {
    const left = x(a.start);
    const w = Math.max(3, x(a.end) - left);
    const where = a.worker ? `${a.host || ""} (${T("ui.worker")} ${a.worker})` : (a.host || "");
    const title = `${a.label} · ${T("ui.outcome." + a.outcome)}\n${fmtClock(a.start)} → ${fmtClock(a.end)} (${fmtDur(a.end - a.start)})` +
      (a.session_id ? `\n${T("ui.session")} ${a.session_id}` : "") + (where ? `\n${T("ui.ran_on")} ${where}` : "") +
      `\n${fmtUsd(a.cost_usd)}`;
    return el("div", { class: "bar " + a.outcome + (state.selected === a.id ? " sel" : ""), "data-outcome": a.outcome,
      "data-id": a.id, "data-worker": a.worker || "", "data-session": a.session_id || "",
      style: `left:${left}px;width:${w}px`, title, onclick: (e) => { e.stopPropagation(); showAttempt(tl, a); } });
  };
  const rows = [];
  for (const s of tl.steps) {
    const kids = s.children;
    const folded = state.collapsed[s.step] !== undefined ? state.collapsed[s.step] : kids.length > 8;
    const tog = kids.length ? el("span", { class: "tog", onclick: () => { state.collapsed[s.step] = !folded; renderTimeline(tl); },
      text: folded ? "▸" : "▾", title: T(folded ? "ui.expand" : "ui.collapse") }) : null;
    const own = (byLabel[s.step] || []).concat(folded ? kids.flatMap((k) => byLabel[k] || []) : []);
    rows.push(el("div", { class: "tl-row", "data-step": s.step },
      el("div", { class: "tl-label", title: s.step }, tog, s.step, kids.length ? el("span", { class: "muted", text: ` (${kids.length})` }) : null),
      el("div", { class: "tl-track", style: `width:${width}px` }, own.map(bar))));
    if (!folded) for (const k of kids) {
      rows.push(el("div", { class: "tl-row child", "data-step": k },
        el("div", { class: "tl-label", title: k, text: k }),
        el("div", { class: "tl-track", style: `width:${width}px` }, (byLabel[k] || []).map(bar))));
    }
  }
  const ticks = [];
  const n = Math.max(2, Math.floor(width / 140));
  for (let i = 0; i <= n; i++) {
    const t = tl.t0 + (span * i) / n;
    ticks.push(el("span", { class: "tick", style: `left:${220 + x(t)}px`, text: fmtClock(t) }));
  }
  const marks = tl.marks.map((m, i) => {
    const label = m.kind === "wake" ? T("ui.mark.wake", { n: m.woke }) :
      m.kind === "end" ? T("ui.mark.end", { state: m.state }) : T("ui.mark." + m.kind);
    return el("div", { class: "mark " + m.kind, "data-kind": m.kind, style: `left:${220 + x(m.t)}px`,
      title: `${label} · ${fmtTime(m.t)}${m.text ? "\n" + m.text : ""}` }, el("span", { text: label, style: `top:${2 + (i % 3) * 12}px` }));
  });
  const live = tl.runs.length && tl.runs[tl.runs.length - 1].state === "running";
  put(main, 
    el("a", { href: "#/", text: T("ui.back") }),
    el("div", { class: "tl-head" },
      el("h1", { text: `${tl.flow} · ${tl.run}` }),
      el("span", { class: "state " + tl.state, text: tl.state }),
      el("span", { class: "muted", text: `${fmtUsd(tl.cost_usd)} · ${tl.attempts.length} ${T("ui.attempts")}` }),
      el("label", {}, T("ui.zoom") + " ", el("input", { type: "range", min: "1", max: "40", step: "1", value: String(state.zoom),
        onchange: (e) => { state.zoom = Number(e.target.value); renderTimeline(tl); } })),
      live ? el("button", { type: "button", class: "danger", id: "cancel", onclick: () => cancelRun(tl.runs[tl.runs.length - 1].run),
        text: T("ui.cancel") }) : null),
    (tl.questions || []).map(questionBox),
    tl.questions_hidden ? el("div", { class: "notice", text: T("ui.token.needed") }) : null,
    el("div", { class: "legend" }, OUTCOMES.map((o) => el("span", {}, el("i", { class: "bar " + o }), T("ui.outcome." + o)))),
    el("div", { class: "tl", id: "timeline" },
      el("div", { class: "tl-grid", style: `width:${220 + width}px` },
        el("div", { class: "axis" }, ticks), rows, marks)));
}

function showAttempt(tl, a) {
  state.selected = a.id;
  const box = document.getElementById("detail");
  const where = a.worker ? `${a.host || ""} · ${T("ui.worker")} ${a.worker}` : (a.host || "-");
  const dl = el("dl", {},
    el("dt", { text: T("ui.col.state") }), el("dd", { text: T("ui.outcome." + a.outcome) }),
    el("dt", { text: T("ui.col.run") }), el("dd", { text: a.run }),
    el("dt", { text: T("ui.session") }), el("dd", { class: "session", text: a.session_id || "-" }),
    el("dt", { text: T("ui.ran_on") }), el("dd", { class: "where", text: where }),
    el("dt", { text: T("ui.col.started") }), el("dd", { text: `${fmtTime(a.start)} (${fmtDur(a.end - a.start)})` }),
    el("dt", { text: T("ui.col.cost") }), el("dd", { text: fmtUsd(a.cost_usd) + (a.num_turns ? ` · ${a.num_turns} ${T("ui.turns")}` : "") }),
    el("dt", { text: T("ui.tokens") }), el("dd", { text: a.tokens ? String(a.tokens) : "-" }),
    el("dt", { text: T("ui.tools") }), el("dd", { class: "tools" }, String(a.tools)),
    a.resumed ? el("dt", { text: "↻" }) : null, a.resumed ? el("dd", { text: T("ui.resumed") }) : null,
    a.error ? el("dt", { text: T("ui.error") }) : null, a.error ? el("dd", { text: a.error }) : null);
  put(box, 
    el("strong", { text: `${T("ui.attempt")} · ${a.label}` }), dl,
    el("a", { href: `#/run/${encodeURIComponent(tl.run)}/step/${encodeURIComponent(a.label)}`, text: T("ui.open_step") }),
    " ", el("button", { type: "button", onclick: () => { box.hidden = true; state.selected = null; }, text: "×" }));
  box.hidden = false;
  if (a.session_id) {
    getJSON(`/api/runs/${encodeURIComponent(tl.run)}/tools?session=${encodeURIComponent(a.session_id)}`).then((data) => {
      if (state.selected !== a.id || !data.tool_calls) return;
      const mine = data.tool_calls.filter((c) => c.started_at >= a.start - 1 && c.started_at <= a.end + 1);
      const cell = box.querySelector("dd.tools");
      if (!cell) return;
      put(cell, String(mine.length), mine.map((c) => el("div", { class: "tool-line" },
        el("code", { text: c.name }), " ", el("span", { class: "ledger " + c.state, text: T("ui.ledger." + c.state) }))));
    }).catch(() => {});
  }
}

function questionBox(q) {
  const input = el("input", { type: "text", class: "answer-text", placeholder: T("ui.answer.placeholder") });
  const send = (text) => answer(q, text);
  return el("div", { class: "question", "data-id": q.id },
    el("strong", { text: T("ui.question") + " " }), q.question || "",
    el("div", { class: "options" },
      q.options.map((o) => el("button", { type: "button", class: "option", onclick: () => send(o), text: o })),
      input,
      el("button", { type: "button", class: "send", onclick: () => send(input.value), text: T("ui.answer") })));
}

async function answer(q, text) {
  if (!String(text || "").trim()) return;
  const res = await fetch(`/api/runs/${encodeURIComponent(q.run)}/answer`, {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ id: q.id, text }),
  });
  const body = await res.json().catch(() => ({}));
  if (res.status === 403) alert(T("ui.token.needed"));
  else if (!res.ok) alert(T("ui.answer.failed", { why: body.error || res.status }));
  else notice(T("ui.answer.sent", { text }));
}

async function cancelRun(run) {
  if (!confirm(T("ui.cancel.confirm", { run }))) return;
  const res = await fetch(`/api/runs/${encodeURIComponent(run)}/cancel`, { method: "POST", credentials: "same-origin" });
  const body = await res.json().catch(() => ({}));
  if (res.status === 403) alert(T("ui.token.needed"));
  else if (!res.ok) alert(T("ui.cancel.failed", { why: body.error || res.status }));
  else notice(T("ui.cancel.done", { run }));
  refresh();
}

function notice(text) {
  const main = document.getElementById("main");
  main.prepend(el("div", { class: "notice", role: "status", text }));
}

// ---- a step --------------------------------------------------------------------------------

function renderStep(doc) {
  const main = document.getElementById("main");
  const parts = [
    el("a", { href: "#/run/" + encodeURIComponent(doc.run), text: "← " + T("ui.timeline") }),
    el("h1", { text: `${T("ui.step")} ${doc.label} · ${doc.flow}` }),
    el("p", { class: "muted" }, doc.attempts.map((a) => el("span", { class: "state " + a.outcome,
      text: `${fmtClock(a.start)} ${T("ui.outcome." + a.outcome)}` }, ))),
  ];
  for (const conv of doc.conversations) {
    const ledger = {};
    for (const c of conv.tool_calls) ledger[c.id] = c.state;
    parts.push(el("h2", {}, T("ui.conversation") + " · ", el("code", { class: "session-id", text: conv.session_id })));
    const body = el("div", { class: "conversation" });
    const turns = conv.turns;
    for (let i = 0; i < turns.length; i++) {
      const turn = turns[i];
      if (turn.kind === "tool_call") {
        const next = turns[i + 1];
        const result = next && next.id === turn.id && next.kind !== "tool_call" ? next : null;
        if (result) i++;
        const st = ledger[turn.id];
        body.append(el("details", { class: "tool", "data-tool": turn.tool },
          el("summary", {}, `${turn.tool}  ${turn.summary || ""}`,
            st ? el("span", { class: "ledger " + st, text: T("ui.ledger." + st) }) : null),
          el("pre", { text: JSON.stringify(turn.input, null, 2) }),
          result ? el("pre", { text: result.kind === "pending" ? "…" : (result.text || "") }) : null));
        continue;
      }
      const role = turn.role === "cli" ? "cli" : turn.kind === "prompt" ? "prompt" : turn.kind === "thinking" ? "thinking" : "text";
      const who = T("ui.kind." + (role === "cli" ? "cli" : role === "prompt" ? "prompt" : role === "thinking" ? "thinking" : "text"));
      body.append(el("div", { class: "turn " + role }, el("span", { class: "who", text: who }), turn.text || ""));
    }
    parts.push(body);
  }
  if (doc.handoff) {
    parts.push(el("h2", { text: T("ui.handoff") }),
      el("details", { class: "handoff", open: true }, el("summary", { text: doc.handoff.path }),
        el("pre", { class: "doc", text: doc.handoff.text })));
  }
  for (const log of doc.logs || []) {
    parts.push(el("h2", { text: `${T("ui.log")} · ${log.run}` }),
      el("details", { class: "steplog", open: doc.live }, el("summary", { text: log.path }),
        el("pre", { class: "doc", text: log.text || T("ui.log.empty") })));
  }
  put(main, ...parts);
}

// ---- routing and live updates ------------------------------------------------------------------

function route() {
  const hash = decodeURIComponent(location.hash.slice(1) || "/");
  const step = hash.match(/^\/run\/([^/]+)\/step\/(.+)$/);
  if (step) return { kind: "step", run: step[1], label: step[2] };
  const run = hash.match(/^\/run\/([^/]+)$/);
  if (run) return { kind: "run", run: run[1] };
  return { kind: "runs" };
}

async function refresh() {
  const r = route();
  let data;
  try {
    if (r.kind === "runs") data = await getJSON("/api/runs");
    else if (r.kind === "run") data = await getJSON(`/api/runs/${encodeURIComponent(r.run)}/timeline`);
    else data = await getJSON(`/api/runs/${encodeURIComponent(r.run)}/steps/${encodeURIComponent(r.label)}`);
  } catch (e) {
    put(document.getElementById("main"), el("p", { class: "notice", text: String(e) }));
    return;
  }
  if (data.__token) {
    put(document.getElementById("main"), el("p", { class: "notice", text: T("ui.token.needed") }));
    return;
  }
  if (r.kind === "runs") renderRuns(data);
  else if (r.kind === "run") renderTimeline(data);
  else renderStep(data);
  document.body.dataset.view = r.kind;
  document.body.dataset.rendered = String(Date.now());
}

function listen() {
  const badge = document.getElementById("live");
  const source = new EventSource("/api/stream");
  source.onopen = () => { badge.className = "live on"; badge.title = ""; };
  source.onerror = () => { badge.className = "live off"; badge.title = T("ui.gone"); };
  let pending = null;
  source.addEventListener("change", () => {
    if (pending) return;
    pending = setTimeout(() => { pending = null; refresh(); }, 100);
  });
}

function applyTexts() {
  document.documentElement.lang = LANG === "zh" ? "zh-CN" : "en";
  document.title = T("ui.title");
  for (const node of document.querySelectorAll("[data-t]")) node.textContent = T(node.dataset.t);
  document.getElementById("lang").textContent = T("ui.lang");
}

function setTheme(theme) {
  document.documentElement.dataset.theme = theme;
  localStorage.setItem("flower.theme", theme);
}

window.addEventListener("DOMContentLoaded", () => {
  const dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  setTheme(localStorage.getItem("flower.theme") || (dark ? "dark" : "light"));
  applyTexts();
  document.getElementById("theme").onclick = () =>
    setTheme(document.documentElement.dataset.theme === "dark" ? "light" : "dark");
  document.getElementById("lang").onclick = () => {
    LANG = LANG === "zh" ? "en" : "zh";
    localStorage.setItem("flower.lang", LANG);
    applyTexts();
    refresh();
  };
  window.addEventListener("hashchange", () => { document.getElementById("detail").hidden = true; refresh(); });
  refresh();
  listen();
});
