// Switches between models, as the several-models card shows them: the step under way
// (on the card, its button and one line over the cards) and a strip of the last WINDOW_S
// seconds' steps, a lane per model. Loaded before dashboard.js, whose helpers it uses.
const STEP = {'bring-in': 'Bringing in', 'put-away': 'Putting away'};
const secs = v => v == null ? 'unknown' : fmt(v, 1) + ' s';
// Seconds that go on counting between polls (a switch under way), from the server's count.
function ticking(prefix, seconds) {
  const node = el('span', {class: 'elapsed', 'data-prefix': prefix, 'data-elapsed': seconds || 0,
    'data-at': Date.now()});
  tick(node);
  return node;
}
function tick(node) {
  const s = Number(node.dataset.elapsed) + (Date.now() - Number(node.dataset.at)) / 1000;
  node.textContent = node.dataset.prefix + fmt(s, 0) + ' s';
}
function progressRows(p) {
  if (!p || (!p.step && !p.waiting)) return [];
  const last = p.step === 'put-away' ? p.last_put_away_s : p.last_bring_in_s;
  return [...(p.step ? [row('Switch under way', ticking(STEP[p.step] + ' for ', p.elapsed_s)),
      row('Last time it took', last == null ? 'not done yet' : secs(last))] : []),
    row('Requests waiting for it', fmt(p.waiting, 0))];
}
// One line over the cards while any switch is under way or any request waits for one.
function showSwitches(models) {
  const moving = models.filter(m => m.progress && m.progress.step);
  const waiting = models.reduce((n, m) => n + ((m.progress && m.progress.waiting) || 0), 0);
  const line = document.getElementById('switch-progress');
  line.hidden = !moving.length && !waiting;
  line.replaceChildren(...moving.flatMap(m => [ticking(`${STEP[m.progress.step]} '${m.name}': `,
    m.progress.elapsed_s), ` (${lastTook(models, m)}) · `]), `${waiting === 1 ? '1 request' : fmt(waiting, 0) + ' requests'} waiting for a switch`);
}
// How long this step last took for this model, else for another (alike enough to guess by).
function lastTook(models, m) {
  const key = m.progress.step === 'put-away' ? 'last_put_away_s' : 'last_bring_in_s';
  if (m.progress[key] != null) return 'last time ' + secs(m.progress[key]);
  const other = models.find(o => o.progress && o.progress[key] != null);
  return other ? `its first; '${other.name}' took ${secs(other.progress[key])}` : 'the first switch';
}
// The strip: each step a bar from its start to its end (a step under way: to now), its
// words in its aria-label and tooltip; the lanes' ends are clock times.
const DID = {'bring-in': 'brought in', 'put-away': 'put away'};
const DOING = {'bring-in': 'being brought in', 'put-away': 'being put away'};
const clockSeconds = t => new Date(t * 1000).toLocaleTimeString([], {hour: '2-digit', minute: '2-digit', second: '2-digit'});
function bar(step, begin, end, now, label) {
  const node = el('span', {class: 'bar ' + step, role: 'img', 'aria-label': label, title: label});
  const from = Math.max(begin, now - WINDOW_S), share = v => (v / WINDOW_S * 100).toFixed(2) + '%';
  node.style.left = share(from - (now - WINDOW_S));
  node.style.width = share(Math.max(end - from, WINDOW_S / 250));  // a quick step stays visible
  return node;
}
function showStrip(models, steps) {
  const now = Date.now() / 1000, from = now - WINDOW_S;
  const recent = steps.filter(s => s.t >= from);
  const lanes = models.map(m => {
    const bars = recent.filter(s => s.model === m.name).map(s => bar(s.step, s.t - s.seconds, s.t, now,
      `'${m.name}' ${DID[s.step]} at ${clockSeconds(s.t)}, took ${secs(s.seconds)}`));
    const p = m.progress || {};
    if (p.step) {
      const under = bar(p.step, now - (p.elapsed_s || 0), now, now, `'${m.name}' ${DOING[p.step]}, for ${fmt(p.elapsed_s, 0)} s so far`);
      under.classList.add('under-way');
      bars.push(under);
    }
    return el('div', {class: 'lane', 'data-model': m.name}, el('span', {class: 'lane-name'}, m.name),
      el('div', {class: 'track'}, ...bars));
  });
  show('strip-lanes', ...lanes);
  show('strip-axis', el('span', {}, clock(from)),
    recent.length ? `${recent.length} switch step${recent.length === 1 ? '' : 's'} in the last 10 minutes` : 'no switch in the last 10 minutes',
    el('span', {}, clock(now)));
}
