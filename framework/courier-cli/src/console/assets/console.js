// The Courier console's page: polls api/state, draws it, and sends the operator's actions to
// the API with the bearer token. No framework, nothing loaded from the network.
"use strict";

const REFRESH_MS = 2000;
let state = null;
let failedSince = null;

// h("td", {class: "num"}, "3") — text always goes in as text, never as HTML.
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function age(secs) {
  if (secs === null || secs === undefined || Number.isNaN(secs)) return "–";
  const s = Math.max(0, Math.floor(secs));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h ${String(Math.floor(s / 60) % 60).padStart(2, "0")}m`;
}

function table(headers, rows, empty) {
  if (!rows.length) return h("p", { class: "empty" }, empty);
  return h("table", {},
    h("thead", {}, h("tr", {}, headers.map(([label, num]) => h("th", { class: num ? "num" : null }, label)))),
    h("tbody", {}, rows));
}

const num = (value) => h("td", { class: "num" }, value);
const canAct = () => state && state.writable;

function actionButton(label, attrs, onclick) {
  return h("button", Object.assign({
    type: "button",
    disabled: !canAct(),
    title: canAct() ? null : "read-only: no http.auth_token configured",
    onclick,
  }, attrs), label);
}

// ---- drawing ----------------------------------------------------------------------------

function horizonWarning(svc) {
  const hz = svc.horizon;
  if (!hz || !hz.warning) return null;
  const who = hz.oldest_session
    ? `pid ${hz.oldest_session.pid} (${hz.oldest_session.state || "state not visible"}${hz.oldest_session.application_name ? ", app " + hz.oldest_session.application_name : ""})`
    : hz.oldest_prepared ? `prepared transaction ${hz.oldest_prepared.gid}`
    : hz.oldest_slot ? `slot ${hz.oldest_slot.name}` : "a transaction";
  return h("p", { class: "warning", "data-testid": "horizon-warning" },
    `xmin horizon held ${age(hz.held_secs)} by ${who}: vacuum cannot clean the outbox meanwhile.`);
}

function relays(svc) {
  return table(
    [["instance"], ["shards"], ["publish limit", 1], ["in flight", 1], ["keys out", 1], ["latency", 1], ["heartbeat", 1]],
    svc.relays.map((r) => h("tr", {},
      h("td", { class: "id" }, r.instance),
      h("td", {}, (r.owned_shards || []).join(", ") || "none"),
      num(r.publish_limit ?? "–"), num(r.publishes_in_flight ?? "–"), num(r.publish_keys_out ?? "–"),
      num(r.publish_latency_ms == null ? "–" : `${Math.round(r.publish_latency_ms)} ms`),
      num(age(r.heartbeat_age_secs)))),
    "No live relay: the outbox is not being published.");
}

function backlog(svc) {
  return table(
    [["topic"], ["shard", 1], ["pending", 1], ["dead", 1], ["oldest pending", 1]],
    svc.backlog.map((b) => h("tr", {},
      h("td", {}, b.topic), num(b.shard), num(b.pending),
      h("td", { class: "num " + (b.dead ? "bad" : "") }, b.dead), num(age(b.oldest_pending_secs)))),
    "Nothing waiting in the outbox.");
}

function deadRows(svc) {
  const rows = svc.dead_rows.map((r) => h("tr", { "data-event-id": r.event_id, class: "dead-row" },
    h("td", { class: "id" }, r.event_id),
    h("td", {}, `${r.aggregate_id} v${r.version}`, h("br"), h("small", {}, r.event_type)),
    h("td", {}, r.topic, h("br"), h("small", {}, `shard ${r.shard}, ${r.publish_attempts} attempts`)),
    h("td", { class: "bad" }, r.last_error || "–"),
    h("td", { class: "actions" },
      actionButton("Retry", { "data-action": "retry" }, () => ask({
        title: "Retry dead row",
        text: `Publish ${r.aggregate_id} v${r.version} (${r.event_type}) again; its key's later versions follow in order.`,
        path: "api/outbox/retry",
        body: { schema: svc.schema, event_ids: [r.event_id] },
      })),
      actionButton("Skip", { "data-action": "skip", class: "danger" }, () => ask({
        title: "Skip dead row",
        text: `Never publish ${r.aggregate_id} v${r.version}; its key's later versions flow again. The event is lost.`,
        path: "api/outbox/skip",
        body: { schema: svc.schema, event_id: r.event_id },
      })))));
  const all = svc.dead_rows.length > 1
    ? actionButton(`Retry all ${svc.dead_rows.length}`, { "data-action": "retry-all" }, () => ask({
        title: "Retry every dead row",
        text: `Publish every dead row of schema ${svc.schema} again.`,
        count: svc.dead_rows.length,
        path: "api/outbox/retry",
        body: { schema: svc.schema, all: true, expected: svc.dead_rows.length },
      }))
    : null;
  return [all, table([["event"], ["aggregate"], ["topic"], ["last error"], [""]], rows, "No dead rows.")];
}

