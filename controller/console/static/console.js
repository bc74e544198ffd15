// mqmeta console: plain JavaScript, no build step. Pages read /api/*; live changes come
// from /api/stream (server-sent events): "event" (a controller decision: the page reads
// what it changed) and "sample" (every few seconds: topics, groups, plot points).
"use strict";

const state = { session: null, page: "overview", samples: [], plots: {}, events: [], history: { commands: [], next: 0 } };
const PLOT_POINTS_MAX = 300;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function table(columns, rows, rowAttrs) {
  const head = el("tr", {}, columns.map(([title]) => el("th", {}, title)));
  const body = rows.map((row) =>
    el("tr", rowAttrs ? rowAttrs(row) : {}, columns.map(([, cell, numeric]) => {
      const value = cell(row);
      return el("td", numeric ? { class: "num" } : {}, value === null || value === undefined ? "—" : value);
    })));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, body));
}

function replace(id, ...children) {
  const target = document.getElementById(id);
  target.replaceChildren(...children.flat());
}

function notice(text) {
  const box = document.getElementById("notice");
  box.textContent = text || "";
  box.hidden = !text;
}

async function api(path, options) {
  const response = await fetch(path, { credentials: "same-origin", ...(options || {}) });
  const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

async function write(path, document) {
  return api(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": state.session.csrf },
    body: JSON.stringify(document),
  });
}

const ms = (value) => (value ? new Date(value).toISOString().replace("T", " ").replace("Z", "") : "—");
const duration = (value) => (value < 1000 ? `${value} ms` : value < 120000 ? `${(value / 1000).toFixed(1)} s` : `${Math.round(value / 60000)} min`);

// Session and login ------------------------------------------------------------------------

async function loadSession() {
  state.session = await api("/api/session");
  const s = state.session;
  document.getElementById("identity").textContent = s.identity ? `${s.identity} (${s.role})` : (s.auth ? "not logged in" : "");
  document.getElementById("login").hidden = !s.auth || Boolean(s.identity);
  document.getElementById("logout").hidden = !s.identity;
}

async function login(event) {
  event.preventDefault();
  try {
    await api("/api/login", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ token: document.getElementById("login-token").value }),
    });
    document.getElementById("login-token").value = "";
    notice("");
    await loadSession();
    startStream();
    show(state.page);
  } catch (error) {
    notice(error.message);
  }
}

// Pages ------------------------------------------------------------------------------------

function renderControllers(c) {
  replace("controllers",
    el("p", {}, `leader ${c.leader || "none"} (${c.leader_grpc || "—"}), term ${c.term}, commit index ${c.commit_index}`),
    table([
      ["node", (n) => n.id], ["address", (n) => n.grpc], ["role", (n) => n.role],
      ["healthy", (n) => (n.healthy ? "yes" : "no")],
    ], c.nodes, (n) => ({ class: n.id === c.leader ? "master" : "" })));
}

function renderBrokerSet(set) {
  const tiered = set.tiered || {};
  return el("div", {
    class: "set", id: `set-${set.broker_name}`,
    "data-master-address": set.master_address, "data-master-epoch": String(set.master_epoch),
  },
  el("h3", {}, `${set.cluster} / ${set.broker_name}: master `,
    el("span", { class: "master master-address" }, set.master_address || "none"),
    ` (broker ${set.master_broker_id}), epoch `, el("span", { class: "master-epoch" }, String(set.master_epoch)),
    `, SyncStateSet {${set.sync_state_set.join(", ")}} (epoch ${set.sync_state_set_epoch})`),
  table([
    ["broker", (r) => r.broker_id, true], ["address", (r) => r.address],
    ["role", (r) => r.error ? el("span", { class: "dead" }, "no answer") : r.role],
    ["in sync", (r) => (r.in_sync ? "yes" : "no")],
    ["max offset", (r) => r.max_offset, true], ["confirm offset", (r) => r.confirm_offset, true],
    ["lag (bytes)", (r) => r.lag_bytes, true],
  ], set.replicas, (r) => ({ class: r.broker_id === set.master_broker_id ? "master" : "" })),
  el("p", {}, tiered.error ? `tiered: ${tiered.error}`
    : `tiered: uploaded to ${tiered.uploaded_offset} in ${tiered.segments} segments, ${tiered.lag_bytes ?? "—"} bytes behind the confirm offset`));
}

async function showOverview() {
  const document_ = await api("/api/overview");
  renderControllers(document_.controllers);
  replace("broker-sets", document_.broker_sets.length ? document_.broker_sets.map(renderBrokerSet) : el("p", {}, "no broker sets"));
}

