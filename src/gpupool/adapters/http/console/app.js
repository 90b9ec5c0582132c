// gpupool operator console. Plain browser JavaScript, no dependencies, no build step.
// Reads the gateway's own API with a Bearer token kept in sessionStorage: GET /v1/pool and /v1/leases
// (refreshed on every event and every few seconds), GET /v1/events (server-sent events, read with
// fetch so that the token travels in a header, reconnecting with Last-Event-ID), and the admin routes
// POST /v1/admin/gpus/{id}/drain, POST /v1/admin/slices/{id}/health, PUT /v1/admin/watermarks.
"use strict";

(() => {
  const TOKEN_KEY = "gpupool.token";
  const POLL_MS = 2000;
  const SIGNIN_RETRY_MS = 2000;
  const MAX_EVENTS = 200;
  const MAX_TICKETS = 30;
  const REQUEST_TIMEOUT_MS = 10000; // a read or an action the gateway does not answer by then has failed
  const LEASE_KINDS = new Set(["granted", "renewed", "released", "expired", "preempted", "revoked"]);

  const $ = (id) => document.getElementById(id);
  const state = {
    token: "",
    isAdmin: null, // null = unknown until an admin route answers
    pool: null,
    leases: [],
    events: [],
    tickets: new Map(),
    lastEventId: "",
    tidal: null,
    shown: new Set(), // ids of the active leases the rendered pool already counts
    stream: null,
    refreshing: false,
    again: false,
    staleSince: null, // when the figures on screen stopped being refreshed (a refresh failed)
    timer: 0,
    pollTimer: 0,
    signInTimer: 0,
    wmDirty: false,
  };

  const { h, gib, pct, widthOf, band, clock, short, pathOf, heat, toast, describe } = window.gpupoolDom;

  // ------------------------------------------------------------------ API
  class ApiError extends Error {
    constructor(status, body) {
      const msg = body && body.error ? body.error : `HTTP ${status}`;
      super(body && body.field ? `${msg} (field ${body.field})` : msg);
      this.status = status;
      this.body = body;
    }
  }

  // A gateway that takes the request and never answers (a blocked process, a proxy holding the
  // connection) fails it after REQUEST_TIMEOUT_MS: a refresh waiting for good held every later one
  // behind it, and the page showed its old figures as current.
  async function api(method, path, body) {
    const token = state.token;
    const headers = { Authorization: `Bearer ${token}` };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const signal = AbortSignal.timeout(REQUEST_TIMEOUT_MS);
    const late = () => new Error(`no answer from the gateway in ${REQUEST_TIMEOUT_MS / 1000} s`);
    let r;
    try {
      r = await fetch(path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store",
        signal,
      });
    } catch (e) {
      throw signal.aborted ? late() : e;
    }
    let data = null;
    try {
      data = await r.json();
    } catch (_) {
      if (signal.aborted) throw late(); // the head came, the body did not
      data = null;
    }
    if (r.status === 401) {
      // a late answer to an earlier token (two reads race at sign-in) must not sign out a newer one
      if (token === state.token) signOut("The gateway rejected this token.");
      throw new ApiError(401, data);
    }
    if (!r.ok) throw new ApiError(r.status, data);
    return data;
  }

  // ------------------------------------------------------------------ sign-in
  function takeTokenFromUrl() {
    const url = new URL(window.location.href);
    const t = url.searchParams.get("token");
    if (t) {
      sessionStorage.setItem(TOKEN_KEY, t);
      url.searchParams.delete("token");
      window.history.replaceState(null, "", url.pathname + url.search + url.hash);
    }
  }

  function showSignIn(message) {
    $("app").hidden = true;
    $("signout").hidden = true;
    $("signin").hidden = false;
    $("signin-error").textContent = message || "";
    $("who").textContent = "";
    $("token").focus();
  }

  function signOut(message) {
    clearTimeout(state.signInTimer);
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = "";
    if (state.stream) state.stream.abort();
    state.stream = null;
    clearInterval(state.pollTimer);
    setLive(false, "offline");
    setStale(null);
    showSignIn(message);
  }

  // What keeps `token` out of an HTTP header (fetch throws before anything is sent): a character past
  // U+00FF (a typographic quote picked up with a copy), NUL or a line break. "" when it can be sent.
  function unsendable(token) {
    const m = /[^\x01-\x09\x0b\x0c\x0e-\xff]/u.exec(token);
    if (!m) return "";
    const code = m[0].codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
    return `The token contains U+${code}, which an HTTP header cannot carry: paste it again as plain text.`;
  }

  // A refusal (401) shows the sign-in form; a failure that may pass (no answer: the gateway is
  // restarting; 5xx: a proxy's 502, a 503; 408, 429) is retried with the same token until the gateway
  // answers or another token is submitted. A token that cannot be sent at all is refused at once.
  async function signIn(token) {
    clearTimeout(state.signInTimer);
    const bad = unsendable(token);
    if (bad) {
      signOut(bad);
      return;
    }
    state.token = token;
    try {
      await refresh(true);
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) return;
      if (token !== state.token) return; // another sign-in or a sign-out came since
      const passing = !(e instanceof ApiError) || e.status >= 500 || e.status === 408 || e.status === 429;
      if (!passing) {
        showSignIn(`Sign-in failed: ${e.message}`);
        return;
      }
      showSignIn(`Cannot reach the gateway: ${e.message}. Trying again in ${SIGNIN_RETRY_MS / 1000} s.`);
      state.signInTimer = setTimeout(() => signIn(token), SIGNIN_RETRY_MS);
      return;
    }
    if (token !== state.token) return;
    await learnRole();
    if (token !== state.token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("signin").hidden = true;
    $("app").hidden = false;
    $("signout").hidden = false;
    showRole();
    startEvents();
    clearInterval(state.pollTimer);
    state.pollTimer = setInterval(() => schedule(0), POLL_MS);
  }

  // The token's role, from an admin read (200: admin, 403: tenant), so that a tenant is not offered
  // admin controls that can only be refused. Unknown (null) if the gateway does not say.
  async function learnRole() {
    try {
      await api("GET", "/v1/admin/watermarks");
      state.isAdmin = true;
    } catch (e) {
      state.isAdmin = e instanceof ApiError && e.status === 403 ? false : null;
    }
  }

  function showRole() {
    const role = state.isAdmin === null ? "signed in" : state.isAdmin ? "admin" : "tenant";
    $("who").textContent = role;
    document.body.classList.toggle("tenant", state.isAdmin === false);
  }

  // ------------------------------------------------------------------ refresh
  const STALE_RETRY_MS = 2000;

  function schedule(delayMs) {
    clearTimeout(state.timer);
    state.timer = setTimeout(() => refresh(false).catch(() => {}), delayMs);
  }

  // A refresh that fails leaves the last figures on screen: say so (and since when), and try again,
  // rather than show old numbers as current while the event stream alone still looks live.
  function setStale(err) {
    const el = $("stale");
    if (!err) {
      el.hidden = true;
      el.textContent = "";
      state.staleSince = null;
      return;
    }
    if (!state.staleSince) state.staleSince = new Date();
    el.hidden = false;
    el.textContent = `stale since ${state.staleSince.toLocaleTimeString()}: ${err.message || err}`;
    schedule(STALE_RETRY_MS);
  }

  async function refresh(first) {
    if (state.refreshing && !first) {
      state.again = true;
      return;
    }
    state.refreshing = true;
    try {
      let pool;
      let leases;
      try {
        [pool, leases] = await Promise.all([api("GET", "/v1/pool"), api("GET", "/v1/leases")]);
      } catch (e) {
        if (!first && state.pool && state.token) setStale(e); // (the first one: sign-in handles it)
        throw e;
      }
      state.pool = pool;
      state.leases = leases.leases || [];
      state.shown = new Set(state.leases.map((l) => l.id));
      setStale(null);
      render();
    } finally {
      state.refreshing = false;
      if (state.again) {
        state.again = false;
        schedule(0);
      }
    }
  }

  // ------------------------------------------------------------------ rendering
  function gpuFigures(g) {
    let cap = 0;
    let granted = 0;
    for (const s of g.slices) {
      cap += s.capacity.vram_mib;
      granted += s.granted.vram_mib;
    }
    const r = g.reading;
    const readFrac = r && r.vram_total_mib ? r.vram_used_mib / r.vram_total_mib : 0;
    const grantFrac = cap ? granted / cap : 0;
    const wm = state.pool.watermarks;
    const unhealthy = !g.drained && g.slices.some((s) => !s.healthy);
    let st = "ok";
    if (g.health === "failed") st = "failed";
    else if (g.paused) st = "paused";
    else if (g.drained) st = "drained";
    else if (g.health === "degraded" || Math.max(readFrac, grantFrac) >= wm.early_warning) st = "warn";
    return { cap, granted, readFrac, grantFrac, st, unhealthy };
  }

  function sliceCell(g, s) {
    const f = s.capacity.vram_mib ? s.granted.vram_mib / s.capacity.vram_mib : 0;
    const tail = s.slice_id.slice(g.gpu_id.length + 1).replace(/^mps-/, "");
    const label = s.kind === "mig" ? s.profile : s.kind === "whole" ? "whole" : tail || s.kind;
    const sick = !s.healthy && !g.drained; // a drain takes every slice of the GPU out of placement
    const title =
      `${s.slice_id}\n${gib(s.granted.vram_mib)} / ${gib(s.capacity.vram_mib)} GiB granted, ` +
      `${s.granted.compute_milli} / ${s.capacity.compute_milli} milli compute, ${s.leases} lease(s)` +
      (s.healthy ? "" : "\nUNHEALTHY");
    return h(
      "button",
      {
        type: "button",
        class: `slice${sick ? " unhealthy" : ""}${g.drained ? " drained" : ""}`,
        "data-slice-id": s.slice_id,
        "data-granted-mib": s.granted.vram_mib,
        title,
        grow: Math.max(1, s.capacity.vram_mib),
        bg: s.healthy ? heat(f) : null,
        "data-healthy": s.healthy ? "1" : "0",
        onclick: () => sliceHealth(s),
      },
      h("span", { class: "slice-label", text: label }),
      h("span", { class: "slice-fill", text: pct(f) }),
    );
  }

  function gpuTile(g) {
    const fig = gpuFigures(g);
    const r = g.reading;
    const byKind = new Map();
    for (const s of g.slices) {
      if (!byKind.has(s.kind)) byKind.set(s.kind, []);
      byKind.get(s.kind).push(s);
    }
    const badges = [];
    if (g.health !== "ok") badges.push(h("span", { class: `badge ${g.health}`, text: g.health }));
    if (g.paused) badges.push(h("span", { class: "badge paused", text: "paused" }));
    if (g.drained) badges.push(h("span", { class: "badge drained", text: "drained" }));
    if (fig.unhealthy) badges.push(h("span", { class: "badge failed", text: "slice unhealthy" }));
    if (!badges.length) badges.push(h("span", { class: `badge ${fig.st}`, text: fig.st === "warn" ? "high" : "ok" }));
    return h(
      "article",
      {
        class: `gpu st-${fig.st}`,
        "data-gpu-id": g.gpu_id,
        "data-granted-mib": fig.granted,
        "data-capacity-mib": fig.cap,
        "data-state": fig.st,
        "data-drained": g.drained ? "1" : "0",
      },
      h("header", { class: "gpu-head" }, h("b", { text: g.gpu_id }), h("span", { class: "model", text: g.model }), badges),
      h(
        "div",
        { class: "meter", title: "VRAM granted by leases / slice capacity" },
        h("div", { class: `fill granted st-${fig.st}`, width: widthOf(Math.min(1, fig.grantFrac)) }),
        h("div", { class: "mark", width: widthOf(state.pool.watermarks.early_warning) }),
      ),
      h("div", { class: "figure granted-text", text: `granted ${gib(fig.granted)} / ${gib(fig.cap)} GiB (${pct(fig.grantFrac)})` }),
      h(
        "div",
        { class: "meter thin", title: "VRAM in use as the node agent last read it / total" },
        h("div", { class: "fill reading", width: widthOf(Math.min(1, fig.readFrac)) }),
        h("div", { class: "mark high", width: widthOf(state.pool.watermarks.vram_high) }),
      ),
      h(
        "div",
        { class: "figure" },
        r
          ? `reading ${gib(r.vram_used_mib)} / ${gib(r.vram_total_mib)} GiB (${pct(fig.readFrac)})` +
              (r.temperature_c !== null && r.temperature_c !== undefined ? `, ${r.temperature_c} \u00b0C` : "")
          : "no reading yet",
      ),
      h(
        "div",
        { class: "kinds" },
        [...byKind.entries()].map(([kind, ss]) =>
          h(
            "div",
            { class: "kind" },
            h("span", { class: "kind-label", text: kind === "time-slice" ? "TS" : kind.toUpperCase() }),
            h("div", { class: "cells" }, ss.map((s) => sliceCell(g, s))),
          ),
        ),
      ),
      h(
        "footer",
        { class: "gpu-actions admin-only" },
        h("button", {
          type: "button",
          class: "ghost",
          "data-action": g.drained ? "undrain" : "drain",
          text: g.drained ? "Undrain\u2026" : "Drain\u2026",
          onclick: () => drain(g),
        }),
      ),
    );
  }

  function renderHeatmap() {
    const nodes = state.pool.nodes.map((n) => {
      const gpus = n.gpus;
      return h(
        "section",
        { class: "node", "data-node": n.node },
        h("h3", {}, n.node, h("span", { class: "muted", text: ` ${gpus.length} GPU${gpus.length === 1 ? "" : "s"}` })),
        h("div", { class: "gpus" }, gpus.map(gpuTile)),
      );
    });
    $("heatmap").replaceChildren(...nodes);
  }

  function renderSummary() {
    const p = state.pool;
    const f = p.capacity.vram_mib ? p.granted.vram_mib / p.capacity.vram_mib : 0;
    $("summary").textContent =
      `${gib(p.granted.vram_mib)} / ${gib(p.capacity.vram_mib)} GiB granted (${pct(f)}) \u00b7 ` +
      `${p.active_leases} leases \u00b7 ${p.request_leases} request leases`;
  }

  function renderLeases() {
    const bands = ["P0", "P1", "P2"];
    const rows = new Map();
    for (const l of state.leases) {
      if (!rows.has(l.tenant)) rows.set(l.tenant, { P0: [0, 0], P1: [0, 0], P2: [0, 0] });
      const cell = rows.get(l.tenant)[band(l.priority)];
      cell[0] += 1;
      cell[1] += l.vram_mib;
    }
    const head = h("tr", {}, h("th", { text: "tenant" }), bands.map((b) => h("th", { class: `band ${b}`, text: b })));
    const body = [...rows.entries()]
      .sort((a, b) => a[0].localeCompare(b[0]))
      .map(([tenant, r]) =>
        h(
          "tr",
          { "data-tenant": tenant },
          h("td", { class: "text", text: tenant }),
          bands.map((b) => h("td", { class: r[b][0] ? "" : "muted", text: r[b][0] ? `${r[b][0]} \u00b7 ${gib(r[b][1])} GiB` : "\u2013" })),
        ),
      );
    if (!body.length) body.push(h("tr", {}, h("td", { colspan: 4, class: "muted", text: "no active leases" })));
    $("lease-bands").replaceChildren(h("thead", {}, head), h("tbody", {}, body));

    $("lease-count").textContent = String(state.leases.length);
    const lh = h("tr", {}, ["lease", "tenant", "band", "slice", "GiB", "model", "expires"].map((t) => h("th", { text: t })));
    const list = [...state.leases]
      .sort((a, b) => b.priority - a.priority || a.tenant.localeCompare(b.tenant))
      .slice(0, 100)
      .map((l) =>
        h(
          "tr",
          { "data-lease-id": l.id },
          h("td", { title: l.id, text: short(l.id) }),
          h("td", { class: "text", text: l.tenant }),
          h("td", { class: `band ${band(l.priority)}`, text: band(l.priority) }),
          h("td", { text: l.slice_id }),
          h("td", { text: gib(l.vram_mib) }),
          h("td", { class: "text", text: l.model || "" }),
          h("td", { text: clock(l.expires_at) }),
        ),
      );
    $("lease-list").replaceChildren(h("thead", {}, lh), h("tbody", {}, list));
  }

  function renderQueue() {
    const q = state.pool.queue || {};
    const chips = ["P0", "P1", "P2"].map((b) =>
      h("span", { class: `chip band ${b}`, "data-band": b }, `${b} `, h("b", { text: String(q[b] || 0) }), " queued"),
    );
    $("queue").replaceChildren(...chips);
    const recent = [...state.tickets.values()].sort((a, b) => b.at - a.at).slice(0, MAX_TICKETS);
    const rows = recent.map((t) =>
      h(
        "tr",
        { class: `ticket ${t.state}` },
        h("td", { title: t.ticket, text: short(t.ticket) }),
        h("td", { text: t.state }),
        h("td", { text: clock(t.at) }),
        h("td", { class: "text", text: t.reason || "" }),
      ),
    );
    if (!rows.length) rows.push(h("tr", {}, h("td", { class: "muted", text: "no tickets seen since this page opened" })));
    $("tickets").replaceChildren(h("tbody", {}, rows));
  }

  function renderHealth() {
    const p = state.pool;
    const wm = p.watermarks;
    const gpus = p.nodes.flatMap((n) => n.gpus);
    const list = (label, items) =>
      h("div", { class: "hrow" }, h("span", { class: "muted", text: label }), items.length ? items.join(", ") : "none");
    const unhealthy = gpus
      .filter((g) => !g.drained)
      .flatMap((g) => g.slices.filter((s) => !s.healthy).map((s) => s.slice_id));
    $("health").replaceChildren(
      h(
        "div",
        { class: "hrow" },
        h("span", { class: "muted", text: "watermarks" }),
        `pause at ${pct(wm.vram_high)} VRAM or ${wm.temp_high_c} \u00b0C, resume at ${pct(wm.vram_low)} and ` +
          `${wm.temp_low_c} \u00b0C, early warning ${pct(wm.early_warning)}`,
      ),
      list("paused GPUs", p.paused_gpus),
      list("drained GPUs", gpus.filter((g) => g.drained).map((g) => g.gpu_id)),
      list("GPUs not ok", gpus.filter((g) => g.health !== "ok").map((g) => `${g.gpu_id} (${g.health})`)),
      list("unhealthy slices", unhealthy),
    );
    const form = $("wm-form");
    if (!state.wmDirty && !form.contains(document.activeElement)) {
      for (const k of Object.keys(wm)) if (form.elements[k]) form.elements[k].value = String(wm[k]);
    }
    const t = state.tidal;
    $("tidal").textContent = t ? `tidal (${clock(t.at)}): ${t.reason}` : "tidal: no tidal event since this page opened";
  }

  function render() {
    if (!state.pool) return;
    renderSummary();
    renderHeatmap();
    renderLeases();
    renderQueue();
    renderHealth();
    document.body.dataset.ready = "1";
  }

  // ------------------------------------------------------------------ events (SSE over fetch)
  function setLive(on, text) {
    const el = $("live");
    el.className = `pill ${on ? "on" : "off"}`;
    el.textContent = text || (on ? "live" : "reconnecting");
  }

  // Apply a lease event to the rendered pool at once (the refresh that follows confirms it), so that
  // the heat map moves as soon as the event arrives rather than one API round trip later.
  function applyLeaseEvent(e) {
    const l = e.lease;
    if (!state.pool || !l || !l.grants) return false;
    let sign = 0;
    if (e.kind === "granted" && !state.shown.has(l.id)) sign = 1;
    else if (["released", "expired", "preempted", "revoked"].includes(e.kind) && state.shown.has(l.id)) sign = -1;
    if (!sign) return false;
    const slices = new Map();
    for (const n of state.pool.nodes) for (const g of n.gpus) for (const sl of g.slices) slices.set(sl.slice_id, sl);
    let hit = false;
    for (const gr of l.grants) {
      const sl = slices.get(gr.slice_id);
      if (!sl) continue;
      hit = true;
      sl.granted.vram_mib += sign * gr.vram_mib;
      sl.granted.compute_milli += sign * gr.compute_milli;
      sl.free.vram_mib -= sign * gr.vram_mib;
      sl.free.compute_milli -= sign * gr.compute_milli;
      sl.leases += sign;
      state.pool.granted.vram_mib += sign * gr.vram_mib;
    }
    if (sign > 0) state.shown.add(l.id);
    else state.shown.delete(l.id);
    return hit;
  }

  function onEvent(kind, data) {
    let e;
    try {
      e = JSON.parse(data);
    } catch (_) {
      return;
    }
    e.kind = e.kind || kind;
    state.events.unshift(e);
    if (state.events.length > MAX_EVENTS) state.events.length = MAX_EVENTS;
    if (e.ticket) {
      const st = e.kind === "queued" ? "queued" : e.kind === "shed" ? "shed" : e.kind === "granted" ? "granted" : e.kind;
      state.tickets.set(e.ticket, { ticket: e.ticket, state: st, at: e.at, reason: e.reason || "" });
      if (state.tickets.size > 4 * MAX_TICKETS) {
        const oldest = [...state.tickets.values()].sort((a, b) => a.at - b.at)[0];
        state.tickets.delete(oldest.ticket);
      }
    }
    if (e.kind === "tidal") state.tidal = e;
    if (applyLeaseEvent(e)) {
      renderSummary();
      renderHeatmap();
    }
    const li = h(
      "li",
      { class: `ev ${e.kind}`, "data-kind": e.kind },
      h("time", { text: clock(e.at) }),
      h("span", { class: `kind-badge ${e.kind}`, text: e.kind }),
      h("span", { class: "ev-text", text: describe(e) }),
    );
    const ol = $("events");
    ol.prepend(li);
    while (ol.children.length > MAX_EVENTS) ol.lastChild.remove();
    $("event-count").textContent = `${state.events.length} since this page opened`;
    if (LEASE_KINDS.has(e.kind) || ["queued", "shed", "cancelled", "failed", "pause", "resume", "tidal", "lagged"].includes(e.kind)) schedule(30);
  }

  function startEvents() {
    if (state.stream) state.stream.abort();
    state.stream = window.gpupoolEvents.open({
      token: () => state.token,
      lastEventId: () => state.lastEventId,
      onId: (id) => {
        state.lastEventId = id;
      },
      onEvent,
      onConnected: () => {
        setLive(true);
        schedule(0); // catch up on what happened while disconnected
      },
      onDisconnected: () => setLive(false),
      onUnauthorized: (token) => {
        if (token === state.token) signOut("The gateway rejected this token.");
      },
    });
  }

  // ------------------------------------------------------------------ admin actions
  function confirmDialog(title, text, { revoke = false } = {}) {
    const d = $("confirm");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-revoke-row").hidden = !revoke;
    $("confirm-revoke").checked = false;
    $("confirm-reason").value = "";
    return new Promise((resolve) => {
      d.addEventListener(
        "close",
        () =>
          resolve({
            ok: d.returnValue === "ok",
            revoke: $("confirm-revoke").checked,
            reason: $("confirm-reason").value.trim(),
          }),
        { once: true },
      );
      d.returnValue = "";
      d.showModal();
    });
  }

  async function adminCall(label, method, path, body) {
    try {
      const out = await api(method, path, body);
      state.isAdmin = true;
      showRole();
      toast(`${label}: done${out && out.leases && out.leases.length ? ` (${out.leases.length} lease(s) ended)` : ""}`, true);
      schedule(0);
      return out;
    } catch (e) {
      if (e instanceof ApiError && e.status === 403) {
        state.isAdmin = false;
        showRole();
      }
      toast(`${label} failed: ${e.message}`, false);
      return null;
    }
  }

  async function drain(g) {
    const undo = g.drained;
    const c = await confirmDialog(
      undo ? `Undrain ${g.gpu_id}?` : `Drain ${g.gpu_id}?`,
      undo
        ? "New leases may be placed on this GPU again."
        : "No new lease will be placed on this GPU. Existing leases keep running unless you revoke them.",
      { revoke: !undo },
    );
    if (!c.ok) return;
    await adminCall(`${undo ? "undrain" : "drain"} ${g.gpu_id}`, "POST", `/v1/admin/gpus/${pathOf(g.gpu_id)}/drain`, {
      undo,
      revoke: c.revoke,
      reason: c.reason,
    });
  }

  async function sliceHealth(s) {
    if (state.isAdmin === false) return; // a tenant token cannot mark slices
    const healthy = !s.healthy;
    const c = await confirmDialog(
      healthy ? `Mark ${s.slice_id} healthy?` : `Mark ${s.slice_id} unhealthy?`,
      healthy
        ? "The slice takes new leases again."
        : `No new lease will be placed on this slice (${s.leases} lease(s) on it now).`,
      { revoke: !healthy },
    );
    if (!c.ok) return;
    await adminCall(`mark ${s.slice_id} ${healthy ? "healthy" : "unhealthy"}`, "POST", `/v1/admin/slices/${pathOf(s.slice_id)}/health`, {
      healthy,
      revoke: c.revoke,
      reason: c.reason,
    });
  }

  async function changeWatermarks(ev) {
    ev.preventDefault();
    const f = ev.target.elements;
    const body = {
      vram_high: Number(f.vram_high.value),
      vram_low: Number(f.vram_low.value),
      early_warning: Number(f.early_warning.value),
      temp_high_c: Math.round(Number(f.temp_high_c.value)),
      temp_low_c: Math.round(Number(f.temp_low_c.value)),
    };
    const c = await confirmDialog(
      "Change watermarks?",
      `Pause at ${pct(body.vram_high)} VRAM or ${body.temp_high_c} \u00b0C, resume at ${pct(body.vram_low)} and ` +
        `${body.temp_low_c} \u00b0C, early warning at ${pct(body.early_warning)}. This applies to every GPU.`,
    );
    if (!c.ok) return;
    const out = await adminCall("change watermarks", "PUT", "/v1/admin/watermarks", body);
    if (out) state.wmDirty = false;
  }

  // ------------------------------------------------------------------ start
  function start() {
    $("signin-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const t = $("token").value.trim();
      $("token").value = "";
      signIn(t);
    });
    $("signout").addEventListener("click", () => signOut(""));
    $("wm-form").addEventListener("submit", changeWatermarks);
    $("wm-form").addEventListener("input", () => {
      state.wmDirty = true;
    });
    takeTokenFromUrl();
    const t = sessionStorage.getItem(TOKEN_KEY);
    if (t) signIn(t);
    else showSignIn("");
  }

  start();
})();