function consumers(svc) {
  return table(
    [["group"], ["subscription"], ["offset (publish time)"], ["lag", 1], ["events/s", 1], ["last save", 1]],
    svc.consumers.map((c) => h("tr", {},
      h("td", {}, c.group), h("td", { class: "id" }, c.subscription),
      h("td", {}, new Date(c.offset_publish_time).toLocaleTimeString()),
      num(`${c.lag_millis} ms`), num(c.applied_per_sec.toFixed(1)), num(`${age(c.idle_secs)} ago`))),
    "No consumer group has saved an offset in this schema.");
}

function parked(svc) {
  return table(
    [["group"], ["key"], ["waits for", 1], ["held"], ["since"], ["why"], [""]],
    svc.parked_keys.map((p) => h("tr", { "data-key": p.routing_key, class: "parked-key" },
      h("td", {}, p.consumer_group), h("td", { class: "id" }, p.routing_key),
      num(`v${p.expected_version}`),
      h("td", {}, p.held_events ? `${p.held_events} (v${p.first_held_version}..v${p.last_held_version})` : "none"),
      h("td", {}, new Date(p.parked_at).toLocaleString()), h("td", {}, p.reason),
      h("td", { class: "actions" },
        actionButton("Release", { "data-action": "release" }, () => ask({
          title: "Release parked key",
          text: `Unpark ${p.routing_key} of ${p.consumer_group} and republish its ${p.held_events} held event(s) in version order. Republish the missing v${p.expected_version} first, or skip to a version to give the gap up for good.`,
          skipTo: true,
          path: "api/parked/release",
          body: { schema: svc.schema, group: p.consumer_group, key: p.routing_key },
        }))))),
    "No parked keys.");
}

function audit(svc) {
  return table([["when"], ["who"], ["what"], ["on"], ["why"]],
    svc.audit.map((a) => h("tr", {},
      h("td", {}, new Date(a.at).toLocaleString()), h("td", {}, a.by), h("td", {}, a.action),
      h("td", {}, a.target), h("td", {}, a.reason))),
    "No operator action yet.");
}

function deadLetters(keepers) {
  if (!keepers.length) return h("p", { class: "empty" }, "No consumer subscription found yet.");
  return keepers.map((k) => h("div", { class: "keeper", "data-subscription": k.subscription },
    h("h3", {}, k.keeper, " ", h("span", { class: "badge " + (k.held ? "bad" : "ok") }, `${k.held} held`)),
    k.error ? h("p", { class: "error" }, k.error) : null,
    k.groups.length ? k.groups.map((g) => h("div", { class: "letter-group" },
      h("p", {}, h("strong", {}, g.reason), ` — ${g.event_type}, ${g.letters.length} message(s) `,
        actionButton(`Republish ${g.letters.length}`, { "data-action": "republish-group" }, () => ask({
          title: "Republish a group of dead letters",
          text: `Publish every dead letter of ${k.subscription} with reason “${g.reason}” and event type ${g.event_type} back to its topic. Deploy the fix first.`,
          count: g.letters.length,
          path: "api/dlq/republish",
          body: { subscription: k.subscription, group: { reason: g.reason, event_type: g.event_type }, expected: g.letters.length },
        }))),
      table([["message"], ["key"], ["event"], ["attempt"], [""]], g.letters.map((l) => h("tr", { "data-message-id": l.message_id, class: "dead-letter" },
        h("td", { class: "id" }, l.original_message_id || l.message_id),
        h("td", { class: "id" }, l.ordering_key),
        h("td", { class: "id" }, l.attributes.event_id || "–", l.attributes.version ? ` v${l.attributes.version}` : ""),
        num(l.delivery_attempt || "–"),
        h("td", { class: "actions" }, actionButton("Republish", { "data-action": "republish" }, () => ask({
          title: "Republish a dead letter",
          text: `Publish this message back to the topic of ${k.subscription} for a fresh delivery.`,
          path: "api/dlq/republish",
          body: { subscription: k.subscription, message_ids: [l.message_id] },
        }))))), ""))) : h("p", { class: "empty" }, "No dead letters.")));
}

function serviceSection(svc) {
  if (svc.error) {
    return h("section", { "data-schema": svc.schema },
      h("div", { class: "service-title" }, h("h2", {}, `schema ${svc.schema}`),
        h("span", { class: "badge bad" }, "unreadable")),
      h("p", { class: "warning" }, svc.error));
  }
  const dead = svc.dead_rows.length;
  return h("section", { "data-schema": svc.schema },
    h("div", { class: "service-title" }, h("h2", {}, `schema ${svc.schema}`),
      h("span", { class: "badge " + (svc.live_relays ? "ok" : "bad") }, `${svc.live_relays} relay(s)`),
      dead ? h("span", { class: "badge bad" }, `${dead} dead`) : null,
      svc.parked_keys.length ? h("span", { class: "badge warn" }, `${svc.parked_keys.length} parked`) : null),
    h("div", { class: "summary" },
      h("span", {}, `${svc.pending} pending (oldest ${age(svc.oldest_pending_secs)})`),
      h("span", {}, `publishing ${svc.published_per_sec.toFixed(1)}/s`),
      h("span", {}, `applying ${svc.applied_per_sec.toFixed(1)}/s`)),
    horizonWarning(svc),
    h("h3", {}, "Relays"), relays(svc),
    h("h3", {}, "Outbox backlog"), backlog(svc),
    h("h3", {}, "Dead rows"), deadRows(svc),
    h("h3", {}, "Consumer groups"), consumers(svc),
    h("h3", {}, "Parked keys"), parked(svc),
    h("h3", {}, "Audit log"), audit(svc));
}