function renderTopics(document_) {
  const rates = (state.samples[state.samples.length - 1] || {}).rates || {};
  replace("topics", table([
    ["topic", (t) => t.name], ["queues", (t) => t.queue_count, true], ["broker sets", (t) => [...new Set(t.queues.map((q) => q.broker_name))].join(", ")],
    ["messages", (t) => t.messages, true], ["msg/s", (t) => rates[t.name], true],
    ["per queue (max offset)", (t) => (t.error ? t.error : t.queues.map((q) => `${q.broker_name}/${q.queue_id}: ${q.max_offset ?? q.error}`).join("; "))],
  ], document_.topics));
}

function renderGroups(document_) {
  replace("groups", document_.groups.length ? document_.groups.map((g) => el("div", { class: "set", id: `group-${g.group}`, "data-backlog": String(g.backlog) },
    el("h3", {}, `${g.group}: backlog `, el("span", { class: "backlog" }, String(g.backlog)), ` messages, ${duration(g.backlog_ms)}`),
    el("p", { class: "hint" }, `members: ${g.members.map((m) => `${m.client_id} (${m.protocol}, seen ${duration(m.last_seen_ms_ago)} ago)`).join(", ") || "none connected"}`,
      g.errors.length ? `; ${g.errors.join("; ")}` : ""),
    g.queues.length ? table([
      ["topic", (q) => q.topic], ["queue", (q) => `${q.broker_name}/${q.queue_id}`], ["consumed", (q) => (q.consumed_offset < 0 ? "none committed" : q.consumed_offset), true],
      ["max offset", (q) => q.max_offset, true], ["backlog", (q) => q.backlog, true], ["backlog time", (q) => duration(q.backlog_ms), true],
    ], g.queues) : el("p", { class: "hint" }, "no committed offsets yet"))) : el("p", {}, "no consumer groups"));
}

function renderReplicator(document_) {
  replace("replicator", document_.rules.length ? document_.rules.map((rule) => el("div", { class: "set" },
    el("h3", {}, `${rule.name}: ${rule.replicated} replicated, lag ${rule.lag_messages}, delay ${duration(rule.delay_ms)}, last sync ${ms(rule.last_sync_ms)}`),
    table([
      ["task", (t) => `${t.topic}/${t.broker_name}/${t.queue_id}`], ["worker", (t) => t.worker], ["epoch", (t) => t.epoch, true],
      ["acked", (t) => t.acked_offset, true], ["lag", (t) => t.lag_messages, true], ["delay", (t) => duration(t.delay_ms), true],
      ["msg/s", (t) => t.messages_per_s, true],
    ], rule.tasks))) : el("p", {}, "no replicator rules"));
}

function renderEvents() {
  const rows = state.events.slice().reverse();
  replace("events", rows.length ? table([
    ["index", (e) => e.index, true], ["time", (e) => ms(e.time_ms)], ["kind", (e) => e.kind],
    ["what", (e) => [e.cluster, e.broker_name, e.name].filter(Boolean).join(" / ")],
    ["master", (e) => (e.master_address !== undefined ? `${e.master_broker_id} ${e.master_address} epoch ${e.master_epoch}` : null)],
    ["SyncStateSet", (e) => (e.sync_state_set ? `{${e.sync_state_set.join(", ")}} epoch ${e.sync_state_set_epoch}` : null)],
  ], rows, (e) => ({ class: `event event-${e.kind}` })) : el("p", {}, "no events since this console started"));
}

function renderHistory() {
  const rows = state.history.commands;
  replace("history", rows.length ? table([
    ["index", (c) => c.index, true], ["term", (c) => c.term, true], ["time", (c) => (c.time_ms ? ms(c.time_ms) : null)],
    ["command", (c) => c.command], ["fields", (c) => Object.entries(c.fields).map(([k, v]) => `${k}=${v}`).join(" ")],
    ["result", (c) => (c.code ? el("span", { class: c.result }, `${c.result.toUpperCase()} ${c.code}: ${c.message}`) : c.result)],
  ], rows, (c) => ({ class: `command command-${c.result}`, "data-index": String(c.index) })) : el("p", {}, "no commands held"));
  document.getElementById("history-older").hidden = !state.history.next;
}

async function loadHistory(older) {
  const page = await api(`/api/history?before=${older ? state.history.next : 0}`);
  const held = state.history.commands;
  if (older) {
    state.history = { commands: held.concat(page.commands), next: page.next_before_index };
  } else if (held.length && state.history.next !== page.next_before_index && page.next_before_index) {
    // paged back already: keep what is shown, add what is newer
    const newest = held[0].index;
    state.history = { commands: page.commands.filter((c) => c.index > newest).concat(held), next: state.history.next };
  } else {
    state.history = { commands: page.commands, next: page.next_before_index };
  }
  renderHistory();
}

