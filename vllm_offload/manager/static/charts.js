// The charts of the last WINDOW_S seconds, drawn on <canvas> (no chart library): each with
// its y axis in its unit, clock times under the x axis, a legend naming each line with its
// latest value, and the canvas's aria-label saying the same in words. Loaded before
// dashboard.js, whose helpers (el, fmt, GIB) and samples it uses when called.
const pct = v => v == null ? null : v * 100;
const gb = v => v == null ? null : v / 1e9;
const ms = v => v == null ? null : v * 1000;
// With several models, vLLM's charts show all of them or the one chosen (#chart-model).
let chartModel = '';
const vllmOf = s => chartModel ? (s.vllm_models || {})[chartModel] || {} : s.vllm;
const vllm = get => Object.assign(s => get(vllmOf(s)), {perModel: true});
// title, the y axis's unit, the lines' names (null: one per GPU), what a sample gives,
// and a fixed top for percentages.
const CHARTS = [
  ['GPU utilisation', '%', null, s => (s.gpus || []).map(g => g.util_percent), 100],
  ['GPU memory used', 'GiB', null, s => (s.gpus || []).map(g => g.memory_used_bytes / GIB)],
  ['GPU temperature', '°C', null, s => (s.gpus || []).map(g => g.temperature_c)],
  ['GPU power', 'W', null, s => (s.gpus || []).map(g => g.power_w)],
  ['CPU', '%', ['all cores'], s => [s.cpu_percent], 100],
  ['RAM and swap used', 'GiB', ['RAM', 'swap'], s => [s.ram_used_bytes / GIB, s.swap_used_bytes / GIB]],
  ['vLLM queue', 'requests', ['running', 'waiting'], vllm(v => [v.running, v.waiting])],
  ['KV use', '%', ['GPU pool', 'CPU tier busy'], vllm(v => [pct(v.gpu_kv_usage), pct(v.cpu_tier_busy)]), 100],
  ['Prompt tokens', 'tokens/s', ['from the CPU tier', 'from the GPU prefix cache', 'all'],
    vllm(v => [v.cpu_tier_hit_tokens_per_s, v.gpu_prefix_hit_tokens_per_s, v.prompt_tokens_per_s])],
  ['KV offload traffic', 'GB/s', ['load (CPU→GPU)', 'store (GPU→CPU)'],
    vllm(v => [gb(v.offload_load_bytes_per_s), gb(v.offload_store_bytes_per_s)])],
  ['Generation', 'tokens/s', ['generated'], vllm(v => [v.generation_tokens_per_s])],
  ['Time to first token', 'ms', ['mean', 'with CPU-tier hits', 'without'],
    vllm(v => [ms(v.ttft_mean_s), ms(v.ttft_with_cpu_hits_s), ms(v.ttft_without_cpu_hits_s)])],
  ['Preemptions', 'per s', ['preempted'], vllm(v => [v.preemptions_per_s])],
];
const COLORS = ['#1565c0', '#c62828', '#2e7d32', '#6a1b9a'];
const PAD = {left: 40, right: 8, top: 20, bottom: 16};  // CSS pixels around the plot
const TICK_S = 120;  // a time label every 2 minutes
const isGpu = title => title.startsWith('GPU');
const clock = t => new Date(t * 1000).toLocaleTimeString([], {hour: '2-digit', minute: '2-digit'});
function setupCharts() {
  show('charts', ...CHARTS.map(([title, unit], i) => el('div', {class: isGpu(title) ? 'chart gpu' : 'chart'},
    el('h3', {id: 'h' + i}, `${title} (${unit})`), el('canvas', {id: 'c' + i, role: 'img'}),
    el('div', {class: 'legend', id: 'l' + i}))));
}
// A host without an NVIDIA GPU: one line instead of four empty charts.
function showGpuCharts() {
  const none = samples.length > 0 && !samples.some(s => (s.gpus || []).length);
  document.getElementById('no-gpu').hidden = !none;
  document.querySelectorAll('.chart.gpu').forEach(c => { c.hidden = none; });
}
// The axis's top: 1, 2 or 5 times a power of ten, at or above the largest value.
function niceTop(v) {
  if (!(v > 0)) return 1;
  const ten = Math.pow(10, Math.floor(Math.log10(v)));
  return [1, 2, 5, 10].map(m => m * ten).find(m => m >= v);
}
// The chooser, where the window holds samples of more than one served model.
function showModelChooser() {
  const names = [...new Set(samples.flatMap(s => Object.keys(s.vllm_models || {})))].sort();
  const pick = document.getElementById('chart-model');
  document.getElementById('chart-model-pick').hidden = names.length < 2;
  const options = ['', ...names];
  if ([...pick.options].map(o => o.value).join('\n') !== options.join('\n')) {
    pick.replaceChildren(...options.map(n => el('option', {value: n}, n || 'all models')));
    pick.value = options.includes(chartModel) ? chartModel : '';
    chartModel = pick.value;
  }
}
function drawCharts() {
  showGpuCharts();
  showModelChooser();
  const now = Date.now() / 1000;
  CHARTS.forEach((chart, i) => drawChart(chart, i, now));
}
function drawChart([title, unit, names, get, fixedTop], i, now) {
  const series = [];
  samples.forEach(s => (get(s) || []).forEach((v, j) => { (series[j] = series[j] || []).push([s.t, v]); }));
  let most = 0;
  series.forEach(pts => pts.forEach(([, v]) => { if (v != null && v > most) most = v; }));
  const top = fixedTop || niceTop(most), name = j => names ? names[j] : 'GPU ' + j;
  const cv = document.getElementById('c' + i), of = get.perModel && chartModel ? ` of '${chartModel}'` : '';
  document.getElementById('h' + i).textContent = `${title}${of} (${unit})`;
  cv.setAttribute('aria-label', `${title}${of}, ${unit}, 0 to ${fmt(top, 2)}, from ${clock(now - WINDOW_S)} to ${clock(now)}`);
  const legend = document.getElementById('l' + i);
  legend.replaceChildren(...(series.length ? ['now: ', ...series.flatMap((pts, j) => {
    const swatch = el('span', {class: 'swatch'});
    swatch.style.backgroundColor = COLORS[j % COLORS.length];
    const latest = pts[pts.length - 1][1];
    return [swatch, `${name(j)} ${latest == null ? '–' : fmt(latest, 2) + ' ' + unit} `];
  })] : ['no data yet']));
  const w = cv.clientWidth, h = cv.clientHeight, dpr = window.devicePixelRatio || 1;
  if (!w || !h) return;  // hidden
  cv.width = w * dpr; cv.height = h * dpr;  // draw at the size shown: text not stretched
  const ctx = cv.getContext('2d');
  ctx.scale(dpr, dpr);
  const x0 = PAD.left, x1 = w - PAD.right, y0 = PAD.top, y1 = h - PAD.bottom;
  const x = t => x0 + (x1 - x0) * (1 - (now - t) / WINDOW_S), y = v => y1 - (y1 - y0) * v / top;
  ctx.font = '10px system-ui, sans-serif'; ctx.fillStyle = '#556'; ctx.strokeStyle = '#e3e5ea'; ctx.lineWidth = 1;
  ctx.textAlign = 'right'; ctx.textBaseline = 'middle';
  [0, top / 2, top].forEach(v => {
    ctx.beginPath(); ctx.moveTo(x0, y(v)); ctx.lineTo(x1, y(v)); ctx.stroke();
    ctx.fillText(fmt(v, 2), x0 - 4, y(v));
  });
  ctx.textAlign = 'left'; ctx.textBaseline = 'bottom'; ctx.fillText(unit, 2, y0 - 8);
  ctx.textAlign = 'center'; ctx.textBaseline = 'top';
  for (let t = Math.ceil((now - WINDOW_S) / TICK_S) * TICK_S; t <= now; t += TICK_S) {
    ctx.beginPath(); ctx.moveTo(x(t), y1); ctx.lineTo(x(t), y1 + 3); ctx.stroke();
    if (x(t) <= x0 + 12 || x(t) >= x1 - 12) continue;
    // centred on its tick, moved in just enough to lie whole inside the canvas (a label
    // near the right edge was cut: "10:36 PM" is wider than the room right of its tick)
    const label = clock(t), half = ctx.measureText(label).width / 2;
    ctx.fillText(label, Math.min(Math.max(x(t), half), w - half), y1 + 4);
  }
  series.forEach((pts, j) => {
    ctx.strokeStyle = COLORS[j % COLORS.length]; ctx.lineWidth = 1.5; ctx.beginPath();
    let started = false;
    pts.forEach(([t, v]) => {
      if (v == null) { started = false; return; }
      started ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v)); started = true;
    });
    ctx.stroke();
  });
}
