// Two cells side by side (compare.html?a=<id>&b=<id>): the inputs that differ, the phases,
// and every figure with those that changed highlighted. A number has changed when it differs
// by more than 1e-9 relative (the same inputs give the same bits); times and memory are
// measurements of the machine that always move (and a build's ccache hits the node's cache), so
// they are marked as such and not counted.
// Text changes when it is not equal.
'use strict';

const idA = param('a'), idB = param('b');
const MEASURED = /(_ms|_ms_per_token\d*|tokens_per_s|speedup\d*|_ratio|rss_bytes|rss_end_bytes|peak_memory_bytes)$|^build_(compilations|cache_hits)$/;

/** Flattens a JSON object to {"topology.tp": 2, ...}. */
function flatten(obj, prefix, out) {
  for (const [k, v] of Object.entries(obj || {})) {
    const key = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === 'object' && !Array.isArray(v)) flatten(v, key, out);
    else out[key] = Array.isArray(v) ? JSON.stringify(v) : v;
  }
  return out;
}

function changed(a, b) {
  if (a === undefined || b === undefined) return true;
  if (typeof a === 'number' && typeof b === 'number') {
    return Math.abs(a - b) > 1e-9 * Math.max(Math.abs(a), Math.abs(b), 1e-300);
  }
  return a !== b;
}

function changeText(a, b) {
  if (typeof a !== 'number' || typeof b !== 'number') return a === undefined ? 'only in B' : b === undefined ? 'only in A' : 'differs';
  if (a === 0) return `${fmt(b - a)}`;
  const rel = (b - a) / Math.abs(a);
  return `${rel >= 0 ? '+' : ''}${(rel * 100).toPrecision(3)}%`;
}

function render(a, b) {
  const onlyChanged = document.getElementById('only-changed').checked;
  document.getElementById('head-a').replaceChildren(cellLink(a.id), document.createTextNode(' '), badge(a.status));
  document.getElementById('head-b').replaceChildren(cellLink(b.id), document.createTextNode(' '), badge(b.status));
  const fa = flatten(Object.assign({}, a.spec, { branch: a.labels.branch }), '', {});
  const fb = flatten(Object.assign({}, b.spec, { branch: b.labels.branch }), '', {});
  const inputs = [];
  for (const k of [...new Set([...Object.keys(fa), ...Object.keys(fb)])].sort()) {
    const diff = changed(fa[k], fb[k]);
    if (onlyChanged && !diff) continue;
    const tr = row([el('span', 'mono', k), el('span', 'mono', fa[k] ?? ''), el('span', 'mono', fb[k] ?? '')]);
    if (diff) tr.className = 'changed';
    inputs.push(tr);
  }
  document.querySelector('#inputs tbody').replaceChildren(...inputs);

  const pa = {}, pb = {};
  for (const p of a.phases) pa[p.phase] = p;
  for (const p of b.phases) pb[p.phase] = p;
  const names = [...new Set([...a.phases.map((p) => p.phase), ...b.phases.map((p) => p.phase)])];
  document.querySelector('#phases tbody').replaceChildren(...names.map((n) => {
    const cell = (p) => (p ? badge(p.status) : el('span', 'muted', 'not run'));
    const tr = row([n, cell(pa[n]), cell(pb[n])]);
    if (!pa[n] || !pb[n] || pa[n].status !== pb[n].status) tr.className = 'changed';
    return tr;
  }));

  const rows = [];
  let count = 0;
  for (const n of names) {
    const ma = {}, mb = {};
    for (const f of (pa[n] || { figures: [] }).figures) ma[f.name] = f.value;
    for (const f of (pb[n] || { figures: [] }).figures) mb[f.name] = f.value;
    for (const k of [...new Set([...Object.keys(ma), ...Object.keys(mb)])]) {
      const diff = changed(ma[k], mb[k]);
      const measured = MEASURED.test(k);
      if (diff && !measured) ++count;
      if (onlyChanged && (!diff || measured)) continue;
      const tr = row([n, el('span', 'mono', k), el('span', 'mono', ma[k] === undefined ? '' : fmt(ma[k])),
                      el('span', 'mono', mb[k] === undefined ? '' : fmt(mb[k])),
                      diff ? changeText(ma[k], mb[k]) + (measured ? ' (measured)' : '') : '']);
      tr.dataset.figure = `${n}.${k}`;
      if (diff) tr.className = measured ? 'changed-measured' : 'changed';
      rows.push(tr);
    }
  }
  document.querySelector('#figures tbody').replaceChildren(...rows);
  document.getElementById('changed-count').textContent = `${count} changed (times and memory aside)`;
}

async function load() {
  try {
    if (!idA || !idB) throw new Error('compare.html needs ?a=<cell id>&b=<cell id>');
    const [a, b] = await Promise.all([fetchApi(`api/v1/cells/${encodeURIComponent(idA)}`),
                                      fetchApi(`api/v1/cells/${encodeURIComponent(idB)}`)]);
    render(a, b);
    document.getElementById('only-changed').onchange = () => render(a, b);
    showError(null);
  } catch (err) {
    showError(err);
  }
  document.body.dataset.loaded = 'true';
}

load();
