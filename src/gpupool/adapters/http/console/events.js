// gpupool console: the server-sent event client (window.gpupoolEvents). GET /v1/events is read with
// fetch, not EventSource, so that the Bearer token travels in a header and never in a URL. It parses
// the event stream format (event:, data:, id:, comments), reconnects with exponential backoff
// (0.5 s doubling to 10 s) and sends Last-Event-ID on reconnect when the server gave ids.
"use strict";

(() => {
  function parseBlock(block, opts) {
    let kind = "message";
    let id = null;
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? "" : line.slice(i + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") kind = value;
      else if (field === "data") data.push(value);
      else if (field === "id") id = value;
    }
    if (id !== null) opts.onId(id);
    if (data.length) opts.onEvent(kind, data.join("\n"));
  }

  // opts: token(), lastEventId(), onId(id), onEvent(kind, data), onConnected(), onDisconnected(),
  // onUnauthorized(token) with the token the stream was refused for. Returns an AbortController:
  // abort() stops the stream for good.
  function open(opts) {
    const ctrl = new AbortController();
    (async () => {
      let backoff = 500;
      while (!ctrl.signal.aborted) {
        try {
          const token = opts.token();
          const headers = { Authorization: `Bearer ${token}`, Accept: "text/event-stream" };
          const last = opts.lastEventId();
          if (last) headers["Last-Event-ID"] = last;
          const r = await fetch("/v1/events", { headers, signal: ctrl.signal, cache: "no-store" });
          if (r.status === 401) {
            opts.onUnauthorized(token);
            return;
          }
          if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}`);
          backoff = 500;
          opts.onConnected();
          const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
          let buf = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buf = (buf + value).replace(/\r\n?/g, "\n");
            let i;
            while ((i = buf.indexOf("\n\n")) >= 0) {
              parseBlock(buf.slice(0, i), opts);
              buf = buf.slice(i + 2);
            }
          }
        } catch (_) {
          if (ctrl.signal.aborted) return;
        }
        if (ctrl.signal.aborted) return;
        opts.onDisconnected();
        await new Promise((res) => setTimeout(res, backoff));
        backoff = Math.min(backoff * 2, 10000);
      }
    })();
    return ctrl;
  }

  window.gpupoolEvents = { open };
})();