// One history read at a time while events stream in; one more after it if any arrived.
let historyLoading = false;
let historyStale = false;

function refreshHistory() {
  if (historyLoading) {
    historyStale = true;
    return;
  }
  historyLoading = true;
  loadHistory(false).catch((error) => notice(error.message)).finally(() => {
    historyLoading = false;
    if (historyStale) {
      historyStale = false;
      refreshHistory();
    }
  });
}

function resendForm(m) {
  const result = el("p", { class: "resend-result", role: "status" });
  const group = el("input", { class: "resend-group", placeholder: "group", required: true });
  const send = async (to) => {
    try {
      const copy = await write("/api/messages/resend", { msg_id: m.msg_id, topic: m.topic, group: to });
      result.className = "resend-result";
      result.textContent = `resent to ${copy.topic} queue ${copy.queue_id} offset ${copy.queue_offset}`;
    } catch (error) {
      result.className = "resend-result error";
      result.textContent = error.message;
    }
  };
  const dlq = m.topic.startsWith("%DLQ%") ? m.topic.slice("%DLQ%".length) : "";
  const form = el("form", { class: "resend" }, group, el("button", { type: "submit", class: "resend-button" }, "Resend to group"),
    dlq ? el("button", { type: "button", class: "requeue-button", onclick: () => send(dlq) }, `Requeue to ${dlq}`) : null,
    el("small", {}, " (admin)"));
  form.addEventListener("submit", (event) => { event.preventDefault(); send(group.value.trim()); });
  return [form, result];
}

function renderSearch(document_) {
  replace("search-results", document_.messages.length ? document_.messages.map((m) => el("div", { class: "set message", "data-msg-id": m.msg_id },
    el("h3", {}, `${m.msg_id}: ${m.topic} ${m.broker_name}/${m.queue_id} offset ${m.queue_offset}`),
    table([["field", (r) => r[0]], ["value", (r) => r[1]]], [
      ["stored", ms(m.store_timestamp_ms)], ["born", ms(m.born_timestamp_ms)], ["confirmed", m.confirmed ? "yes" : "no"], ["tags", m.tags], ["keys", m.keys.join(" ")],
      ["properties", JSON.stringify(m.properties)], ["body", `${m.body}${m.body_bytes > m.body.length ? " …" : ""} (${m.body_bytes} bytes)`],
    ]),
    traceLine(m.trace), resendForm(m))) : el("p", {}, "no message matches"));
}

function traceLine(trace) {
  if (!trace) return el("p", { class: "hint" }, "trace: shown for the first messages only");
  if (trace.error) return el("p", { class: "trace error" }, `trace: ${trace.error}`);
  return el("p", { class: "trace" }, "trace: ",
    `held by the master${trace.replicas.filter((r) => r.holds).map((r) => `, broker ${r.broker_id}`).join("")}; `,
    trace.confirmed ? "confirmed; " : "not yet confirmed; ",
    trace.tiered ? "tiered; " : "not tiered; ",
    `consumed by ${trace.consumed_by.join(", ") || "no group"}`,
    trace.retries.length ? `; retries ${trace.retries.join(", ")}` : "",
    trace.replicated_to.length ? `; copied by ${trace.replicated_to.join(", ")}` : "",
    Object.keys(trace.origin).length ? `; replicated from ${JSON.stringify(trace.origin)}` : "");
}

async function search(event) {
  event.preventDefault();
  const value = (id) => document.getElementById(id).value.trim();
  const time = (id) => (value(id) ? String(new Date(value(id)).getTime()) : "");
  const query = new URLSearchParams({ topic: value("search-topic"), key: value("search-key"), id: value("search-id"), since: time("search-since"), until: time("search-until") });
  try {
    renderSearch(await api(`/api/search?${query}`));
    notice("");
  } catch (error) {
    replace("search-results", el("p", { class: "error" }, error.message));
  }
}

async function resetOffsets(event) {
  event.preventDefault();
  const result = document.getElementById("reset-offsets-result");
  const value = (id) => document.getElementById(id).value.trim();
  try {
    const reset = await write("/api/groups/reset", { group: value("reset-group"), topic: value("reset-topic"), to: value("reset-to"), force: document.getElementById("reset-force").checked });
    result.className = "";
    result.textContent = `reset ${reset.group}: ${reset.queues.length} queues`;
  } catch (error) {
    result.className = "error";
    result.textContent = error.message;
  }
}

async function createTopic(event) {
  event.preventDefault();
  const result = document.getElementById("create-topic-result");
  try {
    const topic = await write("/api/topics", { name: document.getElementById("topic-name").value.trim(), queues: Number(document.getElementById("topic-queues").value) });
    result.className = "";
    result.textContent = `created ${topic.name} with ${topic.queue_count} queues`;
  } catch (error) {
    result.className = "error";
    result.textContent = error.message;
  }
}

