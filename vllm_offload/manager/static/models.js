// The several-models card: a card per model (what it holds where, its state, its controls),
// and its edits of the config. Loaded before dashboard.js, whose helpers it uses when called.
// Several models: a card each, with what it holds where, its state, and its controls.
function showModels(models, controlError, steps) {
  const card = document.getElementById('models-card');
  card.hidden = !models;
  document.getElementById('settings-card').hidden = !!models;  // per model, in its card
  if (!models) return;
  // The front door's control socket did not answer as it should: states are unknown.
  const why = document.getElementById('control-error');
  why.hidden = !controlError;
  why.textContent = controlError ? `Model states unknown: ${controlError}` : '';
  showSwitches(models);
  showStrip(models, steps || []);
  const several = new Set(models.flatMap(m => m.gpus || [])).size > 1;  // a box of several GPUs
  show('model-cards', ...models.map(m => modelCard(m, several)));
}
// Its GPUs, on a box with several (plan.placement): a split is tensor parallel.
const gpuRows = m => [row('GPU', m.gpus.join(', ') + (m.gpus.length > 1 ? ` (split over ${m.gpus.length}: tensor parallel)` : ''))];
function modelCard(m, several) {
  const p = m.progress || {};
  const when = m.last_switch ? new Date(m.last_switch.t * 1000).toLocaleTimeString() + ': ' + m.last_switch.text : 'none yet';
  const len = el('input', {value: m.max_model_len, 'aria-label': 'max_model_len of ' + m.name});
  const tier = el('input', {value: fmt(m.cpu_tier_bytes / GIB, 0), 'aria-label': 'CPU tier GiB of ' + m.name});
  const button = (label, act, attrs = {}) => { const b = el('button', Object.assign({type: 'button'}, attrs), label); b.addEventListener('click', act); return b; };
  // A move button says what it is doing while its step is under way.
  const move = (action, label) => p.step === action
    ? el('button', {type: 'button', class: action, disabled: ''}, ticking(STEP[action] + '… ', p.elapsed_s))
    : button(label, ev => moveModel(m.name, action, ev.currentTarget), {class: action});
  return el('div', {class: 'model', 'data-model': m.name},
    el('h3', {}, m.name, el('span', {class: 'badge ' + m.state}, m.state), m.default ? el('span', {class: 'hint'}, ' default') : ''),
    el('table', {}, row('Folder', m.path), ...(several ? gpuRows(m) : []),
      row('Weights, on GPU / in host RAM', `${fmt(m.weights_gpu_bytes / GIB, 2)} / ${fmt(m.weights_offloaded_bytes / GIB, 2)} GiB`),
      row('GPU KV pool / CPU tier', `${fmt(m.gpu_kv_pool_bytes / GIB, 2)} / ${fmt(m.cpu_tier_bytes / GIB, 2)} GiB`),
      ...requestRows(m),
      row('When away', (m.idle === 'sleep' ? 'asleep' : 'stopped') + (m.away_ram_bytes ? `, holding ${fmt(m.away_ram_bytes / GIB, 1)} GiB of host RAM` : '')),
      ...progressRows(p),
      row('Last switch', when),
      row('max_model_len', len), row('CPU tier, GiB', tier)),
    move('bring-in', 'Bring in'), move('put-away', 'Put away'),
    button('Make default', () => changeModels(c => { c.residency.default_model = m.name; })),
    button('Preview', () => previewModels(c => setModel(c, m.name, len.value, tier.value))),
    button('Save', () => changeModels(c => setModel(c, m.name, len.value, tier.value))),
    button('Remove', () => changeModels(c => { c.models = c.models.filter(e => nameOf(e) !== m.name); })));
}
// As config.schema.model_name: a hub id (no leading '/') answers to its repo id.
const nameOf = e => e.served_name || (e.path && !e.path.startsWith('/')
  ? e.path.split('@')[0] : e.path.split('/').pop());
function setModel(c, name, len, tier) {
  const num = v => (v === 'auto' || v === '' || isNaN(Number(v))) ? v : Number(v);
  const entry = c.models.find(e => nameOf(e) === name);
  entry.max_model_len = num(len);
  entry.kv_offload = Object.assign({}, entry.kv_offload, {cpu_tier_gib: num(tier)});
}
async function moveModel(name, action, clicked) {
  clicked.disabled = true;  // until the next poll shows the step under way, and its time
  clicked.replaceChildren(STEP[action] + '…');
  setTimeout(pollStatus, 300);
  try { const r = await api(`/api/models/${encodeURIComponent(name)}/${action}`, {method: 'POST'});
        show('models-msg', el('span', {class: 'ok'}, r.status)); }
  catch (e) { show('models-msg', error(e.message ? `${e.field}: ${e.message}` : JSON.stringify(e))); }
}
async function editedConfig(edit) {
  const c = await api('/api/config'); configTag = c.etag;
  const config = JSON.parse(JSON.stringify(c.config));
  if (!config.models.length) {  // one [model] becomes the first of several
    config.models = [{path: config.model.path, served_name: config.model.served_name,
      max_model_len: config.model.max_model_len, dtype: config.model.dtype, kv_cache_dtype: config.model.kv_cache_dtype}];
    config.model = {path: '', served_name: '', max_model_len: 'auto', dtype: 'auto', kv_cache_dtype: 'auto'};
  }
  edit(config);
  return config;
}
async function previewModels(edit) {
  try {
    const r = await api('/api/config/preview', {method: 'POST', body: JSON.stringify({config: await editedConfig(edit)})});
    show('models-msg', el('table', {}, ...(r.plan.models ? boxRows(r.plan) : planRows(r.plan)),
      ...(r.problems || []).map(p => row('Cannot start', error(`${p.field}: ${p.message}`)))));
  } catch (e) { show('models-msg', error(e.message ? `${e.field}: ${e.message}` : JSON.stringify(e))); }
}
async function changeModels(edit) {
  try {
    await api('/api/config', {method: 'PUT', body: JSON.stringify({config: await editedConfig(edit)}),
                              headers: {'If-Match': configTag}});
    show('models-msg', el('span', {class: 'ok'}, 'Saved; the server restarts with its models.'));
  } catch (e) { show('models-msg', error(e.message ? `${e.field}: ${e.message}` : JSON.stringify(e))); }
}
async function addModel(ev) {
  ev.preventDefault();
  const path = document.getElementById('m-path').value, name = document.getElementById('m-name').value;
  await changeModels(c => { c.models.push({path: path, served_name: name}); });
}
