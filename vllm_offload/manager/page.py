"""The manager's HTML: one server-rendered page, its CSS and JavaScript served beside it
(static/). The page holds no inline script or style, so the Content-Security-Policy can
forbid both; the script builds every value into the page as text, never as markup.
Charts are drawn on <canvas> by static/charts.js (no chart library); the several-models
card and its switches are static/models.js and static/switches.js."""

from __future__ import annotations

import html
from pathlib import Path

STATIC = Path(__file__).parent / "static"
# Only this origin's files; no inline script, style or handler; no framing.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

LOGIN = """<!doctype html><html><head><meta charset="utf-8"><title>vllm-offload login</title>
<link rel="stylesheet" href="/static/style.css"></head><body>
<header><h1>vllm-offload manager</h1></header>
<main><div class="card narrow">
<h2>Log in</h2>{failed}<p class="hint">Paste the manager token. {where}</p>
<form method="post" action="/login"><label for="token">Token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required>
<p><button class="primary" type="submit">Log in</button></p></form></div></main></body></html>
"""
FAILED = '<p class="error">That token is not right.</p>'


def login(token_file: Path | None, failed: bool = False) -> str:
    """The login page, saying where this manager's token is: its token file (the unit's,
    install-service's), or the terminal it was started from (no --token-file: a token
    for this run alone)."""
    if token_file is not None:
        where = f"It is in the token file {token_file}, readable by the manager's user only."
    else:
        where = (
            "This manager was started without --token-file: its token for this run is "
            "the one `vllm-offload manager` printed on the terminal it was started "
            "from."
        )
    return LOGIN.format(failed=FAILED if failed else "", where=html.escape(where))


# The server, its events, what fits, what the CPU tier is buying, the disks.
SERVER_CARDS = """\
<p id="control-msg" class="hint"></p>
<div class="cards">
 <div class="card"><h2>Server</h2><p class="hint">The vLLM OpenAI server this page controls.</p>
  <table id="server"></table>
  <h2 class="spaced">Events</h2><p class="hint">Restarts, crashes and recoveries
  since the manager started (it checks the unit every 2 s).</p><table id="events"></table></div>
 <div class="card"><h2>What fits</h2><p class="hint">One request must fit the GPU KV pool;
  the CPU tier in host RAM keeps blocks for reuse (repeated prompts) and preemption.</p>
  <table id="plan"></table></div>
 <div class="card"><h2>What the CPU tier is buying</h2><p class="hint">Prompt tokens loaded
  from host RAM instead of being computed again, the prefill time that saved (at this server's
  measured prefill rate), the traffic it cost, and the time to first token with and without
  such hits.</p><p id="hit-rate" class="figure"></p><table id="buying"></table>
  <h2 class="spaced">Disks</h2>
  <table id="disks"></table></div>
</div>
"""

# Several models: each one's card, the switches, adding one (static/models.js).
MODELS_CARD = """\
<div class="card" id="models-card" hidden><h2>Models</h2><p class="hint">Each model this
 server answers to, by its name. As many as fit are on the GPU at once
 (residency.max_resident); a request for another waits while it is brought in (asleep:
 about a second; stopped: a start). Saving a change here restarts the server.</p>
 <p id="control-error" class="error" hidden></p>
 <p id="switch-progress" class="progress" hidden></p>
 <div class="strip" id="switch-strip"><h3>Switches, last 10 minutes</h3><p class="hint">A bar
  per step, from its start to its end: <span class="key bring-in"></span> brought in,
  <span class="key put-away"></span> put away (hover a bar for its times).</p>
  <div id="strip-lanes"></div><p class="hint axis" id="strip-axis"></p></div>
 <div class="model-cards" id="model-cards"></div>
 <form id="add-model"><label for="m-path">Add a model</label><select id="m-path"></select>
  <label for="m-name">Name it answers to</label><input id="m-name">
  <p><button type="submit" id="m-add" disabled>Add model</button></p></form>
 <div id="models-msg"></div></div>
"""

