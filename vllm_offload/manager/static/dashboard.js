const CSRF = document.querySelector('meta[name=csrf]').content;
const WINDOW_S = 600;
let samples = [], last = 0, currentConfig = null, configTag = '';
const GIB = 1073741824;
async function api(path, opts = {}) {
  opts.headers = Object.assign({'X-CSRF-Token': CSRF, 'Content-Type': 'application/json'},
                               opts.headers || {});
  opts.credentials = 'same-origin';
  const r = await fetch(path, opts);
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw body.detail || body;
  return body;
}
const fmt = (v, d = 1) => v == null ? '–' : Number(v).toLocaleString(undefined,
  {maximumFractionDigits: d});
// Every value reaches the page as text (textContent), never as markup: a model folder,
// a served name or a log line cannot inject HTML or script.
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  Object.entries(attrs).forEach(([k, v]) => k === 'class' ? node.className = v : node.setAttribute(k, v));
  children.forEach(c => node.append(c instanceof Node ? c : String(c)));
  return node;
}
function row(k, v) { return el('tr', {}, el('td', {}, k), el('td', {}, v)); }
const error = text => el('span', {class: 'error'}, text);
function show(id, ...nodes) { document.getElementById(id).replaceChildren(...nodes); }
async function pollMetrics() {
  try {
    const r = await api('/api/metrics?since=' + last);
    if (r.samples.length) { samples = samples.concat(r.samples); last = r.samples[r.samples.length - 1].t; }
    const cutoff = Date.now() / 1000 - WINDOW_S;
    samples = samples.filter(s => s.t >= cutoff);
    drawCharts();
    const s = samples[samples.length - 1];
    if (s) {
      show('disks', ...(s.disks || []).map(d => row(d.mount, fmt(d.used_percent) + ' % used')));
    }
  } catch (e) { console.log(e); }
}
function lastOf(key) {
  for (let i = samples.length - 1; i >= 0; i--) if (samples[i].vllm[key] != null) return samples[i].vllm[key];
  return null;
}
async function pollStatus() {
  try {
    const s = await api('/api/status');
    const badge = document.getElementById('state');
    badge.textContent = s.health; badge.className = 'badge ' + s.health;
    show('server', row('Unit', s.unit),
      row('State', `${s.active_state} (${s.sub_state})`), row('Health', s.health),
      row('PID', s.pid || '–'), row('Uptime', s.uptime_s == null ? '–' : fmt(s.uptime_s, 0) + ' s'),
      row('Model', s.model), row('Answers to', s.served_name),
      ...(s.reason ? [row('Why', error(s.reason))] : []),
      ...(s.wedge.wedged ? [row('Wedged', error(s.wedge.reason + (s.wedge.restart_wedged
        ? ' (restarting it: manager.restart_wedged)' : ' (press Restart)')))] : []),
      ...(s.wedge.loads_stalled ? [row('KV loads', error('stalled: requests wait on a KV '
        + 'load from the CPU tier'))] : []),
      ...(s.problems || []).map(p => row('Cannot start', error(`${p.field}: ${p.message}`))));
    show('events', ...(s.events.length ? s.events.slice(-8).reverse()
      .map(e => row(new Date(e.t * 1000).toLocaleTimeString(), e.text)) : [row('nothing yet', '')]));
    show('hit-rate', ...hitRate(s.tier));
    show('buying', ...tierRows(s.tier), ...diskRows(s.disk),
      row('TTFT with CPU-tier hits (last window)', fmt(ms(lastOf('ttft_with_cpu_hits_s')), 0) + ' ms'),
      row('TTFT without (last window)', fmt(ms(lastOf('ttft_without_cpu_hits_s')), 0) + ' ms'));
    show('plan', ...(typeof s.plan === 'string'
      ? [el('tr', {}, el('td', {colspan: 2, class: 'error'}, s.plan))]
      : s.plan.models ? boxRows(s.plan) : planRows(s.plan)));
    showModels(s.models, s.control_error, s.switch_steps);
  } catch (e) { document.getElementById('state').textContent = 'unreachable'; }
}
// The CPU tier's hit rate over the last 10 minutes: of all prompt tokens, those whose KV
// came from the tier (GPU prefix-cache hits are counted among all, not as tier hits).
function hitRate(t) {
  if (!t.available) return [t.size_bytes === 0 ? 'No CPU tier: prompt tokens not in the GPU '
    + 'prefix cache are computed again' : 'CPU-tier hit rate unknown: ' + t.why];
  const w = t.last_10_min;
  if (w.hit_rate == null) return ['CPU-tier hit rate: no prompt tokens in the last 10 minutes'];
  return ['CPU-tier hit rate, last 10 minutes: ', el('strong', {}, fmt(w.hit_rate * 100, 1) + ' %'),
    ` of prompt tokens came from the CPU tier (${fmt(w.served_tokens, 0)} of ${fmt(w.prompt_tokens, 0)})`];
}
function tierRows(t) {
  if (!t.available) return [row('CPU tier', t.why)];
  const span = (name, w) => [
    row(`${name}: prompt tokens from the tier / computed again`,
      `${fmt(w.served_tokens, 0)} / ${fmt(w.computed_tokens, 0)}`),
    row(`${name}: prefill time saved`, w.prefill_saved_s == null
      ? 'no prefill measured yet' : fmt(w.prefill_saved_s, 1) + ' s'),
    row(`${name}: stored / loaded`, `${fmt(w.store_bytes / 1e9, 2)} / ${fmt(w.load_bytes / 1e9, 2)} GB`)];
  return [row('Filled (what it stored, up to its size)',
      `${fmt(t.filled_bytes / GIB, 2)} of ${fmt(t.size_bytes / GIB, 1)} GiB`),
    row('Busy with transfers now', t.busy == null ? 'not exported by this vLLM' : fmt(t.busy * 100, 1) + ' %'),
    ...span('Last 10 min', t.last_10_min), ...span('Since start', t.since_start),
    ...(t.verdict ? [row('Verdict', error(t.verdict))] : [])];
}
function diskRows(d) {
  if (!d || !d.available) return [];  // no disk tier: nothing to show
  const speed = v => v == null ? '–' : fmt(v / 1e9, 2) + ' GB/s';
  const span = (name, w) => [
    row(`Disk tier, ${name}: read (served) / written`, `${fmt(w.read_bytes / 1e9, 2)} / ${fmt(w.write_bytes / 1e9, 2)} GB`),
    row(`Disk tier, ${name}: speed per transfer, read / write`, `${speed(w.read_bytes_per_s)} / ${speed(w.write_bytes_per_s)}`)];
  return [row('Disk tier holds', d.held_bytes == null ? 'not reported yet'
      : `${fmt(d.held_bytes / GIB, 2)} of ${fmt(d.size_bytes / GIB, 1)} GiB (evicted ${fmt((d.evicted_bytes || 0) / GIB, 2)} GiB)`),
    ...span('last 10 min', d.last_10_min), ...span('since start', d.since_start)];
}
// What one request can use: its max_model_len, unless the pool holds less (the planner
// refuses that, but say it right). The pool's figure is room all requests share.
const usableTokens = p => Math.min(p.max_model_len, p.longest_request_tokens);
function requestRows(p) {
  const usable = usableTokens(p);
  return [row('One request can use', `${fmt(usable, 0)} tokens (`
      + (usable === p.max_model_len ? 'max_model_len' : 'all the KV pool holds') + ')'),
    row(p.host_extension_bytes ? 'KV pool room, GPU + host extension (shared by all requests)'
      : 'GPU KV pool room (shared by all requests)', fmt(p.longest_request_tokens, 0) + ' tokens')];
}
function planRows(p) {
  return [row('GPU KV pool', `${fmt(p.gpu_kv_pool_bytes / GIB, 2)} GiB = ${fmt(p.gpu_kv_pool_tokens, 0)} tokens`),
    ...requestRows(p),
    ...(p.host_extension_bytes ? [row('Host extension of the pool', `${fmt(p.host_extension_bytes / GIB, 2)} GiB = ${fmt(p.host_extension_tokens, 0)} tokens per GPU, used after the GPU's blocks`
      + (p.spilled_decode_steps_per_s_ceiling == null ? '' : `; a ${fmt(p.max_model_len, 0)}-token request decodes at most ${fmt(p.spilled_decode_steps_per_s_ceiling, 1)} tokens/s`))] : []),
    row('max_model_len', `${fmt(p.max_model_len, 0)} tokens (${p.max_model_len_source})`),
    row('CPU KV tier', `${p.kv_offload_backend}: ${fmt(p.cpu_tier_bytes / GIB, 2)} GiB = ${fmt(p.cpu_tier_tokens, 0)} tokens, for reuse`),
    ...(p.disk_tier_bytes ? [row('Disk KV tier', `${fmt(p.disk_tier_bytes / GIB, 0)} GiB = ${fmt(p.disk_tier_tokens, 0)} tokens at ${p.disk_tier_path}`)] : []),
    row('Weights on GPU / offloaded', `${fmt(p.weights_gpu_bytes / GIB, 2)} / ${fmt(p.weights_offloaded_bytes / GIB, 2)} GiB`),
    row('KV cache dtype', `${p.kv_cache_dtype} (${p.kv_dtype_bytes} bytes per element)`),
    ...(p.decisions || []).map(d => row('Chose', d)),
    ...(p.warnings || []).map(w => row('Warning', error(w)))];
}
function boxRows(f) {
  return [...Object.entries(f.models).map(([name, p]) => row(name + (name === f.default ? ' (default)' : ''),
      `GPU KV pool ${fmt(p.gpu_kv_pool_bytes / GIB, 2)} GiB; one request up to ${fmt(usableTokens(p), 0)} tokens; `
      + `CPU tier ${fmt(p.cpu_tier_bytes / GIB, 2)} GiB; ${p.idle === 'sleep' ? 'asleep' : 'stopped'} when away`)),
    ...(f.decisions || []).map(d => row('Chose', d)), ...(f.warnings || []).map(w => row('Warning', error(w)))];
}
async function control(action) {
  const msg = document.getElementById('control-msg');
  msg.textContent = action + '…';
  try { await api('/api/service/' + action, {method: 'POST'}); msg.textContent = action + ' requested; watching…'; }
  catch (e) { msg.replaceChildren(error(e.message ? `${e.field}: ${e.message}` : JSON.stringify(e))); }
}
async function loadConfig() {
  const [c, m] = await Promise.all([api('/api/config'), api('/api/models')]);
  currentConfig = c.config; configTag = c.etag;
  const sel = document.getElementById('f-model');
  sel.replaceChildren(...m.models.map(x => el('option', {value: x.path}, x.name)));
  document.getElementById('m-path').replaceChildren(...m.models.map(x => el('option', {value: x.path}, x.name)));
  if (currentConfig.model.path) sel.value = currentConfig.model.path;
  document.getElementById('f-len').value = currentConfig.model.max_model_len;
  document.getElementById('f-util').value = currentConfig.gpu.memory_utilization;
  document.getElementById('f-conc').value = currentConfig.gpu.min_concurrent_requests;
  document.getElementById('f-weights').value = currentConfig.weights_offload.cpu_gib;
  document.getElementById('f-kvdtype').value = currentConfig.model.kv_cache_dtype;
  document.getElementById('f-backend').value = currentConfig.kv_offload.backend;
  document.getElementById('f-tier').value = currentConfig.kv_offload.cpu_tier_gib;
}
function formConfig() {
  const c = JSON.parse(JSON.stringify(currentConfig));
  const num = v => (v === 'auto' || v === '' || isNaN(Number(v))) ? v : Number(v);
  c.model.path = document.getElementById('f-model').value;
  c.model.served_name = '';
  c.model.max_model_len = num(document.getElementById('f-len').value);
  c.gpu.memory_utilization = num(document.getElementById('f-util').value);
  c.gpu.min_concurrent_requests = num(document.getElementById('f-conc').value);
  c.weights_offload.cpu_gib = num(document.getElementById('f-weights').value);
  c.model.kv_cache_dtype = document.getElementById('f-kvdtype').value;
  c.kv_offload.backend = document.getElementById('f-backend').value;
  c.kv_offload.cpu_tier_gib = num(document.getElementById('f-tier').value);
  return {config: c};
}
function showError(e) {
  const d = e.field ? `${e.field}: ${e.message}` : JSON.stringify(e);
  show('form-msg', el('span', {class: 'error', id: 'form-error'}, d));
}
async function previewPlan(ev) {
  ev && ev.preventDefault();
  try {
    const r = await api('/api/config/preview', {method: 'POST', body: JSON.stringify(formConfig())});
    show('form-msg', el('table', {}, ...planRows(r.plan),
      ...(r.problems || []).map(p => row('Cannot start', error(`${p.field}: ${p.message}`)))));
  } catch (e) { showError(e); }
}
async function saveConfig() {
  try {
    await api('/api/config', {method: 'PUT', body: JSON.stringify(formConfig()),
                              headers: {'If-Match': configTag}});
    show('form-msg', el('span', {class: 'ok'}, 'Saved. Restarting; waiting for the new model to answer…'));
    await loadConfig();
    for (let i = 0; i < 150; i++) {
      await new Promise(r => setTimeout(r, 2000));
      try {
        const p = await api('/api/probe', {method: 'POST'});
        show('form-msg', el('span', {class: 'ok', id: 'switched'}, `${p.model} answers: “${p.answer}”`));
        return;
      } catch (e) { /* still starting */ }
    }
    showError({message: 'the server did not answer within 5 minutes; see the logs'});
  } catch (e) { showError(e); }
}
async function clearDisk() {
  try {
    const r = await api('/api/cache/clear', {method: 'POST'});
    show('form-msg', el('span', {class: 'ok'}, `Disk tier cleared: ${fmt(r.files, 0)} files, ${fmt(r.bytes / GIB, 2)} GiB`));
  } catch (e) { showError(e); }
}
async function pollLogs() {
  try {
    const n = document.getElementById('log-lines').value;
    const r = await api('/api/logs?lines=' + n);
    const pre = document.getElementById('logs'), atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 5;
    pre.textContent = r.lines.join('\n');
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  } catch (e) {}
}
async function fetchHubModel(ev) {
  ev.preventDefault();
  try {
    await api('/api/hub/pull', {method: 'POST',
      body: JSON.stringify({model: document.getElementById('h-model').value})});
    pollPulls();
  } catch (e) { show('hub-pulls', row('Fetch', error(e.field ? `${e.field}: ${e.message}` : JSON.stringify(e)))); }
}
let pullsRunning = false;
async function pollPulls() {
  try {
    const r = await api('/api/hub/pulls');
    show('hub-pulls', ...r.pulls.map(p => row(p.model, p.state === 'fetching'
      ? `fetching: ${fmt(p.fetched_bytes / GIB, 2)} of ${fmt(p.total_bytes / GIB, 2)} GiB`
      : p.state === 'done' ? `fetched into ${p.message}` : error(`failed: ${p.message}`))));
    const running = r.pulls.some(p => p.state === 'fetching');
    if (pullsRunning && !running) loadConfig();  // a finished download joins the model list
    pullsRunning = running;
  } catch (e) {}
}
async function pollPeers() {
  try {
    const r = await api('/api/peers');
    document.getElementById('peers-card').hidden = !r.peers.length;
    show('peers', ...r.peers.map(p => el('tr', {},
      el('td', {}, `${p.name} (${p.url})`), el('td', {}, p.models.join(', ')),
      el('td', {class: p.state === 'up' ? 'ok' : 'error'}, p.state))));
  } catch (e) {}
}
async function pollDetect() {
  try {
    const r = await api('/api/detect');
    show('detect', ...(r.servers.length ? r.servers.map(s =>
      row(`port ${s.port} (pid ${s.pid})`, s.models.join(', '))) : [row('none found', '')]));
  } catch (e) {}
}
['start', 'stop', 'restart'].forEach(a =>
  document.getElementById(a).addEventListener('click', () => control(a)));
document.getElementById('logout').addEventListener('click',
  () => api('/logout', {method: 'POST'}).finally(() => { location = '/login'; }));
document.getElementById('chart-model').addEventListener('change', ev => { chartModel = ev.target.value; drawCharts(); });
document.getElementById('settings').addEventListener('submit', previewPlan);
document.getElementById('save').addEventListener('click', saveConfig);
document.getElementById('clear-disk').addEventListener('click', clearDisk);
document.getElementById('add-model').addEventListener('submit', addModel);
document.getElementById('hub-pull').addEventListener('submit', fetchHubModel);
// Their buttons come disabled: a click before this line would submit a form natively (a reload).
['preview', 'm-add', 'h-fetch'].forEach(id => { document.getElementById(id).disabled = false; });
setupCharts(); loadConfig(); pollStatus(); pollMetrics(); pollLogs(); pollDetect(); pollPulls();
pollPeers();
setInterval(pollMetrics, 1000);
setInterval(() => document.querySelectorAll('.elapsed').forEach(tick), 1000); setInterval(pollStatus, 2000); setInterval(pollLogs, 2000);
setInterval(pollPulls, 2000);
setInterval(pollDetect, 15000); setInterval(pollPeers, 10000);