function draw() {
  const main = document.getElementById("main");
  // Keep the reader's place: redraw only while no dialog is open.
  if (document.getElementById("confirm").open) return;
  main.replaceChildren(
    ...state.services.map(serviceSection),
    h("section", { id: "dead-letters" }, h("h2", {}, "Dead letters"), deadLetters(state.dead_letters)));
  const hint = document.getElementById("access-hint");
  hint.textContent = state.writable
    ? "Actions need the bearer token of http.auth_token; your name goes into the audit log."
    : "Read-only: the console has no http.auth_token configured.";
}

async function refresh() {
  const status = document.getElementById("refresh");
  try {
    const response = await fetch("api/state", { cache: "no-store" });
    if (!response.ok) throw new Error(`${response.status} ${(await response.json()).error || ""}`);
    state = await response.json();
    failedSince = null;
    draw();
    status.textContent = `updated ${new Date(state.read_at).toLocaleTimeString()}`;
    status.className = "";
  } catch (error) {
    failedSince = failedSince || Date.now();
    status.textContent = `cannot refresh for ${age((Date.now() - failedSince) / 1000)}: ${error.message}`;
    status.className = "stale";
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

// ---- actions ------------------------------------------------------------------------------

function toast(text) {
  let el = document.getElementById("toast");
  if (!el) { el = h("div", { id: "toast", role: "status" }); document.body.append(el); }
  el.textContent = text;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => el.remove(), 4000);
}

// Opens the confirmation dialog for one action; on Confirm, posts it with the reason.
function ask(action) {
  const dialog = document.getElementById("confirm");
  const operator = localStorage.getItem("courier.operator") || "";
  document.getElementById("confirm-title").textContent = action.title;
  document.getElementById("confirm-text").textContent = action.text;
  document.getElementById("confirm-error").textContent = operator ? "" : "Give your name under Operator access first.";
  document.getElementById("reason").value = "";
  document.getElementById("skip-to").value = "";
  document.getElementById("skip-to-label").hidden = !action.skipTo;
  const countLabel = document.getElementById("count-label");
  const countCheck = document.getElementById("count-check");
  countLabel.hidden = !action.count;
  countCheck.checked = false;
  countCheck.required = Boolean(action.count);
  document.getElementById("count-text").textContent = action.count ? `Yes, act on all ${action.count}` : "";
  const ok = document.getElementById("confirm-ok");
  ok.disabled = !operator;
  ok.onclick = async (event) => {
    event.preventDefault();
    const form = document.getElementById("confirm-form");
    if (!form.reportValidity()) return;
    const body = Object.assign({}, action.body, {
      reason: document.getElementById("reason").value,
      operator: localStorage.getItem("courier.operator") || "",
    });
    const skipTo = document.getElementById("skip-to").value;
    if (action.skipTo && skipTo) body.skip_to = Number(skipTo);
    ok.disabled = true;
    try {
      const response = await fetch(action.path, {
        method: "POST",
        headers: {
          "Content-Type": "application/json",
          Authorization: `Bearer ${sessionStorage.getItem("courier.token") || ""}`,
        },
        body: JSON.stringify(body),
      });
      const answer = await response.json().catch(() => ({}));
      if (!response.ok) throw new Error(answer.error || `${response.status}`);
      dialog.close();
      toast(`${action.title}: done`);
      document.getElementById("refresh").textContent = "refreshing…";
    } catch (error) {
      document.getElementById("confirm-error").textContent = `refused: ${error.message}`;
    } finally {
      ok.disabled = false;
    }
  };
  dialog.showModal();
}

function setUpAccess() {
  const operator = document.getElementById("operator");
  const token = document.getElementById("token");
  operator.value = localStorage.getItem("courier.operator") || "";
  token.value = sessionStorage.getItem("courier.token") || "";
  if (!operator.value) document.getElementById("access").open = true;
  document.getElementById("access-form").addEventListener("submit", (event) => {
    event.preventDefault();
    localStorage.setItem("courier.operator", operator.value.trim());
    // The token stays for this tab only.
    sessionStorage.setItem("courier.token", token.value.trim());
    document.getElementById("access").open = false;
    toast("saved");
  });
}

setUpAccess();
refresh();