# The last 10 minutes' charts (static/charts.js).
CHARTS = """\
<div><h2 class="section">Last 10 minutes</h2>
 <p id="chart-model-pick" class="hint" hidden><label for="chart-model">vLLM's charts
 for</label> <select id="chart-model"></select></p>
 <p id="no-gpu" class="hint" hidden>No NVIDIA GPU found on this host (NVML sees none), so there
 are no GPU charts.</p><div class="charts" id="charts"></div></div>
"""

# Settings, fetching a model, the other boxes, other vLLM servers on this host. The forms'
# submit buttons come disabled; dashboard.js enables them once it handles the forms.
SETTINGS_CARDS = """\
<div class="cards">
 <div class="card" id="settings-card"><h2>Settings</h2>
  <p class="hint">Choose a model and how memory is used.
  Preview shows what will fit; Save writes the config (a backup is kept), restarts the server
  and checks that the new model answers.</p>
  <form id="settings">
   <label for="f-model">Model</label><select id="f-model"></select>
   <label for="f-len">Longest request, tokens (max_model_len, or auto)</label>
   <input id="f-len">
   <label for="f-conc">Full-length requests the GPU must hold at once</label>
   <input id="f-conc" type="number" min="1">
   <label for="f-weights">Weights in host RAM, GiB (auto: the fewest that make room for the
    two above)</label><input id="f-weights">
   <label for="f-kvdtype">KV cache dtype</label><select id="f-kvdtype">
    <option>auto</option><option>fp8</option><option>fit</option></select>
   <label for="f-util">GPU memory vLLM may use (0-1)</label><input id="f-util">
   <label for="f-backend">CPU KV tier</label><select id="f-backend">
    <option>auto</option><option>native</option><option>lmcache</option><option>none</option>
   </select>
   <label for="f-tier">CPU KV tier size, GiB (or auto)</label><input id="f-tier">
   <p><button type="submit" id="preview" disabled>Preview plan</button>
   <button type="button" class="primary" id="save">Save &amp; restart</button>
   <button type="button" id="clear-disk" title="Delete the disk KV tier's files (server
    stopped only)">Clear disk tier</button></p>
  </form><div id="form-msg"></div></div>
 <div class="card" id="hub-card"><h2>Get a model</h2>
  <form id="hub-pull"><label for="h-model">Fetch a Hugging Face model (org/name, as the
   config file's manager.hub_models allows); then choose it under Settings' Model or, with
   several models, under "Add a model"</label><input id="h-model">
   <p><button type="submit" id="h-fetch" disabled>Fetch</button></p></form>
  <table id="hub-pulls"></table></div>
 <div class="card" id="peers-card" hidden><h2>Other boxes</h2><p class="hint">The boxes
  of [cluster] behind the router (docs/several-boxes.md) and whether each answers its
  /health now, checked every 10 s.</p><table id="peers"></table></div>
 <div class="card"><h2>Other vLLM servers on this host</h2><p class="hint">Found by their
  listening ports and /v1/models, whoever started them.</p><table id="detect"></table></div>
</div>
"""

# The journal, then the scripts that fill every part above.
LOGS_AND_SCRIPTS = """\
<div class="card"><h2>Logs</h2><p class="hint">The server's journal, refreshed every 2 s.
 Lines: <select id="log-lines"><option>100</option><option selected>300</option>
 <option>1000</option></select></p><pre id="logs"></pre></div>
</main><script src="/static/charts.js"></script><script src="/static/switches.js"></script>
<script src="/static/models.js"></script><script src="/static/dashboard.js"></script>
</body></html>"""


def dashboard(csrf: str, unit: str) -> str:
    """The page after login: its parts above, each filled by the scripts at its end."""
    unit = html.escape(unit)
    top = f"""\
<!doctype html><html><head><meta charset="utf-8">
<meta name="csrf" content="{html.escape(csrf)}"><title>vllm-offload manager</title>
<link rel="stylesheet" href="/static/style.css"></head><body>
<header><h1>vllm-offload manager · {unit}.service</h1>
<span id="state" class="badge stopped">…</span>
<button id="start">Start</button><button id="stop">Stop</button>
<button id="restart">Restart</button><button id="logout">Log out</button></header>
<main>
"""
    return top + SERVER_CARDS + MODELS_CARD + CHARTS + SETTINGS_CARDS + LOGS_AND_SCRIPTS
