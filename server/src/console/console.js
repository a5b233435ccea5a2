// The console's one script (served as /console.js: the
// Content-Security-Policy allows no inline script). On a command's page
// it follows the output live over server-sent events; the browser
// resumes a cut stream with Last-Event-ID. Text is added as text, never
// as HTML. On Needs you it reloads the page when the page is out of date.
"use strict";
// On Needs you: reload when what the page lists changes (an approval
// asked or answered, a worker stalled, a reply failed).
(function () {
  var el = document.getElementById("needs-you");
  if (!el || !el.dataset.events || !window.EventSource) { return; }
  var es = new EventSource(el.dataset.events);
  es.addEventListener("changed", function () {
    es.close();
    // Marked as the page's own doing: it does not hold the session open.
    window.location.replace("/?auto=1");
  });
})();
(function () {
  var out = document.getElementById("stdout");
  if (!out || !out.dataset.events || !window.EventSource) { return; }
  var err = document.getElementById("stderr");
  var decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
  var es = new EventSource(out.dataset.events);
  es.addEventListener("output", function (e) {
    var d = JSON.parse(e.data);
    var raw = atob(d.b64);
    var bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) { bytes[i] = raw.charCodeAt(i); }
    var el = d.stream === "stderr" ? err : out;
    el.appendChild(document.createTextNode(decoders[d.stream].decode(bytes, { stream: true })));
    el.scrollTop = el.scrollHeight;
  });
  es.addEventListener("state", function (e) {
    var d = JSON.parse(e.data);
    document.getElementById("state").textContent = d.state;
    if (d.exit !== null && d.exit !== undefined) {
      document.getElementById("exit").textContent = String(d.exit);
    } else if (d.signal !== null && d.signal !== undefined) {
      document.getElementById("exit").textContent = "signal " + d.signal;
    }
    document.getElementById("reason").textContent = d.reason || "";
    if (d.terminal) {
      document.getElementById("live").textContent = "Ended.";
      es.close();
    }
  });
  es.addEventListener("failed", function (e) {
    document.getElementById("live").textContent = "Live output stopped: " + JSON.parse(e.data).error;
    es.close();
  });
})();
