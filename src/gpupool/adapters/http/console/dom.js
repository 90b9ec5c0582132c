// gpupool console: DOM and formatting helpers (window.gpupoolDom). No dependencies, no state.
"use strict";

(() => {
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k.startsWith("data-")) el.setAttribute(k, String(v));
      else if (k === "width") el.style.width = v;
      else if (k === "grow") el.style.flexGrow = String(v);
      else if (k === "bg") el.style.backgroundColor = v;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  const gib = (mib) => (mib / 1024).toFixed(mib >= 10240 ? 0 : 1);
  const pct = (x) => `${Math.round(100 * x)} %`;
  const widthOf = (x) => `${(100 * Math.max(0, Math.min(1, x))).toFixed(1)}%`;
  const band = (p) => (p >= 100 ? "P0" : p >= 0 ? "P1" : "P2");
  const clock = (at) => new Date(at * 1000).toLocaleTimeString([], { hour12: false });
  const short = (id) => (id && id.length > 12 ? id.slice(0, 8) : id || "");
  const pathOf = (id) => id.split("/").map(encodeURIComponent).join("/");

  // Green (0) -> amber -> red (1): the heat colour of a fill fraction.
  function heat(f) {
    const x = Math.max(0, Math.min(1, f));
    return `hsl(${Math.round(130 - 130 * x)}, 62%, ${Math.round(44 - 6 * x)}%)`;
  }

  function toast(text, ok) {
    const t = h("div", { class: `toast ${ok ? "ok" : "bad"}`, role: "status", text });
    document.getElementById("toasts").append(t);
    setTimeout(() => t.remove(), ok ? 5000 : 9000);
  }

  // One line of text for an event of /v1/events.
  function describe(e) {
    const l = e.lease;
    const parts = [];
    if (l) {
      parts.push(`${l.tenant} ${band(l.priority)} ${gib(l.vram_mib)} GiB`);
      if (l.slice_id) parts.push(`on ${l.slice_id}`);
      parts.push(`lease ${short(l.id)}`);
      if (l.victims && l.victims.length) parts.push(`victims ${l.victims.map(short).join(", ")}`);
    }
    if (e.ticket) parts.push(`ticket ${short(e.ticket)}`);
    if (e.gpu_id) parts.push(`GPU ${e.gpu_id}${e.lease_ids ? ` (${e.lease_ids.length} P2 lease(s))` : ""}`);
    if (e.wait_s) parts.push(`waited ${e.wait_s.toFixed(2)} s`);
    if (e.reason || (l && l.reason && e.kind !== "granted")) parts.push(`\u2014 ${e.reason || l.reason}`);
    return parts.join(" ");
  }

  window.gpupoolDom = { h, gib, pct, widthOf, band, clock, short, pathOf, heat, toast, describe };
})();