// Plots ------------------------------------------------------------------------------------

function plot(id, series) {
  if (typeof uPlot === "undefined") return;
  const target = document.getElementById(id);
  if (target.offsetParent === null) return; // hidden page: drawn when shown
  const names = [...new Set(state.samples.flatMap((s) => Object.keys(series(s))))].sort();
  const key = `${id}:${names.join(",")}`;
  const times = state.samples.map((s) => s.now_ms / 1000);
  const columns = [times, ...names.map((name) => state.samples.map((s) => series(s)[name] ?? null))];
  const existing = state.plots[id];
  if (existing && existing.key === key) {
    existing.chart.setData(columns);
    return;
  }
  if (existing) existing.chart.destroy();
  const colors = ["#2f6fdb", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285"];
  const options = {
    width: Math.max(400, target.clientWidth - 20), height: 200,
    series: [{}, ...names.map((name, i) => ({ label: name, stroke: colors[i % colors.length] }))],
  };
  target.replaceChildren();
  state.plots[id] = { key, chart: new uPlot(options, columns, target) };
}

function drawPlots() {
  plot("plot-rates", (s) => s.rates || {});
  plot("plot-backlog", (s) => s.backlog || {});
  plot("plot-delay", (s) => s.replication_delay_ms || {});
}

// Live updates -----------------------------------------------------------------------------

let stream = null;

function startStream() {
  if (stream) stream.close();
  stream = new EventSource("/api/stream");
  const dot = document.getElementById("live");
  stream.onopen = () => dot.classList.add("on");
  stream.onerror = () => dot.classList.remove("on");
  stream.addEventListener("event", (message) => {
    state.events.push(JSON.parse(message.data));
    if (state.events.length > 500) state.events.shift();
    if (state.page === "events") {
      renderEvents();
      refreshHistory();
    }
    if (state.page === "overview") showOverview().catch((error) => notice(error.message));
  });
  stream.addEventListener("sample", (message) => {
    const sample = JSON.parse(message.data);
    state.samples.push({ now_ms: sample.now_ms, rates: sample.rates, backlog: sample.backlog, replication_delay_ms: sample.replication_delay_ms });
    if (state.samples.length > PLOT_POINTS_MAX) state.samples.shift();
    if (state.page === "topics") renderTopics(sample.topics);
    if (state.page === "groups") renderGroups(sample.groups);
    const newest = state.history.commands.length ? state.history.commands[0].index : 0;
    if (state.page === "events" && sample.history_index > newest) refreshHistory();
    drawPlots();
  });
}

// Navigation -------------------------------------------------------------------------------

const PATHS = { "/": "overview", "/topics": "topics", "/groups": "groups", "/search": "search", "/replicator": "replicator", "/events": "events" };
const LOADERS = {
  overview: showOverview,
  topics: async () => renderTopics(await api("/api/topics")),
  groups: async () => renderGroups(await api("/api/groups")),
  replicator: async () => renderReplicator(await api("/api/replicator")),
  events: async () => {
    state.events = (await api("/api/events")).events;
    renderEvents();
    state.history = { commands: [], next: 0 };
    await loadHistory(false);
  },
  search: async () => {},
};

async function show(page) {
  state.page = page;
  for (const section of document.querySelectorAll("main > section")) section.hidden = section.dataset.page !== page;
  for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("active", link.dataset.page === page);
  try {
    await LOADERS[page]();
    drawPlots();
  } catch (error) {
    notice(error.message);
  }
}

async function main() {
  document.getElementById("login").addEventListener("submit", login);
  document.getElementById("logout").addEventListener("click", async () => {
    await api("/api/logout", { method: "POST" });
    location.reload();
  });
  document.getElementById("search").addEventListener("submit", search);
  document.getElementById("create-topic").addEventListener("submit", createTopic);
  document.getElementById("reset-offsets").addEventListener("submit", resetOffsets);
  document.getElementById("history-older").addEventListener("click", () => loadHistory(true).catch((error) => notice(error.message)));
  for (const link of document.querySelectorAll("#nav a")) {
    link.addEventListener("click", (event) => {
      event.preventDefault();
      history.pushState({}, "", link.getAttribute("href"));
      show(link.dataset.page);
    });
  }
  window.addEventListener("popstate", () => show(PATHS[location.pathname] || "overview"));
  await loadSession();
  try {
    state.samples = (await api("/api/samples")).samples;
  } catch (error) {
    notice(error.message);
  }
  startStream();
  await show(PATHS[location.pathname] || "overview");
}

document.addEventListener("DOMContentLoaded", main);
